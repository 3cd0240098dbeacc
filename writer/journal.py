"""Which input episodes are committed, as sorted disjoint index ranges (compact for ordered input)."""
from __future__ import annotations

import bisect
from typing import Iterable, Iterator


class IndexRanges:
    """A set of non-negative integers stored as sorted, disjoint, non-adjacent `[start, end)` ranges."""

    def __init__(self, ranges: Iterable[Iterable[int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in ranges:
            self.add_range(int(start), int(end))

    def add(self, index: int) -> None:
        self.add_range(index, index + 1)

    def add_range(self, start: int, end: int) -> None:
        if start >= end:
            return
        i = bisect.bisect_left(self._ends, start)  # first range that ends at or after `start`
        j = bisect.bisect_right(self._starts, end)  # ranges before j start at or before `end`
        if i < j:
            start, end = min(start, self._starts[i]), max(end, self._ends[j - 1])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def __contains__(self, index: int) -> bool:
        i = bisect.bisect_right(self._starts, index) - 1
        return i >= 0 and index < self._ends[i]

    def __iter__(self) -> Iterator[int]:
        for start, end in zip(self._starts, self._ends):
            yield from range(start, end)

    def __len__(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends))

    def to_json(self) -> list[list[int]]:
        return [[s, e] for s, e in zip(self._starts, self._ends)]

    def __repr__(self) -> str:
        return f"IndexRanges({self.to_json()})"
