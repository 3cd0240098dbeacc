"""What a LeRobot v3 root promises, checked (`validate`): the episodes' row ranges tile the frames in order and
agree with their lengths and info.json's totals; every data and video file the episodes name exists; the data
files' `index`, `episode_index` and `frame_index` columns are those the episodes' ranges give; each episode's
video segment lies within its file and holds as many frames as the episode (its packets counted with PyAV,
nothing decoded), and the video's frames are the size info.json gives the camera; within each episode the
`timestamp` column steps by 1/fps (the rule of LeRobot's former `check_timestamps_sync`: `delta_timestamps` become
frame offsets at info.json's fps); stats.json has every feature. Each violation is (where: the file, what: one
line naming the episode and the key).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .lerobot_meta import EPISODES_DIR, INFO, STATS, LeRobotMeta
from .video_table import TOLERANCE

Found = list[tuple[str, str]]


def validate(meta: LeRobotMeta) -> Found:
    """Every violation of the root `meta` describes, as (file, what)."""
    fs, root = meta.location.filesystem()
    found: Found = []
    found += _ranges(meta)
    missing = set()
    for name in [*meta.data_files, *(f for files in meta.video_files.values() for f in files)]:
        if not fs.exists(f"{root}/{name}"):
            missing.add(name)
            found.append((name, "missing (the episodes' metadata names it)"))
    for f, name in enumerate(meta.data_files):
        if name not in missing:
            found += _data_file(meta, fs, root, f, name)
    for cam, files in meta.video_files.items():
        for v, name in enumerate(files):
            if name not in missing:
                found += _video_file(meta, fs, root, cam, v, name)
    found += _stats(meta)
    return found


def _ranges(meta: LeRobotMeta) -> Found:
    ep, found = meta.episodes, []
    total_episodes, total_frames = int(meta.info["total_episodes"]), meta.total_frames
    if len(ep) != total_episodes:
        found.append((INFO, f"key 'total_episodes' is {total_episodes}, but {EPISODES_DIR} holds {len(ep)} episodes"))
    at = 0
    for e in range(len(ep)):
        a, b, n = int(ep.start[e]), int(ep.end[e]), int(ep.length[e])
        if a != at:
            found.append((EPISODES_DIR, f"episode {e}: key 'dataset_from_index' is {a}, expected {at} (the episodes "
                                        "do not tile the frames in order)"))
        if b - a != n:
            found.append((EPISODES_DIR, f"episode {e}: key 'length' is {n}, but dataset_from_index..dataset_to_index "
                                        f"is {a}..{b}"))
        at = b
    if at != total_frames:
        found.append((INFO, f"key 'total_frames' is {total_frames}, but the episodes end at frame {at}"))
    return found


def _data_file(meta: LeRobotMeta, fs: Any, root: str, f: int, name: str) -> Found:
    """The columns `index`, `episode_index` and `frame_index` of data file `f` against the episodes in it."""
    import pyarrow.parquet as pq

    columns = ["index", "episode_index", "frame_index", "timestamp"]
    try:
        with fs.open(f"{root}/{name}", "rb") as fh:
            pf = pq.ParquetFile(fh)
            for c in [*columns, *meta.features]:
                if c not in pf.schema_arrow.names:
                    return [(name, f"column '{c}' missing")]
            table = pf.read(columns=columns)
    except Exception as exc:
        return [(name, f"not a readable Parquet file ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''})")]
    ep = meta.episodes
    start, stop = int(meta.data_start[f]), int(meta.data_stop[f])
    if table.num_rows != stop - start:
        return [(name, f"holds {table.num_rows} rows, but its episodes hold {stop - start} (rows {start}..{stop})")]
    mine = np.flatnonzero(ep.data_file == f)
    episode = np.full(stop - start, -1, np.int64)
    frame = np.zeros(stop - start, np.int64)
    for e in mine.tolist():
        a, b = int(ep.start[e]) - start, int(ep.end[e]) - start
        episode[a:b], frame[a:b] = e, np.arange(b - a)
    found = _time_steps(meta, name, table, start, mine)
    for column, want in (("index", np.arange(start, stop)), ("episode_index", episode), ("frame_index", frame)):
        got = np.asarray(table[column].to_numpy(zero_copy_only=False))
        bad = np.flatnonzero(got != want)
        if len(bad):
            row = int(bad[0])
            e = int(episode[row])
            which = f"episode {e}" if e >= 0 else "a row of no episode"
            found.append((name, f"{which}: column '{column}' is {got[row]} at row {row} of the file (dataset row "
                                f"{start + row}), expected {want[row]}"))
    return found


def _time_steps(meta: LeRobotMeta, name: str, table: Any, start: int, episodes: np.ndarray) -> Found:
    """The first episode of data file `name` whose `timestamp` does not step by 1/fps (within LeRobot's 1e-4 s)."""
    times = np.asarray(table["timestamp"].to_numpy(zero_copy_only=False), np.float64)
    for e in episodes.tolist():
        a, b = int(meta.episodes.start[e]) - start, int(meta.episodes.end[e]) - start
        steps = np.diff(times[a:b])
        slack = TOLERANCE + 2 * np.spacing(np.abs(times[a + 1:b]).astype(np.float32))  # (float32 columns' rounding)
        bad = np.flatnonzero(~(np.abs(steps - 1 / meta.fps) <= slack))  # (NaN too)
        if len(bad):
            return [(name, f"episode {e}: column 'timestamp' steps by {steps[bad[0]]:.6g} s at frame "
                           f"{int(bad[0]) + 1}, not 1/fps = {1 / meta.fps:.6g} s (info.json's fps {meta.fps:g})")]
    return []


def _video_file(meta: LeRobotMeta, fs: Any, root: str, cam: str, v: int, name: str) -> Found:
    """Each episode's segment of video file `v` of camera `cam`: within the file, and holding the episode's
    frame count (packets counted between from_timestamp and to_timestamp)."""
    import av

    try:
        with fs.open(f"{root}/{name}", "rb") as fh, av.open(fh) as container:
            stream = container.streams.video[0]
            base = float(stream.time_base)
            pts = [p.pts for p in container.demux(stream) if p.pts is not None]
            step = float(1 / stream.average_rate) if stream.average_rate else 1 / meta.fps
            size = (stream.codec_context.height, stream.codec_context.width)
    except Exception as exc:
        return [(name, f"camera '{cam}': not a readable video ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''})")]
    times = np.sort(np.asarray(pts, np.float64) * base)
    end = float(times[-1]) + step if len(times) else 0.0
    ep, found = meta.episodes, []
    want = meta.cameras[cam].shape[:2]
    if size != want:
        found.append((name, f"camera '{cam}': frames of {size[0]}x{size[1]} (height x width), but {INFO} gives "
                            f"{want[0]}x{want[1]}"))
    for e in np.flatnonzero(ep.video_file[cam] == v).tolist():
        lo, hi = float(ep.from_timestamp[cam][e]), float(ep.to_timestamp[cam][e])
        if lo < -TOLERANCE or hi > end + TOLERANCE or hi < lo:
            found.append((name, f"episode {e}: key 'videos/{cam}/from_timestamp'..'to_timestamp' is {lo:.4f}.."
                                f"{hi:.4f} s, outside the video's 0..{end:.4f} s"))
            continue
        count = int(np.searchsorted(times, hi - TOLERANCE) - np.searchsorted(times, lo - TOLERANCE))
        if count != int(ep.length[e]):
            found.append((name, f"episode {e}: camera '{cam}' holds {count} frames between {lo:.4f} and {hi:.4f} s, "
                                f"but the episode has {int(ep.length[e])}"))
    return found


def _stats(meta: LeRobotMeta) -> Found:
    if meta.stats is None:
        return [(STATS, "missing")]
    return [(STATS, f"key '{name}' missing (no statistics of that feature)")
            for name in [*meta.features, *meta.cameras] if name not in meta.stats]
