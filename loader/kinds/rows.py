"""Batches of one table's rows, `Loader`'s (`loader.loader`): the rows' description (`RowSource`) and their
builder (`RowBuilder`).

A window's shuffled rows, as cache rows, are written into an index region (`FillIndex`, in parts that
workers make at once); a batch is gathered through that index from the decoded chunks, one column per field,
in one pass (`_gather.gather`).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, cast

import numpy as np

from ...core._proc.pool import preload_in_workers
from ..engine import read_worker
from ..caches.chunk_cache import ChunkMemory
from ..dataset import Dataset
from ..engine.gather import gather
from .base import CacheView, ProbeBatch, probe_of, worker_of
from ..engine.layout import Layout
from ..engine.messages import FillIndex, GatherRows, IndexFilled
from ..ordering.plan import EpochPlan, PlanConfig, WorkerPlans
from .source import ResidentWindow, plan_settings

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool


class RowBuilder:
    """Rows of one table, gathered from the decoded chunks through the index that `FillIndex` wrote (each
    window's shuffled rows, as cache rows), one column per field of `layout`, in one pass."""

    def __init__(self, cache: CacheView, config: PlanConfig, selection: list[np.ndarray] | None, layout: Layout,
                 itemsize: int) -> None:
        self.cache, self.index, self.region_rows = cache.chunks, cache.index, cache.region_rows
        self.plans, self.chunk_rows = WorkerPlans(config, selection), config.chunk_rows
        self.layout, self.itemsize = layout, itemsize
        self.spec = layout.gather_spec()

    def others(self, wid: int) -> Callable[[Any], Any]:
        """`FillIndex`, answered `IndexFilled` by worker `wid`."""
        return functools.partial(self.fill_index, wid)

    def fill_index(self, wid: int, msg: FillIndex) -> IndexFilled:
        """The shuffled rows of the window (or its part), as cache rows (slot * chunk_rows + r), into its index
        region, made in place."""
        start = msg.region * self.region_rows
        self.plans.get(msg.epoch).plan.fill_order(self.index[start:start + self.region_rows], msg.window,
                                                  np.asarray(msg.slots, np.int64) * self.chunk_rows, msg.part)
        return IndexFilled(wid, msg.window, msg.part)

    def start(self, msg: GatherRows) -> tuple[Any, list]:
        """The epoch's plan, and the pieces of each batch of the message (index ranges to gather)."""
        plan = self.plans.get(msg.epoch, msg.spans).plan
        regions, region_rows = msg.regions, self.region_rows
        by_batch: list[list[tuple[int, int, int]]] = [[] for _ in range(msg.count)]
        for piece in plan.group_pieces(msg.first, msg.count):
            start = regions[piece.window] * region_rows + piece.position
            by_batch[piece.batch].append((piece.row, start, start + piece.rows))
        return plan, by_batch

    def build(self, dst: Any, msg: GatherRows, k: int, started: tuple[Any, list]) -> None:
        cache, index, spec, size = self.cache, self.index, self.spec, self.itemsize
        for first, start, end in started[1][k - msg.first]:
            gather(cache, size, index[start:end], dst, spec, first, size)

    def views(self, scratch: np.ndarray, started: tuple[Any, list], k: int, counts: dict[str, int] | None) -> Any:
        return self.layout.views(scratch, started[0].batch_rows(k))

    def rows(self, started: tuple[Any, list], k: int) -> int:
        return started[0].batch_rows(k)


@dataclass
class RowSource:
    """Batches of `table`'s rows (the columns of `layout`), gathered from the index of shuffled cache rows."""

    dataset: Dataset
    table: str
    config: PlanConfig
    selection: list[np.ndarray] | None
    layout: Layout
    reader: read_worker.DatasetOpener
    kind: str = "Loader"
    uses_index: bool = True
    rows_column: str | None = None

    @property
    def itemsize(self) -> int:
        return self.dataset[self.table].dtype.itemsize

    @property
    def chunk_bytes(self) -> int:
        return self.config.chunk_rows * self.itemsize

    @property
    def tables(self) -> list[str]:
        return [self.table]

    def rows_touched(self) -> int:
        return self.config.batch_size

    def with_config(self, config: PlanConfig) -> "RowSource":
        return dataclasses.replace(self, config=config)

    def worker_bytes(self) -> int:
        return 0

    def chunks_of(self, plan: EpochPlan, window: int) -> list[tuple[str, int]]:
        return [(self.table, int(c)) for c in plan.windows[window]]

    def batch_chunks(self, plan: EpochPlan, k: int) -> list[tuple[str, int]]:
        return [(self.table, int(c)) for c in np.unique(plan.batch_row_ids(k) // self.config.chunk_rows)]

    def gather_message(self, plan: EpochPlan, first: int, count: int,
                       windows: dict[int, ResidentWindow]) -> GatherRows:
        regions = {w: cast(int, where.region) for w, where in windows.items()}  # (it uses the index)
        return GatherRows(plan.epoch, first, count, regions, plan.resumed_spans)

    def shared(self, chunks: ChunkMemory, batch_bytes: int, n_slots: int,
               regions: int) -> read_worker.Shared:
        c = self.config
        return read_worker.Shared(chunks, c.window * c.chunk_rows, regions, batch_bytes, n_slots)

    def builder(self) -> tuple[type, tuple]:
        return RowBuilder, (self.config, self.selection, self.layout, self.itemsize)

    def worker(self, shared: read_worker.Shared, outputs: Layout | None,
               transform: Callable | None) -> tuple[Callable, tuple]:
        return worker_of(self, shared, outputs, transform)

    def probe_batch(self, plan: EpochPlan, k: int) -> ProbeBatch:
        return probe_of(self, plan, k)

    def settings(self) -> dict[str, Any]:
        return plan_settings(self.table, self.config)

    def selection_parts(self) -> list[np.ndarray] | None:
        return self.selection
