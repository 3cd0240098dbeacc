"""The writer's segment buffers: shared memory that episodes' rows are copied into, a segment at a time.

A segment is a run of consecutive rows of one table, held in one shared-memory block until a writer worker
has stored it. Each table has at most one segment open (being filled); a full one, or one the writer flushes,
is sent to a worker and stays in flight until the worker says it is stored, when its block is free again.
A segment ends on a chunk boundary where it can, so that its whole chunks have no other writer (only the
chunks at its two ends may be shared with the segments before and after it, under the chunk locks); in a
sharded (zarr v3) table on a shard boundary, for the same reason: a shard is one object, written whole. The
blocks are made once, when the writer opens, and given to the workers when they start: rows then cross from
the parent to a worker without a copy through a pipe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..core._proc.shm import SharedBlock, check_room
from ..core.schema import Table


@dataclass(slots=True)
class RowSegment:
    """Rows [start, start + n) of `table`, in block `block` (room for `capacity` rows); `worker` and `sent`: to
    whom and when it was sent (None and 0 until then)."""

    id: int
    table: str
    start: int
    capacity: int
    block: int
    n: int = 0
    worker: int | None = None
    sent: float = 0.0

    @property
    def end(self) -> int:
        return self.start + self.n


class SegmentBuffers:
    """`n_blocks` shared-memory blocks of `block_bytes` each, and the segments using them (see the module)."""

    def __init__(self, tables: Mapping[str, Table], n_blocks: int, block_bytes: int,
                 align: Mapping[str, int] | None = None) -> None:
        check_room(n_blocks * block_bytes, f"the writer's {n_blocks} segment buffers")
        self.tables = dict(tables)
        # rows a segment ends on a multiple of: the table's chunk rows, or its shard rows
        self.align = {t: (align or {}).get(t, tables[t].chunk_rows) for t in tables}
        self.block_bytes = block_bytes
        self.blocks: list[SharedBlock] = []
        try:
            for _ in range(n_blocks):
                self.blocks.append(SharedBlock(block_bytes))
        except BaseException:
            self.close()
            raise
        self._bytes = [np.frombuffer(b.buf, np.uint8) for b in self.blocks]
        self._free = list(range(n_blocks))[::-1]
        self._open: dict[str, RowSegment | None] = {t: None for t in self.tables}
        self.in_flight: dict[int, RowSegment] = {}  # by id: sent to a worker, not yet stored
        self._ids = 0

    def open_segment(self, table: str) -> RowSegment | None:
        """The segment of `table` being filled, if any."""
        return self._open[table]

    def has_free_block(self) -> bool:
        return bool(self._free)

    def begin(self, table: str, start: int) -> RowSegment:
        """Open a segment of `table` at row `start` in a free block (there must be one: see `has_free_block`).
        It ends at the last chunk boundary the block can hold, or where the block is full if that is none."""
        rows = self.align[table]
        fits = self.block_bytes // self.tables[table].dtype.itemsize
        end = (start + fits) // rows * rows
        seg = RowSegment(self._ids, table, start, (end if end > start else start + fits) - start, self._free.pop())
        self._ids += 1
        self._open[table] = seg
        return seg

    def fill(self, seg: RowSegment, rows: np.ndarray) -> int:
        """Copy as many of `rows` (records of the segment's table, contiguous) as `seg` has room for; return
        how many. Bytes, not records: a uint8 copy runs at memcpy speed, a structured one far slower."""
        take = min(seg.capacity - seg.n, len(rows))
        size = rows.dtype.itemsize
        self._bytes[seg.block][seg.n * size:(seg.n + take) * size] = rows[:take].view(np.uint8).reshape(-1)
        seg.n += take
        return take

    def is_full(self, seg: RowSegment) -> bool:
        return seg.n == seg.capacity

    def end(self, table: str) -> RowSegment | None:
        """Close the open segment of `table`: returned to be sent if it holds rows (it is then in flight);
        an empty one gives its block back (None)."""
        seg, self._open[table] = self._open[table], None
        if seg is None:
            return None
        if seg.n == 0:
            self._free.append(seg.block)
            return None
        self.in_flight[seg.id] = seg
        return seg

    def rows(self, seg: RowSegment) -> np.ndarray:
        """The segment's rows, a view of its block (for a writer with no workers, which stores them itself)."""
        return np.frombuffer(self.blocks[seg.block].buf, self.tables[seg.table].dtype, count=seg.n)

    def stored(self, seg_id: int) -> RowSegment:
        """Segment `seg_id` is stored: its block is free again."""
        seg = self.in_flight.pop(seg_id)
        self._free.append(seg.block)
        return seg

    def close(self) -> None:
        """Free the shared memory (once no process maps it)."""
        self._bytes = []
        for b in self.blocks:
            b.close()
        self.blocks = []
