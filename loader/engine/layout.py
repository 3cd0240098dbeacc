"""Where each field of a batch lives in a ring slot: one C-contiguous column per field.

A slot holds `capacity` rows; field f's column starts at `base[f]` (64-byte aligned) and holds
`capacity * size[f]` bytes, so a batch of n <= capacity rows is, for each field, the first n rows of its
column: an array of shape (n, *subarray shape) that `torch.from_numpy`, `jax.dlpack.from_dlpack` and
`np.from_dlpack` take without a copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.errors import TransformOutputError
from ...core.schema import field_names


def transform_name(fn: Any) -> str:
    """The name messages give a transform: its function's qualified name, a server transform's name, the
    function under `dtypes=` or a `functools.partial`."""
    for _ in range(8):  # wrappers: dtypes= (then), functools.partial (func)
        inner = getattr(fn, "then", None) or getattr(fn, "func", None)
        if inner is None:
            break
        fn = inner
    name = getattr(fn, "name", None)  # zarrfeed.transforms.NamedTransform
    if isinstance(name, str):
        return name
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return qualname.rsplit("<locals>.", 1)[-1]  # where a function defined in a function was defined: noise


@dataclass(frozen=True)
class Column:
    name: str
    dtype: np.dtype  # of one element (the subarray's base)
    shape: tuple[int, ...]  # per row
    offset: int  # in the source record; -1 for transform outputs
    size: int  # bytes per row
    base: int  # in the slot
    capacity: int  # rows


class Layout:
    """Columns of `capacity` rows laid out one after the other."""

    def __init__(self, columns: list[tuple], capacity: int) -> None:
        """`columns`: (name, dtype, shape per row, offset in the source record[, rows if not `capacity`])."""
        self.capacity = capacity
        self.columns: list[Column] = []
        base = 0
        for name, dtype, shape, offset, *rows in columns:
            size = int(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))
            cap = rows[0] if rows else capacity
            self.columns.append(Column(name, np.dtype(dtype), tuple(shape), offset, size, base, cap))
            base += -(-size * cap // 64) * 64
        self.slot_bytes = max(base, 64)

    @classmethod
    def of_records(cls, dtype: np.dtype, fields: list[str] | str | None, capacity: int) -> "Layout":
        """Columns for `fields` (all by default) of records of `dtype`."""
        names = field_names(dtype, fields)  # a field named twice would be two columns in every ring slot
        cols = []
        for n in names:
            sub, offset = dtype[n], int(dtype.fields[n][1])  # type: ignore[index]  # names checked above
            cols.append((n, sub.base, sub.shape, offset))
        return cls(cols, capacity)

    @classmethod
    def of_arrays(cls, arrays: dict[str, np.ndarray], capacity: int) -> "Layout":
        """Columns shaped like `arrays` (a transform's first output), whose first axis is the row axis."""
        return cls([(n, a.dtype, a.shape[1:], -1) for n, a in arrays.items()], capacity)

    def gather_spec(self) -> np.ndarray:
        """(source offset, bytes per row, slot base) per column, for `loader._gather.gather`."""
        return np.array([(c.offset, c.size, c.base) for c in self.columns], np.int64).reshape(-1)

    def views(self, buf: memoryview | np.ndarray, n: int, rows: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        """The first n rows of every column of the slot in `buf` (`rows[name]` rows for columns named there)."""
        out = {}
        for c in self.columns:
            m = rows.get(c.name, n) if rows else n
            count = m * (c.size // c.dtype.itemsize if c.dtype.itemsize else 0)
            out[c.name] = np.frombuffer(buf, c.dtype, count=count, offset=c.base).reshape((m, *c.shape))
        return out

    def check(self, arrays: dict[str, np.ndarray], batch: int, rows: int) -> None:
        """Raise TransformOutputError unless `arrays` fit this layout (a transform output against the first one)."""
        names = [c.name for c in self.columns]
        if list(arrays) != names:
            raise TransformOutputError(f"transform output of batch {batch} has keys {list(arrays)}, "
                                       f"but the first batch's had {names}")
        for c in self.columns:
            a = arrays[c.name]
            if not isinstance(a, np.ndarray) or a.dtype != c.dtype or a.shape != (rows, *c.shape):
                got = f"{a.dtype}{a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise TransformOutputError(f"transform output {c.name!r} of batch {batch} is {got}, expected "
                                           f"{c.dtype}{(rows, *c.shape)} like the first batch's (first axis: the "
                                           "batch's rows)")
