"""`WindowLoader`: L5Kit's access pattern, one sample per frame t with its history and future.

A sample is any frame t of a scene, as in L5Kit: its window [t - history, t + future] holds the frames of the
scene in it, and frames before the scene's start or after its end are absent (zeros, `frames_availability`
0, no agents or faces). `whole_windows=True` keeps only frames whose whole window lies inside their scene
(what WindowLoader made before). A sample holds the T = history + 1 + future frames (shape (T,) per sample),
plus the agents and traffic-light faces they reference as ragged columns: the values of every sample laid
end to end, and per sample `T + 1` offsets into them.

Samples are grouped by the agents chunk their frame's agents start in; the epoch plan shuffles these groups
as it shuffles chunks (windows of `shuffle_window` groups) and the samples within each window. So the agents,
frames and faces chunks a window of samples reads are decoded once into the shared cache, and every sample of
the window is gathered from there, instead of decoding a whole chunk for every sample.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar, Unpack

import numpy as np

from ...core._proc.pool import preload_in_workers
from ..engine import read_worker
from ..loader import Loader, fetch_options, open_dataset
from ..dataset import Dataset
from ..engine.gather import gather_runs
from ..engine.layout import Layout
from ...core.keywords import spelled_out
from ..options import WINDOW_GROUPS, LoaderOptions, Options
from ..ordering.plan import EpochPlan, PlanConfig, selected_rows_per_chunk
from .base import CacheView
from .sample_groups import GroupedSamples, GroupSource, SampleBuilder
from .source import plan_settings
from ..ordering.state import LoaderState

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool

TABLES = ("frames", "agents", "traffic_light_faces")
LINKS = {"agents": "agent_index_interval", "traffic_light_faces": "traffic_light_faces_index_interval"}


class WindowSamples(GroupedSamples):
    """The valid samples of a dataset, grouped by agents chunk, and what each group reads."""

    def __init__(self, ds: Dataset, history: int, future: int, rows: np.ndarray | None = None,
                 whole_windows: bool = False) -> None:
        if history < 0 or future < 0:
            raise ValueError(f"history and future must be >= 0, got {history} and {future}")
        self.history, self.future, self.T = history, future, history + 1 + future
        self.whole_windows = whole_windows
        scenes = ds.read_rows("scenes", 0, ds.rows["scenes"])["frame_index_interval"]
        frames = ds.read_rows("frames", 0, ds.rows["frames"], fields=list(LINKS.values()))
        ds.require_link("scenes", "frame_index_interval", scenes)  # one line, not an IndexError below
        for field in LINKS.values():
            ds.require_link("frames", field, frames[field])
        self.chunk_rows = {t: ds[t].chunks[0] for t in TABLES}
        if whole_windows:
            t = [np.arange(s + history, e - future) for s, e in scenes.tolist() if e - s >= self.T]
        else:
            t = [np.arange(s, e) for s, e in scenes.tolist()]
        self.t = np.concatenate(t).astype(np.int64) if t else np.zeros(0, np.int64)
        if rows is not None:  # only these frames, as an index array or a boolean mask over frames
            keep = selected_rows_per_chunk(len(frames), max(len(frames), 1), rows)
            self.t = self.t[np.isin(self.t, keep[0] if keep else [])]
        scene = np.searchsorted(scenes[:, 1], self.t, side="right")
        # each sample's frames inside its scene: [lo, hi), within its window [t - history, t + future + 1)
        self.lo = np.maximum(self.t - history, scenes[scene, 0]) if len(self.t) else self.t
        self.hi = np.minimum(self.t + future + 1, scenes[scene, 1]) if len(self.t) else self.t
        if len(self.t):
            ivs = {table: frames[field] for table, field in LINKS.items()}
            first, last = self.lo, self.hi - 1
            self.max_rows = {table: int((iv[last, 1] - iv[first, 0]).max()) for table, iv in ivs.items()}
            super().__init__(ivs["agents"][self.t, 0] // self.chunk_rows["agents"])
            tf, tl = self.lo[self.group_start], self.hi[self.group_end - 1] - 1
            for a, b in zip(tf.tolist(), tl.tolist(), strict=True):
                cf = self.chunk_rows["frames"]
                need = [("frames", c) for c in range(a // cf, b // cf + 1)]
                for table, iv in ivs.items():
                    lo, hi = int(iv[a, 0]), int(iv[b, 1])
                    need += [(table, c) for c in range(lo // self.chunk_rows[table],
                                                       (hi - 1) // self.chunk_rows[table] + 1)] if hi > lo else []
                self.reads.append(need)
        else:
            self.max_rows = {table: 0 for table in LINKS}
            super().__init__(np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.t)


def _window_layout(ds: Dataset, samples: WindowSamples, batch_size: int) -> Layout:
    cols: list[tuple] = [("frame_row", np.dtype(np.int64), (), -1),
                         ("frames_availability", np.dtype(np.float32), (samples.T,), -1)]
    fdt = ds["frames"].dtype
    for name in fdt.names:
        sub = fdt.fields[name][0]
        cols.append((f"frames/{name}", sub.base, (samples.T, *sub.shape), fdt.fields[name][1]))
    for table in LINKS:
        dt = ds[table].dtype
        cap = max(1, samples.max_rows[table]) * batch_size  # (at least a batch: the slot views make batch_size rows)
        for name in dt.names:
            sub = dt.fields[name][0]
            cols.append((f"{table}/{name}", sub.base, sub.shape, dt.fields[name][1], cap))
        cols.append((f"{table}_offsets", np.dtype(np.int64), (samples.T + 1,), -1))
    return Layout(cols, batch_size)


def _spec(layout: Layout, prefix: str, dtype: np.dtype) -> np.ndarray:
    """The gather spec of one table's columns: (offset in the record, bytes per record, base in the slot)."""
    cols = [c for c in layout.columns if c.name.startswith(prefix + "/")]
    return np.array([(c.offset, dtype[c.name.split("/", 1)[1]].itemsize, c.base) for c in cols],
                    np.int64).reshape(-1)


class WindowBuilder(SampleBuilder):
    """Window samples (see `WindowLoader`), gathered from the cached chunks of frames, agents and traffic-light
    faces: a batch's frames in runs within chunks, then the agents and faces those frames link to, ragged."""

    samples: WindowSamples

    def __init__(self, cache: CacheView, config: PlanConfig, samples: WindowSamples, dtypes: dict[str, np.dtype],
                 layout: Layout) -> None:
        super().__init__(cache, config, samples, dtypes, layout)
        self.specs = {t: _spec(layout, t, dtypes[t]) for t in TABLES}
        self.by_name = {c.name: c for c in layout.columns}
        self.frame_views = [c for c in layout.columns if c.name.startswith("frames/")]

    def runs(self, table: str, lo: np.ndarray, hi: np.ndarray, slots: dict[int, int]) -> np.ndarray:
        """Rows [lo_i, hi_i) of `table`, in order, as (byte offset in the cache, rows) runs within chunks."""
        c, size, S = self.samples.chunk_rows[table], self.dtypes[table].itemsize, self.slot_bytes
        out = []
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            while a < b:
                chunk, r = divmod(a, c)
                n = min(b, (chunk + 1) * c) - a
                out.append((slots[chunk] * S + r * size, n))
                a += n
        return np.array(out, np.int64).reshape(-1, 2)

    def one_batch(self, dst: Any, p: EpochPlan, orders: dict, k: int,
                  slots: dict[str, dict[int, int]]) -> dict[str, int]:
        samples, cache, dtypes, specs, by_name = self.samples, self.cache, self.dtypes, self.specs, self.by_name
        runs, layout = self.runs, self.layout
        h, T = samples.history, samples.T
        ids = samples.sample_ids(p, p.segments(k), orders)
        t = samples.t[ids]
        b = len(t)
        np.frombuffer(dst, np.int64, count=b, offset=by_name["frame_row"].base)[:] = t
        first, last = samples.lo[ids] - (t - h), samples.hi[ids] - (t - h)  # the present frames [first, last)
        present = (np.arange(T) >= first[:, None]) & (np.arange(T) < last[:, None])
        avail = np.frombuffer(dst, np.float32, count=b * T, offset=by_name["frames_availability"].base)
        avail[:] = present.reshape(-1)
        partial = np.flatnonzero((first > 0) | (last < T))
        whole = np.flatnonzero((first == 0) & (last == T))
        if len(partial):  # absent frames are zeros: the slot holds an earlier batch's bytes
            for c in self.frame_views:
                np.frombuffer(dst, np.uint8, count=b * c.size, offset=c.base).reshape(b, -1)[partial] = 0
        fs = dtypes["frames"].itemsize
        if len(whole) == b:  # one call for the batch
            gather_runs(cache, fs, runs("frames", t - h, t - h + T, slots["frames"]), dst, specs["frames"], 0)
        else:
            for i in range(b):
                a, z = int(samples.lo[ids[i]]), int(samples.hi[ids[i]])
                gather_runs(cache, fs, runs("frames", np.array([a]), np.array([z]), slots["frames"]), dst,
                            specs["frames"], i * T + int(first[i]))
        counts = {}
        rows = np.arange(b)
        for table, field in LINKS.items():
            col = by_name[f"frames/{field}"]
            iv = np.frombuffer(dst, np.int64, count=b * T * 2, offset=col.base).reshape(b, T, 2)
            lo, hi = iv[rows, first, 0], iv[rows, last - 1, 1]
            if len(partial):  # absent frames own no rows: before the scene at its first row, after it at its end
                iv = np.where(present[..., None], iv, np.where(np.arange(T)[:, None] < first[:, None, None],
                                                                lo[:, None, None], hi[:, None, None]))
            n = hi - lo
            base = np.concatenate([[0], np.cumsum(n)])
            total = int(base[-1])
            if total:
                gather_runs(cache, dtypes[table].itemsize, runs(table, lo, hi, slots[table]), dst, specs[table], 0)
            off = np.frombuffer(dst, np.int64, count=b * (T + 1), offset=by_name[f"{table}_offsets"].base)
            off = off.reshape(b, T + 1)
            off[:, :T] = iv[:, :, 0] - lo[:, None] + base[:-1, None]
            off[:, T] = base[1:]
            counts.update({c.name: total for c in layout.columns if c.name.startswith(table + "/")})
        return counts


@dataclass
class WindowSource(GroupSource):
    """Batches of window samples (see `WindowLoader`), gathered from the cached chunks of frames, agents and
    traffic-light faces they read: the plan's 'chunks' are groups of samples, one per agents chunk."""

    builds: ClassVar[type[SampleBuilder]] = WindowBuilder
    dataset: Dataset
    samples: WindowSamples
    config: PlanConfig
    selection: list[np.ndarray] | None
    layout: Layout
    reader: read_worker.DatasetOpener
    kind: str = "WindowLoader"
    table: str = "frames"
    uses_index: bool = False
    rows_column: str | None = "frame_row"

    @property
    def tables(self) -> list[str]:
        return list(TABLES)

    def rows_touched(self) -> int:
        return self.config.batch_size * max(self.samples.T + self.samples.max_rows["agents"], 1)

    def settings(self) -> dict[str, Any]:
        partial = {} if self.samples.whole_windows else {"partial_windows": True}  # whole: as states before it
        return {**plan_settings(self.table, self.config), "history": self.samples.history,
                "future": self.samples.future, "samples": len(self.samples), **partial}

    def selection_parts(self) -> list[np.ndarray]:
        return [self.samples.t]  # the sample frames, exactly


@spelled_out(LoaderOptions, Options)
class WindowLoader(Loader):
    """Batches of L5Kit-style samples: every frame t of every scene with `history` frames before and `future`
    after, and the agents and traffic-light faces of those frames (ragged: values + per-frame offsets). Frames
    of the window outside t's scene are absent, as in L5Kit: zeros, `frames_availability` 0, no agents or
    faces. `whole_windows=True` samples only the frames whose whole window lies inside their scene.

    A batch holds `frame_row` (B,), the row of `frames` each sample is centred on (a global row, not the
    frame's index within its scene, which `EgoSampleLoader` calls `frame_index` as L5Kit does; zarrfeed 0.2
    named this column `frame_index`), `frames_availability` (B, T) float32 (1: the frame is in the sample's
    scene), `frames/<field>` (B, T, ...), `agents/<field>` (A, ...) with
    `agents_offsets` (B, T + 1): sample i's frame j has agents[agents_offsets[i, j]:agents_offsets[i, j + 1]],
    and likewise `traffic_light_faces/<field>` with `traffic_light_faces_offsets`. A `transform` receives the
    whole batch and returns fixed-shape arrays whose first axis is the batch's samples. Batches are numpy:
    ragged columns of different lengths make no single RecordBatch.

    It takes every loader's options (`LoaderOptions`, listed below); `shuffle_window` counts groups of
    samples, one per agents chunk.

    Args:
        dataset_or_path: An open `Dataset`, or a directory, `.zip` file or fsspec URL to open (as `Loader`'s).
        history: Frames before t in each sample's window (default 10).
        future: Frames after t in each sample's window (default 50); a window holds history + 1 + future frames.
        whole_windows: Sample only the frames whose whole window lies inside their scene (no absent frames);
            default: every frame of every scene.
        batch_size: Samples (frames t) per batch (default 32).
        rows: The frames to sample, as an index array or a boolean mask over the frames table (default all;
            with `whole_windows`, those of them whose window is whole).
    """

    def __init__(self, dataset_or_path: Dataset | str | os.PathLike, history: int = 10, future: int = 50, *,
                 whole_windows: bool = False, batch_size: int = 32, rows: np.ndarray | None = None,
                 **options: Unpack[LoaderOptions]) -> None:
        o = Options.of(options, "WindowLoader")
        ds = open_dataset(dataset_or_path, o.read)
        missing = [t for t in ("scenes", *TABLES) if t not in ds.tables]
        if missing:
            raise ValueError(f"WindowLoader needs an L5Kit dataset; table {missing[0]!r} is missing")
        samples = WindowSamples(ds, history, future, rows, whole_windows)
        self.samples, self.history, self.future = samples, history, future
        g = samples.group_rows
        selection = samples.selection()
        config = PlanConfig.of(len(selection) * g, g, batch_size, o.shuffling, o.shard)
        fetch = fetch_options(ds, o.caching)
        source = WindowSource(ds, samples, config, selection, _window_layout(ds, samples, batch_size),
                              read_worker.DatasetOpener.of(ds, fetch))
        self._start(source, o, o.workers, fetch=fetch, groups=WINDOW_GROUPS)


    def load_state_dict(self, state: Any) -> None:
        """As `Loader.load_state_dict`; a state saved before partial windows (whole windows only) says so."""
        for one in state if isinstance(state, (list, tuple)) else [state]:
            saved = LoaderState.from_dict(one)
            if saved.kind == "WindowLoader" and "partial_windows" not in saved.settings and \
                    not self.samples.whole_windows:
                raise ValueError("loader state is of whole windows only (saved before WindowLoader sampled every "
                                 "frame, or with whole_windows=True): pass whole_windows=True to resume it")
        super().load_state_dict(state)
