"""What the committer tracks between commits: which rows are durable, and so which episodes commit
(`CommitTracker`), and which bytes each chunk holds (`ChunkDigests`).

An episode is committed once all of its rows, in every table, are durable.

Segments of a table finish out of order (several workers); a table's durable prefix ends where the first
unfinished segment starts. Episodes commit in the order they were placed, so committed row counts always end
on an episode boundary and every interval below them points at durable rows.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Mapping

from ..core.commit_log import ChunkRecord
from ..core.keys import Key
from .chunk_write import ChunkWrite


class CommitTracker:
    def __init__(self, committed: Mapping[str, int]) -> None:
        self.committed = dict(committed)  # rows per table, at an episode boundary
        self.durable = dict(committed)    # rows per table below which every row is written
        self._finished: dict[str, dict[int, int]] = {t: {} for t in committed}  # start -> end, past `durable`
        self._episodes: deque[tuple[Key, dict[str, int], dict[str, int]]] = deque()  # (key, starts, ends)

    def add_episode(self, key: Key, starts: Mapping[str, int], ends: Mapping[str, int]) -> None:
        self._episodes.append((key, dict(starts), dict(ends)))

    def segment_done(self, table: str, start: int, end: int) -> None:
        finished = self._finished[table]
        finished[start] = end
        while self.durable[table] in finished:
            self.durable[table] = finished.pop(self.durable[table])

    def advance(self) -> list[Key]:
        """Commit every leading episode that is now durable; return their keys."""
        done = []
        while self._episodes and all(end <= self.durable[t] for t, end in self._episodes[0][2].items()):
            key, _, ends = self._episodes.popleft()
            self.committed.update(ends)
            done.append(key)
        return done

    def episodes_touching(self, table: str, start: int, end: int) -> list[Key]:
        """Keys of uncommitted episodes with rows of `table` in `[start, end)`."""
        return [i for i, s, e in self._episodes if s[table] < end and e[table] > start]


class ChunkDigests:
    """Which bytes each chunk holds, from the writers' reports, until the chunk is sealed into a commit.

    A chunk is sealed once no writer will change it: when all of its rows are committed, or, for the last
    chunk of a table, when the writer closes. Whole chunks have one writer (a rerun writes the same bytes); a
    shared chunk is written once per writer, each under its lock, each reporting the digest it replaced: the
    last write is the one whose bytes no other write replaced. Where that is not one write (reports that do
    not link up), the chunk is recorded as unknown (None), which readers call "not verifiable"."""

    def __init__(self, chunk_rows: Mapping[str, int]) -> None:
        self.chunk_rows = dict(chunk_rows)
        self._writes: dict[tuple[str, int], set[ChunkWrite]] = {}

    def add(self, writes: Iterable[ChunkWrite]) -> None:
        for w in writes:
            self._writes.setdefault((w.table, w.index), set()).add(w)

    def seal(self, committed: Mapping[str, int], tail: bool = False) -> dict[str, dict[int, ChunkRecord | None]]:
        """The records of every chunk now sealed: below the committed rows, and with `tail` the last chunk too.
        They stay tracked until `forget` (after the commit that records them is published)."""
        out: dict[str, dict[int, ChunkRecord | None]] = {}
        for (table, index) in sorted(self._writes):
            c = self.chunk_rows[table]
            if (index + 1) * c <= committed[table] or (tail and index * c < committed[table]):
                out.setdefault(table, {})[index] = _last(self._writes[table, index])
        return out

    def forget(self, sealed: Mapping[str, Mapping[int, object]]) -> None:
        for table, indices in sealed.items():
            for index in indices:
                self._writes.pop((table, index), None)


def _last(writes: set[ChunkWrite]) -> ChunkRecord | None:
    replaced = {w.replaced for w in writes if w.replaced != w.digest}  # a rerun that changed nothing links to itself
    last = {(w.size, w.digest) for w in writes if w.digest not in replaced}
    return next(iter(last)) if len(last) == 1 else None
