"""The on-disk format: opening zarr v2 stores, creating a dataset from a schema, and the zarrfeed manifest.

The manifest (`zarrfeed.json` at the group's root) holds the schema and the row count per table that the
writer has *committed*. zarr shows a grown shape before the rows are written, so readers trust the committed
count, not the shape. Datasets written by other tools have no manifest: their shapes are their row counts.
All zarr calls of the project live here and in the modules that read and write chunks, so a move to zarr 3
(once it supports subarray dtypes) is one change.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarr

from .schema import L5KIT_SCHEMA, Schema, Table, dtype_difference

MANIFEST_KEY = "zarrfeed.json"
MANIFEST_VERSION = 1


class FormatError(ValueError):
    """A dataset cannot be read or written as asked; the message is one line saying what and where."""


def open_store(location: str | os.PathLike, mode: str = "r") -> zarr.storage.BaseStore:
    """A zarr v2 store for a directory, a `.zip` file (read-only) or an fsspec URL."""
    text = os.fspath(location)
    if "://" in text:
        return zarr.storage.FSStore(text, mode=mode)
    path = Path(text)
    if text.endswith(".zip"):
        if mode != "r":
            raise FormatError(f"{text}: zip stores are read-only; write to a directory")
        if not path.is_file():
            raise FormatError(f"{text}: no such file")
        try:
            return zarr.storage.ZipStore(text, mode="r")
        except Exception as exc:  # zipfile.BadZipFile and friends
            raise FormatError(f"{text}: not a readable zip file ({exc})") from None
    if mode == "r" and not path.exists():
        raise FormatError(f"{text}: no such file or directory")
    if path.exists() and not path.is_dir():
        raise FormatError(f"{text}: not a directory, a .zip file or a URL")
    return zarr.storage.DirectoryStore(text)


def open_group(location: str | os.PathLike, mode: str = "r") -> zarr.Group:
    """Open an existing zarr v2 group, with a one-line `FormatError` if it is not one."""
    store = open_store(location, mode)
    try:
        has_group = ".zgroup" in store
    except Exception as exc:
        raise FormatError(f"{os.fspath(location)}: cannot read the store ({exc})") from None
    if not has_group:
        if "zarr.json" in store:
            raise FormatError(f"{os.fspath(location)}: a zarr v3 store; zarrfeed reads zarr v2 (L5Kit's format)")
        if ".zarray" in store:
            raise FormatError(f"{os.fspath(location)}: one table's array, not a dataset; open the folder above it")
        raise FormatError(f"{os.fspath(location)}: not a zarr group (no .zgroup)")
    try:
        return zarr.open_group(store, mode="r" if mode == "r" else "r+")
    except Exception as exc:
        raise FormatError(f"{os.fspath(location)}: cannot open the zarr group ({exc})") from None


def open_table(store: zarr.storage.BaseStore, name: str, mode: str = "r", **kwargs: Any) -> zarr.Array:
    """One table's array; a broken `.zarray` becomes a `FormatError` naming the table."""
    try:
        arr = zarr.open_array(store, mode=mode, path=name, **kwargs)
    except Exception as exc:
        raise FormatError(f"table '{name}': cannot open its array ({type(exc).__name__}: {exc})") from None
    if arr.ndim != 1 or arr.dtype.names is None:
        raise FormatError(f"table '{name}': a {arr.ndim}-D {arr.dtype} array, not a 1-D array of structured records")
    return arr


def read_manifest(store: zarr.storage.BaseStore) -> dict[str, Any] | None:
    """The zarrfeed manifest, or None for datasets written by other tools."""
    try:
        raw = store[MANIFEST_KEY]
    except KeyError:
        return None
    try:
        doc = json.loads(bytes(raw))
        doc["committed"] = {k: int(v) for k, v in doc["committed"].items()}
        return doc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError(f"{MANIFEST_KEY}: unreadable manifest ({exc})") from None


def write_manifest(root: str | os.PathLike, doc: dict[str, Any]) -> None:
    """Publish the manifest atomically: write a temporary file, flush it to disk, rename it into place."""
    final = Path(root) / MANIFEST_KEY
    tmp = final.with_name(f".{MANIFEST_KEY}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def manifest(schema: Schema, committed: dict[str, int], **extra: Any) -> dict[str, Any]:
    return {"zarrfeed": MANIFEST_VERSION, "schema": schema.to_json(), "committed": dict(committed), **extra}


def create(root: str | os.PathLike, schema: Schema, *, chunks: dict[str, int] | None = None,
           compressor: numcodecs.abc.Codec | None = None, overwrite: bool = False) -> Schema:
    """Create an empty dataset (every table with 0 rows, attrs, manifest); return the schema as written.

    `chunks` overrides chunk rows per table, `compressor` the schema's compressor.
    """
    unknown = set(chunks or {}) - set(schema.tables)
    if unknown:
        raise FormatError(f"chunks: no table {sorted(unknown)} in schema '{schema.name}'")
    schema = Schema(
        tables={n: (t.dtype, (chunks or {}).get(n, t.chunk_rows)) for n, t in schema.tables.items()},
        links=schema.links, attrs=schema.attrs, compressor=compressor or schema.compressor, name=schema.name,
    )
    root = Path(root)
    if root.exists() and any(root.iterdir()) and not overwrite:
        raise FormatError(f"{root}: already exists and is not empty; append to it, resume an interrupted "
                          "ingest into it, or overwrite it")
    group = zarr.open_group(zarr.storage.DirectoryStore(str(root)), mode="w")
    for t in schema.tables.values():
        group.create_dataset(t.name, shape=(0,), chunks=(t.chunk_rows,), dtype=t.dtype,
                             compressor=schema.compressor, fill_value=np.zeros(1, t.dtype)[0])
    group.attrs.update(schema.attrs)
    write_manifest(root, manifest(schema, {n: 0 for n in schema.tables}))
    return schema


def detect_schema(group: zarr.Group, arrays: dict[str, zarr.Array]) -> Schema:
    """The dataset's schema: from its manifest, else L5Kit's if it looks like L5Kit, else one from its arrays."""
    doc = read_manifest(group.store)
    if doc is not None:
        schema = Schema.from_json(doc["schema"])
        expected = schema.tables
    elif {"scenes", "frames", "agents"} & set(arrays) or "format_version" in group.attrs:
        schema = L5KIT_SCHEMA
        expected = L5KIT_SCHEMA.tables
        first = arrays.get("agents")
        schema = Schema(
            tables={n: (t.dtype, arrays[n].chunks[0] if n in arrays else t.chunk_rows) for n, t in expected.items()},
            links=L5KIT_SCHEMA.links, attrs=dict(group.attrs),
            compressor=first.compressor if first is not None and first.compressor else None, name="l5kit",
        )
    else:
        return Schema(tables={n: (a.dtype, a.chunks[0]) for n, a in arrays.items()}, attrs=dict(group.attrs))
    for name, table in expected.items():
        if name not in arrays:
            if name == "traffic_light_faces" and schema.name == "l5kit":
                continue
            raise FormatError(f"table '{name}': missing from the dataset (schema '{schema.name}' declares it)")
        diff = dtype_difference(arrays[name].dtype, table.dtype)
        if diff:
            raise FormatError(f"table '{name}': wrong dtype, it {diff}")
    return schema


def empty_table(table: Table) -> zarr.Array:
    """An in-memory table with no rows (L5Kit datasets without traffic-light faces read as this)."""
    warnings.warn(f"table '{table.name}' is missing; reading it as empty", stacklevel=3)
    return zarr.zeros((0,), chunks=(table.chunk_rows,), dtype=table.dtype)
