"""`LeRobotLoader`: the items `LeRobotDataset(..., delta_timestamps=...)` returns, in batches, read where the
episodes lie.

A sample is one frame of an episode (its id: the frame's global row, LeRobot's item index). For a key given
`delta_timestamps` (seconds relative to the frame), LeRobot 0.4.4's rules exactly: each delta becomes the frame
offset `round(delta * fps)` (a delta that is not a multiple of 1/fps within 1e-4 s is refused, as its
`check_delta_timestamps` does), frame i of episode [from, to) reads rows `clamp(i + offset, from, to - 1)`, and
`<key>_is_pad` says which offsets fell outside the episode. A key without deltas gives the frame's own value.

The steps are any episode source shaped as a replay buffer (an `episodes` table whose `end` closes each episode,
one step table per key): a LeRobot v3 root opens so, and a Diffusion Policy replay buffer is one. Samples are
grouped by the chunk their frame lies in of the key read with the smallest chunks (`sample_groups`; a camera's
runs of 32 frames, so a shuffle window holds few frames to decode before its first batch); the chunks it reads
are decoded once into the shared cache and every batch is gathered from there, one pass per key.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping, Sequence, Unpack

import numpy as np

from ...core._proc.pool import preload_in_workers
from ...core.location import FormatError
from ...core.replay_buffer import END, EPISODES
from ...core.schema import field_names
from ...core.keywords import spelled_out
from ..engine import read_worker
from ..engine.gather import gather
from ..engine.layout import Layout
from ..dataset import Dataset
from ..loader import Loader, fetch_options, open_dataset
from ..options import SEQUENCE_GROUPS, LoaderOptions, Options
from ..ordering.plan import EpochPlan, PlanConfig
from .base import CacheView
from .sample_groups import GroupedSamples, GroupSource, SampleBuilder, select_episodes
from .source import plan_settings

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool

# the columns LeRobot returns with every item, each the frame's own scalar (read whenever the steps have them)
LEROBOT_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
TOLERANCE_S = 1e-4  # LeRobotDataset's default tolerance_s, which check_delta_timestamps applies


def delta_offsets(delta_timestamps: Mapping[str, Sequence[float]] | None, fps: float,
                  keys: list[str]) -> dict[str, np.ndarray]:
    """Each key's frame offsets, `round(delta * fps)` per delta as LeRobot's `get_delta_indices` makes them;
    ValueError (one line, naming key and value) for a key not among `keys`, no deltas, or a delta that is not a
    multiple of 1/fps within 1e-4 s (LeRobot's `check_delta_timestamps`)."""
    offsets: dict[str, np.ndarray] = {}
    for key, deltas in (delta_timestamps or {}).items():
        if key not in keys:
            raise ValueError(f"delta_timestamps: no key {key!r} in the dataset's steps ({', '.join(keys)})")
        if isinstance(deltas, (str, bytes, Mapping)) or not isinstance(deltas, (Sequence, np.ndarray)):
            raise ValueError(f"delta_timestamps[{key!r}] must be a list of seconds, got {deltas!r}")
        values: list[Any] = list(deltas)
        if not values:
            raise ValueError(f"delta_timestamps[{key!r}] is empty; give at least one delta (0.0: the frame itself)")
        for j, d in enumerate(values):
            if isinstance(d, bool) or not isinstance(d, (int, float, np.integer, np.floating)) or \
                    not math.isfinite(d):
                raise ValueError(f"delta_timestamps[{key!r}]: {d!r} is not a number of seconds")
            values[j] = d = float(d)
            if abs(d * fps - round(d * fps)) / fps > TOLERANCE_S:
                raise ValueError(f"delta_timestamps[{key!r}]: {d!r} s is not a multiple of 1/fps (fps {fps:g}) "
                                 f"within {TOLERANCE_S:g} s, as LeRobot's check_delta_timestamps requires")
        offsets[key] = np.array([round(d * fps) for d in values], np.int64)
    return offsets


def is_camera(dtype: np.dtype) -> bool:
    """A camera's frames: uint8 (H, W, 3)."""
    return dtype.base == np.uint8 and len(dtype.shape) == 3 and dtype.shape[2] == 3


class FrameSamples(GroupedSamples):
    """One sample per frame of the selected episodes, in order (`frame`: its global row), grouped by the chunk
    of `grouping` (the key read with the fewest rows per chunk) the frame lies in, and the chunks of every key
    each group reads."""

    def __init__(self, ds: Dataset, keys: list[str], offsets: dict[str, np.ndarray],
                 episodes: np.ndarray | None) -> None:
        self.keys, self.offsets = keys, offsets
        n = ds.rows[EPISODES]
        ends = ds.read_rows(EPISODES, 0, n)[END].astype(np.int64)
        ds.require_link(EPISODES, END, ends)  # one line naming the episode, not an IndexError below
        self.first = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        self.end = ends
        self.episodes = select_episodes(episodes, n)
        length = np.maximum(ends - self.first, 0)[self.episodes]
        self.episode = np.repeat(self.episodes, length)
        within = np.arange(int(length.sum()), dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
        self.frame = self.first[self.episode] + within
        self.chunk_rows = {k: ds[k].chunks[0] for k in keys}
        # grouped by the key of the smallest chunks (a camera's runs of frames, not a Parquet column's 1,024 rows):
        # a window of groups then holds few frames to decode before its first batch
        self.grouping = min(keys, key=lambda k: self.chunk_rows[k]) if keys else ""
        super().__init__(self.frame // self.chunk_rows[self.grouping] if keys else self.frame)
        group = np.repeat(np.arange(len(self.sizes), dtype=np.int64), self.sizes)
        lo, hi = self.first[self.episode], self.end[self.episode] - 1
        reads: list[list[tuple[str, int]]] = [[] for _ in range(len(self.sizes))]
        for k in keys:  # each group's chunks of key k: the distinct chunks of the rows its samples read
            span = -(-max(int(ends[-1]) if n else 0, 1) // self.chunk_rows[k])
            pairs = np.unique(np.concatenate([np.zeros(0, np.int64)] + [  # one offset at a time: O(samples) memory
                np.unique(group * span + np.clip(self.frame + off, lo, hi) // self.chunk_rows[k])
                for off in self.offsets.get(k, np.zeros(1, np.int64)).tolist()]))
            for g, c in zip((pairs // span).tolist(), (pairs % span).tolist(), strict=True):
                reads[g].append((k, c))
        self.reads = reads

    def __len__(self) -> int:
        return len(self.frame)

    def rows(self, key: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For samples `ids`: the rows key `key` reads, (n, T) (T = 1 for a key without deltas: the frame's own
        row), each clamped to the sample's episode, and which of them are padding (outside the episode)."""
        at = self.frame[ids, None] + self.offsets.get(key, np.zeros(1, np.int64))
        episode = self.episode[ids, None]
        lo, hi = self.first[episode], self.end[episode] - 1
        return np.minimum(np.maximum(at, lo), hi), (at < lo) | (at > hi)


def _layout(ds: Dataset, samples: FrameSamples, batch_size: int, frames: str) -> Layout:
    cols: list[tuple] = [("sample", np.dtype(np.int64), (), -1)]
    for key in samples.keys:
        sub = ds[key].dtype[key]
        shape: tuple[int, ...] = sub.shape
        base = sub.base
        if is_camera(sub) and frames == "float32":  # LeRobot's: channels first, in [0, 1]
            base, shape = np.dtype(np.float32), (3, shape[0], shape[1])
        T = len(samples.offsets.get(key, ()))
        if T and not (T == 1 and is_camera(sub)):  # (LeRobot squeezes a camera's single-frame window)
            shape = (T, *shape)
        cols.append((key, base, shape, 0))
    for key, off in samples.offsets.items():
        cols.append((f"{key}_is_pad", np.dtype(bool), (len(off),), -1))
    return Layout(cols, batch_size)


class LeRobotBuilder(SampleBuilder):
    """LeRobot's items (see `LeRobotLoader`): `sample`, then each key's rows gathered from the cached chunks,
    one pass per key; a camera's frames converted to float32 channels first when asked."""

    samples: FrameSamples

    def __init__(self, cache: CacheView, config: PlanConfig, samples: FrameSamples, dtypes: dict[str, np.dtype],
                 layout: Layout, frames: str) -> None:
        super().__init__(cache, config, samples, dtypes, layout)
        self.by_name = {c.name: c for c in layout.columns}
        self.floats = {k for k in samples.keys if frames == "float32" and is_camera(dtypes[k][k])}
        self.specs = {k: np.array([0, dtypes[k].itemsize, 0 if k in self.floats else self.by_name[k].base],
                                  np.int64) for k in samples.keys}

    def one_batch(self, dst: Any, p: EpochPlan, orders: dict, k: int, slots: dict[str, dict[int, int]]) -> None:
        s, by_name = self.samples, self.by_name
        ids = s.sample_ids(p, p.segments(k), orders)
        b = len(ids)
        np.frombuffer(dst, np.int64, count=b, offset=by_name["sample"].base)[:] = s.frame[ids]
        for key in s.keys:
            rows, pad = s.rows(key, ids)
            if key in s.offsets:
                np.frombuffer(dst, bool, count=pad.size, offset=by_name[f"{key}_is_pad"].base)[:] = pad.reshape(-1)
            rows = rows.reshape(-1)
            c, size = s.chunk_rows[key], self.dtypes[key].itemsize
            chunk = rows // c
            first, at = self.chunk_bases(key, slots[key])
            where = at[chunk - first] + (rows - chunk * c) * size
            if key not in self.floats:
                gather(self.cache, size, where, dst, self.specs[key], 0, 1)
                continue
            frames = np.empty(len(rows) * size, np.uint8)
            gather(self.cache, size, where, frames, self.specs[key], 0, 1)
            h, w, _ = self.dtypes[key][key].shape
            out = np.frombuffer(dst, np.float32, count=frames.size, offset=by_name[key].base)
            out = out.reshape(len(rows), 3, h, w)
            out[:] = frames.reshape(len(rows), h, w, 3).transpose(0, 3, 1, 2)
            np.divide(out, np.float32(255), out=out)  # (LeRobot: float32 frames / 255)


@dataclass
class LeRobotSource(GroupSource):
    """Batches of LeRobot's items (see `LeRobotLoader`), gathered from the cached chunks of their keys: the plan's
    'chunks' are groups of frames, one per chunk of the key with the smallest chunks."""

    builds: ClassVar[type[SampleBuilder]] = LeRobotBuilder
    dataset: Dataset
    samples: FrameSamples
    config: PlanConfig
    selection: list[np.ndarray] | None
    layout: Layout
    reader: read_worker.DatasetOpener
    frames: str = "uint8"
    kind: str = "LeRobotLoader"
    table: str = EPISODES
    uses_index: bool = False
    rows_column: str | None = "sample"

    @property
    def tables(self) -> list[str]:
        return list(self.samples.keys)

    def rows_touched(self) -> int:
        per_sample = sum(len(self.samples.offsets.get(k, (0,))) for k in self.samples.keys)
        return self.config.batch_size * per_sample

    def builder(self) -> tuple[type, tuple]:
        return self.builds, (self.config, self.samples, self.dtypes, self.layout, self.frames)

    def settings(self) -> dict[str, Any]:
        s = self.samples
        return {**plan_settings(self.table, self.config), "keys": list(s.keys),
                "delta_indices": {k: v.tolist() for k, v in s.offsets.items()}, "samples": len(s)}

    def selection_parts(self) -> list[np.ndarray]:
        return [self.samples.episodes]  # the episodes sampled, exactly


def _fps(ds: Dataset, fps: float | None) -> float:
    """The frame rate deltas are rounded at: a LeRobot dataset's own (an `fps` that differs refused: LeRobot
    always uses the dataset's), else `fps`."""
    meta = getattr(ds, "lerobot", None)
    if fps is None:
        if meta is None:
            raise ValueError(f"{ds.location}: fps= is needed (this {ds.schema.name} dataset does not say its "
                             "frame rate; a LeRobot dataset's is read from meta/info.json)")
        fps = meta.fps
    if isinstance(fps, bool) or not isinstance(fps, (int, float, np.integer, np.floating)) or \
            not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps must be a positive number of frames per second, got {fps!r}")
    if meta is not None and float(fps) != meta.fps:
        raise ValueError(f"{ds.location}: fps={fps!r} differs from the LeRobot dataset's own {meta.fps:g} "
                         "(meta/info.json), which LeRobot always uses; leave fps= out")
    return float(fps)


@spelled_out(LoaderOptions, Options)
class LeRobotLoader(Loader):
    """Batches of the items `LeRobotDataset(root, delta_timestamps=...)` returns, equal to its items value for
    value, from a LeRobot v3 dataset (or any replay buffer, given `fps=`), read where it lies.

    One sample per frame of the selected episodes (`sample`: the frame's global row, LeRobot's item index; an
    unshuffled loader yields them in that order). A batch holds, for each key read: with deltas, `<key>`
    (B, T, ...) (the frames at `round(delta * fps)` from the sample's, clamped to its episode: steps outside
    repeat its first or last frame) and `<key>_is_pad` (B, T) bool (True for those); without, `<key>` (B, ...),
    the frame's own value. `timestamp`, `frame_index`, `episode_index`, `index` and `task_index` (B,) are
    always there when the steps have them. A camera (uint8 (H, W, 3) frames) comes as uint8 (B, [T,] H, W, 3),
    or with `frames="float32"` as LeRobot gives it: float32 (B, [T,] 3, H, W) in [0, 1] (value / 255); a camera
    with a single delta has no T axis, as LeRobot squeezes it.

    It takes every loader's options (`LoaderOptions`, listed below); `shuffle_window` counts groups of frames,
    one per chunk of the key read with the smallest chunks (a camera's 32 frames).

    ```python
    import numpy as np
    from zarrfeed import LeRobotLoader
    from zarrfeed.writer import DatasetWriter, replay_buffer_schema

    schema = replay_buffer_schema({"state": (np.float32, (2,)), "action": (np.float32, (2,))})
    with DatasetWriter("demo.zarr", schema, workers=0) as writer:    # two episodes, of 5 and 8 steps
        for i, t in enumerate((5, 8)):
            writer.submit({"state": np.ones((t, 2), np.float32), "action": np.zeros((t, 2), np.float32)},
                          key=f"demo-{i}")
    dt = {"state": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]}    # seconds, as LeRobotDataset takes them
    with LeRobotLoader("demo.zarr", dt, fps=10, batch_size=4, shuffle=False, num_workers=0) as loader:
        batch = next(iter(loader))
    assert batch["action"].shape == (4, 3, 2) and batch["state_is_pad"].tolist()[0] == [True, False]
    ```

    Args:
        dataset_or_path: An open `Dataset`, or a LeRobot v3 root, replay buffer or fsspec URL to open.
        delta_timestamps: Per key, seconds relative to the frame (LeRobot's `delta_timestamps`), each a
            multiple of 1/fps.
        keys: The keys to read (default all; keys given deltas and the five columns above are always read).
        episodes: The episodes to sample: a boolean mask over the episodes or an index array (default all).
        frames: `"uint8"` (channels last, as stored) or `"float32"` (LeRobot's channels first in [0, 1]).
        batch_size: Samples per batch.
        fps: Frames per second the deltas are rounded at: needed for a replay buffer; a LeRobot dataset's own
            (meta/info.json) is used, and another refused.
    """

    def __init__(self, dataset_or_path: Dataset | str | os.PathLike,
                 delta_timestamps: Mapping[str, Sequence[float]] | None = None, *,
                 keys: list[str] | str | None = None, episodes: np.ndarray | None = None,
                 frames: Literal["uint8", "float32"] = "uint8", batch_size: int = 64, fps: float | None = None,
                 **options: Unpack[LoaderOptions]) -> None:
        o = Options.of(options, "LeRobotLoader")
        if frames not in ("uint8", "float32"):
            raise ValueError(f"frames must be 'uint8' or 'float32', got {frames!r}")
        ds = open_dataset(dataset_or_path, o.read)
        steps = ds.schema.step_tables()
        if EPISODES not in ds.tables or not steps:
            raise FormatError(f"{ds.location}: LeRobotLoader reads episodes of steps (a LeRobot dataset or a "
                              f"replay buffer); this is {ds.schema.described()}")
        if delta_timestamps is not None and not isinstance(delta_timestamps, Mapping):
            raise ValueError(f"delta_timestamps must map keys to lists of seconds, got {type(delta_timestamps)}")
        offsets = delta_offsets(delta_timestamps, _fps(ds, fps), steps)
        named = set(field_names(np.dtype([(k, np.uint8) for k in steps]), keys, "keys"))
        names = [k for k in steps if k in named or k in offsets or k in LEROBOT_COLUMNS]
        taken = sorted({"sample", *(f"{k}_is_pad" for k in offsets)} & set(names))
        if taken:
            raise ValueError(f"keys: key {taken[0]!r} has the name of a column LeRobotLoader adds; leave it out "
                             "with keys=")
        samples = FrameSamples(ds, names, offsets, episodes)
        self.samples = samples
        g = samples.group_rows
        selection = samples.selection()
        config = PlanConfig.of(len(selection) * g, g, batch_size, o.shuffling, o.shard)
        fetch = fetch_options(ds, o.caching)
        source = LeRobotSource(ds, samples, config, selection, _layout(ds, samples, batch_size, frames),
                               read_worker.DatasetOpener.of(ds, fetch), frames)
        self._start(source, o, o.workers, fetch=fetch, groups=SEQUENCE_GROUPS)
