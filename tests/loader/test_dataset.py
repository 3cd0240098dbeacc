import json
import shutil

import numpy as np
import pytest
from expected import recount
from zarrfeed.loader import Dataset, FormatError
from zarrfeed.writer import L5KIT_SCHEMA, TL_FACE_DTYPE, synthetic, write_dataset

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array, Group



def test_real_scene_opens_with_its_counts_and_dtypes(real_scene):
    ds = Dataset.open(real_scene)
    assert ds.schema.name == "l5kit" and ds.schema.links == L5KIT_SCHEMA.links
    assert ds.rows == {"scenes": 1, "frames": 248, "agents": 20802, "traffic_light_faces": 3216}
    for name, table in L5KIT_SCHEMA.tables.items():
        assert ds[name].dtype == table.dtype
    scene = ds["scenes"][0]
    assert scene["host"] == "host-a101" and scene["frame_index_interval"].tolist() == [0, 248]


def test_real_scene_info(real_scene):
    info = Dataset.open(real_scene).info()
    stored = sum(p.stat().st_size for p in (real_scene / "agents").iterdir() if p.is_file())  # zarr's nbytes_stored
    agents = info["agents"]
    assert agents["rows"] == 20802 and agents["chunk_rows"] == 20000 and agents["chunks_initialized"] == 2
    assert agents["bytes"] == 20802 * 116 and agents["bytes_stored"] == stored
    assert agents["ratio"] == pytest.approx(20802 * 116 / stored, rel=1e-3)
    assert agents["dtype"][0] == ["centroid", "<f8", [2]]
    json.dumps(info)  # the CLI's --json needs plain types


def test_real_scene_validates(real_scene):
    report = Dataset.open(real_scene).validate()
    assert report.ok and report.count == 0 and str(report) == "valid"


def test_broken_agent_interval_is_reported_with_its_frame_row(real_copy):
    frames = Array.open(DirectoryStore(real_copy), "frames")
    row = frames[100]
    row["agent_index_interval"][1] += 5
    frames[100] = row
    report = Dataset.open(real_copy).validate()
    assert not report.ok
    assert [(v.table, v.field, v.row) for v in report.violations] == [("frames", "agent_index_interval", 101)]
    assert "overlap" in report.violations[0].message


def test_violation_list_is_bounded_but_counted(tmp_path):
    write_dataset(tmp_path / "d.zarr", synthetic.episodes(2))
    frames = Array.open(DirectoryStore(tmp_path / "d.zarr"), "frames")
    data = frames[:]
    data["agent_index_interval"][::2] = [7, 3]  # start > end in every other frame
    frames[:] = data
    report = Dataset.open(tmp_path / "d.zarr").validate(limit=5)
    assert len(report.violations) == 5 and report.count > 400
    assert f"and {report.count - 5} more" in str(report)


def test_zip_store_and_fsspec_url(real_scene, real_zip):
    zpath = real_zip
    for location in (zpath, f"file://{real_scene}"):
        ds = Dataset.open(location)
        assert ds.rows["agents"] == 20802 and ds.validate().ok
        np.testing.assert_array_equal(ds["agents"][:100], Group.open(DirectoryStore(real_scene))["agents"][:100])
    with pytest.raises(FormatError, match="read-only"):
        Dataset.open(zpath, mode="a")


def test_missing_faces_table_warns_and_reads_empty(real_copy):
    shutil.rmtree(real_copy / "traffic_light_faces")
    frames = Array.open(DirectoryStore(real_copy), "frames")
    data = frames[:]
    data["traffic_light_faces_index_interval"] = 0
    frames[:] = data
    with pytest.warns(UserWarning, match="traffic_light_faces' is missing"):
        ds = Dataset.open(real_copy)
    assert ds.rows["traffic_light_faces"] == 0 and ds["traffic_light_faces"].dtype == TL_FACE_DTYPE
    assert ds.validate().ok


def test_committed_count_not_shape_is_what_readers_see(tmp_path):
    write_dataset(tmp_path / "d.zarr", synthetic.episodes(1))
    agents = Array.open(DirectoryStore(tmp_path / "d.zarr"), "agents")
    committed = agents.shape[0]
    agents.resize(committed + 5000)  # a writer grew the array; these rows are not committed
    ds = Dataset.open(tmp_path / "d.zarr")
    assert ds.rows["agents"] == committed and ds.info()["agents"]["rows"] == committed
    recount(tmp_path / "d.zarr", "agents", committed + 10_000)
    with pytest.raises(FormatError, match="agents.*rows committed but the array holds"):
        Dataset.open(tmp_path / "d.zarr")


def test_validate_checks_links_against_the_committed_rows_not_the_arrays_length(tmp_path):
    """The links were checked against the child array's length.
    A writer mid-append grows the arrays before it commits: the committed rows must still validate, and a
    frame whose agents run into the uncommitted rows (rows a reader never sees) must be a violation."""
    write_dataset(tmp_path / "d.zarr", synthetic.episodes(2))
    agents = Array.open(DirectoryStore(tmp_path / "d.zarr"), "agents")
    committed = agents.shape[0]
    agents.resize(committed + 5000)  # rows written, not committed
    assert Dataset.open(tmp_path / "d.zarr").validate().ok
    frames = Array.open(DirectoryStore(tmp_path / "d.zarr"), "frames")
    last = frames[-1]
    last["agent_index_interval"][1] += 10  # into the uncommitted rows, inside the array
    frames[-1] = last
    report = Dataset.open(tmp_path / "d.zarr").validate()
    assert not report.ok and f"is outside the rows of agents, [0, {committed})" in str(report), str(report)


def test_missing_chunk_inside_committed_rows_is_a_violation(tmp_path):
    write_dataset(tmp_path / "d.zarr", synthetic.episodes(3), chunks={"agents": 5000})
    (tmp_path / "d.zarr" / "agents" / "2").unlink()
    report = Dataset.open(tmp_path / "d.zarr").validate()
    assert report.count == 1 and "chunk 'agents/2' (rows 10000-15000) is missing" in str(report)


@pytest.mark.parametrize("breakage, message", [
    ("missing", "no such file or directory"),
    ("not_zarr", "not a zarr group (no .zgroup)"),
    ("wrong_dtype", "table 'agents': wrong dtype, it field 'yaw' is <f8, expected <f4"),
    ("bad_zarray", "table 'agents': cannot open its array"),
    ("truncated", "table 'agents': chunk 'agents/0' cannot be decoded"),
    ("corrupt", "table 'agents': chunk 'agents/1' cannot be decoded"),
])
def test_unreadable_input_gives_one_line_reason(real_copy, tmp_path, breakage, message):
    path = real_copy
    if breakage == "missing":
        path = tmp_path / "nope.zarr"
    elif breakage == "not_zarr":
        path = tmp_path / "plain"
        path.mkdir()
    elif breakage == "wrong_dtype":
        meta = json.loads((real_copy / "agents" / ".zarray").read_text())
        meta["dtype"][2][1] = "<f8"
        (real_copy / "agents" / ".zarray").write_text(json.dumps(meta))
    elif breakage == "bad_zarray":
        (real_copy / "agents" / ".zarray").write_text("{not json")
    elif breakage == "truncated":
        chunk = real_copy / "agents" / "0"
        chunk.write_bytes(chunk.read_bytes()[:500])
    elif breakage == "corrupt":
        chunk = real_copy / "agents" / "1"
        chunk.write_bytes(b"\x02\x01" + bytes(len(chunk.read_bytes()) - 2))
    if breakage in ("truncated", "corrupt"):  # a dataset, and an invalid one: validate says which chunk
        report = Dataset.open(path).validate()
        assert not report.ok and report.count == 1 and message in str(report)
        return
    with pytest.raises(FormatError) as err:
        Dataset.open(path).validate()
    assert message in str(err.value) and "\n" not in str(err.value)
