"""`Dataset.open` of a LeRobot v3 root: read in place as a replay buffer's tables (`episodes` and one step table
per feature), described, validated, tagged; loaders read it through worker processes, and from S3."""
import os
import pickle
import shutil

import numpy as np
import pytest
from lerobot_roots import CAM, VIDEO, copy_root, current_frames, edit_info, split_root
from repo_paths import LEROBOT_ROOT

from zarrfeed.core.errors import FormatError
from zarrfeed.core.external_table import ExternalTable
from zarrfeed.loader import Dataset, Loader
from zarrfeed.loader.engine.fetch import ChunkFetcher, ChunkRef, FetchOptions
from zarrfeed.loader.engine.read_worker import DatasetOpener
from zarrfeed.loader.kinds.sequences import SequenceLoader

FEATURES = ["observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index", CAM]


def assert_golden(ds: Dataset) -> None:
    steps = ds.read_rows("steps", 0, 153)
    assert list(steps.dtype.names) == FEATURES
    for name, values in current_frames().items():
        np.testing.assert_array_equal(steps[name], values, err_msg=name)
    np.testing.assert_array_equal(ds.read_rows("episodes", 0, 5)["end"], [40, 72, 98, 129, 153])


def test_a_lerobot_root_opens_as_a_replay_buffer_of_its_features():
    ds = Dataset.open(LEROBOT_ROOT)
    assert ds.schema.name == "lerobot" and ds.schema.step_tables() == FEATURES
    assert ds.readable_tables()[-1] == "steps" and ds.row_count("steps") == 153 and ds.rows["episodes"] == 5
    assert ds.lerobot.fps == 10 and ds.lerobot.tasks == ["pick", "place"] and list(ds.lerobot.cameras) == [CAM]
    assert_golden(ds)
    assert ds.to_arrow("observation.state").num_rows == 153


def test_it_is_described_validated_and_tagged_and_records_no_digests(tmp_path):
    ds = Dataset.open(LEROBOT_ROOT)
    info = ds.info()
    assert info[CAM]["rows"] == 153 and info[CAM]["chunk_rows"] == 32 and info[CAM]["chunks_initialized"] == 5
    assert info["action"]["dtype"] == [["action", "<f4", [6]]] and info["action"]["bytes_stored"] > 0
    assert ds.validate().ok and str(ds.validate()) == "valid"
    assert ds.digests() is None and ds.check is None and ds.commit is None
    verified = ds.verify()
    assert verified.ok and not verified.recorded and verified.unverifiable == 13
    copy = copy_root(tmp_path / "copy")
    tag = Dataset.open(copy).version_tag()
    assert tag == Dataset.open(copy).version_tag()
    edit_info(copy, lambda info: info.update(robot_type="so100"))
    assert Dataset.open(copy).version_tag() != tag


def test_validate_names_file_episode_and_key(tmp_path):
    root = copy_root(tmp_path / "root")
    os.unlink(root / VIDEO)
    report = Dataset.open(root).validate()
    assert not report.ok and [str(v) for v in report.violations] == [
        f"{VIDEO}: missing (the episodes' metadata names it)"]


def test_problems_opening_it_are_one_line_naming_the_file(tmp_path):
    root = copy_root(tmp_path / "root")
    edit_info(root, lambda info: info.pop("total_frames"))
    with pytest.raises(FormatError, match=rf"^{root}/meta/info.json: key 'total_frames' missing$"):
        Dataset.open(root)
    with pytest.raises(FormatError, match="read-only"):
        Dataset.open(LEROBOT_ROOT, mode="r+")
    with pytest.raises(FormatError, match="no commits"):
        Dataset.open(LEROBOT_ROOT, commit=1)
    shutil.rmtree(tmp_path / "root" / "meta")  # no meta/info.json: not a LeRobot root, said as before
    with pytest.raises(FormatError, match="not a zarr group"):
        Dataset.open(root)


def test_workers_are_handed_the_external_tables_and_reopen_it():
    ds = Dataset.open(LEROBOT_ROOT)
    opener = pickle.loads(pickle.dumps(DatasetOpener.of(ds, FetchOptions())))
    table = opener.open_table(opener.location.store("r"), CAM)
    assert isinstance(table, ExternalTable) and table.chunks == (32,)
    again = Dataset.reopen(ds.location)
    assert again.schema == ds.schema and again.rows == ds.rows


def test_loaders_read_it_with_worker_processes_as_lerobot_gave_it(tmp_path):
    want = current_frames()
    with Loader(LEROBOT_ROOT, CAM, batch_size=40, shuffle=False, num_workers=2, copy=True) as loader:
        frames = np.concatenate([b[CAM] for b in loader])
    np.testing.assert_array_equal(frames, want[CAM])
    root = split_root(tmp_path / "split")  # over two data files and two video files
    with SequenceLoader(root, 2, keys=["action", CAM], batch_size=16, shuffle=False, num_workers=2,
                        copy=True) as loader:
        batches = list(loader)
    sample = np.concatenate([b["sample"] for b in batches])
    steps = loader.indices()[sample, :1] + np.arange(2)
    action = np.concatenate([b["action"] for b in batches])
    cam = np.concatenate([b[CAM] for b in batches])
    np.testing.assert_array_equal(action, want["action"][steps])
    np.testing.assert_array_equal(cam, want[CAM][steps])


def test_the_fetcher_reads_external_tables_through_the_table_on_a_remote_store(s3):
    url, server = s3
    server.fs().put(str(LEROBOT_ROOT), url.removeprefix("s3://") + "/root", recursive=True)
    ds = Dataset.open(f"{url}/root", storage_options=server.options)
    assert ds.location.settings.remote and ds.lerobot.fps == 10
    assert_golden(ds)
    assert ds.validate().ok
    fetcher = ChunkFetcher(ds.location, ds.location.store("r"), FetchOptions())
    [raw] = fetcher.fetch([ChunkRef(ds.tables["action"], 0)], [None])
    assert raw == ds.tables["action"].read_chunks([0])[0]
    with Loader(ds, "action", batch_size=64, shuffle=False, num_workers=1, copy=True) as loader:
        action = np.concatenate([b["action"] for b in loader])
    np.testing.assert_array_equal(action, current_frames()["action"])


def _rewrite_action(root, regroup: bool = False) -> None:
    """The data file replaced by one whose `action` differs, row groups as before (`regroup`: all in one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    at = table.schema.get_field_index("action")
    values = np.stack(table["action"].to_numpy(zero_copy_only=False)) + 1000
    table = table.set_column(at, table.schema.field(at), pa.array(list(values), table.schema.field(at).type))
    groups = pq.ParquetFile(path).metadata
    with pq.ParquetWriter(f"{path}.new", table.schema) as writer:
        start = 0
        for g in range(groups.num_row_groups if not regroup else 0):
            writer.write_table(table.slice(start, groups.row_group(g).num_rows))
            start += groups.row_group(g).num_rows
        if regroup:
            writer.write_table(table)
    os.replace(f"{path}.new", path)


def _rewrite_video(root) -> None:
    """The camera's video replaced by one of other frames at the same times."""
    from zarrfeed.writer import lerobot_video

    frames = np.full((153, 48, 64, 3), 7, np.uint8)
    lerobot_video.encode_episode(frames, root / "new.mp4", 10, "libsvtav1")
    os.replace(root / "new.mp4", root / VIDEO)


@pytest.mark.parametrize("key, rewrite", [("action", _rewrite_action), ("action", lambda root: _rewrite_action(
    root, regroup=True)), (CAM, _rewrite_video)])
@pytest.mark.parametrize("workers", [0, 1])
def test_a_file_replaced_under_an_open_loader_is_refused_never_mixed(tmp_path, key, rewrite, workers):
    root = copy_root(tmp_path / "root")
    ds = Dataset.open(root)
    with Loader(ds, key, batch_size=64, shuffle=False, num_workers=workers, cache="off", copy=True) as loader:
        first = np.concatenate([b[key] for b in loader])
        np.testing.assert_array_equal(first, current_frames()[key])
        rewrite(root)
        with pytest.raises(Exception, match="replaced or rewritten since the dataset was opened") as refused:
            list(loader)
        assert "\n" not in str(refused.value)
    assert Dataset.open(root).read_rows(key, 0, 1)[key].shape[0] == 1  # opened again: read as it is now


def test_a_frame_rate_other_than_the_roots_own_is_refused():
    from zarrfeed import LeRobotLoader

    with pytest.raises(ValueError, match=r"fps=20 differs from the LeRobot dataset's own 10 \(meta/info.json\)"):
        LeRobotLoader(LEROBOT_ROOT, {"action": [0.0, 0.1]}, fps=20, num_workers=0)
    with LeRobotLoader(LEROBOT_ROOT, {"action": [0.0, 0.1]}, fps=10, num_workers=0, shuffle=False) as loader:
        assert sum(len(b["action"]) for b in loader) == 153
