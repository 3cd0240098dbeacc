"""The Arrow bridge: batches and tables as Arrow record batches and streams (Parquet: `loader.parquet_export`).

`to_arrow` of a columnar batch (what `Loader` yields) shares its memory: numeric columns and fixed-size
lists of them are not copied (bools and strings are converted). A structured array's fields are copied out
of the interleaved records once. Every stream here implements the Arrow PyCapsule stream interface
(`__arrow_c_stream__`), so polars, DuckDB, pyarrow and pandas read it directly. See `writer.arrow_records` for the
type mapping; the numpy dtype travels in the schema metadata, so `from_arrow` restores records exactly.
"""
from __future__ import annotations

import functools
import json
import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa

from ..core.arrow_records import (arrow_schema, column_to_arrow, columns_from_arrow, dtype_of, from_arrow,
    records_to_arrow)
from ..core.refusals import refused_writes
from ..core.schema import dtype_from_descr
from ..core.stores import PARTIAL

if TYPE_CHECKING:
    from .dataset import Dataset

__all__ = ["ArrowStream", "arrow_schema", "from_arrow", "table_batches", "to_arrow", "window_batch_from_arrow",
           "window_batch_to_arrow", "write_ipc_stream"]

WINDOW_KEY = b"zarrfeed.window"


@functools.lru_cache(maxsize=64)
def _batch_schema(key: tuple) -> tuple[pa.Schema, list[tuple[pa.DataType | None, tuple[int, ...]]]]:
    """Schema of a batch's columns, and per column the leaf type to wrap zero-copy (None: convert)."""
    dtype = np.dtype([(n, np.dtype(d), shape) for n, d, shape in key])
    schema = arrow_schema(dtype)
    plans = []
    for _, d, shape in key:
        base = np.dtype(d)
        plans.append((pa.from_numpy_dtype(base) if base.kind in "iuf" and base.isnative else None, shape))
    return schema, plans


def to_arrow(batch: Mapping[str, np.ndarray] | np.ndarray) -> pa.RecordBatch:
    """A batch (dict of columns) or a structured array as a RecordBatch; no copy of numeric columns of a
    columnar batch, so the RecordBatch is valid as long as the batch is (for a Loader batch with
    `copy=False`: until the next batch, docs/architecture.md#views). The schema is built once per kind of batch.

    Args:
        batch: A dict of columns (field -> array whose first axis is the rows; subarray fields become
            fixed-size lists) or a 1-D structured array (copied into Arrow columns).
    """
    if isinstance(batch, np.ndarray):
        return records_to_arrow(batch)
    schema, plans = _batch_schema(tuple((n, c.dtype.str, c.shape[1:]) for n, c in batch.items()))
    arrays = []
    for (name, col), (leaf, shape) in zip(batch.items(), plans, strict=True):
        if leaf is None or not col.flags.c_contiguous:
            arrays.append(column_to_arrow(col, schema.field(name).type))
            continue
        values = pa.Array.from_buffers(leaf, col.size, [None, pa.py_buffer(col)])
        for size in reversed(shape):
            values = pa.FixedSizeListArray.from_arrays(values, size)
        arrays.append(values)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _ragged_tables(batch: Mapping[str, np.ndarray]) -> list[str]:
    return [name[: -len("_offsets")] for name in batch if name.endswith("_offsets")]


def window_batch_to_arrow(batch: Mapping[str, np.ndarray]) -> pa.RecordBatch:
    """A WindowLoader batch as one record batch with a row per sample. Per-sample columns stay as they are
    (`frames/<field>` a fixed-size list of T frames); each ragged table's columns become lists holding the
    sample's rows, and `<table>_offsets` stays a column (T + 1 offsets per sample, into the batch's rows as
    locally), so any Arrow reader sees each sample whole. Numeric values are not copied."""
    tables = _ragged_tables(batch)
    own = {n: c for n, c in batch.items() if n.split("/", 1)[0] not in tables}
    head = to_arrow(own)
    arrays, fields = list(head.columns), list(head.schema)
    descr: dict[str, Any] = {}
    for table in tables:
        offsets = batch[f"{table}_offsets"]
        bounds = pa.array(np.append(offsets[:, 0], offsets[-1, -1] if len(offsets) else 0).astype(np.int64))
        rows = to_arrow({n.split("/", 1)[1]: c for n, c in batch.items() if n.startswith(table + "/")})
        for name, col in zip(rows.schema.names, rows.columns, strict=True):
            arrays.append(pa.LargeListArray.from_arrays(bounds, col))
            fields.append(pa.field(f"{table}/{name}", arrays[-1].type, nullable=False))
        descr[table] = dtype_of(rows.schema).descr  # type: ignore[union-attr]  # to_arrow records it
    meta = dict(head.schema.metadata or {})
    meta[WINDOW_KEY] = json.dumps({"columns": list(batch), "tables": descr}).encode()
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=meta))


def window_batch_from_arrow(rb: pa.RecordBatch) -> dict[str, np.ndarray]:
    """The WindowLoader batch that `window_batch_to_arrow` made `rb` from: the same columns, in the same
    order, numeric ones as views of `rb`'s buffers."""
    raw = (rb.schema.metadata or {}).get(WINDOW_KEY)
    if raw is None:
        raise ValueError("not a batch of windows (no zarrfeed.window metadata)")
    doc = json.loads(raw)
    tables = doc["tables"]
    own = [n for n in rb.schema.names if n.split("/", 1)[0] not in tables]
    out = columns_from_arrow(rb.select(own))
    for table, descr in tables.items():
        names = [n for n in rb.schema.names if n.startswith(table + "/")]
        rows = pa.RecordBatch.from_arrays([rb.column(n).flatten() for n in names],
                                          names=[n.split("/", 1)[1] for n in names])
        cols = columns_from_arrow(rows, dtype_from_descr(descr))
        out.update({f"{table}/{k}": v for k, v in cols.items()})
    return {name: out[name] for name in doc["columns"]}


class ArrowStream:
    """Record batches made on demand; iterate it, `read_all()` it, or hand it to anything that takes an Arrow
    C stream (`polars.DataFrame(s)`, `duckdb.sql("SELECT ... FROM s")`, `pa.RecordBatchReader.from_stream(s)`).
    Each consumer of the C stream gets a fresh pass over the data."""

    def __init__(self, schema: pa.Schema, make: Callable[[], Iterable[pa.RecordBatch]]) -> None:
        self.schema, self._make = schema, make

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self._make())

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, iter(self))

    def read_all(self) -> pa.Table:
        return self.reader().read_all()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.reader().__arrow_c_stream__(requested_schema)


def table_batches(ds: "Dataset", table: str, batch_size: int = 65_536, fields: list[str] | str | None = None,
                  join: Mapping[str, str] | None = None, row_index: str | None = None) -> ArrowStream:
    """`table`'s committed rows in row order, `batch_size` rows a batch.

    `join={"agents": "agent_index_interval"}` adds a column `agents` of type list<struct>: each row's child
    rows, following the interval field. `row_index="_row"` adds each row's global row number (for joining
    interval fields in SQL)."""
    dtype, n = ds.record_dtype(table), ds.row_count(table)
    joins = dict(join or {})
    for child, field in joins.items():
        if child not in ds.tables or field not in (dtype.names or ()):
            raise ValueError(f"join: no table {child!r} or no field {field!r} in table {table!r}")
    base = arrow_schema(dtype, fields)
    extra = [pa.field(row_index, pa.int64(), nullable=False)] if row_index else []
    for child in joins:
        extra.append(pa.field(child, pa.list_(pa.struct(list(arrow_schema(ds[child].dtype)))), nullable=False))
    schema = pa.schema(list(base) + extra, metadata=base.metadata)

    def make() -> Iterator[pa.RecordBatch]:
        for start in range(0, n, batch_size):
            rows = ds.read_rows(table, start, min(start + batch_size, n))
            cols = list(records_to_arrow(rows, fields).columns)
            if row_index:
                cols.append(pa.array(np.arange(start, start + len(rows), dtype=np.int64)))
            for child, field in joins.items():
                iv = rows[field]
                lo, hi = int(iv[0, 0]), int(iv[-1, 1])
                if (iv[1:, 0] != iv[:-1, 1]).any():
                    raise ValueError(f"join: {table}.{field} intervals in rows [{start}, {start + len(rows)}) are "
                                     "not contiguous; run `zarrfeed validate`")
                children = records_to_arrow(ds.read_rows(child, lo, hi)) if hi > lo else \
                    records_to_arrow(np.zeros(0, ds[child].dtype))
                offsets = pa.array(np.concatenate([iv[:, 0], [hi]]) - lo, pa.int32())
                structs = pa.StructArray.from_arrays(children.columns, fields=list(children.schema))
                cols.append(pa.ListArray.from_arrays(offsets, structs))
            yield pa.RecordBatch.from_arrays(cols, schema=schema)

    return ArrowStream(schema, make)


def write_ipc_stream(stream: ArrowStream, sink: Any) -> int:
    """Write `stream` as an Arrow IPC stream to `sink` (a path or a binary file object); return rows. A path to a
    file (not a pipe or a device) is written aside and renamed into place: a stream that fails (a full disk)
    leaves the file as it was, or none. A write the system refuses is one line naming the path (`refusals`)."""
    if not isinstance(sink, (str, os.PathLike)):
        return _write_ipc(stream, sink)
    with refused_writes(sink, "the Arrow stream cannot be written there"):
        if os.path.islink(sink) or (os.path.exists(sink) and not os.path.isfile(sink)):
            return _write_ipc(stream, sink)
        tmp = f"{os.fspath(sink)}.{os.getpid()}{PARTIAL}"
        try:
            rows = _write_ipc(stream, tmp)
            os.replace(tmp, sink)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return rows


def _write_ipc(stream: ArrowStream, sink: Any) -> int:
    rows = 0
    with pa.ipc.new_stream(sink, stream.schema) as writer:
        for batch in stream:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows
