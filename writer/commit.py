"""Deciding what is committed: an episode is committed once all of its rows, in every table, are durable.

Segments of a table finish out of order (several workers); a table's durable prefix ends where the first
unfinished segment starts. Episodes commit in the order they were placed, so committed row counts always end
on an episode boundary and every interval below them points at durable rows.
"""
from __future__ import annotations

from collections import deque
from typing import Mapping

from .keys import Key


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
