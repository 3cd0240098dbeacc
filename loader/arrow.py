"""The Arrow bridge: batches and tables as Arrow record batches, streams and Parquet files.

`to_arrow` of a columnar batch (what `Loader` yields) shares its memory: numeric columns and fixed-size
lists of them are not copied (bools and strings are converted). A structured array's fields are copied out
of the interleaved records once. Every stream here implements the Arrow PyCapsule stream interface
(`__arrow_c_stream__`), so polars, DuckDB, pyarrow and pandas read it directly. See `writer.arrow` for the
type mapping; the numpy dtype travels in the schema metadata, so `from_arrow` restores records exactly.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from writer.arrow import arrow_schema, column_to_arrow, from_arrow, records_to_arrow, schema_metadata
from writer.store import Location

from .dataset import Dataset

__all__ = ["ArrowStream", "arrow_schema", "export_parquet", "from_arrow", "to_arrow"]


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
    `copy=False`: until the next batch). The schema is built once per kind of batch."""
    if isinstance(batch, np.ndarray):
        return records_to_arrow(batch)
    schema, plans = _batch_schema(tuple((n, c.dtype.str, c.shape[1:]) for n, c in batch.items()))
    arrays = []
    for (name, col), (leaf, shape) in zip(batch.items(), plans):
        if leaf is None or not col.flags.c_contiguous:
            arrays.append(column_to_arrow(name, col))
            continue
        values = pa.Array.from_buffers(leaf, col.size, [None, pa.py_buffer(col)])
        for size in reversed(shape):
            values = pa.FixedSizeListArray.from_arrays(values, size)
        arrays.append(values)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


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


def table_batches(ds: Dataset, table: str, batch_size: int = 65_536, fields: list[str] | None = None,
                  join: Mapping[str, str] | None = None, row_index: str | None = None) -> ArrowStream:
    """`table`'s committed rows in row order, `batch_size` rows a batch.

    `join={"agents": "agent_index_interval"}` adds a column `agents` of type list<struct>: each row's child
    rows, following the interval field. `row_index="_row"` adds each row's global row number (for joining
    interval fields in SQL)."""
    arr, n = ds[table], ds.rows[table]
    joins = dict(join or {})
    for child, field in joins.items():
        if child not in ds.tables or field not in arr.dtype.names:
            raise ValueError(f"join: no table {child!r} or no field {field!r} in table {table!r}")
    base = arrow_schema(arr.dtype, fields)
    extra = [pa.field(row_index, pa.int64(), nullable=False)] if row_index else []
    for child in joins:
        extra.append(pa.field(child, pa.list_(pa.struct(list(arrow_schema(ds[child].dtype)))), nullable=False))
    schema = pa.schema(list(base) + extra, metadata=base.metadata)

    def make() -> Iterator[pa.RecordBatch]:
        for start in range(0, n, batch_size):
            rows = arr[start:min(start + batch_size, n)]
            cols = list(records_to_arrow(rows, fields).columns)
            if row_index:
                cols.append(pa.array(np.arange(start, start + len(rows), dtype=np.int64)))
            for child, field in joins.items():
                iv = rows[field]
                lo, hi = int(iv[0, 0]), int(iv[-1, 1])
                if (iv[1:, 0] != iv[:-1, 1]).any():
                    raise ValueError(f"join: {table}.{field} intervals in rows [{start}, {start + len(rows)}) are "
                                     "not contiguous; run `zarrfeed validate`")
                children = records_to_arrow(ds[child][lo:hi]) if hi > lo else \
                    records_to_arrow(np.zeros(0, ds[child].dtype))
                offsets = pa.array(np.concatenate([iv[:, 0], [hi]]) - lo, pa.int32())
                structs = pa.StructArray.from_arrays(children.columns, fields=list(children.schema))
                cols.append(pa.ListArray.from_arrays(offsets, structs))
            yield pa.RecordBatch.from_arrays(cols, schema=schema)

    return ArrowStream(schema, make)


# ---------------------------------------------------------------- Parquet export
def to_dask(ds: Dataset, table: str, chunks_per_partition: int = 8, fields: list[str] | None = None) -> Any:
    """`table`'s committed rows as a dask DataFrame: one partition per `chunks_per_partition` chunks, each
    read through the Arrow bridge on whichever worker computes it (pyarrow-backed columns; subarray fields
    are fixed-size lists). The rows are those of the dataset's commit, pinned, so every partition agrees."""
    import dask.dataframe as dd
    import pandas as pd

    if table not in ds.tables:
        raise ValueError(f"table: no table {table!r} (tables: {', '.join(ds.tables)})")
    c = ds[table].chunks[0] * max(1, chunks_per_partition)
    n = ds.rows[table]
    pieces = [(ds.location, ds.commit, table, a, min(a + c, n), fields) for a in range(0, n, c)] or \
        [(ds.location, ds.commit, table, 0, 0, fields)]
    meta = records_to_arrow(np.zeros(0, ds[table].dtype), fields).to_pandas(types_mapper=pd.ArrowDtype)
    divisions = [p[3] for p in pieces] + [max(n - 1, 0)]
    return dd.from_map(_dask_partition, pieces, meta=meta, divisions=divisions, enforce_metadata=False)


def _dask_partition(piece: tuple) -> Any:
    """Rows [a, b) of a table as a pandas DataFrame indexed by row number (for `to_dask`)."""
    import pandas as pd

    location, commit, table, a, b, fields = piece
    ds = Dataset.open(location, commit=commit)
    rows = ds[table][a:b] if b > a else np.zeros(0, ds[table].dtype)
    df = records_to_arrow(rows, fields).to_pandas(types_mapper=pd.ArrowDtype)
    df.index = pd.RangeIndex(a, b)
    return df


def _pieces(ds: Dataset, table: str, file_rows: int) -> list[tuple[int, int]]:
    c = ds[table].chunks[0]
    step = max(c, file_rows // c * c)  # files end on chunk boundaries: each chunk is decoded once
    n = ds.rows[table]
    return [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]


def _write_piece(location: Location, table: str, a: int, b: int, out: Location, name: str, row_group_rows: int,
                 compression: str, meta: dict[bytes, bytes], row_index: str | None) -> int:
    ds = Dataset.open(location)
    rows = ds[table][a:b] if b > a else np.zeros(0, ds[table].dtype)
    rb = records_to_arrow(rows)
    if row_index:
        rb = rb.append_column(pa.field(row_index, pa.int64(), nullable=False),
                              pa.array(np.arange(a, b, dtype=np.int64)))
    data = pa.Table.from_batches([rb]).replace_schema_metadata({**(rb.schema.metadata or {}), **meta})
    if out.is_local:  # a file is complete or absent: written aside, then renamed
        path = out.path / name
        tmp = f"{path}.tmp-{os.getpid()}"
        pq.write_table(data, tmp, row_group_size=row_group_rows, compression=compression)
        os.replace(tmp, path)
    else:  # an object store shows an object once its upload is complete
        fs, root = out.filesystem()
        pq.write_table(data, f"{root}/{name}", row_group_size=row_group_rows, compression=compression,
                       filesystem=fs)
    return (b - a) * ds[table].dtype.itemsize


def _piece_task(args: tuple) -> int:
    return _write_piece(*args)


def export_parquet(dataset: Dataset | str | os.PathLike, out_dir: str | os.PathLike | Location,
                   tables: list[str] | None = None, row_group_rows: int = 100_000, compression: str = "zstd",
                   workers: int = 2, file_rows: int = 1_000_000, row_index: str | None = "_row",
                   progress: bool = False, storage_options: dict[str, Any] | None = None,
                   client: Any = None) -> dict[str, Any]:
    """Write one Parquet dataset per table, `out_dir/<table>/part-NNNNN.parquet` (a folder or any fsspec URL),
    files split on chunk boundaries and written by `workers` processes (0: this one), or with a Dask
    `client`, by its cluster's workers (which must reach the dataset and `out_dir`). Each file's metadata
    holds the numpy dtype, the zarrfeed schema, the dataset attrs and its first row; `row_index` adds each
    row's global row number (None: no such column). `storage_options` apply to the dataset (when a path is
    given) and to `out_dir`. Returns rows and bytes per table, and seconds."""
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0: write in this process), got {workers}")
    ds = dataset if isinstance(dataset, Dataset) else Dataset.open(dataset, storage_options=storage_options)
    names = list(ds.tables) if tables is None else list(tables)
    unknown = [t for t in names if t not in ds.tables]
    if unknown:
        raise ValueError(f"tables: no table {unknown[0]!r} (tables: {', '.join(ds.tables)})")
    out = Location.of(out_dir, storage_options)
    if out.is_zip:
        raise ValueError(f"{out}: Parquet goes to a folder or a URL, not a .zip file")
    fs, root = out.filesystem()
    tasks = []
    for t in names:
        fs.makedirs(f"{root}/{t}", exist_ok=True)
        old = fs.glob(f"{root}/{t}/part-*.parquet")
        if old:
            fs.rm(old)
        for i, (a, b) in enumerate(_pieces(ds, t, file_rows)):
            meta = schema_metadata({"schema": ds.schema.to_json(), "attrs": dict(ds.group.attrs), "table": t,
                                    "first_row": a})
            tasks.append((ds.location, t, a, b, out, f"{t}/part-{i:05d}.parquet", row_group_rows,
                          compression, meta, row_index))
    t0 = time.perf_counter()
    total = sum((b - a) * ds[t].dtype.itemsize for _, t, a, b, *_ in tasks)
    with tqdm(total=total, unit="B", unit_scale=True, desc="export", disable=not progress) as bar:
        if client is not None:
            from distributed import as_completed

            for done in as_completed(client.map(_piece_task, tasks, pure=False)):
                bar.update(done.result())
        elif workers == 0:
            for task in tasks:
                bar.update(_piece_task(task))
        else:
            import multiprocess as mp

            with mp.get_context().Pool(workers) as pool:
                for done in pool.imap_unordered(_piece_task, tasks):
                    bar.update(done)
    return {"rows": {t: ds.rows[t] for t in names}, "bytes": total, "seconds": time.perf_counter() - t0}


def write_ipc_stream(stream: ArrowStream, sink: Any) -> int:
    """Write `stream` as an Arrow IPC stream to `sink` (a path or a binary file object); return rows."""
    rows = 0
    with pa.ipc.new_stream(sink, stream.schema) as writer:
        for batch in stream:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows
