"""Importing a LeRobot v3.0 dataset into a Diffusion Policy replay buffer, read with pyarrow and PyAV directly.

Every feature but LeRobot's own frame columns becomes a data key, named as the feature with each "." made "_"
(a dataset's table names are folder names, without dots; `names=` chooses others): a camera as uint8
(T, H, W, 3) frames decoded from its MP4, each found by its timestamp (`from_timestamp` + `timestamp`, within
LeRobot's 1e-4 s); a vector column as (T, D); a plain column as (T,). Episodes are read one at a time (the row
groups of the data file that hold them; the video from the key frame before the episode) and written through
the writer's replay-buffer layout (`replay_buffer_schema`): the import is crash-safe as every zarrfeed write,
and `resume=True` finishes it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.errors import FormatError
from ..core.keys import Position
from ..core.location import Location
from ..core.replay_buffer import replay_buffer_schema
from . import lerobot_format as fmt
from . import lerobot_video
from .committer import holds_data
from .dataset_writer import DatasetWriter


class LeRobotEpisodes:
    """The episodes of the LeRobot v3.0 dataset at the directory `root`, key -> steps, in episode order."""

    def __init__(self, root: str | os.PathLike, keys: list[str] | None = None) -> None:
        if "://" in os.fspath(root):
            raise ValueError(f"{os.fspath(root)}: a LeRobot dataset is imported from a local directory (copy it here "
                             "first; Dataset.open reads one at a URL in place)")
        if keys is not None and not keys:
            raise ValueError("keys: none given; name at least one feature to import (default: every feature)")
        self.root = Path(root)
        try:
            self.info = json.loads((self.root / fmt.INFO).read_text())
        except (OSError, ValueError) as exc:
            raise FormatError(f"{self.root / fmt.INFO}: not a LeRobot dataset's info.json ({exc})") from None
        if not str(self.info.get("codebase_version", "")).startswith("v3."):
            raise FormatError(f"{self.root / fmt.INFO}: codebase_version {self.info.get('codebase_version')!r}, "
                              "not v3.x (LeRobot's format v3.0)")
        features = {k: v for k, v in self.info["features"].items() if k not in fmt.FRAME_COLUMNS}
        if keys is not None:
            unknown = sorted(set(keys) - set(features))
            if unknown:
                raise ValueError(f"key {unknown[0]!r}: not a feature of {self.root} ({', '.join(features)})")
            features = {k: v for k, v in features.items() if k in keys}
        for key, spec in features.items():
            if spec["dtype"] in ("image", "string"):
                raise FormatError(f"{self.root / fmt.INFO}: feature {key!r} is of dtype {spec['dtype']!r}; "
                                  "imported are video and numeric features (leave it out: keys=, --keys)")
        self.features = features
        self.cameras = [k for k, v in features.items() if v["dtype"] == "video"]
        files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise FormatError(f"{self.root}/meta/episodes: no episodes' Parquet file")
        self.episodes = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("episode_index").to_pylist()
        self._files: dict[str, pq.ParquetFile] = {}
        self.names = {k: k for k in features}  # feature -> data key

    def keys(self) -> dict[str, tuple[Any, tuple[int, ...]]]:
        """Each feature's dtype and step shape."""
        out = {}
        for key, spec in self.features.items():
            if key in self.cameras:
                out[key] = (np.uint8, tuple(int(n) for n in spec["shape"]))
            else:
                data_type = self._data_file(self.episodes[0]).schema_arrow.field(key).type
                scalar = not pa.types.is_fixed_size_list(data_type) and not pa.types.is_list(data_type)
                out[key] = (np.dtype(spec["dtype"]), () if scalar else (int(np.prod(spec["shape"])),))
        return out

    def identity(self) -> str:
        h = hashlib.blake2b(digest_size=8)
        h.update(json.dumps([self.info["features"], [(e["dataset_from_index"], e["dataset_to_index"])
                                                        for e in self.episodes]]).encode())
        return h.hexdigest()

    def __len__(self) -> int:
        return len(self.episodes)

    def episode(self, i: int) -> dict[str, np.ndarray]:
        """Episode i's steps."""
        ep = self.episodes[i]
        table = self._rows(ep)
        out: dict[str, np.ndarray] = {}
        for key in self.features:
            if key in self.cameras:
                continue
            column = table.column(key).combine_chunks()
            if pa.types.is_fixed_size_list(column.type) or pa.types.is_list(column.type):
                out[key] = np.asarray(column.flatten().to_numpy()).reshape(len(table), -1)
            else:
                out[key] = column.to_numpy(zero_copy_only=False)
        timestamps = table.column("timestamp").to_numpy()
        for key in self.cameras:
            out[key] = self._frames(ep, key, timestamps)
        return out

    def _data_file(self, ep: dict[str, Any]) -> pq.ParquetFile:
        path = self.info["data_path"].format(chunk_index=ep["data/chunk_index"], file_index=ep["data/file_index"])
        if path not in self._files:
            try:
                self._files[path] = pq.ParquetFile(self.root / path)
            except OSError as exc:
                raise FormatError(f"{self.root / path}: episode {ep['episode_index']}'s data file: {exc}") from None
        return self._files[path]

    def _rows(self, ep: dict[str, Any]) -> pa.Table:
        """The episode's rows of its data file, read from the row groups that hold them."""
        f = self._data_file(ep)
        lo, hi = ep["dataset_from_index"], ep["dataset_to_index"]
        columns = [k for k in self.features if k not in self.cameras] + ["timestamp", "index"]
        groups = []
        for g in range(f.metadata.num_row_groups):
            stats = f.metadata.row_group(g).column(f.schema_arrow.get_field_index("index")).statistics
            if stats is None or not stats.has_min_max or (stats.min < hi and stats.max >= lo):
                groups.append(g)
        table = f.read_row_groups(groups, columns=columns) if groups else f.read(columns=columns)
        index = table.column("index").to_numpy()
        keep = np.flatnonzero((index >= lo) & (index < hi))
        if len(keep) != hi - lo:
            raise FormatError(f"{self.root}: episode {ep['episode_index']}'s data file holds {len(keep)} of its "
                              f"{hi - lo} frames (index {lo} to {hi - 1})")
        return table.take(pa.array(keep))

    def _frames(self, ep: dict[str, Any], key: str, timestamps: np.ndarray) -> np.ndarray:
        path = self.root / self.info["video_path"].format(video_key=key, chunk_index=ep[f"videos/{key}/chunk_index"],
                                                          file_index=ep[f"videos/{key}/file_index"])
        start = float(ep[f"videos/{key}/from_timestamp"])
        if not path.exists():
            raise FormatError(f"{path}: missing (camera {key}, episode {ep['episode_index']})")
        wanted = start + timestamps.astype(np.float64)
        try:
            decoded = lerobot_video.decode(path, float(wanted.min()), float(wanted.max()) + 1e-3)
        except lerobot_video.av().FFmpegError as exc:  # a damaged or truncated file
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FormatError(f"{path}: cannot be decoded (camera {key}, episode {ep['episode_index']}: {said})") \
                from None
        times = np.array([t for t, _ in decoded])
        frames = np.empty((len(wanted), *self.features[key]["shape"]), np.uint8)
        for n, t in enumerate(wanted):
            j = int(np.argmin(np.abs(times - t))) if len(times) else -1
            if j < 0 or abs(times[j] - t) >= 1e-4:
                raise FormatError(f"{path}: no frame at {t:.4f} s (camera {key}, episode {ep['episode_index']}, "
                                  f"frame {n})")
            frames[n] = decoded[j][1]
        return frames


def lerobot_to_replay_buffer(root: str | os.PathLike, out: str | os.PathLike, *, keys: list[str] | None = None,
                             names: dict[str, str] | None = None, resume: bool = False, progress: bool = False,
                             durable: bool = True) -> dict[str, Any]:
    """Write the LeRobot v3.0 dataset at the directory `root` as a Diffusion Policy replay buffer at `out`
    (cameras uint8 (T, H, W, 3), vectors (T, D), plain columns (T,)); return the writer's summary.

    `keys`: the features to import (default: all but LeRobot's own columns); `names`: feature -> data key
    (default: the feature's name, each "." made "_"). `resume=True` finishes an interrupted import of the same
    dataset into `out`; a non-empty `out` is refused otherwise."""
    episodes = LeRobotEpisodes(root, keys)
    renamed = {k: (names or {}).get(k, k.replace(".", "_")) for k in episodes.features}
    if len(set(renamed.values())) != len(renamed):
        raise ValueError(f"{root}: two features get one data key ({renamed}); give names=")
    episodes.names = renamed
    identity = episodes.identity()
    if not resume and holds_data(Location.of(out)):
        said = f"{out}: already exists and is not empty; import to another path, or finish an interrupted import "
        raise FormatError(said + "into it (resume=True)", cli=said + "into it (--resume)")
    schema = replay_buffer_schema({renamed[k]: v for k, v in episodes.keys().items()})
    with DatasetWriter(out, schema, workers=0, mode="a" if resume else "w", progress=progress,
                       durable=durable) as w:
        w.begin_input(identity, resume, "the LeRobot dataset's identity is", "episodes")
        todo = [i for i in range(len(episodes)) if not w.is_committed(Position(identity, i))]
        return w.ingest(_Remaining(episodes, todo), keys=[Position(identity, i) for i in todo])


class _Remaining:
    """The episodes at positions `todo`, read one at a time as the writer takes them."""

    def __init__(self, episodes: LeRobotEpisodes, todo: list[int]) -> None:
        self.episodes, self.todo = episodes, todo

    def __len__(self) -> int:
        return len(self.todo)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        names = self.episodes.names
        return ({names[k]: v for k, v in self.episodes.episode(i).items()} for i in self.todo)
