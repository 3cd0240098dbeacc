"""The reader worker: prepares windows (shuffled row order + decoded chunks) and gathers batches.

Messages (all small; the worker computes the plan itself from the settings it was started with):
  ("window", epoch, window, window slot)   -> ("window", worker, window)      the window's shuffled rows,
                                                                              as cache rows, into the index
  ("decode", chunk, cache chunk)           -> ("decoded", worker, cache chunk) the chunk into the cache
  ("gather", epoch, first batch, count, {window: window slot}) -> ("gathered", worker, first batch, count)
                                                  or, if the transform fails, ("failed", worker, first batch,
                                                  failed batch, traceback)
A gather copies, for each batch row, the cache row the index names into the batch's ring slot, one column
per field, in one pass (`_gather.gather`). With a transform, rows are gathered into a private buffer, the
transform runs on views of it, and only its outputs are copied into the slot.
"""
from __future__ import annotations

import traceback
from typing import Callable

import numpy as np

from writer import format
from writer.chunkio import read_chunk_into
from writer.shm import SharedBlock, check_room

from ._gather import gather
from .layout import Layout
from .plan import EpochPlan, PlanConfig


class Shared:
    """The shared memory of one Loader: chunk cache, index of cache rows, ring of batch slots."""

    def __init__(self, config: PlanConfig, itemsize: int, window_slots: int, slot_bytes: int, n_slots: int) -> None:
        self.config, self.itemsize = config, itemsize
        self.window_slots, self.slot_bytes, self.n_slots = window_slots, slot_bytes, n_slots
        self.window_rows = config.shuffle_window * config.chunk_rows
        cache_rows = window_slots * self.window_rows
        check_room(cache_rows * (itemsize + 8) + n_slots * slot_bytes,
                   f"the loader's chunk cache ({window_slots} windows of {config.shuffle_window} chunks) and "
                   f"ring ({n_slots} batch slots)")
        self.cache = SharedBlock(cache_rows * itemsize)
        self.index = SharedBlock(cache_rows * 8)
        self.ring = SharedBlock(n_slots * slot_bytes)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.frombuffer(self.cache.buf, np.uint8), np.frombuffer(self.index.buf, np.int64)

    def slot(self, k: int) -> memoryview:
        s = k % self.n_slots
        return self.ring.buf[s * self.slot_bytes:(s + 1) * self.slot_bytes]

    def close(self) -> None:
        for block in (self.cache, self.index, self.ring):
            block.close()


def setup(wid: int, location: str, table: str, shared: Shared, selection: list[np.ndarray] | None,
          records: Layout, outputs: Layout | None, transform: Callable | None) -> Callable[[tuple], tuple]:
    """Open the dataset in this process (no zarr handle is inherited); return the message handler."""
    group = format.open_group(location)
    array = format.open_table(group.store, table)
    chunk_bytes = shared.config.chunk_rows * shared.itemsize
    cache, index = shared.arrays()
    spec = records.gather_spec()
    scratch = np.empty(records.slot_bytes, np.uint8) if transform else None
    plans: dict[int, EpochPlan] = {}

    def plan(epoch: int) -> EpochPlan:
        if epoch not in plans:
            plans.clear()
            plans[epoch] = EpochPlan(shared.config, epoch, selection)
        return plans[epoch]

    def handle(msg: tuple) -> tuple:
        kind = msg[0]
        if kind == "decode":
            _, chunk, cache_chunk = msg
            read_chunk_into(array, chunk, cache[cache_chunk * chunk_bytes:(cache_chunk + 1) * chunk_bytes])
            return ("decoded", wid, cache_chunk)
        if kind == "window":
            _, epoch, w, wslot = msg
            order = plan(epoch).window_order(w)
            start = wslot * shared.window_rows
            np.add(order, start, out=index[start:start + len(order)])
            return ("window", wid, w)
        _, epoch, k0, count, wslots = msg
        p = plan(epoch)
        pieces = p.group_pieces(k0, count)
        for i in range(count):
            k = k0 + i
            dst = scratch if transform else shared.slot(k)
            for _, first, w, pos, n in pieces[pieces[:, 0] == i] if count > 1 else pieces:
                start = wslots[w] * shared.window_rows + pos
                gather(cache, shared.itemsize, index[start:start + n], dst, spec, first)
            if transform:
                try:
                    rows = p.batch_rows(k)
                    out = transform(records.views(scratch, rows))
                    outputs.check(out, k, rows)
                except Exception:  # the user's code: report which batch, keep serving
                    return ("failed", wid, k0, k, traceback.format_exc())
                for name, view in outputs.views(shared.slot(k), rows).items():
                    view[...] = out[name]
        return ("gathered", wid, k0, count)

    return handle
