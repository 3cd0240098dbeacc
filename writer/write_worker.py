"""The writer worker: writes the segments it is sent from the shared blocks to the dataset's chunks."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import zarr

from ..core._proc.pool import preload_in_workers
from ..core._proc.shm import SharedBlock
from ..core.store import Location
from .chunk_write import write_rows
from .lease import Fence

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool


def setup(wid: int, location: Location, dtypes: dict[str, np.dtype], synchronizer: Any,
          blocks: list[SharedBlock], fence: Fence) -> Callable[[tuple], tuple]:
    """Open the store in this process (no zarr handle is inherited; tables at first use); return the handler.
    Every chunk write first checks the writer's lease `fence` (a writer paused past its lease stops here).

    A message is (segment id, table, first row, row count, block); the reply (done, worker, segment id, the
    `ChunkWrite`s of what was stored)."""
    store = location.store("w")
    arrays: dict[str, zarr.Array] = {}

    def handle(msg: tuple) -> tuple:
        seg_id, table, start, n, block = msg
        if table not in arrays:
            # opened at first use, not at start: on an object store the first request also builds the client
            # (a fraction of a second), which then overlaps the parent's filling of the next segment. The
            # parent made or checked the table: open it directly (zarr's checks are two more requests).
            arrays[table] = zarr.Array(store, path=table)
        rows = np.frombuffer(blocks[block].buf, dtypes[table], count=n)
        return ("done", wid, seg_id, write_rows(arrays[table], start, rows, synchronizer,
                                                lambda: fence.check(location)))

    return handle
