import numpy as np
import pytest
from expected import expected_tables
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group
from zarrfeed.loader import Dataset
from zarrfeed.writer import L5KIT_SCHEMA, Schema, synthetic, write_dataset


def test_written_dataset_is_plain_l5kit_zarr(tmp_path):
    eps = list(synthetic.episodes(6, seed=3))
    summary = write_dataset(tmp_path / "d.zarr", eps)
    want = expected_tables(eps)
    assert summary["episodes"] == 6 and summary["rows"] == {n: len(a) for n, a in want.items()}
    # the format layer, not the loader (zarr-python 2 reads the same: test_zarr_interop.py)
    group = Group.open(DirectoryStore(tmp_path / "d.zarr"))
    assert dict(group.attrs.items()) == L5KIT_SCHEMA.attrs
    for name, table in L5KIT_SCHEMA.tables.items():
        arr = group[name]
        assert arr.dtype == table.dtype and arr.chunks == (table.chunk_rows,)
        assert arr.compressor.get_config() == L5KIT_SCHEMA.compressor.get_config()
        np.testing.assert_array_equal(arr[:], want[name])
    assert Dataset.open(tmp_path / "d.zarr").validate().ok


def test_custom_chunks_and_schema(tmp_path):
    eps = list(synthetic.episodes(2))
    write_dataset(tmp_path / "d.zarr", eps, chunks={"agents": 1000})
    ds = Dataset.open(tmp_path / "d.zarr")
    assert ds["agents"].chunks == (1000,) and ds.schema.tables["agents"].chunk_rows == 1000
    assert ds["agents"].nchunks_initialized == -(-ds.rows["agents"] // 1000)

    step = np.dtype([("t", "<f4"), ("a", "<i2", (3,))])
    run = np.dtype([("steps", "<i8", (2,)), ("name", "S8")])
    schema = Schema({"runs": (run, 4), "steps": (step, 5)}, {"runs.steps": "steps"}, attrs={"v": 1})
    runs = [{"runs": np.array([([0, n], b"r%d" % n)], run), "steps": np.ones(n, step)} for n in (3, 0, 9)]
    write_dataset(tmp_path / "c.zarr", runs, schema)
    ds = Dataset.open(tmp_path / "c.zarr")
    assert ds.schema == schema and ds.rows == {"runs": 3, "steps": 12}
    assert ds["runs"][:]["steps"].tolist() == [[0, 3], [3, 3], [3, 12]]
    assert ds.validate().ok


def test_bad_episode_is_refused_naming_where(tmp_path):
    good, bad = synthetic.episode(0), synthetic.episode(1)
    bad["frames"]["agent_index_interval"][5, 1] += 1
    with pytest.raises(ValueError, match=r"episode 1: frames.agent_index_interval row 6: .*overlap"):
        write_dataset(tmp_path / "d.zarr", [good, bad])


def test_refuses_to_overwrite_a_dataset(tmp_path):
    write_dataset(tmp_path / "d.zarr", synthetic.episodes(1))
    with pytest.raises(ValueError, match="already exists"):
        write_dataset(tmp_path / "d.zarr", synthetic.episodes(1))


def test_each_kind_of_bad_episode_is_one_exact_line():
    """check_episode's lines (only their start was tested)."""
    from zarrfeed.writer.episode import check_episode
    good = synthetic.episode(0)

    def refused(episode) -> str:
        with pytest.raises(ValueError) as err:
            check_episode(episode, L5KIT_SCHEMA)
        return str(err.value)
    assert refused([good]) == "expected a dict of table name -> structured ndarray, got list"
    assert refused({**good, "extra": good["scenes"]}) == (
        "table 'extra': not in schema 'l5kit' (tables: scenes, frames, agents, traffic_light_faces)")
    assert refused({**good, "agents": [1, 2]}) == "table 'agents': expected a structured ndarray, got list"
    assert refused({**good, "agents": np.zeros(3)}) == (
        "table 'agents': expected a structured ndarray, got ndarray of float64")
    assert refused({**good, "agents": np.stack([good["agents"], good["agents"]])}) == (
        f"table 'agents': expected 1-D records, got shape (2, {len(good['agents'])})")
