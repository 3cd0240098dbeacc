"""Importing a LeRobot v3.0 dataset into a Diffusion Policy replay buffer, read in place by zarrfeed's LeRobot
reader (`core.lerobot_tables`: the tables `Dataset.open` gives such a root, shaped as a replay buffer's).

Every feature but LeRobot's own frame columns becomes a data key, named as the feature with each "." made "_"
(a replay buffer's keys are folder names, without dots; `names=` chooses others): a camera as uint8
(T, H, W, 3) frames (decoded by `core.video_table`, each found by its timestamp within LeRobot's 1e-4 s); a vector
column as (T, D); a plain column as (T,). Episodes are read one at a time (the rows of each feature over the
episode's range) and written through the writer's replay-buffer layout (`replay_buffer_schema`): the import is
crash-safe as every zarrfeed write, and `resume=True` finishes it.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any, Callable, Iterator

import numpy as np

from ..core.chunks import read_rows
from ..core.errors import FormatError
from ..core.keys import Position
from ..core.lerobot_meta import FRAME_COLUMNS, INFO, LeRobotMeta
from ..core.lerobot_tables import open_lerobot
from ..core.location import Location
from ..core.replay_buffer import replay_buffer_schema
from .committer import holds_data
from .dataset_writer import DatasetWriter

Read = Callable[[str, int, int], np.ndarray]  # (feature, first row, end row) -> records of one field


class LeRobotEpisodes:
    """The episodes of a LeRobot v3.0 dataset, key -> steps, in episode order: `source` is a location (a
    directory, an fsspec URL or a `Location`) or a LeRobot dataset opened by `Dataset.open` (its `lerobot` and
    `read_rows`). Only `keys` (default: every feature but LeRobot's own columns) are read."""

    def __init__(self, source: Any, keys: list[str] | None = None) -> None:
        if keys is not None and not keys:
            raise ValueError("keys: none given; name at least one feature to import (default: every feature)")
        self.meta, self.read = _reader(source)
        where = f"{str(self.meta.location).rstrip('/')}/{INFO}"
        features = [k for k in self.meta.info["features"] if k not in FRAME_COLUMNS]
        if keys is not None:
            unknown = sorted(set(keys) - set(features))
            if unknown:
                raise ValueError(f"key {unknown[0]!r}: not a feature of {self.meta.location} ({', '.join(features)})")
            features = [k for k in features if k in keys]
        for key in features:
            if key in self.meta.left_out:
                raise FormatError(f"{where}: feature {key!r} is of dtype {self.meta.info['features'][key]['dtype']!r} "
                                  f"({self.meta.left_out[key]}); imported are video and numeric features (leave "
                                  "it out: keys=, --keys)")
        self.features = features

    def keys(self) -> dict[str, tuple[Any, tuple[int, ...]]]:
        """Each feature's dtype and step shape (a vector's values flattened: (D,))."""
        out: dict[str, tuple[Any, tuple[int, ...]]] = {}
        for key in self.features:
            if key in self.meta.cameras:
                out[key] = (np.uint8, self.meta.cameras[key].shape)
            else:
                f = self.meta.features[key]
                out[key] = (f.dtype, (int(np.prod(f.shape)),) if f.shape else ())
        return out

    def identity(self) -> str:
        """A digest of the features and the episodes' rows: what an interrupted import resumes only from."""
        h = hashlib.blake2b(digest_size=8)
        ep = self.meta.episodes
        h.update(json.dumps([self.meta.info["features"], list(zip(ep.start.tolist(), ep.end.tolist(),
                                                                      strict=True))]).encode())
        return h.hexdigest()

    def __len__(self) -> int:
        return len(self.meta.episodes)

    def episode(self, i: int) -> dict[str, np.ndarray]:
        """Episode i's steps."""
        a, b = int(self.meta.episodes.start[i]), int(self.meta.episodes.end[i])
        out = {}
        for key in self.features:
            values = self.read(key, a, b)[key]
            out[key] = values if key in self.meta.cameras or values.ndim <= 2 else values.reshape(b - a, -1)
        return out


def _reader(source: Any) -> tuple[LeRobotMeta, Read]:
    """The metadata of `source` and how to read its features' rows (see `LeRobotEpisodes`)."""
    if hasattr(source, "read_rows") and hasattr(source, "schema"):
        meta = getattr(source, "lerobot", None)
        if meta is None:
            raise FormatError(f"{source.location}: not a LeRobot v3 dataset (no {INFO})")
        return meta, source.read_rows
    with warnings.catch_warnings():  # (features not read are refused when asked for, see LeRobotEpisodes)
        warnings.simplefilter("ignore")
        meta, _, tables = open_lerobot(source if isinstance(source, Location) else Location.of(source))
    return meta, lambda key, a, b: read_rows(tables[key], a, b)


def lerobot_to_replay_buffer(source: Any, out: str | os.PathLike, *, keys: list[str] | None = None,
                             names: dict[str, str] | None = None, resume: bool = False, progress: bool = False,
                             durable: bool = True) -> dict[str, Any]:
    """Write the LeRobot v3.0 dataset `source` (a directory, an fsspec URL, a `Location`, or the dataset
    `Dataset.open` made of one) as a Diffusion Policy replay buffer at `out` (cameras uint8 (T, H, W, 3), vectors
    (T, D), plain columns (T,)); return the writer's summary.

    `keys`: the features to import (default: all but LeRobot's own columns); `names`: feature -> data key
    (default: the feature's name, each "." made "_"). `resume=True` finishes an interrupted import of the same
    dataset into `out`; a non-empty `out` is refused otherwise."""
    episodes = LeRobotEpisodes(source, keys)
    renamed = {k: (names or {}).get(k, k.replace(".", "_")) for k in episodes.features}
    if len(set(renamed.values())) != len(renamed):
        raise ValueError(f"{episodes.meta.location}: two features get one data key ({renamed}); give names=")
    identity = episodes.identity()
    if not resume and holds_data(Location.of(out)):
        said = f"{out}: already exists and is not empty; import to another path, or finish an interrupted import "
        raise FormatError(said + "into it (resume=True)", cli=said + "into it (--resume)")
    schema = replay_buffer_schema({renamed[k]: v for k, v in episodes.keys().items()})
    with DatasetWriter(out, schema, workers=0, mode="a" if resume else "w", progress=progress,
                       durable=durable) as w:
        w.begin_input(identity, resume, "the LeRobot dataset's identity is", "episodes")
        todo = [i for i in range(len(episodes)) if not w.is_committed(Position(identity, i))]
        return w.ingest(_Remaining(episodes, renamed, todo), keys=[Position(identity, i) for i in todo])


class _Remaining:
    """The episodes at positions `todo`, read one at a time as the writer takes them, keyed by `names`."""

    def __init__(self, episodes: LeRobotEpisodes, names: dict[str, str], todo: list[int]) -> None:
        self.episodes, self.names, self.todo = episodes, names, todo

    def __len__(self) -> int:
        return len(self.todo)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return ({self.names[k]: v for k, v in self.episodes.episode(i).items()} for i in self.todo)
