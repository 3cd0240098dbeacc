"""Parquet export: one Parquet dataset per table, files split on chunk boundaries, written in parallel.

`writer.parquet_ingest` reads such an export back; each file carries the numpy dtype and the zarrfeed schema
in its metadata, so the round trip is exact.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ..core._proc.pool import Failed, WorkerPool, describe_exit
from ..core.errors import WorkerError
from ..core.arrow_records import records_to_arrow, schema_metadata
from ..core.chunk_check import ChunkCheck
from ..core.refusals import refused_writes
from ..core.location import Location, exists
from .dataset import Dataset

__all__ = ["export_parquet"]


def _pieces(ds: Dataset, table: str, file_rows: int) -> list[tuple[int, int]]:
    c = ds[ds.tables_of(table)[0]].chunks[0]
    step = max(c, file_rows // c * c)  # files end on chunk boundaries: each chunk is decoded once
    n = ds.row_count(table)
    return [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]


def _write_piece(location: Location, commit: int | None, check: ChunkCheck | None, table: str, a: int, b: int,
                 out: Location, name: str, row_group_rows: int, compression: str, meta: dict[bytes, bytes],
                 row_index: str | None) -> int:
    ds = Dataset.reopen(location, commit, check)  # the parent's commit and records: every file agrees while a
    rows = ds.read_rows(table, a, b)  # writer appends, and none holds another dataset's rows
    rb = records_to_arrow(rows)
    if row_index:
        rb = rb.append_column(pa.field(row_index, pa.int64(), nullable=False),
                              pa.array(np.arange(a, b, dtype=np.int64)))
    data = pa.Table.from_batches([rb]).replace_schema_metadata({**(rb.schema.metadata or {}), **meta})
    if out.settings.renames:  # a file is complete or absent: written aside, then renamed
        path = out.path / name
        tmp = f"{path}.tmp-{os.getpid()}"
        pq.write_table(data, tmp, row_group_size=row_group_rows, compression=compression)
        os.replace(tmp, path)
    else:  # an object store shows an object once its upload is complete
        fs, root = out.filesystem()
        pq.write_table(data, f"{root}/{name}", row_group_size=row_group_rows, compression=compression,
                       filesystem=fs)
    return (b - a) * ds.record_dtype(table).itemsize


def _piece_task(args: tuple) -> int:
    return _write_piece(*args)


def _piece_worker(wid: int) -> Callable[[tuple], tuple[int, int]]:
    """A worker of `_pieces_in_workers`: each message is one piece's arguments; the reply, (the worker, the
    piece's bytes)."""
    return lambda task: (wid, _piece_task(task))


def _pieces_in_workers(tasks: list[tuple], workers: int) -> Iterator[int]:
    """Each piece written by one of `workers` processes (zarrfeed's own pool: a worker that fails or dies stops
    the export at once, its error raised here; `multiprocess.Pool.terminate` after a failed task hung now and
    then, as CPython's own pool does: python/cpython#78178), yielding each piece's bytes as it is written."""
    pool = WorkerPool(workers, _piece_worker, (), "export worker")
    try:
        queued, busy = list(reversed(tasks)), [0] * workers
        for wid in range(workers):
            for _ in range(2):  # two each: the next is there when one is written
                if queued:
                    pool.send(wid, queued.pop())
                    busy[wid] += 1
        while any(busy):
            for reply in pool.poll(0.5):
                if isinstance(reply, Failed):
                    if reply.error.exc is not None:
                        raise reply.error.exc
                    raise WorkerError(f"export worker {reply.worker} failed: {reply.error}", reply.error)
                wid, written = reply
                busy[wid] -= 1
                yield written
                if queued:
                    pool.send(wid, queued.pop())
                    busy[wid] += 1
            dead = pool.dead()
            if dead:
                raise WorkerError(describe_exit("export worker", *dead[0]) + " while writing Parquet files")
        pool.stop()
    finally:
        pool.kill()


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
    given) and to `out_dir`. Returns rows and bytes per table, and seconds.

    Args:
        dataset: An open `Dataset`, or a path or URL to open (its latest commit; an open one's commit is kept).
        out_dir: The folder (or fsspec URL, or `Location`) to write to; not a `.zip`. Each exported table's
            existing `part-*.parquet` files there are removed first, and if the export fails, what it wrote.
        tables: The tables to export (default all; of a replay buffer, `episodes` and `steps`: every key's
            steps in one table, a column per key).
        row_group_rows: Rows per Parquet row group (default 100,000): smaller groups let readers skip more,
            larger ones compress better.
        compression: The Parquet codec, as pyarrow names it ("zstd" (default), "snappy", "gzip", "lz4",
            "none", ...).
        workers: Processes writing files (default 2; 0: this process). Ignored with a `client`.
        file_rows: Rows per file (default 1,000,000), rounded down to whole chunks of the table (at least one).
        row_index: The name of a column holding each row's index in the table (default "_row"), which
            `from_arrow` and `ingest_parquet` ignore; None: no such column.
        progress: Show a progress bar (bytes).
        storage_options: fsspec options for the dataset (when a path is given) and for `out_dir`.
        client: A `distributed.Client` whose cluster writes the files instead of `workers`.
    """
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0: write in this process), got {workers}")
    ds = dataset if isinstance(dataset, Dataset) else Dataset.open(dataset, storage_options=storage_options)
    names = default_tables(ds) if tables is None else list(tables)
    unknown = [t for t in names if t not in ds.readable_tables()]
    if unknown:
        raise ValueError(f"tables: no table {unknown[0]!r} (tables: {', '.join(ds.readable_tables())})")
    out = Location.of(out_dir, storage_options)
    if out.settings.read_only:
        raise ValueError(f"{out}: Parquet goes to a folder or a URL, not a .zip file")
    if out.within(ds.location):  # its part files would land among the dataset's chunks
        raise ValueError(f"{out}: inside the dataset exported ({ds.location}); export to another folder")
    fs, root = out.filesystem()
    if fs.isfile(root):
        raise ValueError(f"{out}: a file; Parquet goes to a folder (one per table inside it)")
    existed = exists(fs, root)
    made = [t for t in names if not exists(fs, f"{root}/{t}")]  # table folders this export makes
    tasks = []
    t0 = time.perf_counter()
    try:
        with refused_writes(out, "the Parquet files cannot be written there"):  # a full disk, a read-only one
            for t in names:
                fs.makedirs(f"{root}/{t}", exist_ok=True)
                old = fs.glob(f"{root}/{t}/part-*.parquet")
                if old:
                    fs.rm(old)
                for i, (a, b) in enumerate(_pieces(ds, t, file_rows)):
                    meta = schema_metadata({"schema": ds.schema.to_json(), "attrs": dict(ds.group.attrs),
                                            "table": t, "first_row": a})
                    check = ds.check.part(ds.tables_of(t), a, b) if ds.check is not None else None  # its chunks'
                    tasks.append((ds.location, ds.commit, check, t, a, b, out, f"{t}/part-{i:05d}.parquet",
                                  row_group_rows, compression, meta, row_index))
            total = sum((b - a) * ds.record_dtype(t).itemsize for _, _, _, t, a, b, *_ in tasks)
            with tqdm(total=total, unit="B", unit_scale=True, desc="export", disable=not progress) as bar:
                if client is not None:
                    from distributed import as_completed

                    for done in as_completed(client.map(_piece_task, tasks, pure=False)):
                        bar.update(done.result())
                elif workers == 0:
                    for task in tasks:
                        bar.update(_piece_task(task))
                else:
                    for done in _pieces_in_workers(tasks, workers):
                        bar.update(done)
    except BaseException:  # no half export: what this run wrote and made goes (the files it replaced were
        # removed above)
        for t in names:
            written = fs.glob(f"{root}/{t}/part-*")  # finished files and temporary ones
            if written:
                fs.rm(written)
            if t in made and exists(fs, f"{root}/{t}"):
                fs.rm(f"{root}/{t}", recursive=True)
        if not existed and exists(fs, root):
            fs.rm(root, recursive=True)
        raise
    return {"rows": {t: ds.row_count(t) for t in names}, "bytes": total, "seconds": time.perf_counter() - t0}


def default_tables(ds: Dataset) -> list[str]:
    """What an export takes by default: every table; of a replay buffer, its episodes and its steps."""
    steps = ds.schema.step_tables()
    return [t for t in ds.tables if t not in steps] + (["steps"] if steps else [])
