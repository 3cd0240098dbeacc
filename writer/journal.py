"""Which episodes are committed: index ranges for positional keys, sets for the caller's keys."""
from __future__ import annotations

import bisect
from typing import Any, Iterable, Iterator

from ..core.keys import Key, Position, key_from_json, key_to_json


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

    Positional keys are kept per input as index ranges (compact for ordered input) and travel in the manifest.
    The caller's keys are sets in memory; in the store they live in the commit log (`commit_log`): each commit
    writes only the keys it adds (`take_new`), so a commit costs the same after a million keyed episodes as
    after one. `pending` maps a submitted, uncommitted key to its episode's fingerprint, so a resume can check
    that it is given the same episode again.
    """

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[IndexRanges, IndexRanges]] = {}  # fingerprint -> (committed, skipped)
        self.keys: tuple[set, set] = (set(), set())  # caller's keys: (committed, skipped)
        self.pending: dict[Key, str] = {}
        self.last_input: str | None = None  # the input of the latest ingest
        self.legacy = False  # the manifest numbered episodes before keys existed: no input can be matched
        self._new: tuple[list, list] = ([], [])  # caller's keys committed, skipped since the last take_new()

    def known_input(self, input_id: str) -> bool:
        return input_id in self.inputs

    def other_input(self, input_id: str) -> str | None:
        """The input recorded last ("unknown" if that cannot be told), when inputs are recorded and `input_id` is
        not one of them: an ingest of `input_id` cannot be a resumed one. None otherwise."""
        if self.known_input(input_id) or not (self.inputs or self.legacy):
            return None
        return self.last_input or "unknown"

    def add_input(self, input_id: str) -> None:
        self.inputs.setdefault(input_id, (IndexRanges(), IndexRanges()))

    def done(self, key: Key) -> bool:
        """Committed or skipped."""
        if isinstance(key, Position):
            sets = self.inputs.get(key.input)
            return sets is not None and (key.index in sets[0] or key.index in sets[1])
        return key in self.keys[0] or key in self.keys[1]

    def commit(self, key: Key) -> None:
        self._record(key, 0)

    def skip(self, key: Key) -> None:
        self._record(key, 1)

    def _record(self, key: Key, part: int) -> None:
        if isinstance(key, Position):
            self.add_input(key.input)
            self.inputs[key.input][part].add(key.index)
        elif key not in self.keys[part]:
            self.keys[part].add(key)
            self._new[part].append(key)
        self.pending.pop(key, None)

    def take_new(self) -> tuple[list, list]:
        """The caller's keys committed and skipped since the last call (for the next commit's log segment)."""
        new, self._new = self._new, ([], [])
        return new

    def give_back(self, new: tuple[list, list]) -> None:
        """Undo `take_new` (the commit that would have carried them failed)."""
        self._new = (new[0] + self._new[0], new[1] + self._new[1])

    def committed_count(self) -> int:
        return sum(len(c) for c, _ in self.inputs.values()) + len(self.keys[0])

    def to_json(self) -> dict[str, Any]:
        """The part kept in the manifest (the caller's keys are in the commit log)."""
        return {
            "inputs": {i: {"committed": c.to_json(), "skipped": s.to_json()} for i, (c, s) in self.inputs.items()},
            "pending": [[key_to_json(k), digest] for k, digest in self.pending.items()],
            "last_input": self.last_input,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None, committed: Iterable[Key] = (), skipped: Iterable[Key] = ()
                  ) -> "Journal":
        """A journal from a manifest's part and the caller's keys from the commit log. A manifest of format 2
        kept the caller's keys inline: they are read, and written to the log at the next commit. One written
        before keys existed (numbered input only) starts empty."""
        j = cls()
        doc = doc or {}
        for input_id, sets in doc.get("inputs", {}).items():
            j.inputs[input_id] = (IndexRanges(sets.get("committed", [])), IndexRanges(sets.get("skipped", [])))
        j.keys = (set(committed), set(skipped))
        inline = doc.get("keys", {})
        for part, name in enumerate(("committed", "skipped")):
            for key in inline.get(name, []):
                if key not in j.keys[part]:
                    j.keys[part].add(key)
                    j._new[part].append(key)
        j.pending = {key_from_json(k): digest for k, digest in doc.get("pending", [])}
        j.last_input = doc.get("last_input")
        j.legacy = bool(doc.get("committed"))  # a journal of version 1: {"committed": ranges, "skipped": ranges}
        return j
