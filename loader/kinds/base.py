"""What every kind of batch shares: the worker that runs its builder, and the probe that runs the same builder
on one batch in any process.

A kind of batch (rows, window samples, L5Kit agent and ego samples, sequences) is one module holding a
parent-side description (a `loader.kinds.source.BatchSource`: what the scheduler asks, and which builder makes its
batches), a worker-side builder (a `KindBuilder`: the per-batch code, as methods) and its
public loader class. The description names the builder's class and its arguments (`builder()`); `start_worker`
makes a reader worker around it, and `ProbeBatch` makes batch k with it from plain reads, so the batch a
transform is first run on (to size its output) is made by exactly the code the workers run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from ...core.chunk_check import ChunkCheck
from ...core.location import Location
from ..dataset import Dataset
from ..engine.layout import Layout
from ..engine.messages import FillIndex, GatherRows, GatherWindows
from ..ordering.plan import EpochPlan
from ..engine.read_worker import BatchBuilder, BatchWorker, ChunkDecoder, DatasetOpener, Shared
from .source import BatchSource, ResidentWindow


@dataclass(frozen=True)
class CacheView:
    """What a builder reads: the decoded chunks (`chunks`, bytes, slot s at s * `slot_bytes`) and the index of
    cache rows (`index`, regions of `region_rows`; only kinds whose windows need one fill it)."""

    chunks: np.ndarray
    slot_bytes: int
    index: np.ndarray
    region_rows: int

    @classmethod
    def of(cls, shared: Shared) -> "CacheView":
        """A worker's: its loader's shared memory."""
        chunks, index = shared.arrays()
        return cls(chunks, shared.slot_bytes, index, shared.region_rows)


class KindBuilder(BatchBuilder, Protocol):
    """A kind's worker-side builder, made as `builder(CacheView, *args)` from what its description's
    `builder()` names: a `BatchBuilder` whose batches are laid out by `layout` (before any transform)."""

    layout: Layout

    def others(self, wid: int) -> Callable[[Any], Any] | None:
        """The handler of the messages other than decodes and gathers that worker `wid` is sent, if any."""
        ...


def start_worker(wid: int, reader: DatasetOpener, tables: list[str], shared: Shared, outputs: Layout | None,
                 transform: Callable | None, builder: type, args: tuple) -> BatchWorker:
    """A reader worker's message handler (see `loader.engine.read_worker`) whose batches `builder` builds; it opens
    the dataset in this process (no zarr handle is inherited)."""
    made: KindBuilder = builder(CacheView.of(shared), *args)
    return BatchWorker(wid, ChunkDecoder(reader, tables, shared), shared, made, transform, outputs,
                       made.layout.slot_bytes, others=made.others(wid))


def worker_of(source: BatchSource, shared: Shared, outputs: Layout | None,
              transform: Callable | None) -> tuple[Callable, tuple]:
    """`BatchSource.worker` of a kind: `start_worker` and its arguments."""
    builder, args = source.builder()
    return start_worker, (source.reader, source.tables, shared, outputs, transform, builder, args)


def probe_of(source: BatchSource, plan: EpochPlan, k: int) -> "ProbeBatch":
    """`BatchSource.probe_batch` of a kind: batch k of `plan`, made by its builder from plain reads of the
    chunks it reads, with the messages its workers would be sent."""
    reads = list(dict.fromkeys(source.batch_chunks(plan, k)))
    slots = {key: j for j, key in enumerate(reads)}
    windows = plan.group_windows(k, 1)
    # the windows batch k reads, region i the i-th, and the chunks it reads, slot j the j-th (a chunk of a window
    # that batch k does not read is not resident)
    resident = {w: ResidentWindow(i, tuple((t, c, slots[(t, c)]) for t, c in source.chunks_of(plan, w)
                                           if (t, c) in slots)) for i, w in enumerate(windows)}
    message = source.gather_message(plan, k, 1, resident)
    fills, region_rows = [], 0
    if source.uses_index:  # each window's order, over the cache rows of the chunks read (any slot for the rest)
        region_rows = max(int(plan.window_starts[w + 1] - plan.window_starts[w]) for w in windows)
        for region, w in enumerate(windows):
            window_slots = tuple(slots.get(key, 0) for key in source.chunks_of(plan, w))
            fills += [FillIndex(plan.epoch, w, region, window_slots, part) for part in plan.index_parts(w)]
    builder, args = source.builder()
    return ProbeBatch(source.dataset.location, source.dataset.commit, source.reader.check, reads,
                      source.chunk_bytes, region_rows * len(windows) if fills else 0, region_rows, fills, message,
                      k, builder, args)


@dataclass(frozen=True)
class ProbeBatch:
    """A picklable call that makes batch `k` in any process, as a worker does: the dataset opened again, the
    chunks `reads` read into slots 0.. of a private cache, the index `fills` handled, and `builder`
    building the batch of `message` into a private buffer; its columns, copied out (what a transform is given)."""

    location: Location
    commit: int | None
    check: ChunkCheck | None
    reads: list[tuple[str, int]]
    slot_bytes: int
    index_rows: int
    region_rows: int
    fills: list[FillIndex]
    message: GatherRows | GatherWindows
    k: int
    builder: type
    args: tuple

    def __call__(self) -> dict[str, np.ndarray]:
        S = self.slot_bytes
        chunks = np.zeros(max(len(self.reads), 1) * S, np.uint8)
        with Dataset.reopen(self.location, self.commit, self.check) as ds:
            for slot, (table, chunk) in enumerate(self.reads):
                n = ds[table].chunks[0]
                records = ds.read_rows(table, chunk * n, min((chunk + 1) * n, ds.rows[table]))
                chunks[slot * S:slot * S + records.nbytes] = records.view(np.uint8)
        cache = CacheView(chunks, S, np.zeros(self.index_rows, np.int64), self.region_rows)
        made: KindBuilder = self.builder(cache, *self.args)
        fill = made.others(0)
        for msg in self.fills:
            assert fill is not None  # (a kind whose windows need an index handles FillIndex)
            fill(msg)
        started = made.start(self.message)
        scratch = np.zeros(made.layout.slot_bytes, np.uint8)
        counts = made.build(scratch, self.message, self.k, started)
        return {name: view.copy() for name, view in made.views(scratch, started, self.k, counts).items()}
