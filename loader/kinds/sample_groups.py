"""What the kinds of batch made of samples share (window samples, L5Kit agent and ego samples, sequences,
LeRobot's items): their samples grouped by the chunk they read (`GroupedSamples`), the episodes selected
(`select_episodes`), the description of such a kind (`GroupSource`) and the base of its builder
(`SampleBuilder`, with where each resident chunk lies in the cache).

A loader of samples (L5Kit windows, Diffusion Policy sequences) hands the plan its samples as groups, each of
which reads a few chunks: group g is a plan "chunk" of `group_rows` rows whose first `sizes[g]` are samples.
The plan shuffles groups as it shuffles chunks (windows of `shuffle_window` groups) and the samples within
each window, so the chunks a window reads are decoded once into the shared cache and every sample of the
window is gathered from there (no index regions).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import numpy as np

from ..engine import read_worker
from ..caches.chunk_cache import ChunkMemory
from ..dataset import Dataset
from .base import CacheView, ProbeBatch, probe_of, worker_of
from ..engine.layout import Layout
from ..engine.messages import GatherWindows
from ..ordering.plan import EpochPlan, PlanConfig, WorkerPlan, WorkerPlans
from .source import ResidentWindow


class GroupedSamples:
    """Samples 0..n-1 cut into groups of consecutive samples with the same `key` (the chunk they start in);
    `reads[g]`: the (table, chunk) group g reads, filled in by the loader that groups them."""

    def __init__(self, key: np.ndarray) -> None:
        key = np.asarray(key, np.int64)
        cuts = np.flatnonzero(np.diff(key)) + 1
        self.group_start = np.concatenate([[0], cuts]).astype(np.int64) if len(key) else np.zeros(0, np.int64)
        self.group_end = np.concatenate([cuts, [len(key)]]).astype(np.int64) if len(key) else self.group_start
        self.sizes = self.group_end - self.group_start
        self.group_rows = int(self.sizes.max(initial=1))
        self.reads: list[list[tuple[str, int]]] = []

    def selection(self) -> list[np.ndarray]:
        """The plan's view: group g is a 'chunk' of `group_rows` rows whose first `sizes[g]` are samples."""
        return [np.arange(n) for n in self.sizes.tolist()]

    def sample_ids(self, plan: EpochPlan, pieces: list[tuple[int, int, int]],
                   orders: dict[int, np.ndarray]) -> np.ndarray:
        """Sample indices of plan pieces (window, first, count), in batch order (`orders` caches each window's
        shuffled order)."""
        return self.sample_groups(plan, pieces, orders)[0]

    def sample_groups(self, plan: EpochPlan, pieces: list[tuple[int, int, int]],
                      orders: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """`sample_ids`, and the group of each."""
        ids, groups = [], []
        for w, pos, n in pieces:
            if w not in orders:
                orders[w] = plan.window_order(w)
            local = orders[w][pos:pos + n]
            g = plan.windows[w][local // self.group_rows]
            ids.append(self.group_start[g] + local % self.group_rows)
            groups.append(g)
        if not ids:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(ids), np.concatenate(groups)


def select_episodes(episodes: np.ndarray | None, n: int) -> np.ndarray:
    """The episodes a loader of episodes' steps samples (`episodes=` of `SequenceLoader`, `LeRobotLoader`), as
    indices in order, from None (all), a boolean mask over the episodes (Diffusion Policy's `episode_mask`) or an
    index array."""
    if episodes is None:
        return np.arange(n, dtype=np.int64)
    sel = np.asarray(episodes)
    if sel.dtype == bool:
        if sel.shape != (n,):
            raise ValueError(f"episodes: a mask of {sel.shape[0] if sel.ndim == 1 else sel.shape} values, but the "
                             f"buffer has {n} episodes")
        return np.flatnonzero(sel).astype(np.int64)
    if sel.size == 0:
        return np.zeros(0, np.int64)
    if sel.ndim != 1 or sel.dtype.kind not in "iu":
        raise ValueError(f"episodes: expected a boolean mask or an array of episode indices, got {sel.dtype} "
                         f"{sel.shape}")
    if sel.min() < 0 or sel.max() >= n:
        raise ValueError(f"episodes: index {int(sel.min() if sel.min() < 0 else sel.max())} is not an episode of "
                         f"the buffer's {n}")
    unique, counts = np.unique(sel.astype(np.int64), return_counts=True)
    if (counts > 1).any():  # (a 0/1 mask given as integers reads as indices repeated: a mask is boolean)
        raise ValueError(f"episodes: episode {int(unique[counts > 1][0])} is named {int(counts.max())} times; give "
                         "each episode once, or a boolean mask over the episodes")
    return unique


class SampleBuilder:
    """The base of a builder of samples: batch k of a gather message is made by `one_batch(dst, plan, orders,
    k, slots)`, each kind's, from the epoch's plan and the cache slots of the chunks it reads; `layout` lays
    out its columns."""

    def __init__(self, cache: CacheView, config: PlanConfig, samples: Any, dtypes: dict[str, np.dtype],
                 layout: Layout) -> None:
        self.cache, self.slot_bytes = cache.chunks, cache.slot_bytes
        self.samples, self.dtypes, self.layout = samples, dtypes, layout
        self.plans = WorkerPlans(config, samples.selection())
        self.bases: dict[str, tuple[dict, int, np.ndarray]] = {}  # per key, of the current message's slots

    def chunk_bases(self, key: str, slots: dict[int, int]) -> tuple[int, np.ndarray]:
        """Where each resident chunk of `key` starts in the cache, by chunk index from the first resident one:
        made once per message (a message's batches read the same slots)."""
        made = self.bases.get(key)
        if made is None or made[0] is not slots:
            first = min(slots)  # (a chunk not resident, which the plan never asks for, is far outside the
            at = np.full(max(slots) - first + 1, -(1 << 62), np.int64)  # cache: the gather refuses it)
            for chunk, slot in slots.items():
                at[chunk - first] = slot * self.slot_bytes
            made = self.bases[key] = (slots, first, at)
        return made[1], made[2]

    def one_batch(self, dst: Any, plan: EpochPlan, orders: dict, k: int,
                  slots: dict[str, dict[int, int]]) -> dict[str, int] | None:
        """Write batch k of `plan` into `dst`; the rows of each ragged column, for batches that have them."""
        raise NotImplementedError

    def others(self, wid: int) -> Callable[[Any], Any] | None:
        return None  # (gathers only)

    def start(self, msg: GatherWindows) -> WorkerPlan:
        return self.plans.get(msg.epoch, msg.spans)

    def build(self, dst: Any, msg: GatherWindows, k: int, started: WorkerPlan) -> dict[str, int] | None:
        return self.one_batch(dst, started.plan, started.orders, k, msg.slots)

    def views(self, scratch: np.ndarray, started: WorkerPlan, k: int, counts: dict[str, int] | None) -> Any:
        return self.layout.views(scratch, started.plan.batch_rows(k), counts)

    def rows(self, started: WorkerPlan, k: int) -> int:
        return started.plan.batch_rows(k)


class GroupSource:
    """What the descriptions of grouped samples share (`windows.WindowSource`, `sample_loaders.MotionSource`,
    `sequences.SequenceSource`, each a dataclass): each plan 'chunk' is a group of samples that reads
    `samples.reads[group]`; workers gather straight from the cached chunks (no index regions). Each names the
    tables its workers read (`tables`) and its builder's class (`builds`)."""

    builds: ClassVar[type[SampleBuilder]]
    samples: Any
    dataset: Dataset
    config: PlanConfig
    layout: Layout
    reader: read_worker.DatasetOpener

    @property
    def tables(self) -> list[str]:
        """The tables whose chunks the groups read."""
        raise NotImplementedError

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        """The records of each table read."""
        return {t: self.dataset[t].dtype for t in self.tables}

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one cache slot: the largest chunk of the tables read."""
        return max(self.dataset[t].chunks[0] * self.dataset[t].dtype.itemsize for t in self.tables)

    def with_config(self, config: PlanConfig) -> Any:
        """This source with another plan configuration."""
        return dataclasses.replace(self, config=config)  # type: ignore[type-var]  # (subclasses are dataclasses)

    def worker_bytes(self) -> int:
        """None of their own beyond the shared chunks (an agent loader's workers hold an index: its override)."""
        return 0

    def chunks_of(self, plan: EpochPlan, window: int) -> list[tuple[str, int]]:
        return list(dict.fromkeys(key for g in plan.windows[window] for key in self.samples.reads[g]))

    def batch_chunks(self, plan: EpochPlan, k: int) -> list[tuple[str, int]]:
        groups = self.samples.sample_groups(plan, plan.segments(k), {})[1]
        return list(dict.fromkeys(key for g in np.unique(groups).tolist() for key in self.samples.reads[g]))

    def gather_message(self, plan: EpochPlan, first: int, count: int,
                       windows: dict[int, ResidentWindow]) -> GatherWindows:
        slots: dict[str, dict[int, int]] = {t: {} for t in self.tables}
        for where in windows.values():
            for table, chunk, slot in where.chunks:
                slots[table][chunk] = slot
        return GatherWindows(plan.epoch, first, count, slots, plan.resumed_spans)

    def shared(self, chunks: ChunkMemory, batch_bytes: int, n_slots: int,
               regions: int) -> read_worker.Shared:
        return read_worker.Shared(chunks, 0, 0, batch_bytes, n_slots)

    def builder(self) -> tuple[type, tuple]:
        return self.builds, (self.config, self.samples, self.dtypes, self.layout)

    def worker(self, shared: read_worker.Shared, outputs: Layout | None,
               transform: Callable | None) -> tuple[Callable, tuple]:
        return worker_of(self, shared, outputs, transform)  # type: ignore[arg-type]  # (subclasses are sources)

    def probe_batch(self, plan: EpochPlan, k: int) -> ProbeBatch:
        return probe_of(self, plan, k)  # type: ignore[arg-type]
