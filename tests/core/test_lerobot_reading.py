"""A LeRobot v3 root read in place as tables: the golden dataset's values are LeRobot's own, tabular values
exactly, video frames exactly as its PyAV decoding gave them."""
import os
import pickle
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lerobot_roots import CAM, DATA, copy_root, current_frames, edit_info, split_root
from repo_paths import LEROBOT_ROOT

from zarrfeed.core.chunks import read_coordinates, read_rows
from zarrfeed.core import parquet_files
from zarrfeed.core.errors import ChunkError, FormatError
from zarrfeed.core.external_table import ChunkRead, ExternalTable
from zarrfeed.core.lerobot_checks import validate
from zarrfeed.core.lerobot_meta import LeRobotMeta, is_lerobot
from zarrfeed.core.lerobot_tables import lerobot_tables
from zarrfeed.core.location import Location
from zarrfeed.core.parquet_table import ParquetTable
from zarrfeed.loader import Dataset

FEATURES = ("observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index")


@pytest.fixture(scope="module")
def golden():
    meta = LeRobotMeta.read(Location.of(LEROBOT_ROOT))
    return meta, *lerobot_tables(meta)


def test_the_metadata_says_what_lerobot_wrote(golden):
    meta, schema, _ = golden
    assert is_lerobot(Location.of(LEROBOT_ROOT)) and meta.fps == 10 and meta.tasks == ["pick", "place"]
    assert list(meta.episodes.length) == [40, 32, 26, 31, 24] and meta.episodes.end[-1] == 153
    assert meta.features["observation.state"].shape == (6,) and meta.features["index"].shape == ()
    assert meta.cameras[CAM].shape == (48, 64, 3) and meta.data_files == [DATA]
    assert schema.name == "lerobot" and schema.step_tables() == [*FEATURES, CAM]
    assert schema.tables["observation.state"].dtype == np.dtype([("observation.state", np.float32, (6,))])


def test_every_feature_reads_as_the_parquet_and_lerobot_hold_it(golden):
    _, _, tables = golden
    parquet, want = pq.read_table(LEROBOT_ROOT / DATA), current_frames()
    for name in FEATURES:
        got = read_rows(tables[name], 0, 153)[name]
        assert np.array_equal(got, np.stack(parquet[name].to_numpy(zero_copy_only=False))), name
        assert np.array_equal(got, want[name]), name
    frames = read_rows(tables[CAM], 0, 153)[CAM]
    assert frames.dtype == np.uint8 and np.array_equal(frames, want[CAM])  # 0 difference: the same decoder


def test_chunks_smaller_than_row_groups_and_episodes_read_the_same(golden):
    meta, _, _ = golden
    _, small = lerobot_tables(meta, chunk_rows=7, video_chunk_rows=5)
    want = current_frames()
    rows = np.array([152, 0, 39, 40, 97, 98, 128, 129, 3])
    for name in ("observation.state", "index", CAM):
        assert small[name].chunks == ((7,) if name != CAM else (5,))
        assert np.array_equal(read_coordinates(small[name], rows)[name], want[name][rows]), name
        assert np.array_equal(read_rows(small[name], 30, 75)[name], want[name][30:75]), name


def test_a_chunk_is_read_straight_into_the_buffer_zero_padded(golden):
    """`read_chunks` gives tokens, and `decode_into` reads the rows into the caller's buffer (a loader's shared
    memory), the rows past the table's end zeroed; a buffer of another size is refused."""
    _, _, tables = golden
    raw = tables["action"].read_chunks([0, 1])
    assert raw[1] is None and isinstance(raw[0], ChunkRead) and raw[0].chunk == 0
    out = np.full(1024 * 24, 255, np.uint8)
    tables["action"].decode_into(raw[0], out)
    assert not out[153 * 24:].any()
    np.testing.assert_array_equal(out[:153 * 24].view("<f4").reshape(153, 6),
                                  read_rows(tables["action"], 0, 153)["action"])
    with pytest.raises(ValueError, match="bytes for a chunk"):
        tables["action"].decode_into(raw[0], out[:-1])
    copied = np.empty_like(out)
    tables["action"].decode_into(out.tobytes(), copied)  # (decoded bytes, copied)
    np.testing.assert_array_equal(copied, out)


def test_external_tables_are_picklable_and_flagged_for_the_fetcher(golden):
    _, _, tables = golden
    read_rows(tables["observation.state"], 0, 10)  # (opened its files once: nothing open goes in the pickle)
    for name in ("episodes", "observation.state", CAM):
        table = pickle.loads(pickle.dumps(tables[name]))
        assert isinstance(table, ExternalTable) and table.reads_own_chunks and table.sharding is None
        assert table.chunk_key(3) == f"{name}#3" and table.zarr_format is None and not table.missing_is_fill
    again = pickle.loads(pickle.dumps(tables[CAM]))
    assert np.array_equal(read_rows(again, 40, 42)[CAM], current_frames()[CAM][40:42])


def test_a_fixed_size_list_column_is_read_by_row_groups_without_reading_others(golden, monkeypatch):
    meta, _, tables = golden
    asked = []
    real = pq.ParquetFile.read_row_groups

    def spy(self, groups, *args, **kwargs):
        asked.append((list(groups), kwargs.get("columns")))
        return real(self, groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    table = ParquetTable(meta.location, "action", "action", tables["action"].dtype, meta.data_files,
                         meta.data_start, meta.data_stop, chunk_rows=10)
    assert np.array_equal(read_rows(table, 40, 50)["action"], current_frames()["action"][40:50])
    assert asked == [([1], ["action"])]  # episode 1's row group only (the file's row groups are its episodes)


def test_the_columns_of_a_root_read_each_range_of_row_groups_once_from_a_file_opened_once(monkeypatch):
    """A loader's window asks every column's table for the same rows: one read of all the columns serves them
    (each column read apart, with its file opened again, cost 2.5 ms a chunk: 0.36 s of a 2 s epoch)."""
    meta = LeRobotMeta.read(Location.of(LEROBOT_ROOT))
    asked, opened = [], []
    real_read, real_init = pq.ParquetFile.read_row_groups, pq.ParquetFile.__init__

    def read(self, groups, *args, **kwargs):
        asked.append((list(groups), kwargs.get("columns")))
        return real_read(self, groups, *args, **kwargs)

    def init(self, *args, **kwargs):
        opened.append(1)
        real_init(self, *args, **kwargs)
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", read)
    monkeypatch.setattr(pq.ParquetFile, "__init__", init)
    _, tables = lerobot_tables(meta, chunk_rows=50)  # (reads the timestamps of the camera's frames)
    asked.clear()
    want = current_frames()
    for chunk in (0, 2, 0):
        for name in FEATURES:
            got = read_rows(tables[name], chunk * 50, chunk * 50 + 50)[name]
            assert np.array_equal(got, want[name][chunk * 50:chunk * 50 + 50]), (name, chunk)
    assert len(opened) == 1 and [a[1] for a in asked] == [list(FEATURES)] * 2  # chunks 0 and 2, once each
    again = pickle.loads(pickle.dumps(tables["action"]))  # (a worker's copy opens its own)
    assert again.reader is not tables["action"].reader and not again.reader._files


def test_reading_a_column_does_not_import_pandas(golden, tmp_path):
    """A loader worker's first read imported pandas through pyarrow's `to_numpy` (0.2 s of every first batch)."""
    _, _, tables = golden
    (tmp_path / "tables.pkl").write_bytes(pickle.dumps({k: tables[k] for k in ("observation.state", "index")}))
    code = ("import pickle, sys\n"
            f"tables = pickle.loads(open({str(tmp_path / 'tables.pkl')!r}, 'rb').read())\n"
            "from zarrfeed.core.chunks import read_rows\n"
            "rows = [read_rows(t, 0, 153) for t in tables.values()]\n"
            "print('pandas' in sys.modules, float(rows[0]['observation.state'].sum()), int(rows[1]['index'][-1]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    state = float(current_frames()["observation.state"].sum())
    imported, total, last = out.stdout.split()
    assert imported == "False" and last == "152" and abs(float(total) - state) <= 1e-3 * max(1.0, abs(state))


def test_a_forked_process_reads_through_its_own_open_files_never_the_parents():
    """Loader workers started with "fork" used the files their parent had open (one file offset for both): reads
    raced, failing as corrupt Parquet or, worse, reading another column's bytes."""
    meta = LeRobotMeta.read(Location.of(LEROBOT_ROOT))
    _, tables = lerobot_tables(meta)
    want = current_frames()
    read_rows(tables["action"], 0, 10)
    read_rows(tables[CAM], 0, 2)  # (the parent's files are open now)
    parents = [h for h, _ in tables["action"].reader._files.values()] + list(tables[CAM]._readers.values())
    assert len(parents) == 2
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say whether it read right, through files of its own
        ok = False
        try:
            ok = (np.array_equal(read_rows(tables["action"], 0, 153)["action"], want["action"])
                  and np.array_equal(read_rows(tables[CAM], 40, 42)[CAM], want[CAM][40:42])
                  and not any(h is p for h, _ in tables["action"].reader._files.values() for p in parents)
                  and not any(v is p for v in tables[CAM]._readers.values() for p in parents))
        finally:
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
    os.close(w)
    said = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert said == b"1"
    assert np.array_equal(read_rows(tables["action"], 0, 153)["action"], want["action"])  # the parent's still read


def test_a_file_opened_while_its_path_was_swapped_to_another_is_refused(tmp_path, monkeypatch):
    """A file swapped for another while it was opened, and back before the check after the read, left the other
    file's handle open: each later read returned its rows while the path's check passed."""
    root = copy_root(tmp_path / "root")
    ds = Dataset.open(root)
    path, other = root / DATA, tmp_path / "other.parquet"
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.schema.get_field_index("index"), "index",
                                    pa.array(np.arange(len(table)) + 1000)), other)
    ds["index"].reader.forget(DATA)  # (opening the root read the timestamps: opened again below)
    real_open = parquet_files.ParquetFiles._open

    def swapped_while_opened(self, name):
        if name in self._files:
            return real_open(self, name)
        os.replace(path, tmp_path / "kept.parquet")
        shutil.copy(other, path)
        try:
            return real_open(self, name)
        finally:
            os.replace(tmp_path / "kept.parquet", path)  # back before the check
    monkeypatch.setattr(parquet_files.ParquetFiles, "_open", swapped_while_opened)
    for _ in range(2):
        with pytest.raises(ChunkError, match=r"file-000.parquet: was replaced or rewritten since the dataset was "
                                             r"opened \(the file opened is another\)"):
            ds.read_rows("index", 0, 10)


def test_lists_of_several_lengths_whose_total_matches_are_refused_not_shifted_between_rows(tmp_path):
    """A variable-length list column of 5 and 7 values where (6,) is expected had the right total: its rows were
    read with values shifted into their neighbours."""
    root = copy_root(tmp_path / "root")
    table = pq.read_table(root / DATA)
    n, values = len(table), np.concatenate(table["observation.state"].to_numpy(zero_copy_only=False))
    lengths = np.where(np.arange(n) % 2 == 0, 5, 7)
    lengths[-1] += 6 * n - lengths.sum()
    ragged = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32)),
                                      pa.array(values, pa.float32()))
    at = table.schema.get_field_index("observation.state")
    pq.write_table(table.set_column(at, pa.field("observation.state", pa.list_(pa.float32())), ragged),
                   root / DATA)
    with pytest.raises(ChunkError, match=r"column 'observation.state': lists of 5 to \d+ values, not one length "
                                         r"for rows of shape \(6,\)"):
        Dataset.open(root).read_rows("observation.state", 0, 20)


def test_data_and_videos_over_several_files_read_the_same(tmp_path):
    root = split_root(tmp_path / "split")
    meta = LeRobotMeta.read(Location.of(root))
    assert meta.data_files == [DATA, "data/chunk-000/file-001.parquet"] and len(meta.video_files[CAM]) == 2
    assert validate(meta) == []
    _, tables = lerobot_tables(meta, chunk_rows=50, video_chunk_rows=16)
    want = current_frames()
    for name in (*FEATURES, CAM):
        assert np.array_equal(read_rows(tables[name], 0, 153)[name], want[name]), name


def test_features_not_read_are_left_out_with_a_warning_and_unknown_dtypes_refused(tmp_path):
    root = copy_root(tmp_path / "r")

    def add(info):
        info["features"]["observation.images.top"] = {"dtype": "image", "shape": [8, 8, 3], "names": None}
        info["features"]["language"] = {"dtype": "string", "shape": [1], "names": None}
    edit_info(root, add)
    with pytest.warns(UserWarning) as said:
        meta = LeRobotMeta.read(Location.of(root))
    assert sorted(str(w.message).split("feature ")[1].split(" left out")[0] for w in said) == \
        ["'language'", "'observation.images.top'"]
    assert set(meta.left_out) == {"observation.images.top", "language"} and "language" not in meta.features
    edit_info(root, lambda info: info["features"]["action"].update(dtype="float128x"))
    with warnings.catch_warnings(), pytest.raises(FormatError, match=r"meta/info.json: features.action: dtype "):
        warnings.simplefilter("ignore")
        LeRobotMeta.read(Location.of(root))
