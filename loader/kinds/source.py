"""What a kind of batch tells the scheduler (`BatchSource`), and the settings every kind's resume state holds.

The scheduler (`loader.engine.scheduler`) knows nothing of rows or windows: it asks a source which chunks a window
of the plan reads, how big a cache slot is, whether windows need an index region, how to make the gather
message for a group of batches (given where the scheduler put the windows they read, as plain data:
`ResidentWindow`; a source never calls back into the scheduler), which worker to start and how to make one
batch in any process (to size a transform's output). Each kind of batch is a module (`loader.kinds.base`):
`loader.kinds.rows.RowSource` makes batches of one table's rows, `loader.kinds.windows.WindowSource` L5Kit-style window
samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from ..engine import read_worker
from ..caches.chunk_cache import ChunkMemory
from ..dataset import Dataset
from ..engine.layout import Layout
from ..engine.messages import GatherRows, GatherWindows
from ..ordering.plan import EpochPlan, PlanConfig


@dataclass(frozen=True)
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
        """The message that makes batches [first, first + count), which read `windows`."""
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
        """A picklable call that makes batch k in any process, as the workers make it (`kinds.ProbeBatch`)."""
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

    # what its worker and its probe are made from (`loader.kinds.base`)
    reader: read_worker.DatasetOpener  # how a worker opens the dataset and fetches from it

    @property
    def tables(self) -> list[str]:
        """The tables whose chunks its workers decode."""
        ...

    def builder(self) -> tuple[type, tuple]:
        """The class of its worker-side builder (a `kinds.KindBuilder`) and the arguments after the
        `kinds.CacheView` it is made with (sent to every worker: picklable)."""
        ...

    def batch_chunks(self, plan: EpochPlan, k: int) -> list[tuple[str, int]]:
        """The (table, chunk) batch k of `plan` reads (what its probe reads)."""
        ...


def plan_settings(table: str, config: PlanConfig) -> dict[str, Any]:
    """The settings that decide a plan's batch order, as a resume state records them."""
    c = config
    return {"table": table, "table_rows": c.n_rows, "chunk_rows": c.chunk_rows, "batch_size": c.batch_size,
            "shuffle": c.shuffling.shuffle, "seed": c.shuffling.seed, "shuffle_window": c.window,
            "rank": c.shard.rank, "world_size": c.shard.world_size, "drop_last": c.shard.drop_last}
