"""Opening a dataset's zarr v2 group and tables, and creating a dataset from a schema.

A table's `.zarray` is checked as strictly as the manifest (`array_meta`), and a dataset's schema comes from
its manifest (`manifest`, read by `commits`), else L5Kit's when it looks like L5Kit, else its arrays. zarr shows
a grown shape before the rows are written, so readers trust the committed count (docs/architecture.md#commits); datasets
written by other tools have no manifest, and their shapes are their row counts. Arrays, groups and their
documents are zarrfeed's own (`zarr_array`, `zarr_meta`): zarr-python is not needed to read or write a dataset.
"""
from __future__ import annotations

import json
import os
import warnings
from typing import Any, Mapping

import numcodecs
import numpy as np

from . import array_meta
from .manifest_io import read_manifest, write_manifest
from .manifest import DIGEST, EVERY_CHUNK, LAYOUT, MANIFEST_KEY, TAILS, new_dataset_id, new_manifest
from .schema import L5KIT_SCHEMA, SCHEMA_CODEC, Schema, Table, dtype_difference
from .errors import FormatError, MetaError
from .location import Location
from .s3 import missing_credentials
from .stores import MemoryStore, Store, connection_failure, unreachable
from .zarr_array import Array, Group
from .record_view import RecordArray
from .replay_buffer import is_replay_buffer, open_replay_buffer, rows_by_ends
from .v3_meta import ZARR_JSON, node_type
from .storage_layout import StorageLayout
from .zarr_meta import ArrayMeta, consolidated, json_bytes

__all__ = ["FormatError", "Location", "create", "detect_schema", "open_group", "open_store", "open_table"]


def open_store(location: str | os.PathLike | Location, mode: str = "r",
               storage_options: dict[str, Any] | None = None) -> Store:
    """A zarr v2 store for a directory, a `.zip` file (read-only) or an fsspec URL."""
    return Location.of(location, storage_options).store(mode)


def open_group(location: str | os.PathLike | Location, mode: str = "r",
               storage_options: dict[str, Any] | None = None) -> Group:
    """Open an existing zarr v2 group, with a one-line `FormatError` if it is not one."""
    loc = Location.of(location, storage_options)
    store = loc.store(mode)
    try:
        has_group = ".zgroup" in store or _v3_group(store)
    except Exception as exc:
        if missing_credentials(exc):  # the command line explains where credentials are read from
            raise
        if connection_failure(exc):
            raise unreachable(str(loc), exc) from None
        raise FormatError(f"{loc}: cannot read the store ({type(exc).__name__}: "
                          f"{_first_line(_why_refused(loc, exc))})") from None
    if not has_group:
        if ".zarray" in store or "zarr.json" in store:
            raise FormatError(f"{loc}: one table's array, not a dataset; open the folder above it")
        if loc.settings.remote and not loc.exists():
            raise FormatError(f"{loc}: no such dataset (nothing is stored there)")
        where = store.misplaced_group()
        if where:
            raise FormatError(f"{loc}: {where}")
        raise FormatError(f"{loc}: not a zarr group (no .zgroup)")
    try:
        return Group.open(store, read_only=mode == "r")
    except MetaError as exc:
        raise FormatError(f"{loc}: cannot open the zarr group ({exc})") from None


def _v3_group(store: Store) -> bool:
    """Whether the store's root is a zarr v3 group (its `zarr.json`, node type "group")."""
    raw = store.get(ZARR_JSON)
    if raw is None:
        return False
    try:
        return node_type(json.loads(raw)) == "group"
    except (ValueError, TypeError, RecursionError):
        return True  # a damaged document: opening the group names it


def _why_refused(loc: Location, exc: BaseException) -> BaseException:
    """A store's refusal in its own words: S3 answers a HEAD request's 403 with no body ("Forbidden" alone), so
    a listing, whose answer says why (an unknown access key, a wrong signature), is asked too."""
    if not isinstance(exc, PermissionError):
        return exc
    try:
        loc.entries(1)
    except PermissionError as listed:
        return listed
    except Exception:
        pass
    return exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def open_table(store: Store, name: str, mode: str = "r", dtype: np.dtype | None = None,
               written: dict[str, Any] | None = None, path: str = "") -> Array:
    """One table's array (of records of `dtype`, if given); a broken `.zarray` becomes a `FormatError` naming the
    table and the file: each field zarrfeed relies on is checked (see `array_meta`), since zarr reads a
    negative chunk size as no chunks. `written`: the schema that zarrfeed wrote it with (its manifest's, as
    JSON), whose compressor, and no filters, the `.zarray` must name. `path`: where the table's array is,
    if not at its name: an array of any shape, read as records of one field (`core.record_view`)."""
    if path:
        return _open_steps(store, name, path, mode, dtype, written)
    key = f"{name}/.zarray"
    if key not in store and f"{name}/{ZARR_JSON}" in store:
        return _open_v3_table(store, name, mode, dtype, written)
    try:
        meta: Any = json.loads(bytes(store[key]))
    except KeyError:
        meta = None  # zarr names what is there instead (a group, nothing)
    except (ValueError, TypeError, RecursionError) as exc:
        said = "nested too deep to read" if isinstance(exc, RecursionError) else str(exc)
        raise FormatError(f"table '{name}': cannot open its array ({key} is not JSON: {said}); the array's "
                          "metadata is damaged (restore it from a copy)") from None
    if array_meta.not_records(meta):
        meta = None  # not a table's array (a user's mask, another tool's data): zarr says what it is, below
    why = array_meta.layout_problem(meta) if meta is not None else None
    if why is None:
        try:
            arr = Array.open(store, name, read_only=mode == "r")
        except MetaError as exc:
            raise FormatError(f"table '{name}': cannot open its array ({key}: {type(exc).__name__}: {exc})") \
                from None
        if arr.ndim != 1 or arr.dtype.names is None:
            raise FormatError(f"table '{name}': a {arr.ndim}-D {arr.dtype} array, not a 1-D array of structured "
                              "records")
        diff = dtype_difference(arr.dtype, dtype) if dtype is not None else None
        if diff:
            raise FormatError(f"table '{name}': wrong dtype, it {diff}")
        if meta is None:
            return arr
        why = array_meta.fill_problem(meta, arr.dtype) or array_meta.codec_problem(meta, arr.dtype)
        if why is None and written is not None:
            why = array_meta.written_problem(meta, written_codec(written, name))
            if why is not None:
                raise FormatError(f"table '{name}': {key}: {why}; the array's metadata was changed, and its chunks "
                                  "would decode to other rows (restore it from a copy)")
        if why is None:
            return arr
    raise FormatError(f"table '{name}': {key}: {why}; the array's metadata is damaged (restore it from a copy)")


def _open_v3_table(store: Store, name: str, mode: str, dtype: np.dtype | None,
                   written: dict[str, Any] | None) -> Array:
    """A table whose array is zarr v3: its `zarr.json` is checked whole when it is parsed (`v3_meta`)."""
    key = f"{name}/{ZARR_JSON}"
    try:
        arr = Array.open(store, name, read_only=mode == "r")
    except MetaError as exc:
        raise FormatError(f"table '{name}': cannot open its array ({exc})") from None
    if arr.ndim != 1 or arr.dtype.names is None:
        raise FormatError(f"table '{name}': a {arr.ndim}-D {arr.dtype} array, not a 1-D array of structured records")
    diff = dtype_difference(arr.dtype, dtype) if dtype is not None else None
    if diff:
        raise FormatError(f"table '{name}': wrong dtype, it {diff}")
    why = _v3_written_problem(arr, written_codec(written, name)) if written is not None else None
    if why is not None:
        raise FormatError(f"table '{name}': {key}: {why}; the array's metadata was changed, and its chunks would "
                          "decode to other rows (restore it from a copy)")
    return arr


def _v3_written_problem(arr: Array, compressor: dict[str, Any] | None) -> str | None:
    """Whether a v3 array is compressed as zarrfeed wrote it (`compressor`, the codec config its manifest's
    schema records): its `zarr.json` holds v3 codecs, compared as the numcodecs codec they run; and with the
    values' bytes as zarrfeed writes them (little-endian, not transposed), since a changed `bytes` or
    `transpose` codec decodes the same stored bytes (whose digests still hold) into other values."""
    codecs = arr.codecs
    if getattr(codecs, "endian", None) == "big":
        return "its 'bytes' codec is big-endian, but zarrfeed wrote the table little-endian"
    if getattr(codecs, "transposes", ()):
        return "its codecs have a 'transpose', but zarrfeed wrote the table with none"
    want = array_meta.normal_codec(compressor)
    got = array_meta.normal_codec(arr.compressor.get_config() if arr.compressor else None)
    return None if got == want else (f"it is compressed with {got}, not {want}, the compressor its manifest's "
                                     "schema records")


def _open_steps(store: Store, name: str, path: str, mode: str, dtype: np.dtype | None,
                written: dict[str, Any] | None) -> Array:
    """The table `name` whose array is at `path`, of any shape, as records of one field (the field of `dtype`,
    else the table's name)."""
    try:
        array = Array.open(store, path, read_only=mode == "r")
    except MetaError as exc:
        raise FormatError(f"table '{name}': cannot open its array ({exc})") from None
    key = array.doc_key
    field = dtype.names[0] if dtype is not None and dtype.names else name
    records = RecordArray.of(array, field, name)
    diff = dtype_difference(records.dtype, dtype) if dtype is not None else None
    if diff:
        raise FormatError(f"table '{name}': wrong dtype, {key}: it {diff}")
    why = None
    if written:
        codec = written_codec(written, name)
        why = _v3_written_problem(array, codec) if array.zarr_format == 3 else \
            array_meta.written_problem(array.meta.to_json(), codec)
    if why is not None:
        raise FormatError(f"table '{name}': {key}: {why}; the array's metadata was changed, and its chunks would "
                          "decode to other rows (restore it from a copy)")
    return records


def create(store: Store, schema: Schema, *, chunks: dict[str, int] | None = None,
           compressor: numcodecs.abc.Codec | None = None,
           layout: StorageLayout = StorageLayout()) -> tuple[Schema, str]:
    """Create an empty dataset in an empty store (every table with 0 rows, attrs, manifest); return the schema
    as written (`new_schema`) and the new dataset's id. `layout` says how it is stored (zarr v2, or v3 with
    shards: recorded in its first manifest)."""
    schema = new_schema(schema, chunks, compressor, layout)
    if any(mark in store for mark in (".zgroup", ZARR_JSON, MANIFEST_KEY)):  # e.g. another writer made it since
        raise FormatError("already holds a dataset; append to it or overwrite it")
    dataset_id = new_dataset_id()
    extra = {LAYOUT: layout.to_json()} if layout != StorageLayout() else {}
    # the manifest first: a reader that comes while the arrays are being made finds a zarrfeed dataset with a
    # table missing (a clean error), never a group it would take for another tool's dataset with no tables
    write_manifest(store, new_manifest(schema, {n: 0 for n in schema.tables}, 0, dataset_id, digest=DIGEST,
                                   **{EVERY_CHUNK: True, TAILS: {}}, **extra))
    create_documents(store, schema, layout)
    return schema, dataset_id


def new_schema(schema: Schema, chunks: Mapping[str, int] | None = None,
               compressor: numcodecs.abc.Codec | None = None,
               layout: StorageLayout = StorageLayout()) -> Schema:
    """The schema a new dataset is written with: `chunks` overrides chunk rows per table, `compressor` the
    schema's. Refused in one line (`FormatError`) if it cannot be: a table `chunks` names that the schema has
    not, a compressor zarr v3 has no codec for. A writer asks before it changes anything (an overwrite clears
    the old dataset only once the new one can be made)."""
    unknown = set(chunks or {}) - set(schema.tables)
    if unknown:
        raise FormatError(f"chunks: no table {', '.join(map(repr, sorted(unknown)))} in schema '{schema.name}' "
                          f"(its tables: {', '.join(schema.tables)})")
    schema = Schema(
        tables={n: Table(n, t.dtype, (chunks or {}).get(n, t.chunk_rows), t.path,  # a compressor asked for: all
                         SCHEMA_CODEC if compressor is not None else t.compressor)  # tables', else as the schema's
                # (a new dataset stores every chunk: `missing_is_fill` is left out)
                for n, t in schema.tables.items()},
        links=schema.links, attrs=schema.attrs, compressor=compressor or schema.compressor, name=schema.name,
    )
    for t in schema.tables.values():  # a compressor v3 has no codec for
        layout.array_meta((0,), t.chunk_rows, t.dtype, schema.codec_of(t.name), where=f"table '{t.name}'")
    return schema


def interrupted_create(store: Store) -> Schema | None:
    """The schema of a dataset whose create stopped after its manifest, before its group and arrays were all
    stored (a killed process, a power loss; on an object store each is a PUT of its own, and any of them may be
    missing, `.zgroup` stored and a table's `.zarray` not): commit 0, no rows, a document of `create_documents`
    missing. Nothing was committed to it, so a writer appending finishes it (`create_documents`). None for
    anything else."""
    doc = read_manifest(store)
    if doc is None or doc["commit"] != 0 or any(doc["committed"].values()):
        return None
    schema = Schema.from_json(doc["schema"])
    documents = _documents(schema, StorageLayout.from_json(doc.get(LAYOUT)))
    return schema if len(store.get_many(list(documents))) < len(documents) else None


def create_documents(store: Store, schema: Schema, layout: StorageLayout | None = None) -> None:
    """The group and every table's array, with 0 rows: what `create` writes after the manifest (and what a
    writer appending writes again when a create was interrupted between the two: nothing was committed; its
    layout is then its manifest's)."""
    if layout is None:
        doc = read_manifest(store)
        layout = StorageLayout.from_json(doc.get(LAYOUT) if doc else None)
    store.put_many(_documents(schema, layout))  # stored together (concurrent requests)


def _documents(schema: Schema, layout: StorageLayout) -> dict[str, bytes]:
    """The documents of `create_documents`, made in memory: key -> bytes."""
    made = MemoryStore()
    group = Group.create(made, attrs=schema.attrs, zarr_format=layout.zarr_format)
    folders = {t.path.rsplit("/", 1)[0] for t in schema.tables.values() if "/" in t.path}
    for folder in sorted(folders):  # a replay buffer's `data` and `meta` groups
        Group.create(made, folder, zarr_format=layout.zarr_format)
    for t in schema.tables.values():
        create_table(group, t, schema.codec_of(t.name), layout)
    return made.data


def create_table(group: Group, table: Table, compressor: numcodecs.abc.Codec | None,
                 layout: StorageLayout = StorageLayout()) -> Array:
    """An empty table's array in `group`: 0 rows, the table's chunk rows and dtype, filled with zero bytes
    (the documents zarr 2 wrote, byte for byte). A table at a path of its own (a replay buffer's) is the
    array of its one field: (0, *its shape), of its base dtype, filled with 0, as Diffusion Policy makes them."""
    if table.path:
        field = table.dtype.names[0]  # type: ignore[index]  # a record dtype of one field (see `record_view`)
        sub = table.dtype[field]
        fill = 0 if sub.base.kind in "biufc" else None  # (zarr reads no number as a string's fill value)
        meta = layout.array_meta((0, *sub.shape), table.chunk_rows, sub.base, compressor, fill, table.path)
        return RecordArray.of(group.create_array(table.path, meta), field, table.name)
    return group.create_array(table.name, layout.array_meta((0,), table.chunk_rows, table.dtype, compressor,
                                                            np.zeros(1, table.dtype)[0], table.name))


def table_array(store: Store, table: Table, read_only: bool = False) -> Array:
    """The array of `table` in `store`, opened directly (the dataset was checked, or just made): at its path,
    as records of its one field, for a table at a path of its own."""
    array = Array.open(store, table.array_path, read_only)
    array.missing_is_fill = table.missing_is_fill
    if table.path:
        return RecordArray.of(array, table.dtype.names[0], table.name)  # type: ignore[index]
    return array


def consolidate(store: Store) -> None:
    """Write `.zmetadata`, every metadata document in one, as zarr 2's `consolidate_metadata` does (its parts
    read concurrently on an object store). A v3 dataset has none: zarr v3 leaves consolidated metadata to
    each implementation, and every reader opens each array's own `zarr.json`."""
    if ".zgroup" in store:
        store.put(".zmetadata", consolidated(Group(store).consolidated_docs()))


def set_lengths(arrays: Mapping[str, Array], rows: Mapping[str, int]) -> None:
    """`set_length` for several arrays of one store at once, their documents stored together (one request each
    on an object store, concurrently; on a local disk written aside, then renamed one after the other, in the
    order of `rows`)."""
    docs, metas = {}, {}
    for name, n in rows.items():
        array = arrays[name]
        key = array.doc_key
        meta = json.loads(bytes(array.store[key]))
        meta["shape"] = [int(n), *meta["shape"][1:]]
        docs[key] = json.dumps(meta, indent=4, sort_keys=True).encode() if array.zarr_format == 2 \
            else json_bytes(meta)
        metas[name] = array.meta.resized(n)
    if docs:
        next(iter(arrays.values())).store.put_many(docs)
    for name, meta in metas.items():
        arrays[name].meta = meta


def set_length(array: Array, rows: int) -> None:
    """Set a table's length in its metadata alone (`Array.resize` also deletes every chunk past a shorter end,
    one request each on an object store); call this only when no chunk lies past `rows` (a writer that closes
    cleanly has committed everything it wrote). The rest of the document is kept as it was read."""
    set_lengths({array.table: array}, {array.table: rows})


def readable_rows(schema: Schema, tables: Mapping[str, Array], doc: Mapping[str, Any] | None) -> dict[str, int]:
    """The rows of each table that readers read: those its manifest `doc` commits, or without one (another tool
    wrote the dataset) each array's length, a replay buffer's steps those of its episodes
    (`replay_buffer.rows_by_ends`)."""
    if doc is not None:
        return {n: doc["committed"].get(n, 0) for n in tables}
    return rows_by_ends(schema, tables, {n: a.shape[0] for n, a in tables.items()})


def open_tables(group: Group, mode: str = "r") -> tuple[Schema, dict[str, Array], dict[str, str]]:
    """The dataset's schema, the arrays of its tables, and the other arrays in the group (name -> what it is),
    which readers and writers leave alone. Only the tables are opened and checked: an array of the schema
    that is broken refuses the dataset; one that is not in the schema (a user's mask, another tool's data)
    does not."""
    doc = read_manifest(group.store)
    if doc is None and is_replay_buffer(group):
        return open_replay_buffer(group, read_only=mode == "r")
    names = sorted(group.array_keys())
    if doc is not None:
        wanted: dict[str, Table] | None = Schema.from_json(doc["schema"]).tables
    elif {"scenes", "frames", "agents"} & set(names) or "format_version" in group.attrs:
        wanted = L5KIT_SCHEMA.tables
    else:
        wanted = None  # no schema to go by: every array of structured records is a table
    # a table's v3 document that is damaged, or not an array's, is no array member: opened, it says what it is
    # (as a damaged v2 `.zarray` does), rather than the table being called missing
    names = sorted(set(names) | {n for n, t in (wanted or {}).items()
                                 if not t.path and n not in names and f"{n}/{ZARR_JSON}" in group.store})
    arrays, others = {}, {}
    at_paths = {n: t for n, t in (wanted or {}).items() if t.path}
    for name, table in at_paths.items():
        arrays[name] = open_table(group.store, name, mode, table.dtype, doc["schema"] if doc else None, table.path)
        arrays[name].missing_is_fill = table.missing_is_fill
    for name in names:
        if name in at_paths:
            continue
        if wanted is not None and name not in wanted:
            others[name] = _describe(group.store, name)
            continue
        try:
            arrays[name] = open_table(group.store, name, mode, wanted[name].dtype if wanted is not None else None,
                                      doc["schema"] if doc is not None else None)
        except FormatError as exc:
            if wanted is not None:
                raise
            others[name] = str(exc).split(": ", 1)[-1]
    return detect_schema(group, arrays), arrays, others


def _describe(store: Store, name: str) -> str:
    try:
        if f"{name}/{ZARR_JSON}" in store:
            doc = json.loads(bytes(store[f"{name}/{ZARR_JSON}"]))
            return f"a {len(doc['shape'])}-D array of {doc['data_type']}"
        meta = json.loads(bytes(store[f"{name}/.zarray"]))
        return f"a {len(meta['shape'])}-D array of {meta['dtype']}"
    except Exception:
        return "an array zarrfeed cannot read"


def detect_schema(group: Group, arrays: dict[str, Array]) -> Schema:
    """The dataset's schema: from its manifest, else L5Kit's if it looks like L5Kit, else one from its arrays."""
    doc = read_manifest(group.store)
    if doc is not None:
        schema = Schema.from_json(doc["schema"])
        expected = schema.tables
    elif {"scenes", "frames", "agents"} & set(arrays) or "format_version" in group.attrs:
        schema = L5KIT_SCHEMA
        expected = L5KIT_SCHEMA.tables
        schema = Schema(
            tables={n: (t.dtype, arrays[n].chunks[0] if n in arrays else t.chunk_rows) for n, t in expected.items()},
            links=L5KIT_SCHEMA.links, attrs=dict(group.attrs), compressor=shared_compressor(arrays), name="l5kit",
        )
    else:
        return Schema(tables={n: (a.dtype, a.chunks[0]) for n, a in arrays.items()}, attrs=dict(group.attrs),
                      compressor=shared_compressor(arrays))
    for name, table in expected.items():
        if name not in arrays:
            if name == "traffic_light_faces" and schema.name == "l5kit":
                continue
            raise FormatError(f"table '{name}': missing from the dataset (schema '{schema.name}' declares it)")
        diff = dtype_difference(arrays[name].dtype, table.dtype)
        if diff:
            raise FormatError(f"table '{name}': wrong dtype, it {diff}")
        if doc is not None and arrays[name].chunks[0] != table.chunk_rows:  # commits count chunks of the schema's
            rows = arrays[name].chunks[0]
            field = f"field 'chunks' is [{rows}]" if arrays[name].zarr_format == 2 else \
                f"the {'sharding codec' if arrays[name].sharding is not None else 'chunk grid'} has chunks of " \
                f"{rows} rows"
            raise FormatError(f"table '{name}': {arrays[name].doc_key}: {field}, but the manifest's schema has "
                              f"{table.chunk_rows} rows per chunk; the array's metadata is damaged (restore it from "
                              "a copy)")
    return schema


def shared_compressor(arrays: dict[str, Array]) -> numcodecs.abc.Codec | None:
    """The compressor every table of a dataset another tool wrote shares (what its schema records, and what a
    manifest will record once zarrfeed appends to it), or None if they differ or some have none (then the
    schema takes zarrfeed's default, and appending is refused: `codecs_problem`)."""
    configs = [a.compressor.get_config() if a.compressor else None for a in arrays.values()]
    if not configs or configs[0] is None or any(c != configs[0] for c in configs):
        return None
    return next(iter(arrays.values())).compressor


def written_codec(written: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The compressor a dataset's manifest (its schema, as JSON: `written`) records for table `name`."""
    table = written.get("tables", {}).get(name, {})
    return table["compressor"] if "compressor" in table else written.get("compressor")


def codecs_problem(name: str, array: Array, compressor: numcodecs.abc.Codec | None) -> str | None:
    """Why rows cannot be appended to the table `name` of a dataset another tool wrote, whose manifest will record
    `compressor` and no filters for every table (a reader refuses a table whose codecs differ from its manifest's:
    `array_meta.written_problem`), or None."""
    config = {"compressor": array.compressor.get_config() if array.compressor else None,
              "filters": [f.get_config() for f in array.filters or []]}
    if config["filters"]:
        return f"table '{name}' has filters {config['filters']}"
    want = compressor.get_config() if compressor is not None else None
    if config["compressor"] != want:
        return (f"table '{name}' is compressed with {config['compressor']}, another table with "
                f"{want}" if config["compressor"] else f"table '{name}' has no compressor")
    return None


def empty_table(table: Table) -> Array:
    """An in-memory table with no rows (L5Kit datasets without traffic-light faces read as this)."""
    warnings.warn(f"table '{table.name}' is missing; reading it as empty", stacklevel=3)
    return Array.create(MemoryStore(), table.name, ArrayMeta.new((0,), table.chunk_rows, table.dtype))
