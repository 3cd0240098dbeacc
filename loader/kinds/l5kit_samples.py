"""`AgentSampleLoader` and `EgoSampleLoader`: L5Kit's `AgentDataset` and `EgoDataset` samples (no raster), in
fixed-shape batches, from the loader's workers and its shared cache of decoded chunks.

A sample is an agent row (by default those of L5Kit's agents mask: >= 10 valid past and >= 1 future frames)
or, for the ego, a frame; every frame of a scene can be one, and frames of the window outside the scene are
unavailable, as in L5Kit. Samples are grouped by the chunk their row lies in (agents chunk, or frames chunk for
the ego), and a group reads the frames of its samples' windows (clipped to their scenes) and, for agents,
those frames' agents. The epoch plan shuffles groups as it shuffles chunks, and samples within windows of
groups, as for `WindowLoader`. A worker turns a group's cached chunks into a `motion.Context` once (kept
across epochs) and computes a batch's samples from it with arrays (`loader.kinds.motion`).
"""
from __future__ import annotations

import functools
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Unpack

import numpy as np

from ...core._proc.pool import preload_in_workers
from . import agents_mask
from ..engine import read_worker
from ..loader import Loader, fetch_options, open_dataset
from ..dataset import Dataset
from ..engine.layout import Layout
from .motion import AGENT_FIELDS, FRAME_FIELDS, AgentPool, Context, Steps, ego_samples, sample_fields
from ...core.keywords import count, spelled_out
from ..options import LoaderOptions, Options
from ..ordering.plan import EpochPlan, PlanConfig, selected_rows_per_chunk
from .base import CacheView
from .sample_groups import GroupedSamples, GroupSource, SampleBuilder
from .source import plan_settings
from ..ordering.state import MASK_MINIMUMS

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool
log = logging.getLogger("zarrfeed.loader")
_CONTEXTS = 64  # groups whose Context a worker keeps (about 1-3 MB each)


class MotionSamples(GroupedSamples):
    """The samples of an agent or ego loader: each one's row (agent row, or frame for the ego), frame t and
    scene, grouped by the chunk of their row, and the frames and agents each group reads."""

    def __init__(self, ds: Dataset, steps: Steps, ego: bool, items: np.ndarray, threshold: float = 0.5) -> None:
        self.steps, self.ego = steps, ego
        self.threshold = threshold  # L5Kit's label threshold: which row of a track is the agent at t
        h, f = steps.history, steps.future
        scenes = ds.read_rows("scenes", 0, ds.rows["scenes"])["frame_index_interval"]
        iv = ds.read_rows("frames", 0, ds.rows["frames"], fields=["agent_index_interval"])["agent_index_interval"]
        ds.require_link("scenes", "frame_index_interval", scenes)  # one line, not an IndexError below
        ds.require_link("frames", "agent_index_interval", iv)
        self.chunk_rows = {t: ds[t].chunks[0] for t in ("frames", "agents")}
        self.items = np.asarray(items, np.int64)
        self.t = self.items if ego else np.searchsorted(iv[:, 1], self.items, side="right").astype(np.int64)
        self.scene = np.searchsorted(scenes[:, 1], self.t, side="right").astype(np.int64)
        if len(self.t) and (self.scene >= len(scenes)).any():
            bad = int(self.t[self.scene >= len(scenes)][0])
            raise ValueError(f"frame {bad} belongs to no scene (the scenes' frame intervals end at {scenes[-1, 1]})")
        self.scene_lo = scenes[self.scene, 0] if len(self.t) else np.zeros(0, np.int64)
        self.scene_hi = scenes[self.scene, 1] if len(self.t) else np.zeros(0, np.int64)
        lo, hi = np.maximum(self.t - h, self.scene_lo), np.minimum(self.t + f + 1, self.scene_hi)  # frames [lo, hi)
        key = self.items // self.chunk_rows["frames" if ego else "agents"]
        super().__init__(key)
        ends = self.group_end
        self.frame_spans = np.stack([lo[self.group_start], hi[ends - 1]], axis=1) if len(key) else \
            np.zeros((0, 2), np.int64)
        self.agent_spans = np.stack([iv[self.frame_spans[:, 0], 0], iv[self.frame_spans[:, 1] - 1, 1]], axis=1) \
            if len(key) else np.zeros((0, 2), np.int64)
        for (f0, f1), (a0, a1) in zip(self.frame_spans.tolist(), self.agent_spans.tolist(), strict=True):
            cf, ca = self.chunk_rows["frames"], self.chunk_rows["agents"]
            need = [("frames", c) for c in range(f0 // cf, (f1 - 1) // cf + 1)]
            if not ego and a1 > a0:
                need += [("agents", c) for c in range(a0 // ca, (a1 - 1) // ca + 1)]
            self.reads.append(need)

    def __len__(self) -> int:
        return len(self.items)


def _columns(view: Callable[[str, int], np.ndarray], table: str, rows: tuple[int, int], chunk_rows: int,
             fields: tuple[str, ...], dtype: np.dtype) -> dict[str, np.ndarray]:
    """Rows [a, b) of `table`'s `fields` as owned columns, from the chunks `view(table, chunk)` gives."""
    a, b = rows
    parts: dict[str, list[np.ndarray]] = {f: [] for f in fields}
    while a < b:
        chunk, r = divmod(a, chunk_rows)
        n = min(b, (chunk + 1) * chunk_rows) - a
        records = view(table, chunk)
        for f in fields:
            parts[f].append(records[f][r:r + n])
        a += n
    return {f: np.concatenate(p) if p else np.zeros(0, dtype[f]) for f, p in parts.items()}


class MotionBuilder(SampleBuilder):
    """Agent or ego samples (see `AgentSampleLoader`), computed from each group's `motion.Context`, made from its
    cached chunks once and kept across epochs (the `_CONTEXTS` last used); an agent loader's batches in one pass
    over the agents of all their groups (`AgentPool`)."""

    samples: MotionSamples

    def __init__(self, cache: CacheView, config: PlanConfig, samples: MotionSamples, dtypes: dict[str, np.dtype],
                 layout: Layout) -> None:
        super().__init__(cache, config, samples, dtypes, layout)
        self.contexts: OrderedDict[int, Context] = OrderedDict()
        self.pool = None if samples.ego else AgentPool(len(samples.sizes), len(samples), _pool_rows(samples, config))

    def chunk(self, slots: dict[str, dict[int, int]], table: str, chunk: int) -> np.ndarray:
        """The records of `table`'s cached chunk `chunk`."""
        n = self.samples.chunk_rows[table]
        return np.frombuffer(self.cache, self.dtypes[table], count=n, offset=slots[table][chunk] * self.slot_bytes)

    def context(self, g: int, slots: dict[str, dict[int, int]], keep: bool = True) -> Context:
        """Group g's context, made from its cached chunks (and kept, least recently used dropped, with `keep`)."""
        samples, dtypes, contexts = self.samples, self.dtypes, self.contexts
        if g in contexts:
            contexts.move_to_end(g)
            return contexts[g]
        view = functools.partial(self.chunk, slots)
        f0, f1 = (int(x) for x in samples.frame_spans[g])
        frames = _columns(view, "frames", (f0, f1), samples.chunk_rows["frames"], FRAME_FIELDS,
                          dtypes["frames"])
        a0, a1 = (int(x) for x in samples.agent_spans[g])
        if samples.ego:
            agents = {"track_id": np.zeros(0, np.uint64)}
            frames["agent_index_interval"] = np.zeros((f1 - f0, 2), np.int64)
            a0 = 0
        else:
            agents = _columns(view, "agents", (a0, a1), samples.chunk_rows["agents"],
                              (*AGENT_FIELDS, "label_probabilities"), dtypes["agents"])
            agents["passing"] = agents_mask.of_interest(agents.pop("label_probabilities"), samples.threshold)
        ctx = Context(f0, frames, a0, agents)
        if keep:
            contexts[g] = ctx
            if len(contexts) > _CONTEXTS:
                contexts.popitem(last=False)
        return ctx

    def pooled(self, ids: np.ndarray, groups: np.ndarray, slots: dict[str, dict[int, int]]) -> dict[str, np.ndarray]:
        """Agent samples from any number of groups in one pass (`AgentPool`), each group added once."""
        samples, pool = self.samples, self.pool
        assert pool is not None
        touched = np.unique(groups).tolist()
        keep = set(touched)
        for g in touched:
            if not pool.holds(g):
                lo, hi = int(samples.group_start[g]), int(samples.group_end[g])
                group = np.arange(lo, hi)
                pool.add(g, self.context(g, slots, keep=False), group, samples.items[group], samples.t[group], keep)
        return pool.samples(ids, groups, samples.items[ids], samples.t[ids], samples.scene[ids],
                            samples.scene_lo[ids], samples.scene_hi[ids], samples.steps)

    def one_batch(self, dst: Any, p: EpochPlan, orders: dict, k: int, slots: dict[str, dict[int, int]]) -> None:
        samples = self.samples
        ids, groups = samples.sample_groups(p, p.segments(k), orders)
        views = self.layout.views(dst, len(ids))
        if self.pool is not None:
            out = self.pooled(ids, groups, slots)
            for name, view in views.items():
                view[:] = out[name]
            return
        for g in np.unique(groups).tolist():  # ego samples: a call per group (cheap: frames only)
            at = np.flatnonzero(groups == g)
            i = ids[at]
            out = ego_samples(self.context(g, slots), samples.t[i], samples.scene[i], samples.scene_lo[i],
                              samples.scene_hi[i], samples.steps)
            for name, view in views.items():
                view[at] = out[name]


def _pool_rows(samples: MotionSamples, config: PlanConfig) -> int:
    """Agent rows a worker's `AgentPool` holds: those of the largest window's groups and one more (a batch may
    straddle two windows), at least those of 64 groups (the contexts a worker kept before)."""
    rows = np.sort(samples.agent_spans[:, 1] - samples.agent_spans[:, 0])[::-1]
    return int(rows[:max(config.window + 1, _CONTEXTS)].sum())


@dataclass
class MotionSource(GroupSource):
    """Batches of agent or ego samples (see `AgentSampleLoader`): the plan's 'chunks' are groups of samples."""

    builds: ClassVar[type[SampleBuilder]] = MotionBuilder
    dataset: Dataset
    samples: MotionSamples
    config: PlanConfig
    selection: list[np.ndarray] | None
    layout: Layout
    reader: read_worker.DatasetOpener
    kind: str
    table: str
    options: dict[str, Any]  # the loader's arguments that decide its samples (for its resume state)
    uses_index: bool = False
    rows_column: str | None = "frame_row"

    @property
    def tables(self) -> list[str]:
        return ["frames"] if self.samples.ego else ["frames", "agents"]

    def rows_touched(self) -> int:
        return self.config.batch_size * self.samples.steps.T * (1 if self.samples.ego else 8)

    def worker_bytes(self) -> int:
        """An agent loader's workers each hold their window's agents (`motion.AgentPool`), each group the
        agents of the frames around its samples, so neighbouring groups' overlap."""
        return 0 if self.samples.ego else _pool_rows(self.samples, self.config) * AgentPool.ROW_BYTES

    def settings(self) -> dict[str, Any]:
        s = self.samples.steps
        out = {**plan_settings(self.table, self.config), "history": s.history, "future": s.future,
               "step_time": s.step_time, "samples": len(self.samples)}
        if not self.samples.ego:  # which row of a track is the agent at t
            out["threshold"] = self.samples.threshold
        for key in MASK_MINIMUMS:  # the agents mask's (without rows=)
            if key in self.options:
                out[key] = self.options[key]
        return out

    def selection_parts(self) -> list[np.ndarray]:
        return [self.samples.items]  # the sample rows, exactly


def _layout(ego: bool, steps: Steps, batch_size: int) -> Layout:
    return Layout([(name, dtype, shape, -1) for name, (dtype, shape) in sample_fields(ego, steps).items()],
                  batch_size)


class _SampleLoader(Loader):
    """What both sample loaders share: the samples, the source, the options."""

    def _begin(self, ds: Dataset, steps: Steps, ego: bool, items: np.ndarray, options: dict[str, Any],
               batch_size: int, o: Options) -> None:
        samples = MotionSamples(ds, steps, ego, items, options.get("threshold", 0.5))
        self.samples, self.steps = samples, steps
        self.history, self.future = steps.history, steps.future
        g = samples.group_rows
        selection = samples.selection()
        config = PlanConfig.of(len(selection) * g, g, batch_size, o.shuffling, o.shard)
        fetch = fetch_options(ds, o.caching)
        kind = type(self).__name__
        source = MotionSource(ds, samples, config, selection, _layout(ego, steps, batch_size),
                              read_worker.DatasetOpener.of(ds, fetch), kind, "frames" if ego else "agents", options)
        self._start(source, o, o.workers, fetch=fetch)  # Loader's default window


def _l5kit_dataset(ds: Dataset, who: str) -> None:
    missing = [t for t in ("scenes", "frames", "agents") if t not in ds.tables]
    if missing:
        raise ValueError(f"{who} needs an L5Kit dataset; table {missing[0]!r} is missing")


def _selected(n: int, rows: np.ndarray | None, what: str) -> np.ndarray | None:
    """`rows=` (an index array or a boolean mask over `what`) as sorted unique rows; None when not given."""
    if rows is None:
        return None
    keep = selected_rows_per_chunk(n, max(n, 1), rows)
    return keep[0].astype(np.int64) if keep else np.zeros(0, np.int64)


@spelled_out(LoaderOptions, Options)
class AgentSampleLoader(_SampleLoader):
    """Batches of L5Kit's `AgentDataset` samples (without the raster): one per selected agent row, with its
    history and future in its own frame (`target_positions` (B, future, 2), `target_yaws`, `target_velocities`,
    `target_availabilities`, `history_positions` (B, history + 1, 2), `history_yaws`, `history_velocities`
    (B, history, 2), `history_availabilities`, `agent_from_world`, `world_from_agent`, `centroid`, `yaw`,
    `extent`, `history_extents`, `future_extents`, `curr_speed`), and `track_id`, `frame_index` (in its scene,
    as L5Kit), `scene_index`, `timestamp`, `frame_row` (the frame's row) and `agent_row` (the agent's row).

    The rows are L5Kit's: those of the agents mask at `threshold` (label probability; L5Kit's other thresholds)
    with at least `min_history` valid past and `min_future` valid future frames. The mask is read from
    `agents_mask/<threshold>` when it belongs to this dataset commit (`zarrfeed mask DATASET`), else computed
    now (said in the log). `rows=` samples other agent rows (an index array or a boolean mask over agents).

    It takes every loader's options (`LoaderOptions`, listed below); `shuffle_window` counts groups of
    samples, one per agents chunk, and `num_workers` also computes the agents mask when none is stored. The
    default window is `Loader`'s (the whole table when it fits `shuffle_bytes`): each worker computes a batch's
    samples over all its groups at once, from its own copy of the window's agents, each group those of the
    frames around its samples (48 bytes a row; with L5Kit's chunks of 20,000 agents 1.24 times the window's
    agents, 124 MB for 100 scenes; more with denser frames or smaller chunks, counted when the loader checks
    that a window fits this machine).

    Args:
        dataset_or_path: An open `Dataset`, or a directory, `.zip` file or fsspec URL to open (as `Loader`'s).
        history: Past frames of each sample (L5Kit's `history_num_frames`, default 10).
        future: Future frames of each sample (L5Kit's `future_num_frames`, default 50).
        step_time: Seconds between two frames (default 0.1), which velocities are divided by.
        threshold: The label probability (summed over L5Kit's kept labels) above which a row counts as an agent
            (default 0.5): it picks the agents mask, and which row of a track is the agent in each frame (also
            with `rows=`).
        min_history: Valid past frames a sampled agent needs in the mask (default 10); not used with `rows=`.
        min_future: Valid future frames a sampled agent needs in the mask (default 1); not used with `rows=`.
        batch_size: Samples per batch (default 32).
        rows: The agent rows to sample instead of the mask's, as an index array or a boolean mask over agents.
    """

    def __init__(self, dataset_or_path: Dataset | str | os.PathLike, history: int = 10, future: int = 50, *,
                 step_time: float = 0.1, threshold: float = 0.5, min_history: int = 10, min_future: int = 1,
                 batch_size: int = 32, rows: np.ndarray | None = None, **options: Unpack[LoaderOptions]) -> None:
        o = Options.of(options, "AgentSampleLoader")
        min_history, min_future = count(min_history, "min_history", 0), count(min_future, "min_future", 0)
        ds = open_dataset(dataset_or_path, o.read)
        _l5kit_dataset(ds, "AgentSampleLoader")
        steps = Steps(history, future, step_time)
        items = _selected(ds.rows["agents"], rows, "agents")
        # the mask's minimums decide the selection without rows=: a state names them when they differ
        mask_options = {} if items is not None else {"min_history": min_history, "min_future": min_future}
        if items is None:
            mask, why = agents_mask.load(ds, threshold)
            if mask is None:
                log.info("zarrfeed: computing L5Kit's agents mask at threshold %s (%s); `zarrfeed mask` stores it",
                         threshold, why)
                mask = agents_mask.compute(ds, threshold, workers=o.workers.num_workers)
            items = agents_mask.selected_rows(mask, min_history, min_future)
        self.threshold = threshold
        self._begin(ds, steps, False, items, dict(history=history, future=future, step_time=step_time,
                                                  threshold=threshold, **mask_options), batch_size, o)


@spelled_out(LoaderOptions, Options)
class EgoSampleLoader(_SampleLoader):
    """Batches of L5Kit's `EgoDataset` samples (without the raster): one per frame (or per frame of `rows=`,
    an index array or boolean mask over frames), the ego's history and future in its own frame, with the same
    fields as `AgentSampleLoader` (`track_id` and `agent_row` -1; `extent` float64, as L5Kit gives it). The ego's
    yaw comes from the frame's rotation matrix, as in L5Kit.

    It takes every loader's options (`LoaderOptions`, listed below); `shuffle_window` counts groups of
    samples, one per frames chunk.

    Args:
        dataset_or_path: An open `Dataset`, or a directory, `.zip` file or fsspec URL to open (as `Loader`'s).
        history: Past frames of each sample (L5Kit's `history_num_frames`, default 10).
        future: Future frames of each sample (L5Kit's `future_num_frames`, default 50).
        step_time: Seconds between two frames (default 0.1), which velocities are divided by.
        batch_size: Samples per batch (default 32).
        rows: The frames to sample, as an index array or a boolean mask over frames (default: every frame).
    """

    def __init__(self, dataset_or_path: Dataset | str | os.PathLike, history: int = 10, future: int = 50, *,
                 step_time: float = 0.1, batch_size: int = 32, rows: np.ndarray | None = None,
                 **options: Unpack[LoaderOptions]) -> None:
        o = Options.of(options, "EgoSampleLoader")
        ds = open_dataset(dataset_or_path, o.read)
        _l5kit_dataset(ds, "EgoSampleLoader")
        steps = Steps(history, future, step_time)
        items = _selected(ds.rows["frames"], rows, "frames")
        if items is None:
            items = np.arange(ds.rows["frames"], dtype=np.int64)
        self._begin(ds, steps, True, items, dict(history=history, future=future, step_time=step_time), batch_size,
                    o)
