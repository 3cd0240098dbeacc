"""Reading a Parquet export (`zarrfeed.loader.parquet_export.export_parquet`, or any Parquet with the same columns)
back into a dataset through the writer, so every interval is checked and relocated as for any other input.

Every file is checked before anything is written: a file that is not Parquet, a missing column, a column whose
type does not match the table's dtype, or a list of the wrong length is refused with one line naming the file
and the column.
"""
from __future__ import annotations

import json
import os
from typing import Any, Unpack

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..core.arrow_records import _field_type, from_arrow
from ..core.keywords import spelled_out
from ..core.schema import L5KIT_SCHEMA, Schema
from ..core.location import Location
from .dataset_writer import DatasetWriter
from .options import WriteOptions, Writes
from .dataset_episodes import Episodes


def _fix_lists(data: pa.Table, dtype: np.dtype, where: str) -> pa.Table:
    """Variable-length list columns (as other tools write them) cast to the fixed-size lists of `dtype`, after
    checking every list has the right length."""
    for name in dtype.names or ():
        if name not in data.schema.names:
            raise ValueError(f"column {name!r} in {where}: missing")
        want = _field_type(name, dtype[name])
        col = data.column(name)
        if pa.types.is_fixed_size_list(want) and (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(lengths != want.list_size)
            if len(bad):
                raise ValueError(f"column {name!r} in {where}: row {bad[0]} holds a list of {lengths[bad[0]]} "
                                 f"values, expected {want.list_size}")
            try:
                data = data.set_column(data.schema.get_field_index(name), name, col.cast(want))
            except pa.ArrowInvalid as exc:
                raise ValueError(f"column {name!r} in {where}: cannot be read as {want} ({exc})") from None
    return data


def read_table_dir(fs: Any, folder: str, dtype: np.dtype) -> np.ndarray:
    """All Parquet files of one table, in name order, as records of `dtype` (checked file by file)."""
    files = sorted(fs.glob(f"{folder}/*.parquet"))
    parts = []
    for f in files:
        try:
            data = pq.read_table(f, filesystem=fs)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{f}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        parts.append(from_arrow(_fix_lists(data, dtype, str(f)), dtype, where=str(f)))
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _schema_of(fs: Any, root: str) -> Schema:
    for f in sorted(fs.glob(f"{root}/*/*.parquet")):
        try:
            meta = pq.read_schema(f, filesystem=fs).metadata or {}
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{f}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        if b"zarrfeed.schema" in meta:
            return Schema.from_json(json.loads(meta[b"zarrfeed.schema"]))
    return L5KIT_SCHEMA


@spelled_out(WriteOptions, Writes)
def ingest_parquet(in_dir: str | os.PathLike | Location, out: str | os.PathLike | Location, *, workers: int = 2,
                   schema: Schema | None = None, **options: Unpack[WriteOptions]) -> dict[str, Any]:
    """Write the Parquet export in `in_dir` (one folder per table; a folder or any fsspec URL) to a new
    dataset at `out`; return the writer's summary. The schema is `schema` if given, else the one in the files'
    metadata (a zarrfeed export's), else L5Kit's. The options are every writer's (`WriteOptions`); their
    `storage_options` apply to both places (pass `Location`s for different ones).

    Args:
        in_dir: The export: a folder (or fsspec URL, or `Location`) holding one folder of `*.parquet` files per
            table of the schema, read in name order.
        out: Where the new dataset goes: a directory, an fsspec URL or a `Location`.
        workers: Writer processes (default 2; 0: write in this process).
        schema: The dataset's tables and links, for Parquet that another tool wrote; it takes precedence over
            the schema recorded in the files. Default: the recorded one, else L5Kit's.
    """
    storage_options = Writes.of(options, "ingest_parquet").storage_options  # each option checked before any read
    options.pop("storage_options", None)
    source = Location.of(in_dir, storage_options)
    fs, root = source.filesystem()
    if not fs.isdir(root):
        raise ValueError(f"{source}: no such folder")
    schema = schema or _schema_of(fs, root)
    tables = {}
    for name, table in schema.tables.items():
        folder = f"{root.rstrip('/')}/{name}"
        if not fs.isdir(folder):
            raise ValueError(f"{source.child(name)}: missing (schema '{schema.name}' has table {name!r})")
        tables[name] = read_table_dir(fs, folder, table.dtype)
    episodes = Episodes(schema, tables, {n: len(a) for n, a in tables.items()})
    with DatasetWriter(Location.of(out, storage_options), schema, workers=workers, **options) as w:
        return w.ingest(episodes)
