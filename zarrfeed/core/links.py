"""Checks that a link's `[start, end)` intervals (or cumulative ends) tile its child table: in bounds, ordered,
contiguous, complete.

These are L5Kit's semantics: parent row i owns child rows [start_i, end_i), the first interval starts at 0,
each starts where the previous one ends, and the last ends at the child's row count. The same checker serves
the writer (an episode's local intervals) and `validate` (a whole dataset, fed chunk by chunk).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .schema import ENDS, Link


@dataclass(frozen=True)
class Violation:
    """One broken rule: where (table, field, row) and what.

    Args:
        table: The table.
        field: The field, when the rule is about one.
        row: The row, when the rule is about one.
        message: What is wrong, in a line.
    """

    table: str
    field: str | None
    row: int | None
    message: str

    def __str__(self) -> str:
        where = self.table + (f".{self.field}" if self.field else "")
        where += f" row {self.row}" if self.row is not None else ""
        return f"{where}: {self.message}"


class IntervalChecker:
    """Streams one link's intervals through `feed` (in row order), then `finish`; collects violations."""

    def __init__(self, link: Link, n_child: int, limit: int = 20) -> None:
        self.link, self.n_child, self.limit = link, n_child, limit
        self.violations: list[Violation] = []
        self.count = 0
        self._rows = 0
        self._prev_end: int = 0

    def _add(self, row: int | None, message: str) -> None:
        self.count += 1
        if len(self.violations) < self.limit:
            self.violations.append(Violation(self.link.parent, self.link.field, row, message))

    def feed(self, intervals: np.ndarray) -> None:
        """Check the next `len(intervals)` parent rows; `intervals` has shape (n, 2)."""
        n = len(intervals)
        if n == 0:
            return
        start, end = intervals[:, 0].astype(np.int64), intervals[:, 1].astype(np.int64)
        expected = np.empty(n, np.int64)
        expected[0] = self._prev_end
        expected[1:] = end[:-1]
        child = self.link.child
        bad = (start > end) | (start < 0) | (end > self.n_child) | (start != expected)
        for i in np.flatnonzero(bad):
            s, e, row = int(start[i]), int(end[i]), self._rows + int(i)
            if s > e:
                self._add(row, f"interval [{s}, {e}) has start > end")
            elif s < 0 or e > self.n_child:
                self._add(row, f"interval [{s}, {e}) is outside the rows of {child}, [0, {self.n_child})")
            else:
                what = "a gap" if s > expected[i] else "an overlap"
                prev = f"the previous interval ends at {expected[i]}" if row else "the first interval must start at 0"
                self._add(row, f"interval [{s}, {e}) starts at {s} but {prev} ({what} in {child})")
        self._rows += n
        self._prev_end = int(end[-1])

    def finish(self) -> list[Violation]:
        """Check the end: the last interval must end at the child's row count."""
        if self._rows == 0 and self.n_child > 0:
            self._add(None, f"no {self.link.parent} rows, but {self.link.child} has {self.n_child} rows")
        elif self._rows and self._prev_end != self.n_child:
            self._add(self._rows - 1, f"last interval ends at {self._prev_end}, but {self.link.child} "
                                      f"has {self.n_child} rows (they must be covered in order)")
        return self.violations


class EndsChecker(IntervalChecker):
    """The same rules for an "ends" link (Diffusion Policy's `episode_ends`): each parent row's end, cumulative;
    row i owns the child rows from the end before it to its own. Ends never decrease (an episode of no steps,
    which Diffusion Policy's `add_episode` accepts, owns none) and stay within the child's rows; the last must
    be the child's row count."""

    def feed(self, intervals: np.ndarray) -> None:
        """Check the next `len(intervals)` parent rows' ends."""
        ends = np.asarray(intervals, np.int64).reshape(-1)
        if not len(ends):
            return
        before = np.concatenate([[self._prev_end], ends[:-1]])
        child = self.link.child
        for i in np.flatnonzero((ends < before) | (ends > self.n_child)):
            end, prev, row = int(ends[i]), int(before[i]), self._rows + int(i)
            if end > self.n_child:
                self._add(row, f"end {end} is past the rows of {child}, [0, {self.n_child})")
            else:
                self._add(row, f"end {end} is before the end before it, {prev} (ends never decrease)")
        self._rows += len(ends)
        self._prev_end = int(ends[-1])


def link_checker(link: Link, n_child: int, limit: int = 20) -> IntervalChecker:
    """The checker of one link, by its kind."""
    return (EndsChecker if link.kind == ENDS else IntervalChecker)(link, n_child, limit)


def check_link(link: Link, intervals: np.ndarray, n_child: int, limit: int = 20) -> tuple[list[Violation], int]:
    """All violations of one link held in memory: (the first `limit`, total count)."""
    checker = link_checker(link, n_child, limit)
    checker.feed(intervals)
    return checker.finish(), checker.count


def require_link(link: Link, intervals: np.ndarray, n_child: int, consequence: str) -> None:
    """Raise `FormatError` if one link's intervals over its parent's committed rows do not tile the child's
    committed rows: one line naming the first violation (table, field, row), and `consequence` (what the
    caller does not do)."""
    from .errors import FormatError

    violations, count = check_link(link, intervals, n_child, limit=1)
    if count:
        more = f" (and {count - 1} more)" if count > 1 else ""
        raise FormatError(f"{violations[0]}{more}: {consequence} (zarrfeed validate lists every violation)")
