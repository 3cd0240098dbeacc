"""Structured numpy records <-> Arrow, exactly.

| numpy field                   | Arrow type                                   | copy?                       |
|-------------------------------|----------------------------------------------|-----------------------------|
| int, uint, float (any order)  | the primitive (little-endian)                | none if columnar and native |
| bool                          | bool (bit-packed)                            | converted                   |
| subarray (k,) / (k, m) / ...  | fixed_size_list<k> / of fixed_size_list<m>   | none (the list's values)    |
| `<U n`                        | string (trailing NULs stripped)              | converted                   |
| `S n`                         | binary (trailing NULs stripped)              | converted                   |
| object, structured, datetime, timedelta, complex, void | TypeError naming the field                |
The numpy dtype is kept in the schema metadata (`zarrfeed.dtype`), so `from_arrow` restores it exactly:
field order, byte order, subarray shapes and string widths.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schema import dtype_from_descr, field_names

DTYPE_KEY = b"zarrfeed.dtype"


def _field_type(name: str, sub: np.dtype) -> pa.DataType:
    base = sub.base
    if base.names is not None:
        raise TypeError(f"field {name!r}: nested structured fields have no Arrow mapping")
    if base.kind == "b":
        t = pa.bool_()
    elif base.kind in "iuf":
        t = pa.from_numpy_dtype(base.newbyteorder("<"))
    elif base.kind == "U":
        t = pa.string()
    elif base.kind == "S":
        t = pa.binary()
    else:
        raise TypeError(f"field {name!r}: {base} ({base.kind!r} kind) has no Arrow mapping")
    for size in reversed(sub.shape):
        t = pa.list_(t, size)
    return t


def arrow_schema(dtype: np.dtype, fields: list[str] | str | None = None) -> pa.Schema:
    """The Arrow schema of records of `dtype` (only `fields`, if given), with the dtype in its metadata."""
    dtype = np.dtype(dtype)
    if dtype.names is None:
        raise TypeError(f"{dtype} is not a structured dtype")
    names = field_names(dtype, fields)
    kept = np.dtype([(n, dtype[n]) for n in names])
    return pa.schema([pa.field(n, _field_type(n, dtype[n]), nullable=False) for n in names],
                     metadata={DTYPE_KEY: json.dumps(kept.descr).encode()})


def column_to_arrow(col: np.ndarray, field_type: pa.DataType) -> pa.Array:
    """One column (rows, *subarray shape) as an Arrow array of `field_type` (its field's type in
    `arrow_schema`); no copy for native numeric C-contiguous data."""
    leaf = _leaf(field_type)
    flat = np.ascontiguousarray(col).reshape(-1)  # a view when the column is C-contiguous already
    if col.dtype.kind in ("i", "u", "f"):
        if not col.dtype.isnative:
            flat = flat.astype(col.dtype.newbyteorder("="))
        values = pa.Array.from_buffers(leaf, len(flat), [None, pa.py_buffer(flat)])
    else:
        values = pa.array(flat, type=leaf)
    for size in reversed(col.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values


def _leaf(t: pa.DataType) -> pa.DataType:
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def records_to_arrow(records: np.ndarray, fields: list[str] | str | None = None) -> pa.RecordBatch:
    """A structured array as a RecordBatch (each field is copied out of the interleaved records once)."""
    schema = arrow_schema(records.dtype, fields)
    return pa.RecordBatch.from_arrays([column_to_arrow(records[f.name], f.type) for f in schema], schema=schema)


def dtype_of(schema: pa.Schema) -> np.dtype | None:
    """The numpy dtype recorded in an Arrow schema's metadata, if any."""
    raw = (schema.metadata or {}).get(DTYPE_KEY)
    return dtype_from_descr(json.loads(raw)) if raw else None


def from_arrow(data: pa.Table | pa.RecordBatch, dtype: np.dtype | None = None, where: str = "") -> np.ndarray:
    """Arrow data back to structured records of `dtype` (default: the one in its metadata), bit-exact.

    `ValueError` names the column (and `where`, e.g. a file) for a missing column, a type that does not
    match the dtype, a list of the wrong length, nulls, or a string longer than its numpy width.

    Args:
        data: A pyarrow Table or RecordBatch with a column per field of `dtype` (other columns are ignored).
        dtype: The structured dtype of the records; default: the one recorded in the schema's metadata (as
            `to_arrow` and `export_parquet` write it).
        where: What the data is (a file name), for the error messages.
    """
    dtype = _dtype(data, dtype, where)
    out = np.zeros(data.num_rows, dtype)
    for name, column in columns_from_arrow(data, dtype, where).items():
        out[name] = column
    return out


def columns_from_arrow(data: pa.Table | pa.RecordBatch, dtype: np.dtype | None = None,
                       where: str = "") -> dict[str, np.ndarray]:
    """Arrow data as columns (field -> array of shape (rows, *subarray shape)), the form a Loader yields:
    numeric columns of a RecordBatch are views of its buffers, not copies. Checked as `from_arrow`."""
    at = f" in {where}" if where else ""
    dtype = _dtype(data, dtype, where)
    out = {}
    for name in dtype.names or ():
        sub = dtype[name]
        if name not in data.schema.names:
            raise ValueError(f"column {name!r}{at}: missing")
        want = _field_type(name, sub)
        col = data.column(name)
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if not col.type.equals(want):
            raise ValueError(f"column {name!r}{at}: Arrow type {col.type}, expected {want} for numpy {sub}")
        if col.null_count:
            raise ValueError(f"column {name!r}{at}: {col.null_count} nulls; records have no nulls")
        values = col
        for _ in sub.shape:
            values = values.flatten()
        base = sub.base
        if base.kind in "iuf":
            flat = values.to_numpy(zero_copy_only=False)
        elif base.kind == "b":
            flat = values.to_numpy(zero_copy_only=False).astype(bool)
        else:
            objs = values.to_numpy(zero_copy_only=False)
            width = base.itemsize // (4 if base.kind == "U" else 1)
            lengths = pc.utf8_length(values) if base.kind == "U" else pc.binary_length(values)
            too_long = np.flatnonzero(lengths.to_numpy(zero_copy_only=False) > width)
            if len(too_long):
                raise ValueError(f"column {name!r}{at}: row {too_long[0] // max(1, int(np.prod(sub.shape)))} "
                                 f"holds a value longer than {width}, the width of {base}")
            flat = np.array(objs, dtype=base) if len(objs) else np.zeros(0, base)
        out[name] = flat.reshape((data.num_rows, *sub.shape))
    return out


def _dtype(data: pa.Table | pa.RecordBatch, dtype: np.dtype | None, where: str) -> np.dtype:
    found = np.dtype(dtype) if dtype is not None else dtype_of(data.schema)
    if found is None:
        raise ValueError(f"no numpy dtype given and none in the Arrow metadata{f' in {where}' if where else ''}")
    return found


def schema_metadata(extra: Mapping[str, Any]) -> dict[bytes, bytes]:
    """Metadata entries `zarrfeed.<key>` holding JSON values."""
    return {f"zarrfeed.{k}".encode(): json.dumps(v).encode() for k, v in extra.items()}
