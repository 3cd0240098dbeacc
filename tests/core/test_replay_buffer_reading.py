"""Diffusion Policy's replay buffers open as they are: a steps table per `data/<key>` array, episodes from
`meta/episode_ends`; `info`, `validate` and the Arrow bridge work on them, nothing is copied."""
import json

import numpy as np
import pytest
import zarr
from cli_process import zarrfeed
from zarrfeed.loader import Dataset, from_arrow

KEYS = ["action", "img", "keypoint", "n_contacts", "state"]


def test_a_replay_buffer_opens_as_it_is(dp_buffer, dp_samples):
    ds = Dataset.open(dp_buffer)
    assert ds.schema.name == "replay_buffer" and list(ds.tables) == ["episodes", *KEYS]
    assert ds.schema.step_tables() == KEYS
    assert ds.rows == {"episodes": 40, **{k: 5913 for k in KEYS}}
    assert ds.others == {}
    z = zarr.open_group(str(dp_buffer), mode="r")
    ends = ds.read_rows("episodes", 0, 40)["end"]
    assert (ends == z["meta/episode_ends"][:]).all() and (ends == dp_samples["episode_ends"]).all()
    for key in KEYS:
        assert ds[key].dtype[key].shape == z[f"data/{key}"].shape[1:]
        got = ds.read_rows(key, 0, 5913)[key]
        assert got.dtype == z[f"data/{key}"].dtype and (got == z[f"data/{key}"][:]).all(), key
        some = np.array([0, 249, 250, 251, 4000, 5912])
        assert (ds.read_coordinates(key, some)[key] == z[f"data/{key}"][:][some]).all(), key
    # the steps: every key at once, one field each, any rows
    steps = ds.read_rows("steps", 240, 260)
    assert steps.dtype.names == tuple(KEYS)
    for key in KEYS:
        assert (steps[key] == z[f"data/{key}"][240:260]).all()


def test_info_and_validate_describe_a_replay_buffer(dp_buffer):
    out = zarrfeed("info", dp_buffer)
    assert out.returncode == 0, out.stderr
    assert "(replay_buffer)" in out.stdout and "img |u1(12, 12, 3)" in out.stdout and "5,913" in out.stdout
    doc = json.loads(zarrfeed("info", dp_buffer, "--json").stdout)
    assert doc["episodes"]["rows"] == 40 and doc["img"]["chunk_rows"] == 250
    out = zarrfeed("validate", dp_buffer)
    assert out.returncode == 0 and "valid (40 episodes, 5,913 action" in out.stdout, out.stdout + out.stderr


def _resize_data(path, extra: int) -> None:
    z = zarr.open_group(str(path), mode="r+")
    for key in KEYS:
        a = z[f"data/{key}"]
        a.resize((a.shape[0] + extra, *a.shape[1:]))


def test_steps_past_the_last_episode_are_not_read_and_validate_says_so(dp_copy):
    """Diffusion Policy's writer resizes the data arrays and writes them, then `episode_ends`: a writer stopped in
    between leaves steps that belong to no episode, and its `ReplayBuffer` refuses to open the buffer."""
    _resize_data(dp_copy, 7)
    ds = Dataset.open(dp_copy)
    assert ds.rows["img"] == 5913 and ds.to_arrow("steps").num_rows == 5913
    report = ds.validate()
    assert report.count == len(KEYS)
    assert str(report.violations[1]).startswith("img row 5913: data/img holds 7 steps past the last episode's end")
    out = zarrfeed("validate", dp_copy)
    assert out.returncode == 1 and "7 steps past the last episode's end" in out.stdout


def test_broken_episode_ends_are_violations_naming_the_episode(dp_copy):
    z = zarr.open_group(str(dp_copy), mode="r+")
    ends = z["meta/episode_ends"][:]
    ends[3], ends[5] = ends[2], ends[4] - 1
    z["meta/episode_ends"][:] = ends
    report = Dataset.open(dp_copy).validate()
    found = [str(v) for v in report.violations]
    assert found == [f"episodes.end row 5: end {ends[4] - 1} is before the end before it, {ends[4]} (ends never "
                     "decrease)"] + found[1:]  # episode 3, now of no steps, is allowed (DP's add_episode takes one)
    assert report.count == len(KEYS)  # each step table's link says so


def test_ends_past_the_stored_steps_refuse_in_one_line(dp_copy):
    z = zarr.open_group(str(dp_copy), mode="r+")
    ends = z["meta/episode_ends"][:]
    ends[-1] += 100
    z["meta/episode_ends"][:] = ends
    out = zarrfeed("info", dp_copy)
    assert out.returncode == 2 and out.stderr.strip() == (
        "zarrfeed: error: table 'action': meta/episode_ends says the episodes end at step 6,013, but data/action "
        "holds 5,913 steps; the data is incomplete")


def test_the_arrow_bridge_exports_the_steps(dp_buffer):
    ds = Dataset.open(dp_buffer)
    table = ds.to_arrow("steps")
    assert table.column_names == KEYS and table.num_rows == 5913
    z = zarr.open_group(str(dp_buffer), mode="r")
    records = from_arrow(table)  # back to records, every field its shape and dtype
    for key in KEYS:
        assert (records[key] == z[f"data/{key}"][:]).all(), key
    two = ds.to_arrow("steps", fields=["state", "action"])
    assert two.column_names == ["state", "action"]
    assert (from_arrow(two)["action"] == z["data/action"][:]).all()


@pytest.mark.parametrize("separator", [".", "/"])
def test_either_dimension_separator_and_other_chunks_per_key(tmp_path, separator):
    """A replay buffer written by zarr with `/` chunk keys (`0/0/0/0`), and keys chunked differently."""
    path = tmp_path / "b.zarr"
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (97, 4, 4, 3), dtype=np.uint8)
    action = rng.normal(size=(97, 2)).astype(np.float32)
    data, meta = root.create_group("data"), root.create_group("meta")
    enc = {"name": "v2", "separator": separator}
    data.create_array("img", shape=img.shape, chunks=(10, 4, 4, 3), dtype=img.dtype, chunk_key_encoding=enc)[:] = img
    data.create_array("action", shape=action.shape, chunks=(33, 2), dtype=action.dtype,
                      chunk_key_encoding=enc)[:] = action
    meta.create_array("episode_ends", shape=(3,), chunks=(3,), dtype=np.int64)[:] = [30, 60, 97]
    if separator == "/":
        assert (path / "data" / "img" / "9" / "0" / "0" / "0").is_file()
    ds = Dataset.open(path)
    assert ds.rows == {"episodes": 3, "action": 97, "img": 97}
    assert (ds.read_rows("img", 5, 97)["img"] == img[5:]).all()
    assert (ds.read_rows("steps", 0, 97)["action"] == action).all()
    assert ds.validate().ok


def test_not_a_replay_buffer_is_one_line(dp_copy):
    z = zarr.open_group(str(dp_copy), mode="r+")
    del z["meta/episode_ends"]
    z["meta"].create_array("episode_ends", shape=(40, 2), dtype=np.int64)
    out = zarrfeed("info", dp_copy)
    assert out.returncode == 2 and out.stderr.strip() == (
        "zarrfeed: error: meta/episode_ends: a 2-D array of int64, not the 1-D integer array of episode ends of a "
        "replay buffer")


def test_export_writes_the_episodes_and_the_steps(dp_buffer, tmp_path):
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    out = zarrfeed("export", dp_buffer, tmp_path / "pq", "-q")
    assert out.returncode == 0, out.stderr
    assert "exported 40 episodes, 5,913 steps" in out.stdout
    steps = pq.read_table(tmp_path / "pq" / "steps")
    assert steps.num_rows == 5913 and steps.column_names == [*KEYS, "_row"]
    z = zarr.open_group(str(dp_buffer), mode="r")
    assert (from_arrow(steps.sort_by("_row"))["img"] == z["data/img"][:]).all()
    assert (from_arrow(pq.read_table(tmp_path / "pq" / "episodes"))["end"] == z["meta/episode_ends"][:]).all()
    out = zarrfeed("export", dp_buffer, tmp_path / "s.arrows", "--format", "arrow")
    assert out.returncode == 0 and "5,913 rows of steps" in out.stdout, out.stderr
    with ipc.open_stream(tmp_path / "s.arrows") as reader:
        assert (from_arrow(reader.read_all())["state"] == z["data/state"][:]).all()
    out = zarrfeed("export", dp_buffer, tmp_path / "x", "--tables", "stepz")
    assert out.returncode == 2 and "no table 'stepz'" in out.stderr and "n_contacts, state, steps)" in out.stderr


def test_ingest_from_a_replay_buffer_copies_it_episode_by_episode(dp_buffer, tmp_path):
    """`zarrfeed ingest NEW --from BUFFER` (re-chunking, re-compressing) split a replay buffer into episodes as
    interval links: an IndexError traceback. Each episode is the steps from the end before it to its own."""
    out = tmp_path / "copy.zarr"
    r = zarrfeed("ingest", out, "--from", dp_buffer, "--chunks", "img=100", "-q")
    assert r.returncode == 0, r.stderr
    a, b = zarr.open_group(str(out), mode="r"), zarr.open_group(str(dp_buffer), mode="r")
    assert (a["meta/episode_ends"][:] == b["meta/episode_ends"][:]).all()
    for key in KEYS:
        assert (a[f"data/{key}"][:] == b[f"data/{key}"][:]).all(), key
    assert a["data/img"].chunks == (100, 12, 12, 3) and a["data/state"].chunks == (250, 5)
    assert a["meta/episode_ends"].metadata.compressor is None  # as the source stores it
    r = zarrfeed("ingest", out, "--from", dp_buffer, "--append", "-q")  # the same input again: refused
    assert r.returncode == 2 and "ingested before" in r.stderr


def test_load_reads_a_replay_buffers_steps(dp_buffer):
    r = zarrfeed("load", dp_buffer, "-q")
    assert r.returncode == 0 and "loaded 5,913 rows of action" in r.stdout, r.stdout + r.stderr
    r = zarrfeed("load", dp_buffer, "-q", "--table", "img", "--batch-size", "64", "--workers", "0")
    assert r.returncode == 0 and "loaded 5,913 rows of img in 93 shuffled batches" in r.stdout, r.stderr


def _buffer(path, keys: dict, ends, chunks: int = 10, **create):
    """A replay buffer written with zarr 3 (zarr_format=2): `keys` maps each key to its (T, ...) values."""
    import numcodecs

    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    for key, value in keys.items():
        root.create_array(f"data/{key}", shape=value.shape, chunks=(chunks, *value.shape[1:]), dtype=value.dtype,
                          compressors=numcodecs.Blosc("lz4", 5, 0), fill_value=0, **create)[:] = value
    root.create_array("meta/episode_ends", shape=(len(ends),), chunks=(len(ends),), dtype="i8", compressors=None,
                      fill_value=0)[:] = ends
    return root


def test_a_chunk_zarr_left_out_reads_as_its_fill_value(tmp_path):
    """zarr 3 stores no chunk that is all fill (a contact flag 0 for a whole chunk): zarr and Diffusion Policy
    read those steps as 0; zarrfeed refused the buffer ("chunk ... is missing ... the dataset is incomplete").
    It reads them as zarr does, and keeps doing so once zarrfeed has appended to the buffer."""
    from zarrfeed import SequenceLoader
    from zarrfeed.writer import DatasetWriter

    path = tmp_path / "b.zarr"
    contact = np.zeros((30, 1), np.float32)
    contact[20:] = 1
    action = np.arange(60, dtype=np.float32).reshape(30, 2)
    _buffer(path, {"action": action, "contact": contact}, [10, 30])
    assert not (path / "data" / "contact" / "0.0").exists()  # left out by zarr
    ds = Dataset.open(path)
    assert (ds.read_rows("steps", 0, 30)["contact"] == contact).all() and ds.validate().ok
    with SequenceLoader(path, 4, 1, 1, shuffle=False, num_workers=2, batch_size=100) as loader:
        batch, indices = next(iter(loader)), loader.indices()
    for i, (lo, hi, s0, s1) in enumerate(indices.tolist()):  # Diffusion Policy's padding, on zarr's values
        want = np.concatenate([np.repeat(contact[lo:lo + 1], s0, 0), contact[lo:hi],
                               np.repeat(contact[hi - 1:hi], 4 - s1, 0)])
        assert (batch["contact"][i] == want).all(), i
    with DatasetWriter(path, mode="a", workers=0) as w:
        w.submit({"action": np.ones((3, 2), np.float32), "contact": np.ones((3, 1), np.float32)})
    ds = Dataset.open(path)
    assert ds.commit is not None and ds.validate().ok
    assert (ds.read_rows("contact", 0, 33)["contact"][:, 0] == np.concatenate([contact[:, 0], [1, 1, 1]])).all()


@pytest.mark.parametrize("key", ["steps", "episodes"])
def test_a_key_with_a_name_zarrfeed_gives_is_refused_in_one_line(tmp_path, key):
    """A data key named `steps` hid every other key from the steps read together (an export lost them)."""
    _buffer(tmp_path / "b.zarr", {"action": np.zeros((5, 2), np.float32), key: np.zeros((5, 1), np.float32)}, [5])
    r = zarrfeed("export", tmp_path / "b.zarr", tmp_path / "out", "-q")
    assert r.returncode == 2 and f"data/{key}: a data key named '{key}'" in r.stderr, r.stderr
    from zarrfeed.writer import replay_buffer_schema

    with pytest.raises(ValueError, match=f"key '{key}': a name zarrfeed gives"):
        replay_buffer_schema({key: (np.float32, (1,))})
    with pytest.raises(ValueError, match=r"key 'z': a step of shape \(0,\) holds nothing"):
        replay_buffer_schema({"z": (np.float32, (0,))})


def test_a_buffer_without_its_episode_ends_or_with_a_damaged_key_is_refused(dp_copy):
    """Without `meta/episode_ends` (deleted, or a group), `validate` said "valid ()" and `export` exported
    nothing, both exit 0; a `data/<key>/.zarray` that is not JSON dropped the key with a warning."""
    import shutil

    (dp_copy / "data" / "state" / ".zarray").write_text("{not json")
    r = zarrfeed("validate", dp_copy)
    assert r.returncode == 2 and r.stderr.startswith("zarrfeed: error: data/state: cannot open its array"), r.stderr
    shutil.rmtree(dp_copy / "meta" / "episode_ends")
    for command in ("validate", "export"):
        r = zarrfeed(command, dp_copy, *(["out"] if command == "export" else []))
        assert r.returncode == 2 and "meta/episode_ends: missing" in r.stderr, r.stderr


def test_validate_names_lengths_a_writer_left_unset(tmp_path):
    """A writer killed among the renames that set a commit's lengths leaves arrays Diffusion Policy refuses;
    `validate` says so and how to set them right, and a writer opened and closed sets them."""
    from zarrfeed.core import dataset_format
    from zarrfeed.writer import DatasetWriter, replay_buffer_schema

    path = tmp_path / "b.zarr"
    with DatasetWriter(path, replay_buffer_schema({"action": (np.float32, (2,))}, chunk_rows=4), workers=0) as w:
        w.submit({"action": np.ones((6, 2), np.float32)})
    ds = Dataset.open(path)
    dataset_format.set_length(Dataset.open(path, mode="r+")["action"], 9)  # as if a later commit's had begun
    report = Dataset.open(path).validate()
    assert report.count == 1 and "data/action is 9 long, but meta/episode_ends ends at 6" in str(
        report.violations[0])
    assert "DatasetWriter(path, mode='a').close()" in str(report.violations[0])
    DatasetWriter(path, mode="a", workers=0).close()
    assert Dataset.open(path).validate().ok and ds.rows["action"] == 6
