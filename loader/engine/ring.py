"""The ring of batch slots: where workers write batches and the training loop reads them.

Batch k of an epoch is written into slot `k % n_slots` of one shared-memory block (`RingMemory`, mapped by
every worker). While the loop holds batch k, the slots of batches before it are free again, so batches
[k, k + n_slots) may be written (`Ring.end`); a batch's columns are views into its slot (`Ring.batch`), and
they are handed to the user as views valid until the next batch, owned copies, or views that fault when used
late (`Handout`). The scheduler and the `Loader` use these methods; nothing else reads the ring's memory.
"""
from __future__ import annotations

import numpy as np

from ...core._proc.shm import SharedBlock
from . import view_check
from .layout import Layout


class RingMemory:
    """`n_slots` batch slots of `batch_bytes` in shared memory: what a worker writes batch k into (picklable: a
    worker maps the same memory)."""

    def __init__(self, batch_bytes: int, n_slots: int) -> None:
        self.batch_bytes, self.n_slots = batch_bytes, n_slots
        self.block = SharedBlock(batch_bytes * n_slots)

    def slot(self, k: int) -> memoryview:
        """The ring slot of batch k."""
        s = k % self.n_slots
        return self.block.buf[s * self.batch_bytes:(s + 1) * self.batch_bytes]

    def close(self) -> None:
        self.block.close()


class Ring:
    """The consumer's side of a ring: which batches may be written while one is held, and a batch's columns
    as views of its slot (`layout`, batches of `batch_size` rows)."""

    def __init__(self, memory: RingMemory, layout: Layout, batch_size: int) -> None:
        self.memory, self.layout, self.batch_size = memory, layout, batch_size
        self._views: dict[int, dict[str, np.ndarray]] = {}  # see _slot_views

    @property
    def n_slots(self) -> int:
        return self.memory.n_slots

    def end(self, held: int) -> int:
        """The first batch that may not be written while batch `held` is handed out (its slot is `held`'s)."""
        return held + self.n_slots

    def has_room(self, first: int, count: int, held: int) -> bool:
        """Whether batches [first, first + count) may be written while batch `held` is handed out."""
        return first + count <= self.end(held)

    def batch(self, k: int, rows: int, counts: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        """Batch k's `rows` rows as views into its slot; `counts`: the rows of each ragged column, if any."""
        if counts:
            return self.layout.views(self.memory.slot(k), rows, counts)
        views = self._slot_views(k % self.n_slots)
        return dict(views) if rows == self.batch_size else {f: v[:rows] for f, v in views.items()}

    def _slot_views(self, s: int) -> dict[str, np.ndarray]:
        """Slot s's columns as views of a whole batch, made at the slot's first use and kept: a ring of small
        batches has tens of thousands of slots (3 groups of 32,768 rows), most never used by a short epoch, and
        making them all took most of a small loader's start."""
        views = self._views.get(s)
        if views is None:
            views = self._views[s] = self.layout.views(self.memory.slot(s), self.batch_size)
        return views

    def close(self) -> None:
        """Drop the views (the memory is closed by whoever made it: `read_worker.Shared`)."""
        self._views = {}


class Handout:
    """How a loop hands batches to the user: the ring's views, valid until the next batch is asked for
    (default); owned copies (`copy`); or, to find views used too late, copies that fault when touched after the
    next batch is asked for (`check`, see `loader.engine.view_check`). `close` when the loop ends."""

    def __init__(self, copy: bool, check: bool) -> None:
        self.copy = copy
        self.checker = view_check.ViewChecker() if check and not copy else None

    def give(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`batch` (views into the ring) as the user gets it."""
        if self.copy:
            return {n: a.copy() for n, a in batch.items()}
        if self.checker is not None:
            return self.checker.hand_out(batch)
        return batch

    def close(self) -> None:
        """The loop ended: the last batch's checked views fault from now on too."""
        if self.checker is not None:
            self.checker.seal()
