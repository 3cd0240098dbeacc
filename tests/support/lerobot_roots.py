"""Copies of the golden LeRobot v3 root (`repo_paths.LEROBOT_ROOT`) for tests: as it is, damaged, or with its
frames spread over several data and video files, rewritten with pyarrow as LeRobot lays them out."""
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from repo_paths import LEROBOT_ROOT, LEROBOT_SAMPLES

DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
CAM = "observation.images.cam"
VIDEO = f"videos/{CAM}/chunk-000/file-000.mp4"


def copy_root(to: Path) -> Path:
    """A copy of the golden root at `to`."""
    shutil.copytree(LEROBOT_ROOT, to)
    return to


def current_frames() -> dict[str, np.ndarray]:
    """What LeRobot returned for every frame at the window position of delta 0 (samples.npz): per key the
    current frame's value; the camera as uint8 (H, W, 3)."""
    s = np.load(LEROBOT_SAMPLES)
    out = {k: s[k] for k in ("timestamp", "frame_index", "episode_index", "index", "task_index")}
    out["observation.state"], out["action"] = s["observation.state"][:, 2], s["action"][:, 0]
    out[CAM] = s[CAM][:, 1].transpose(0, 2, 3, 1)
    return out


def edit_episodes(root: Path, change) -> None:
    """Rewrite meta/episodes' file with `change(columns: dict of lists)` applied (same schema and metadata)."""
    path = root / EPISODES
    table = pq.read_table(path)
    columns = table.to_pydict()
    change(columns)
    pq.write_table(pa.Table.from_pydict(columns, schema=table.schema), path)


def edit_info(root: Path, change) -> None:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info, indent=4))


def split_root(to: Path) -> Path:
    """A copy whose data is split over two data files (episodes 0-1 in file-000, 2-4 in file-001) and whose video
    episodes 3-4 point at a second video file (a copy of the first, same timestamps)."""
    root = copy_root(to)
    table = pq.read_table(root / DATA)
    cut = 72  # episodes 0 and 1: rows 0..72
    pq.write_table(table.slice(0, cut), root / DATA, row_group_size=16)
    pq.write_table(table.slice(cut), root / "data/chunk-000/file-001.parquet", row_group_size=16)
    shutil.copy(root / VIDEO, root / f"videos/{CAM}/chunk-000/file-001.mp4")

    def change(c):
        c["data/file_index"] = [0, 0, 1, 1, 1]
        c[f"videos/{CAM}/file_index"] = [0, 0, 0, 1, 1]
    edit_episodes(root, change)
    return root
