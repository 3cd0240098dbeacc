"""A damaged LeRobot v3 root: each problem is one line naming the file, and the episode and key where it has
them; `validate` finds what the format promises and does not hold, without decoding the videos."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from lerobot_roots import CAM, DATA, VIDEO, copy_root, edit_episodes, edit_info

from zarrfeed.core.chunks import read_rows
from zarrfeed.core.errors import ChunkError, FormatError
from zarrfeed.core.lerobot_checks import validate
from zarrfeed.core.lerobot_meta import LeRobotMeta
from zarrfeed.core.lerobot_tables import lerobot_tables
from zarrfeed.core.location import Location


def found(root) -> list[str]:
    return [f"{where}: {what}" for where, what in validate(LeRobotMeta.read(Location.of(root)))]


def tables(root):
    return lerobot_tables(LeRobotMeta.read(Location.of(root)))[1]


@pytest.fixture
def root(tmp_path):
    return copy_root(tmp_path / "root")


def test_the_golden_root_is_valid(root):
    assert found(root) == []


def test_a_missing_video_file_is_named_by_validate_and_by_a_read(root):
    os.unlink(root / VIDEO)
    assert found(root) == [f"{VIDEO}: missing (the episodes' metadata names it)"]
    with pytest.raises(ChunkError, match=rf"camera '{CAM}', {VIDEO}, episode 0: the video file is missing"):
        read_rows(tables(root)[CAM], 0, 3)


def test_a_truncated_data_file_is_named(root):
    path = root / DATA
    path.write_bytes(path.read_bytes()[:-3000])
    [line] = found(root)
    assert line.startswith(f"{DATA}: not a readable Parquet file (") and "\n" not in line
    opened = tables(root)  # opens: the frames' times cannot be read, which a read of the camera says
    with pytest.raises(ChunkError, match=rf"^{DATA}: column 'action' cannot be read"):
        read_rows(opened["action"], 0, 3)
    with pytest.raises(ChunkError, match=rf"camera '{CAM}': frame times unknown \({DATA}"):
        read_rows(opened[CAM], 0, 3)


def test_episodes_that_do_not_tile_the_frames_are_named(root):
    def gap(c):
        c["dataset_from_index"][2] = 73
        c["length"][2] = 25
    edit_episodes(root, gap)
    lines = found(root)
    assert "meta/episodes: episode 2: key 'dataset_from_index' is 73, expected 72 (the episodes do not tile the " \
           "frames in order)" in lines
    assert f"{DATA}: a row of no episode: column 'episode_index' is 2 at row 72 of the file (dataset row 72), " \
           "expected -1" in lines
    assert f"{VIDEO}: episode 2: camera '{CAM}' holds 26 frames between 7.2000 and 9.8000 s, but the episode has 25" \
           in lines


def test_a_video_segment_past_the_end_of_its_file_is_named(root):
    def late(c):
        c[f"videos/{CAM}/from_timestamp"][4] = 15.3
        c[f"videos/{CAM}/to_timestamp"][4] = 17.7
    edit_episodes(root, late)
    assert found(root) == [f"{VIDEO}: episode 4: key 'videos/{CAM}/from_timestamp'..'to_timestamp' is "
                           "15.3000..17.7000 s, outside the video's 0..15.3000 s"]
    with pytest.raises(ChunkError, match=rf"{VIDEO}, episode 4: no frame at 15.300000 s: the stream ends first"):
        read_rows(tables(root)[CAM], 129, 131)


def test_a_video_segment_of_another_length_than_its_episode_is_named(root):
    edit_episodes(root, lambda c: c[f"videos/{CAM}/to_timestamp"].__setitem__(0, 3.8))
    assert found(root) == [f"{VIDEO}: episode 0: camera '{CAM}' holds 38 frames between 0.0000 and 3.8000 s, but "
                           "the episode has 40"]


def test_columns_that_disagree_with_the_episodes_are_named(root):
    table = pq.read_table(root / DATA)
    at = table.schema.get_field_index("index")
    pq.write_table(table.set_column(at, "index", pc.add(table["index"], 1)), root / DATA)
    assert found(root) == [f"{DATA}: episode 0: column 'index' is 1 at row 0 of the file (dataset row 0), expected 0"]


def test_totals_and_stats_that_disagree_are_named(root):
    edit_info(root, lambda info: info.update(total_frames=150, total_episodes=6))
    stats = json.loads((root / "meta/stats.json").read_text())
    del stats["action"]
    (root / "meta/stats.json").write_text(json.dumps(stats))
    assert found(root) == ["meta/info.json: key 'total_episodes' is 6, but meta/episodes holds 5 episodes",
                           "meta/info.json: key 'total_frames' is 150, but the episodes end at frame 153",
                           "meta/stats.json: key 'action' missing (no statistics of that feature)"]


def test_an_info_json_whose_fps_or_camera_size_the_files_contradict_is_named(root):
    def lie(info):
        info["fps"] = 20
        info["features"][CAM]["shape"] = [96, 128, 3]

    edit_info(root, lie)
    assert found(root) == [f"{DATA}: episode 0: column 'timestamp' steps by 0.1 s at frame 1, not 1/fps = 0.05 s "
                           "(info.json's fps 20)",
                           f"{VIDEO}: camera '{CAM}': frames of 48x64 (height x width), but meta/info.json gives "
                           "96x128"]


def test_a_missing_timestamp_is_named(root):
    table = pq.read_table(root / DATA)
    at = table.schema.get_field_index("timestamp")
    times = table["timestamp"].to_numpy().copy()
    times[45] = np.nan  # (episode 1, frame 5)
    pq.write_table(table.set_column(at, table.schema.field(at), pa.array(times)), root / DATA)
    assert found(root) == [f"{DATA}: episode 1: column 'timestamp' steps by nan s at frame 5, not 1/fps = 0.1 s "
                           "(info.json's fps 10)"]


@pytest.mark.parametrize("key", ["fps", "features", "data_path", "codebase_version"])
def test_a_missing_info_key_refuses_the_root_in_one_line(root, key):
    edit_info(root, lambda info: info.pop(key))
    with pytest.raises(FormatError, match=rf"^meta/info.json: key '{key}' missing$"):
        LeRobotMeta.read(Location.of(root))


def test_other_metadata_problems_are_one_line_naming_the_file(root):
    edit_info(root, lambda info: info.update(codebase_version="v2.1"))
    with pytest.raises(FormatError, match=r"^meta/info.json: codebase_version 'v2.1'; zarrfeed reads LeRobot's "):
        LeRobotMeta.read(Location.of(root))
    edit_info(root, lambda info: info.update(codebase_version="v3.0"))
    os.unlink(root / "meta/tasks.parquet")
    with pytest.raises(FormatError, match=r"^meta/tasks.parquet: missing$"):
        LeRobotMeta.read(Location.of(root))
    edit_episodes(root, lambda c: c["episode_index"].__setitem__(3, 1))
    with pytest.raises(FormatError, match=r"^meta/episodes: episode 3 missing \(episode_index must be 0..4\)$"):
        LeRobotMeta.read(Location.of(root))
    ep = root / "meta/episodes/chunk-000/file-000.parquet"
    ep.write_bytes(ep.read_bytes()[:100])
    with pytest.raises(FormatError, match=r"^meta/episodes/chunk-000/file-000.parquet: not a readable Parquet file"):
        LeRobotMeta.read(Location.of(root))


def test_the_frames_read_of_a_root_whose_episodes_skip_rows_say_so(root):
    def skip(c):
        c["dataset_to_index"][0] = 39
        c["length"][0] = 39
    edit_episodes(root, skip)
    with pytest.raises(ChunkError, match=r"row 39 is in no episode"):
        read_rows(tables(root)[CAM], 38, 41)
    assert np.array_equal(read_rows(tables(root)["index"], 38, 41)["index"], [38, 39, 40])
