"""A LeRobot v3 dataset's metadata, read where it lies: `meta/info.json` (features, fps, path templates),
`meta/episodes/chunk-XXX/file-XXX.parquet` (per episode: its rows, its data file, per camera its video file and
time range), `meta/tasks.parquet` and `meta/stats.json` (LeRobot's format v3.0, huggingface/lerobot >= 0.4).

Everything is read through the location's fsspec filesystem (a directory, `s3://...`). Every problem that
keeps the dataset from being read is a `FormatError` of one line naming the file and the key or episode.
Features whose values zarrfeed does not read (dtype "image": PNG bytes stored in Parquet; "string"; a video
that is not 3-channel, such as a depth map) are left out, with a warning naming each (`LeRobotMeta.left_out`);
a dtype LeRobot does not define is refused.
"""
from __future__ import annotations

import json
import posixpath
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import FormatError
from .file_tags import Tag, file_tag
from .location import Location

INFO = "meta/info.json"
EPISODES_DIR = "meta/episodes"
TASKS = "meta/tasks.parquet"
STATS = "meta/stats.json"
# the path templates info.json names (`data_path`, `video_path`) as LeRobot writes them, and its episodes' files
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = EPISODES_DIR + "/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CODEBASE_VERSION = "v3.0"  # the version written; any "v3.*" is read
REQUIRED = ("codebase_version", "fps", "features", "total_episodes", "total_frames", "data_path")
# LeRobot's own columns of every frame, with their dtypes (features of every dataset, never a source's own keys)
FRAME_FEATURES = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
                  "task_index": "int64"}
FRAME_COLUMNS = tuple(FRAME_FEATURES)
NUMERIC = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64")
NOT_READ = {"image": "images stored in Parquet (PNG bytes), not read", "string": "strings, not read",
            "audio": "audio, not read"}
VIDEO = "video"


def video_columns(camera: str) -> tuple[str, str, str, str]:
    """The columns of meta/episodes that place an episode in camera `camera`'s video: its file's chunk_index and
    file_index, and the time range [from, to) of its frames there."""
    where = f"videos/{camera}"
    return f"{where}/chunk_index", f"{where}/file_index", f"{where}/from_timestamp", f"{where}/to_timestamp"


def is_lerobot(location: Location) -> bool:
    """Whether `location` holds `meta/info.json` naming a `codebase_version` (a LeRobot dataset; one that is
    not v3 is refused when read, saying so)."""
    try:
        fs, root = location.filesystem()
        with fs.open(f"{root}/{INFO}", "rb") as f:
            doc = json.loads(f.read())
    except Exception:
        return False
    return isinstance(doc, dict) and "codebase_version" in doc


@dataclass(frozen=True)
class Feature:
    """One feature: its values' numpy dtype and shape per frame (LeRobot's [1] is a scalar, shape ()); a camera
    (`video`) holds (H, W, 3) uint8 frames."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    video: bool = False


@dataclass
class Episodes:
    """Per episode (in `episode_index` order), as numpy arrays: its index, its frames [start, end) in the
    dataset's rows (`dataset_from_index`, `dataset_to_index`), its length, its data file (an index into
    `LeRobotMeta.data_files`), its tasks; per camera its video file (an index into `video_files[camera]`) and
    the time range [from, to) of its frames in that file."""

    index: np.ndarray
    start: np.ndarray
    end: np.ndarray
    length: np.ndarray
    data_file: np.ndarray
    tasks: list[list[str]]
    video_file: dict[str, np.ndarray] = field(default_factory=dict)
    from_timestamp: dict[str, np.ndarray] = field(default_factory=dict)
    to_timestamp: dict[str, np.ndarray] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # the episodes' metadata files, in order

    def __len__(self) -> int:
        return len(self.index)


@dataclass
class LeRobotMeta:
    """What a LeRobot v3 root's `meta/` says (see the module's docstring). `data_files` are the data files in
    the order of their episodes (paths below the root), `data_start`/`data_stop` the dataset rows each holds;
    `video_files[camera]` likewise the camera's video files; `file_tags` what each data and video file was when
    the metadata was read (`core.file_tags`: every read of it checks it is still so)."""

    location: Location
    info: dict[str, Any]
    fps: float
    features: dict[str, Feature]  # the columns of the data files that are read, in info.json's order
    cameras: dict[str, Feature]  # the video features
    left_out: dict[str, str]  # features not read: name -> why
    tasks: list[str]  # by task_index
    episodes: Episodes
    stats: dict[str, Any] | None  # None: no meta/stats.json
    data_files: list[str]
    data_start: np.ndarray
    data_stop: np.ndarray
    video_files: dict[str, list[str]]
    file_tags: dict[str, Tag | None] = field(default_factory=dict)  # data and video file -> its tag when read

    @property
    def total_frames(self) -> int:
        return int(self.info["total_frames"])

    @classmethod
    def read(cls, location: Location) -> "LeRobotMeta":
        """Read `location`'s metadata (`FormatError` in one line naming file and key or episode)."""
        fs, root = location.filesystem()
        info = _info(fs, root)
        features, cameras, left_out = _features(info)
        for name, why in left_out.items():
            warnings.warn(f"{location}/{INFO}: feature '{name}' left out ({why})", stacklevel=4)
        episodes, data_chunk, video_chunk = _episodes(fs, root, list(cameras))
        data_files, episodes.data_file = _files(data_chunk, episodes.data_file, info, "data_path")
        starts = np.array([episodes.start[episodes.data_file == i].min() for i in range(len(data_files))], np.int64)
        stops = np.array([episodes.end[episodes.data_file == i].max() for i in range(len(data_files))], np.int64)
        video_files: dict[str, list[str]] = {}
        for cam in cameras:
            video_files[cam], episodes.video_file[cam] = _files(video_chunk[cam], episodes.video_file[cam], info,
                                                                "video_path", video_key=cam)
        tags = {name: file_tag(fs, f"{root}/{name}") for name in [*data_files, *(f for files in video_files.values()
                                                                              for f in files)]}
        return cls(location, info, float(info["fps"]), features, cameras, left_out, _tasks(fs, root), episodes,
                   _json_object(fs, root, STATS), data_files, starts, stops, video_files, tags)

    def describe(self) -> str:
        """One paragraph: episodes, frames, tasks, fps, features and cameras."""
        feats = ", ".join(f"{f.name} {f.dtype}{f.shape if f.shape else ''}" for f in self.features.values())
        cams = ", ".join(f"{c.name} {c.shape[0]}x{c.shape[1]}" for c in self.cameras.values()) or "none"
        left = f"\nleft out: {', '.join(f'{k} ({v})' for k, v in self.left_out.items())}" if self.left_out else ""
        return (f"LeRobot {self.info['codebase_version']}: {len(self.episodes):,} episodes, {self.total_frames:,} "
                f"frames, {len(self.tasks):,} tasks, {self.fps:g} fps\nfeatures: {feats}\ncameras: {cams}{left}")


def _read_bytes(fs: Any, root: str, name: str) -> bytes | None:
    try:
        with fs.open(f"{root}/{name}", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _json_object(fs: Any, root: str, name: str) -> dict[str, Any] | None:
    """The JSON object in file `name` (None: no such file; `FormatError` naming it if it is not one)."""
    raw = _read_bytes(fs, root, name)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise FormatError(f"{name}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise FormatError(f"{name}: a JSON {type(doc).__name__}, not an object")
    return doc


def _info(fs: Any, root: str) -> dict[str, Any]:
    info = _json_object(fs, root, INFO)
    if info is None:
        raise FormatError(f"{INFO}: missing (not a LeRobot dataset)")
    for key in REQUIRED:
        if key not in info:
            raise FormatError(f"{INFO}: key '{key}' missing")
    version = str(info["codebase_version"])
    if not version.startswith("v3"):
        raise FormatError(f"{INFO}: codebase_version {version!r}; zarrfeed reads LeRobot's format v3 (convert with "
                          "LeRobot's own convert_dataset_v21_to_v30)")
    if not isinstance(info["features"], dict):
        raise FormatError(f"{INFO}: key 'features' is not an object")
    fps = info["fps"]
    if not isinstance(fps, (int, float)) or isinstance(fps, bool) or fps <= 0:
        raise FormatError(f"{INFO}: key 'fps' is {fps!r}, not a positive number")
    return info


def _features(info: dict[str, Any]) -> tuple[dict[str, Feature], dict[str, Feature], dict[str, str]]:
    """The tabular features, the cameras, and the features left out (name -> why)."""
    features: dict[str, Feature] = {}
    cameras: dict[str, Feature] = {}
    left_out: dict[str, str] = {}
    for name, spec in info["features"].items():
        where = f"{INFO}: features.{name}"
        if not isinstance(spec, dict) or "dtype" not in spec or "shape" not in spec:
            raise FormatError(f"{where}: not an object with 'dtype' and 'shape'")
        kind, shape = spec["dtype"], spec["shape"]
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 1 for n in shape):
            raise FormatError(f"{where}: shape {shape!r} is not a list of positive integers")
        if kind == VIDEO:
            video = spec.get("info") or {}
            hwc = _hwc(shape, spec.get("names"))
            if video.get("video.is_depth_map") or hwc is None or hwc[2] != 3:
                left_out[name] = "a video that is not 3-channel color frames (a depth map?), not read"
                continue
            cameras[name] = Feature(name, np.dtype(np.uint8), hwc, video=True)
        elif kind in NOT_READ:
            left_out[name] = NOT_READ[kind]
        elif kind in NUMERIC:
            features[name] = Feature(name, np.dtype(kind), () if shape == [1] else tuple(shape))
        else:
            raise FormatError(f"{where}: dtype {kind!r} is not one LeRobot defines")
    if "video_path" not in info and cameras:
        raise FormatError(f"{INFO}: key 'video_path' missing (features {', '.join(cameras)} are videos)")
    return features, cameras, left_out


def _hwc(shape: list[int], names: Any) -> tuple[int, int, int] | None:
    """A video feature's frame shape as (H, W, C), from its shape and its dimension names (LeRobot writes
    ["height", "width", "channels"]; channels first where the names say so)."""
    if len(shape) != 3:
        return None
    if isinstance(names, list) and len(names) == 3 and names[0] in ("channels", "channel"):
        return shape[1], shape[2], shape[0]
    return shape[0], shape[1], shape[2]


def _path(info: dict[str, Any], template: str, where: str, **keys: Any) -> str:
    try:
        return str(info[template]).format(**keys)
    except (KeyError, IndexError, ValueError) as exc:
        raise FormatError(f"{where}: key '{template}' {info.get(template)!r} cannot be filled ({exc})") from None


def _files(chunk: np.ndarray, file: np.ndarray, info: dict[str, Any], template: str,
           **keys: Any) -> tuple[list[str], np.ndarray]:
    """The distinct files the episodes' (chunk_index, file_index) name, in the order of the episodes, and each
    episode's file as an index into them."""
    pairs = list(zip(chunk.tolist(), file.tolist(), strict=True))
    distinct = list(dict.fromkeys(pairs))
    at = {k: i for i, k in enumerate(distinct)}
    paths = [_path(info, template, INFO, chunk_index=c, file_index=f, **keys) for c, f in distinct]
    return paths, np.array([at[k] for k in pairs], np.int64)


def _parquet(fs: Any, root: str, name: str, columns: list[str] | None = None,
             required: tuple[str, ...] = ()) -> Any:
    """The Arrow table of Parquet file `name` (only `columns`); `FormatError` naming the file and a missing
    column (of `columns` and `required`)."""
    import pyarrow.parquet as pq

    try:
        with fs.open(f"{root}/{name}", "rb") as f:
            pf = pq.ParquetFile(f)
            have = pf.schema_arrow.names
            for c in [*(columns or ()), *required]:
                if c not in have:
                    raise FormatError(f"{name}: column '{c}' missing")
            return pf.read(columns=columns)
    except FileNotFoundError:
        raise FormatError(f"{name}: missing") from None
    except FormatError:
        raise
    except Exception as exc:  # pyarrow's ArrowInvalid and friends: a truncated or corrupt file
        raise FormatError(f"{name}: not a readable Parquet file ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def _episodes(fs: Any, root: str, cameras: list[str]) -> tuple[Episodes, np.ndarray, dict[str, np.ndarray]]:
    """Every episode's row in meta/episodes/*/*.parquet, in episode order; the chunk_index of each episode's data
    file, and per camera of its video file."""
    files = sorted(posixpath.relpath(p, root) for p in fs.find(f"{root}/{EPISODES_DIR}") if p.endswith(".parquet"))
    if not files:
        raise FormatError(f"{EPISODES_DIR}: no episode metadata files (chunk-XXX/file-XXX.parquet)")
    columns = ["episode_index", "tasks", "length", "data/chunk_index", "data/file_index", "dataset_from_index",
               "dataset_to_index"]
    for cam in cameras:
        columns += video_columns(cam)
    tables = [_parquet(fs, root, name, columns) for name in files]
    import pyarrow as pa

    table = pa.concat_tables([t.select(columns) for t in tables])
    for name, t in zip(files, tables, strict=True):
        for c in columns:
            if c != "tasks" and t[c].null_count:
                raise FormatError(f"{name}: column '{c}' has missing values")

    def col(name: str, dtype: Any) -> np.ndarray:
        return np.asarray(table[name].to_numpy(), dtype)

    index = col("episode_index", np.int64)
    order = np.argsort(index, kind="stable")
    if not np.array_equal(index[order], np.arange(len(index))):
        missing = sorted(set(range(len(index))) - set(index.tolist()))
        what = f"episode {missing[0]} missing" if missing else "an episode_index named twice"
        raise FormatError(f"{EPISODES_DIR}: {what} (episode_index must be 0..{len(index) - 1})")

    def ordered(name: str, dtype: Any) -> np.ndarray:
        return col(name, dtype)[order]

    out = Episodes(index[order], ordered("dataset_from_index", np.int64), ordered("dataset_to_index", np.int64),
                   ordered("length", np.int64), ordered("data/file_index", np.int64),
                   [table["tasks"][int(i)].as_py() or [] for i in order], files=files)
    video_chunk = {}
    for cam in cameras:
        chunk, file, start, stop = video_columns(cam)
        video_chunk[cam], out.video_file[cam] = ordered(chunk, np.int64), ordered(file, np.int64)
        out.from_timestamp[cam], out.to_timestamp[cam] = ordered(start, np.float64), ordered(stop, np.float64)
    return out, ordered("data/chunk_index", np.int64), video_chunk


def _tasks(fs: Any, root: str) -> list[str]:
    """The task of each task_index (LeRobot writes the task as the pandas index of meta/tasks.parquet)."""
    table = _parquet(fs, root, TASKS, required=("task_index",))
    names = [n for n in table.column_names if n in ("task", "__index_level_0__")]
    if not names:
        raise FormatError(f"{TASKS}: no column of task names ('task', or the pandas index)")
    index = table["task_index"].to_pylist()
    if sorted(index) != list(range(len(index))):
        raise FormatError(f"{TASKS}: task_index is not 0..{len(index) - 1}")
    tasks = [""] * len(index)
    for i, task in zip(index, table[names[0]].to_pylist(), strict=True):
        tasks[i] = str(task)
    return tasks
