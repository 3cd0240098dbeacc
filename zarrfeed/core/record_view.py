"""An N-dimensional array read and written as a table: one record per step along its first axis.

Diffusion Policy's replay buffers (and zarr data of many other tools) keep each quantity in an array of its
own, concatenated along time: `data/img` of shape (T, 96, 96, 3) uint8, `data/action` (T, 2) float32,
`meta/episode_ends` (E,) int64. Chunked along the first axis only, such an array's chunk holds exactly the
bytes of `chunk_rows` records of the dtype `[(field, base, shape[1:])]`: the same bytes, in the same order.
So `RecordArray` shows it as a 1-D table of those records, and everything zarrfeed does with a table (chunk
keys, digests, the loaders' shared-memory cache, the writer's commits) works on it unchanged, with no copy
and no conversion: its documents stay N-dimensional (`.zarray` keeps the array's shape, chunk keys keep their
`i.0.0.0` form) and its chunks are encoded from the array's own dtype and shape, so that codecs that look at
the item size (Blosc's shuffle) or the values (filters) write the bytes the tool itself would.
"""
from __future__ import annotations


import numpy as np

from .stores import Store
from .zarr_array import Array, Meta


def step_dtype(field: str, meta: Meta) -> np.dtype:
    """The record of one step of an array: one field named `field`, of the array's dtype and the shape of one
    step (a scalar field for a 1-D array)."""
    inner = tuple(meta.shape[1:])
    return np.dtype([(field, meta.dtype, inner)] if inner else [(field, meta.dtype)])


class RecordArray(Array):
    """The array at `path`, as a 1-D table of one-field records (see the module's docstring)."""

    def __init__(self, store: Store, path: str, meta: Meta, field: str, read_only: bool = False,
                 table: str | None = None) -> None:
        super().__init__(store, path, meta, read_only)
        self.field, self._table = field, table or field

    @classmethod
    def of(cls, array: Array, field: str, table: str | None = None) -> "RecordArray":
        """`array` as the table `table` (default: named as the field) whose records have the one field `field`."""
        out = cls(array.store, array.path, array.meta, field, array.read_only, table)
        out.missing_is_fill = array.missing_is_fill
        return out

    @property
    def table(self) -> str:
        return self._table

    def __repr__(self) -> str:
        return f"<zarrfeed RecordArray '{self.path}' {self.meta.shape} {self.meta.dtype} as {self.dtype}>"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape[:1]

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.meta.chunks[:1]

    @property
    def dtype(self) -> np.dtype:
        return step_dtype(self.field, self.meta)

    @property
    def ndim(self) -> int:
        return 1

    def decode_chunk(self, raw: bytes | None) -> np.ndarray:
        out = np.zeros(self.chunks, self.dtype)
        if raw is None:
            if self.meta.fill_value is not None:
                out[self.field] = self.fill_value
            return out
        self.decode_into(raw, out.view(np.uint8))
        return out

    def encode_chunk(self, chunk: np.ndarray) -> bytes:
        """One chunk of records encoded as the array's own chunk: the records' one field, as an array of the
        array's dtype and step shape, through the filters and the compressor."""
        records = np.ascontiguousarray(chunk, self.dtype)
        return self.encode_values(np.ascontiguousarray(records[self.field]))
