"""The writer worker: writes the segments it is sent from the shared blocks to the dataset's chunks."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import zarr

from .chunkio import write_rows
from .shm import SharedBlock
from .store import Location


def setup(wid: int, location: Location, dtypes: dict[str, np.dtype], synchronizer: Any,
          blocks: list[SharedBlock]) -> Callable[[tuple], tuple]:
    """Open the dataset in this process (no zarr handle is inherited); return the message handler.

    A message is (segment id, table, first row, row count, block); the reply (done, worker, segment id,
    chunks that needed the lock)."""
    store = location.store("w")
    arrays = {t: zarr.open_array(store, mode="r+", path=t) for t in dtypes}
    locked = {t: zarr.open_array(store, mode="r+", path=t, synchronizer=synchronizer, cache_metadata=False)
              for t in dtypes}

    def handle(msg: tuple) -> tuple:
        seg_id, table, start, n, block = msg
        rows = np.frombuffer(blocks[block].buf, dtypes[table], count=n)
        shared = write_rows(arrays[table], locked[table], start, rows)
        return ("done", wid, seg_id, shared)

    return handle
