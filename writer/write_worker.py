"""The writer worker: writes the segments it is sent from the shared blocks to the dataset's chunks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core._proc.pool import preload_in_workers
from ..core._proc.shm import SharedBlock
from ..core import dataset_format
from ..core.schema import Table
from ..core.location import Location
from ..core.zarr_array import Array
from .chunk_write import ChunkWrite, write_rows
from .lease import Fence

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool


@dataclass(frozen=True, slots=True)
class WriteSegment:
    """Write `rows` rows of `table` from shared block `block` at row `start` (segment `segment`)."""

    segment: int
    table: str
    start: int
    rows: int
    block: int


@dataclass(frozen=True, slots=True)
class SegmentWritten:
    """Segment `segment` is stored, as `writes` say (each chunk object stored, with its digest)."""

    worker: int
    segment: int
    writes: list[ChunkWrite]


def setup(wid: int, location: Location, tables: dict[str, Table], synchronizer: Any,
          blocks: list[SharedBlock], fence: Fence) -> Callable[[WriteSegment], SegmentWritten]:
    """Open the store in this process (no zarr handle is inherited; tables at first use); return the handler
    of `WriteSegment` messages. Every chunk write first checks the writer's lease `fence` (a writer paused
    past its lease stops here)."""
    store = location.store("w")
    arrays: dict[str, Array] = {}

    def handle(msg: WriteSegment) -> SegmentWritten:
        table = msg.table
        if table not in arrays:
            # opened at first use, not at start: on an object store the first request also builds the client
            # (a fraction of a second), which then overlaps the parent's filling of the next segment. The
            # parent made or checked the table: open it directly (zarr's checks are two more requests).
            arrays[table] = dataset_format.table_array(store, tables[table])
        rows = np.frombuffer(blocks[msg.block].buf, tables[table].dtype, count=msg.rows)
        return SegmentWritten(wid, msg.segment, write_rows(arrays[table], msg.start, rows, synchronizer,
                                                           lambda: fence.check(location), sync_later=True))

    return handle
