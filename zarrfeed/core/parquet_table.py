"""One column of a sequence of Parquet files read as a table (a LeRobot feature over its data files).

The files hold consecutive rows of the table: file f holds rows [start[f], stop[f]). A chunk is `chunk_rows`
consecutive rows; reading it reads, from each file it overlaps, only the row groups that hold its rows and only
its column, with pyarrow. A (nested) fixed-size list column becomes a numpy array of the feature's shape without
a Python loop over rows.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ChunkError
from .external_table import ExternalTable
from .file_tags import Tag, check_unchanged
from .location import Location
from .parquet_files import ParquetFiles

CHUNK_ROWS = 1024


class ParquetTable(ExternalTable):
    """Column `column` of the Parquet `files` (paths below `location`) as the table `table` of one-field
    records `dtype` (the field named as the column), file f holding rows [starts[f], stops[f]). With `tags`
    (file -> its `core.file_tags` tag when the dataset was opened), a read of a file that no longer has its tag is
    refused (`ChunkError`), never mixed with what was read before."""

    def __init__(self, location: Location, table: str, column: str, dtype: np.dtype, files: Sequence[str],
                 starts: Sequence[int] | np.ndarray, stops: Sequence[int] | np.ndarray,
                 chunk_rows: int = CHUNK_ROWS, tags: Mapping[str, Tag | None] | None = None,
                 reader: ParquetFiles | None = None) -> None:
        rows = int(max(stops, default=0))
        super().__init__(table, dtype, rows, chunk_rows, posixpath_dir(files))
        self.location, self.column, self.files = location, column, list(files)
        self.starts, self.stops = np.asarray(starts, np.int64), np.asarray(stops, np.int64)
        self.tags = dict(tags) if tags is not None else None
        # the open files and recent reads, shared with the tables of the other columns of `files` when given
        self.reader = reader if reader is not None else ParquetFiles(location, [column], tags)

    def read_records(self, start: int, stop: int) -> np.ndarray:
        out = np.zeros(stop - start, self.dtype)
        for f in np.flatnonzero((self.starts < stop) & (self.stops > start)).tolist():
            lo, hi = max(start, int(self.starts[f])), min(stop, int(self.stops[f]))
            values = self.read_file_rows(f, lo - int(self.starts[f]), hi - int(self.starts[f]))
            out[self.column][lo - start:hi - start] = values
        return out

    def read_file_rows(self, f: int, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) of file `f` of this column, as a numpy array of the field's dtype and shape
        (`ChunkError` naming the file if they cannot be read)."""
        fs, root = self.reader.filesystem()
        name = self.files[f]
        try:
            bounds = self.reader.row_group_bounds(name)
            if hi > bounds[-1]:
                raise ChunkError(f"{name}: holds {int(bounds[-1])} rows, but the episodes place rows up to "
                                 f"{hi} in it (column '{self.column}', table '{self.table}')")
            first = int(np.searchsorted(bounds, lo, side="right")) - 1
            last = int(np.searchsorted(bounds, hi, side="left"))
            table = self.reader.read(name, first, last)
            if self.column not in table.column_names:
                raise ChunkError(f"{name}: column '{self.column}' missing")
            self._check_unchanged(fs, root, name)  # (after the read: a file replaced while it was read too)
        except FileNotFoundError:
            self.reader.forget(name)
            self._check_unchanged(fs, root, name)  # (a file there when opened: gone since)
            raise ChunkError(f"{name}: missing (column '{self.column}' of table '{self.table}')") from None
        except ChunkError as exc:
            self.reader.forget(name)
            if "since the dataset was opened" not in str(exc):
                self._check_unchanged(fs, root, name)  # (a file replaced: said so, rather than what it now lacks)
            raise
        except Exception as exc:  # pyarrow's: a truncated or corrupt file
            self.reader.forget(name)
            self._check_unchanged(fs, root, name)
            raise ChunkError(f"{name}: column '{self.column}' cannot be read ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        column = table.column(self.column).slice(lo - int(bounds[first]), hi - lo)
        return column_values(column, self.dtype[self.column], f"{name}: column '{self.column}'")


    def _check_unchanged(self, fs: Any, root: str, name: str) -> None:
        """`ChunkError` if file `name` is no longer what it was when the dataset was opened (with `tags`)."""
        if self.tags is not None:
            check_unchanged(fs, f"{root}/{name}", name, self.tags.get(name))


def column_values(column: Any, field: np.dtype, where: str) -> np.ndarray:
    """An Arrow column (chunked) of scalars or (nested) lists as a numpy array (n, *field.shape) of field's base
    dtype: list levels flattened by pyarrow, then reshaped (`ChunkError` naming `where` for missing values or a
    list of another length)."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(array)
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or \
            pa.types.is_fixed_size_list(array.type):
        if array.null_count:
            raise ChunkError(f"{where}: missing values")
        if not pa.types.is_fixed_size_list(array.type):  # lists of one length each: else the total may still
            lengths = np.diff(_numbers(array.offsets))  # match while the values shift between rows
            if lengths.size and (lengths != lengths[0]).any():
                raise ChunkError(f"{where}: lists of {int(lengths.min())} to {int(lengths.max())} values, not "
                                 f"one length for rows of shape {field.shape}")
        array = array.flatten()
    if array.null_count:
        raise ChunkError(f"{where}: missing values")
    values = _numbers(array)
    want = n * int(np.prod(field.shape, dtype=np.int64))
    if values.size != want:
        raise ChunkError(f"{where}: {values.size} values for {n} rows of shape {field.shape}")
    try:
        return values.astype(field.base, copy=False).reshape((n, *field.shape))
    except (TypeError, ValueError) as exc:
        raise ChunkError(f"{where}: values of {values.dtype}, not {field.base} ({exc})") from None


def _numbers(array: Any) -> np.ndarray:
    """A pyarrow array without nulls as numpy: a view of its buffer for ints and floats, else `to_numpy`. Why not
    always `to_numpy`: its first call imports pandas (0.2 s of a loader worker's first batch)."""
    dtype = _numpy_types().get(array.type)
    if dtype is None:
        return array.to_numpy(zero_copy_only=False)
    return np.frombuffer(array.buffers()[1], dtype, count=len(array), offset=array.offset * dtype.itemsize)


@functools.cache
def _numpy_types() -> dict[Any, np.dtype]:
    """pyarrow's int and float types -> numpy's."""
    import pyarrow as pa

    return {pa.from_numpy_dtype(np.dtype(t)): np.dtype(t) for t in (
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")}


def posixpath_dir(files: Sequence[str]) -> str:
    """The folder the files are in (their common one), as a table's `path`."""
    import posixpath

    return posixpath.commonpath(list(files)) if files else ""
