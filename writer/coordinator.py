"""Coordinators hand out row ranges: one reservation per episode, atomically for all of its tables.

The writer relocates an episode's intervals with the offsets it is given, so any coordinator that never
hands out the same rows twice keeps every interval right. `LocalCoordinator` serves one writer process; a
cluster version (for example a counter behind `distributed.Lock`) implements the same method, and the
writing code handles reservations that are not contiguous (their shared chunks are written under the lock).
"""
from __future__ import annotations

from typing import Mapping, Protocol


class Coordinator(Protocol):
    """What `DatasetWriter(coordinator=...)` takes: anything that reserves rows, never the same rows twice."""

    def reserve(self, rows: Mapping[str, int]) -> dict[str, int]:
        """Reserve `rows[t]` rows in every table t; return the first reserved row of each."""
        ...


class LocalCoordinator:
    """Appends in submission order from the given starting rows.

    Args:
        start: Each table's first row to place episodes at (its committed rows).
    """

    def __init__(self, start: Mapping[str, int]) -> None:
        self.next = dict(start)

    def reserve(self, rows: Mapping[str, int]) -> dict[str, int]:
        """Reserve `rows[t]` rows in every table t right after the last reservation; return the first reserved
        row of each."""
        offsets = {t: self.next[t] for t in rows}
        for t, n in rows.items():
            self.next[t] += n
        return offsets
