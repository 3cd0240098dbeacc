"""What a kind of batch tells the scheduler (`BatchSource`), and the source of row batches (`RowSource`).

The scheduler (`loader.scheduler`) knows nothing of rows or windows: it asks a source which chunks a window
of the plan reads, how big a cache slot is, whether windows need an index region, how to make the gather
message for a group of batches (given where the scheduler put the windows they read, as plain data:
`ResidentWindow`; a source never calls back into the scheduler), which worker to start and how to make one
batch in plain zarr (to size a transform's output). `RowSource` makes batches of one table's rows;
`loader.windows.WindowSource` makes L5Kit-style window samples.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Protocol, cast

import numpy as np

from ..core.chunk_check import ChunkCheck
from ..core.location import Location
from . import read_worker
from .chunk_cache import ChunkMemory
from .dataset import Dataset
from .layout import Layout
from .messages import GatherRows, GatherWindows
from .plan import EpochPlan, PlanConfig


@dataclass(frozen=True, slots=True)
class ResidentWindow:
    """Where the scheduler put a resident window: the index region holding its shuffled rows (None: the source
    uses no index), and the (table, chunk, cache slot) of each chunk it reads, in `chunks_of`'s order."""

    region: int | None
    chunks: tuple[tuple[str, int, int], ...]


class BatchSource(Protocol):
    """A kind of batch, as the scheduler sees it."""

    dataset: Dataset
    kind: str  # the loader's name in its resume state
    table: str  # the table named in messages about it
    config: PlanConfig  # the plan's settings (a loader that follows torch.distributed's ranks replaces it)
    selection: list[np.ndarray] | None  # the plan's rows per chunk (None: all)
    layout: Layout  # a batch in its ring slot, before any transform
    uses_index: bool  # whether a resident window needs an index region
    rows_column: str | None  # the batch column whose length is the batch's rows (None: the first)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one cache slot."""
        ...

    def rows_touched(self) -> int:
        """Rows a batch copies (for sizing groups of batches per message)."""
        ...

    def worker_bytes(self) -> int:
        """Memory each worker holds of its own for the largest window (beyond the shared decoded chunks)."""
        ...

    def chunks_of(self, plan: EpochPlan, window: int) -> list[tuple[str, int]]:
        """The (table, chunk) a window of the plan reads."""
        ...

    def gather_message(self, plan: EpochPlan, first: int, count: int,
                       windows: dict[int, ResidentWindow]) -> GatherRows | GatherWindows:
        """The message that makes batches [first, first + count), which read `windows` (each resident)."""
        ...

    def shared(self, chunks: ChunkMemory, batch_bytes: int, n_slots: int,
               regions: int) -> read_worker.Shared:
        """The shared memory of one run: its decoded chunks, index and ring."""
        ...

    def worker(self, shared: read_worker.Shared, outputs: Layout | None,
               transform: Callable | None) -> tuple[Callable, tuple]:
        """The worker's setup function and its arguments."""
        ...

    def probe_batch(self, plan: EpochPlan, k: int) -> Callable[[], dict[str, np.ndarray]]:
        """A picklable call that makes batch k with plain zarr, in any process."""
        ...

    def settings(self) -> dict[str, Any]:
        """What decides the batch order, for the resume state."""
        ...

    def with_config(self, config: PlanConfig) -> "BatchSource":
        """This source with another plan configuration (sources do not change: a loader takes a new one)."""
        ...

    def selection_parts(self) -> list[np.ndarray] | None:
        """What the resume state's selection digest is computed from."""
        ...


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

    def rows_touched(self) -> int:
        return self.config.batch_size

    def with_config(self, config: PlanConfig) -> "RowSource":
        return dataclasses.replace(self, config=config)

    def worker_bytes(self) -> int:
        return 0

    def chunks_of(self, plan: EpochPlan, window: int) -> list[tuple[str, int]]:
        return [(self.table, int(c)) for c in plan.windows[window]]

    def gather_message(self, plan: EpochPlan, first: int, count: int,
                       windows: dict[int, ResidentWindow]) -> GatherRows:
        regions = {w: cast(int, where.region) for w, where in windows.items()}  # (it uses the index)
        return GatherRows(plan.epoch, first, count, regions, plan.resumed_spans)

    def shared(self, chunks: ChunkMemory, batch_bytes: int, n_slots: int,
               regions: int) -> read_worker.Shared:
        c = self.config
        return read_worker.Shared(chunks, c.window * c.chunk_rows, regions, batch_bytes, n_slots)

    def worker(self, shared: read_worker.Shared, outputs: Layout | None,
               transform: Callable | None) -> tuple[Callable, tuple]:
        return read_worker.setup, (self.reader, self.table, shared, self.config, self.itemsize, self.selection,
                                   self.layout, outputs, transform)

    def probe_batch(self, plan: EpochPlan, k: int) -> Callable[[], dict[str, np.ndarray]]:
        return functools.partial(_read_rows, self.dataset.location, self.dataset.commit, self.reader.check,
                                 self.table, [col.name for col in self.layout.columns], plan.batch_row_ids(k))

    def settings(self) -> dict[str, Any]:
        return plan_settings(self.table, self.config)

    def selection_parts(self) -> list[np.ndarray] | None:
        return self.selection


def plan_settings(table: str, config: PlanConfig) -> dict[str, Any]:
    """The settings that decide a plan's batch order, as a resume state records them."""
    c = config
    return {"table": table, "table_rows": c.n_rows, "chunk_rows": c.chunk_rows, "batch_size": c.batch_size,
            "shuffle": c.shuffling.shuffle, "seed": c.shuffling.seed, "shuffle_window": c.window,
            "rank": c.shard.rank, "world_size": c.shard.world_size, "drop_last": c.shard.drop_last}


def _read_rows(location: Location, commit: int | None, check: ChunkCheck | None, table: str, fields: list[str],
               rows: np.ndarray) -> dict[str, np.ndarray]:
    records = Dataset.reopen(location, commit, check).read_coordinates(table, rows)
    return {n: np.ascontiguousarray(records[n]) for n in fields}
