"""Which episodes are committed: index ranges for positional keys, sets for the caller's keys."""
from __future__ import annotations

import bisect
from typing import Any, Iterable, Iterator

from .keys import Key, Position, key_from_json, key_to_json


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
        for start, end in zip(self._starts, self._ends, strict=True):
            yield from range(start, end)

    def __len__(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    def to_json(self) -> list[list[int]]:
        return [[s, e] for s, e in zip(self._starts, self._ends, strict=True)]

    def __repr__(self) -> str:
        return f"IndexRanges({self.to_json()})"


class Journal:
    """Which episode keys are committed or skipped, and which were submitted but not yet committed.

    Positional keys are kept per input as index ranges (compact for ordered input); the caller's keys as sets.
    `pending` maps a submitted, uncommitted key to its episode's fingerprint, so a resume can check that it is
    given the same episode again. It all travels in the manifest, written in one piece at each commit.
    """

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[IndexRanges, IndexRanges]] = {}  # fingerprint -> (committed, skipped)
        self.keys: tuple[set, set] = (set(), set())  # caller's keys: (committed, skipped)
        self.pending: dict[Key, str] = {}
        self.last_input: str | None = None  # the input of the latest ingest
        self.legacy = False  # the manifest numbered episodes before keys existed: no input can be matched

    def known_input(self, input_id: str) -> bool:
        return input_id in self.inputs

    def add_input(self, input_id: str) -> None:
        self.inputs.setdefault(input_id, (IndexRanges(), IndexRanges()))

    def _sets(self, key: Key) -> tuple[Any, Any]:
        if isinstance(key, Position):
            self.add_input(key.input)
            return self.inputs[key.input]
        return self.keys

    def done(self, key: Key) -> bool:
        """Committed or skipped."""
        if isinstance(key, Position):
            sets = self.inputs.get(key.input)
            return sets is not None and (key.index in sets[0] or key.index in sets[1])
        return key in self.keys[0] or key in self.keys[1]

    def commit(self, key: Key) -> None:
        committed, _ = self._sets(key)
        committed.add(key.index if isinstance(key, Position) else key)
        self.pending.pop(key, None)

    def skip(self, key: Key) -> None:
        _, skipped = self._sets(key)
        skipped.add(key.index if isinstance(key, Position) else key)
        self.pending.pop(key, None)

    def committed_count(self) -> int:
        return sum(len(c) for c, _ in self.inputs.values()) + len(self.keys[0])

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": {i: {"committed": c.to_json(), "skipped": s.to_json()} for i, (c, s) in self.inputs.items()},
            "keys": {"committed": sorted(self.keys[0], key=repr), "skipped": sorted(self.keys[1], key=repr)},
            "pending": [[key_to_json(k), digest] for k, digest in self.pending.items()],
            "last_input": self.last_input,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> "Journal":
        """A journal from a manifest; one written before keys existed (numbered input only) starts empty."""
        j = cls()
        doc = doc or {}
        for input_id, sets in doc.get("inputs", {}).items():
            j.inputs[input_id] = (IndexRanges(sets.get("committed", [])), IndexRanges(sets.get("skipped", [])))
        keys = doc.get("keys", {})
        j.keys = (set(keys.get("committed", [])), set(keys.get("skipped", [])))
        j.pending = {key_from_json(k): digest for k, digest in doc.get("pending", [])}
        j.last_input = doc.get("last_input")
        j.legacy = bool(doc.get("committed"))  # a journal of version 1: {"committed": ranges, "skipped": ranges}
        return j
