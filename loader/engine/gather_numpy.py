"""The gather kernel in numpy, for installs where the C extension (`loader/_gather.c`) could not be built.

Same calls, same checks, same results as the C kernel, in two passes per call (the rows' bytes with one
`take`, then one strided copy per field) instead of one: about 10 times slower per row (`python
bench/bench_gather.py` measures both), which is why this one warns once.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def _int64(arg: Any, fn: str, what: str, group: int) -> np.ndarray:
    """An index argument as the C kernel takes it: C-contiguous int64 (a float64 or int32 array is refused, not
    read as other numbers), in whole groups of `group`."""
    view = memoryview(arg)
    fmt = view.format.lstrip("<=@")
    if view.itemsize != 8 or fmt not in ("q", "l") or not view.c_contiguous or view.nbytes % (8 * group):
        whole = " of whole groups" if group > 1 else ""
        raise TypeError(f"{fn}: {what} must be a C-contiguous int64 array{whole}, got format '{view.format}' "
                        f"item size {view.itemsize}")
    return np.frombuffer(view, np.int64).reshape(-1, group) if group > 1 else np.frombuffer(view, np.int64)


def _fields(fields: Any, fn: str) -> np.ndarray:
    return _int64(fields, fn, "fields", 3)


def _copy(src: Any, row_bytes: int, starts: np.ndarray, out: Any, fields: Any, first: int, what: str) -> None:
    s, o, f = np.frombuffer(src, np.uint8), np.frombuffer(out, np.uint8), _fields(fields, what)
    n = len(starts)
    for off, size, base in f.tolist():
        if off < 0 or size < 0 or off + size > row_bytes or base < 0 or base + (first + n) * size > len(o):
            raise ValueError(f"{what}: a field does not fit the source row or the output")
    if n == 0:
        return
    rows = s[starts[:, None] + np.arange(row_bytes)]  # (n, row_bytes): every row's record
    for off, size, base in f.tolist():
        o[base + first * size:base + (first + n) * size].reshape(n, size)[:] = rows[:, off:off + size]


def gather(src: Any, row_bytes: int, rows: Any, out: Any, fields: Any, first: int, scale: int) -> None:
    """gather(src, row_bytes, rows, out, fields, first, scale): see `loader/_gather.c`."""
    if row_bytes <= 0 or scale <= 0 or first < 0:
        raise ValueError("gather: row_bytes and scale must be positive, first >= 0")
    r = _int64(rows, "gather", "rows", 1)
    size = np.frombuffer(src, np.uint8).nbytes
    bad = (r < 0) | (r > (size - row_bytes) // scale)
    if bad.any():
        raise IndexError(f"gather: row {int(r[bad][0])} is outside the source")
    _copy(src, row_bytes, r * scale, out, fields, first, "gather")


def gather_runs(src: Any, row_bytes: int, runs: Any, out: Any, fields: Any, first: int) -> None:
    """gather_runs(src, row_bytes, runs, out, fields, first): see `loader/_gather.c`."""
    if row_bytes <= 0 or first < 0:
        raise ValueError("gather_runs: bad row_bytes or first")
    r = _int64(runs, "gather_runs", "runs", 2)
    size = np.frombuffer(src, np.uint8).nbytes
    if ((r[:, 0] < 0) | (r[:, 1] < 0) | (r[:, 0] + r[:, 1] * row_bytes > size)).any():
        raise IndexError("gather_runs: a run is outside the source")
    counts = r[:, 1]
    total = int(counts.sum())
    # each run's start, repeated for its records, plus the record's position within the run
    starts = np.repeat(r[:, 0], counts) + (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)) * row_bytes
    _copy(src, row_bytes, starts, out, fields, first, "gather_runs")
