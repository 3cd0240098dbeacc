"""The on-disk format: opening zarr v2 stores, creating a dataset from a schema, and the zarrfeed manifest.

The manifest (`zarrfeed.json` at the group's root) holds the schema, the row count per table that the writer
has *committed*, the commit's number and the journal of episode keys; each commit's row counts are also kept
as `zarrfeed.commits/<number>.json`, so readers can pin one. zarr shows a grown shape before the rows are
written, so readers trust the committed count, not the shape. Datasets written by other tools have no
manifest: their shapes are their row counts.
Arrays, groups and their documents are zarrfeed's own (`zarr_array`, `zarr_meta`): zarr-python is not needed
to read or write a dataset.
"""
from __future__ import annotations

import json
import os
import uuid
import warnings
from typing import Any

import numcodecs
import numpy as np

from . import array_meta
from .commit_log import DIGEST_HEX, LOG_PREFIX, ChunkRecord, CommitLog, Segment, SegmentRef
from .schema import L5KIT_SCHEMA, Schema, Table, dtype_difference
from .store import FormatError, Location, missing_credentials
from .stores import MemoryStore, Store
from .zarr_array import Array, Group
from .zarr_meta import ArrayMeta, MetaError, consolidated

__all__ = ["FormatError", "Location", "MANIFEST_KEY", "create", "detect_schema", "open_group", "open_store",
           "open_table", "read_manifest", "write_manifest"]

MANIFEST_KEY = "zarrfeed.json"
COMMITS_PREFIX = "zarrfeed.commits"
MANIFEST_VERSION = 4  # 3: the caller's episode keys and the chunks' digests in the commit log; 4: `TAILS`
DIGESTS_SINCE = 3  # every commit of this format or later records its chunks' digests
TAILS_SINCE = 4  # every manifest of this format or later records its last chunks' rows (`TAILS`)
DIGEST = "xxh3_64"  # how chunk digests are computed (zarrfeed.core.chunks.digest)
# a manifest field: true where the commit log records every chunk whose rows are all committed (datasets made,
# or adopted from another tool, by a zarrfeed that records them all; one that an earlier zarrfeed adopted may
# lack the records of the chunks that were there before, which read as unverifiable)
EVERY_CHUNK = "every_chunk_recorded"
# a manifest and commit field: per table whose last chunk is partly filled, the digest of that chunk's committed
# rows, decoded (`chunks.rows_digest`). A writer rewrites that chunk as it appends, withdrawing its stored
# bytes' record, and one killed before it closed never seals it again: these rows never change, so readers
# check them whatever the chunk's later versions. Required from format `TAILS_SINCE` on, and where the log records
# every chunk (`EVERY_CHUNK`): an edit must take out three fields to turn the check off
TAILS = "tails"
KEEP_COMMITS = 100  # numbered commits kept for readers that pin one (older ones are deleted as new ones land)


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
        has_group = ".zgroup" in store
    except Exception as exc:
        if missing_credentials(exc):  # the command line explains where credentials are read from
            raise
        raise FormatError(f"{loc}: cannot read the store ({type(exc).__name__}: "
                          f"{_first_line(_why_refused(loc, exc))})") from None
    if not has_group:
        if "zarr.json" in store:
            raise FormatError(f"{loc}: a zarr v3 store; zarrfeed reads zarr v2 (L5Kit's format)")
        if ".zarray" in store:
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
               written: dict[str, Any] | None = None) -> Array:
    """One table's array (of records of `dtype`, if given); a broken `.zarray` becomes a `FormatError` naming the
    table and the file: each field zarrfeed relies on is checked (see `array_meta`), since zarr reads a
    negative chunk size as no chunks. `written`: the schema that zarrfeed wrote it with (its manifest's, as
    JSON), whose compressor, and no filters, the `.zarray` must name."""
    key = f"{name}/.zarray"
    try:
        meta: Any = json.loads(bytes(store[key]))
    except KeyError:
        meta = None  # zarr names what is there instead (a group, nothing)
    except (ValueError, TypeError) as exc:
        raise FormatError(f"table '{name}': cannot open its array ({key} is not JSON: {exc}); the array's "
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
            why = array_meta.written_problem(meta, written.get("compressor"))
            if why is not None:
                raise FormatError(f"table '{name}': {key}: {why}; the array's metadata was changed, and its chunks "
                                  "would decode to other rows (restore it from a copy)")
        if why is None:
            return arr
    raise FormatError(f"table '{name}': {key}: {why}; the array's metadata is damaged (restore it from a copy)")


def _parse(raw: Any, key: str, tables: dict[str, int] | None = None) -> dict[str, Any]:
    """The manifest stored under `key`, checked; or with `tables` (the manifest's chunk rows per table), a
    numbered commit."""
    try:
        doc = json.loads(bytes(raw))
    except (ValueError, TypeError) as exc:
        raise FormatError(f"{key}: unreadable manifest ({exc})") from None
    why = _manifest_problem(doc) if tables is None else _commit_problem(doc, tables)
    if why:
        raise FormatError(f"{key}: {why}; the manifest is damaged (restore it from a copy, or rewrite the dataset)")
    doc.setdefault("commit", 0)
    return doc


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _manifest_problem(doc: Any) -> str | None:
    """What is wrong with the shape of a manifest (or a numbered commit), in a few words naming the field, or
    None. Readers trust these fields to pick rows: a wrong type must never read as a valid dataset."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    if not isinstance(doc.get("committed"), dict):
        return "field 'committed' is missing or not an object"
    for table, n in doc["committed"].items():
        if not _count(n):
            return f"field 'committed.{table}' is {n!r}, not a row count (a whole number >= 0)"
    if "commit" in doc and not _count(doc["commit"]):
        return f"field 'commit' is {doc['commit']!r}, not a commit number (a whole number >= 0)"
    if "zarrfeed" in doc and not _count(doc["zarrfeed"]):
        return f"field 'zarrfeed' is {doc['zarrfeed']!r}, not a format version"
    if doc.get("zarrfeed", 0) > MANIFEST_VERSION:
        return (f"field 'zarrfeed' is {doc['zarrfeed']}: written by a newer zarrfeed (this one reads formats up to "
                f"{MANIFEST_VERSION}; upgrade it)")
    if "digest" in doc and doc["digest"] not in (None, DIGEST):
        return f"field 'digest' is {doc['digest']!r}, not a digest this zarrfeed computes ({DIGEST})"
    if "dataset_id" in doc and not isinstance(doc["dataset_id"], str):
        return f"field 'dataset_id' is {doc['dataset_id']!r}, not a string"
    if "schema" not in doc:  # every zarrfeed manifest holds one: readers take the tables from it
        return "field 'schema' is missing"
    if not isinstance(doc["schema"], dict) or not isinstance(doc["schema"].get("attrs", {}), dict):
        return "field 'schema' is not an object" if not isinstance(doc["schema"], dict) else \
            "field 'schema.attrs' is not an object"
    try:
        schema = Schema.from_json(doc["schema"])
    except Exception as exc:  # any malformed part: a missing key, a wrong type, an unknown dtype or codec
        return f"field 'schema' is not a zarrfeed schema ({type(exc).__name__}: {exc})"
    why = _tables_problem(doc["committed"], list(schema.tables))
    if why:
        return why
    rows = any(n > 0 for n in doc["committed"].values())
    if doc.get("digest") != DIGEST and (doc.get("log") or (doc.get("zarrfeed", 0) >= DIGESTS_SINCE and (
            rows or doc.get("commit", 0) > 0))):  # else every chunk would be read unchecked
        return (f"field 'digest' is {'missing' if 'digest' not in doc else repr(doc['digest'])}, but its commits "
                f"record chunk digests (a manifest of format {DIGESTS_SINCE} or later with commits, or with a "
                "commit log, names them)")
    full = [t for t, n in doc["committed"].items() if n >= schema.tables[t].chunk_rows]
    if doc.get("digest") == DIGEST and full and not doc.get("log"):
        return (f"field 'log' is empty, but table '{full[0]}' has chunks whose rows are all committed: their "
                "records (chunk digests) are not listed")
    if EVERY_CHUNK in doc and doc[EVERY_CHUNK] is not True:
        return f"field '{EVERY_CHUNK}' is {doc[EVERY_CHUNK]!r}, not true (or absent)"
    why = _tails_problem(doc, {t: tab.chunk_rows for t, tab in schema.tables.items()},
                         required=doc.get("zarrfeed", 0) >= TAILS_SINCE or bool(doc.get(EVERY_CHUNK)))
    if why:
        return why
    journal = doc.get("journal", {})
    if not isinstance(journal, dict):
        return f"field 'journal' is {journal!r}, not an object"
    inputs = journal.get("inputs", {})
    if not isinstance(inputs, dict):
        return "field 'journal.inputs' is not an object"
    for name, sets in inputs.items():
        if not isinstance(sets, dict) or not all(
                isinstance(r, list) and len(r) == 2 and all(_count(x) for x in r) and r[0] <= r[1]
                for part in ("committed", "skipped") for r in _list(sets.get(part, []))):
            return f"field 'journal.inputs.{name}' is not lists of [start, end) ranges"
    keys = journal.get("keys", {})
    if not isinstance(keys, dict) or not all(isinstance(keys.get(p, []), list) and all(_key(k) for k in keys[p])
                                             for p in ("committed", "skipped") if p in keys):
        return "field 'journal.keys' is not lists of keys"
    pending = journal.get("pending", [])
    if not isinstance(pending, list) or not all(isinstance(p, list) and len(p) == 2 and _key(p[0])
                                                and isinstance(p[1], str) for p in pending):
        return "field 'journal.pending' is not a list of [key, fingerprint] pairs"
    if not isinstance(journal.get("last_input"), (str, type(None))):
        return "field 'journal.last_input' is not a string"
    log = doc.get("log", [])
    if not isinstance(log, list) or not all(
            isinstance(r, dict) and isinstance(r.get("key"), str) and _count(r.get("level"))
            and _count(r.get("entries")) for r in log):
        return "field 'log' is not a list of log segments ({key, level, entries})"
    return None


def _tables_problem(committed: dict[str, Any], tables: list[str]) -> str | None:
    """A commit must count the rows of every table of the schema, and of no other: a table it leaves out would
    read as empty, and a writer would append to it from row 0 over the rows it holds."""
    for table in tables:
        if table not in committed:
            return f"field 'committed' has no row count for table '{table}'"
    for table in committed:
        if table not in tables:
            return f"field 'committed.{table}' counts the rows of a table the schema does not have"
    return None


def _tails_problem(doc: dict[str, Any], chunk_rows: dict[str, int], required: bool) -> str | None:
    """What is wrong with a commit's `TAILS` field: one 16-hex-digit digest per table whose last chunk is partly
    filled by its committed rows, and none for another table; None if it is right (or absent and not
    `required`). Its `committed` was checked before."""
    if TAILS not in doc:
        return f"field '{TAILS}' is missing (this dataset's commits record their last chunks' rows)" \
            if required else None
    tails = doc[TAILS]
    if not isinstance(tails, dict):
        return f"field '{TAILS}' is {tails!r}, not an object of digests per table"
    for table, value in tails.items():
        n, c = doc["committed"].get(table), chunk_rows.get(table)
        if n is None or c is None or n % c == 0:
            return f"field '{TAILS}.{table}': the table has no partly filled last chunk to record"
        if not (isinstance(value, str) and DIGEST_HEX.fullmatch(value)):
            return f"field '{TAILS}.{table}' is {value!r}, not an XXH3-64 digest (16 hex digits)"
    for table, n in doc["committed"].items():
        if table in chunk_rows and n % chunk_rows[table] and table not in tails:
            return (f"field '{TAILS}' has no digest for table '{table}', whose last chunk holds committed rows "
                    f"{n // chunk_rows[table] * chunk_rows[table]}-{n}")
    return None


def _commit_problem(doc: Any, chunk_rows: dict[str, int]) -> str | None:
    """What is wrong with the shape of a numbered commit of a dataset whose tables have `chunk_rows`, or None.
    Its `TAILS` may be absent (commits made before they were recorded): then its last chunks go unchecked."""
    if not isinstance(doc, dict) or not isinstance(doc.get("committed"), dict):
        return "field 'committed' is missing or not an object"
    for table, n in doc["committed"].items():
        if not _count(n):
            return f"field 'committed.{table}' is {n!r}, not a row count (a whole number >= 0)"
    if not _count(doc.get("commit")):
        return f"field 'commit' is {doc.get('commit')!r}, not a commit number (a whole number >= 0)"
    return _tables_problem(doc["committed"], list(chunk_rows)) or _tails_problem(doc, chunk_rows, required=False)


def _key(value: Any) -> bool:
    """An episode key as the journal stores it: a str, an int, or an input's position {input, index}."""
    if isinstance(value, dict):
        return set(value) == {"input", "index"} and isinstance(value["input"], str) and _count(value["index"])
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else [None]


def commit_key(number: int) -> str:
    return f"{COMMITS_PREFIX}/{number:010d}.json"


def read_manifest(store: Store, commit: int | None = None) -> dict[str, Any] | None:
    """The zarrfeed manifest (the latest commit, or commit number `commit`), or None for datasets written by
    other tools. A pinned commit gives its row counts; everything below them never changes."""
    try:
        raw = store[MANIFEST_KEY]
    except KeyError:
        if commit is not None:
            raise FormatError(f"commit {commit}: this dataset has no zarrfeed commits") from None
        return None
    doc = _parse(raw, MANIFEST_KEY)
    if commit is None or commit == doc["commit"]:
        return doc
    if not isinstance(commit, int) or isinstance(commit, bool) or commit < 0:
        raise FormatError(f"commit {commit!r}: not a commit number (a whole number >= 0)")
    if commit > doc["commit"]:
        raise FormatError(f"commit {commit}: the latest commit is {doc['commit']}")
    try:
        chunk_rows = {t: int(tab["chunk_rows"]) for t, tab in doc["schema"]["tables"].items()}
        pinned = _parse(store[commit_key(commit)], commit_key(commit), chunk_rows)
    except KeyError:
        raise FormatError(f"commit {commit}: no longer kept (the dataset keeps its last {KEEP_COMMITS} commits; "
                          f"the latest is {doc['commit']})") from None
    if pinned["commit"] != commit:
        raise FormatError(f"{commit_key(commit)}: field 'commit' is {pinned['commit']}, not the number its name says; "
                          "the commit is damaged (restore it from a copy)")
    pinned_doc = {k: v for k, v in doc.items() if k != TAILS}  # the latest commit's tails are not this one's
    return {**pinned_doc, "commit": commit, "committed": pinned["committed"],
            **({TAILS: pinned[TAILS]} if TAILS in pinned else {})}


def write_manifest(store: Store, doc: dict[str, Any], log_objects: dict[str, bytes] | None = None,
                   retry: bool = False) -> None:
    """Publish commit `doc["commit"]`: the new commit log segments it lists, then the whole manifest as one
    object, then its row counts as an immutable numbered object. Each is one atomic write on every store (a
    PUT; a temporary file renamed on local disks), and readers only ever start from the manifest, so they see
    the old commit or the new one, never a mixture. The numbered object comes last and is created only if
    absent (`record_commit`): so every commit object has a number the manifest reached, an existing one is
    never rewritten, and one found above the manifest's number means the number went backwards. `retry`: this
    writer's earlier call for the same number may have landed (it timed out), so its object is replaced. Log
    segments merged into a new one are deleted by the writer only once this returned (a call that timed out
    may still land, and must not delete what the next attempt lists)."""
    number = int(doc["commit"])
    if log_objects:
        put_all(store, dict(log_objects))
    put(store, MANIFEST_KEY, json.dumps(doc).encode())
    record_commit(store, number, doc["committed"], doc.get(TAILS), replace=retry)
    if number >= KEEP_COMMITS:
        delete(store, [commit_key(number - KEEP_COMMITS)])


def record_commit(store: Store, number: int, committed: dict[str, int],
                  tails: dict[str, str] | None = None, replace: bool = False) -> None:
    """Store commit `number`'s row counts (and `TAILS`, its last chunks' digests) as
    `zarrfeed.commits/<number>.json`, only if no such object exists (unless `replace`); `FormatError` if one
    does."""
    doc: dict[str, Any] = {"commit": number, "committed": committed}
    if tails is not None:
        doc[TAILS] = tails
    key, raw = commit_key(number), json.dumps(doc).encode()
    if replace:
        put(store, key, raw)
    elif not put_new(store, key, raw):
        raise FormatError(f"{key}: already exists, so commit {number} was made before; {MANIFEST_KEY}'s commit "
                          "number went backwards (restore it from a copy); nothing more is committed")


def put_new(store: Store, key: str, value: bytes) -> bool:
    """Store `key` only if it is absent; False if it is there (atomic where the store allows, see
    `Store.put_new`)."""
    return store.put_new(key, value)


def commit_numbers(store: Store) -> list[int]:
    """The numbers of the commit objects stored (`zarrfeed.commits/<number>.json`), in order."""
    try:
        names = store.listdir(COMMITS_PREFIX)
    except (KeyError, FileNotFoundError):
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def history_problem(store: Store, doc: dict[str, Any]) -> str | None:
    """Whether the manifest's commit number is below what its commits have reached (a commit object, or a log
    segment it lists, numbered above it): the number went backwards, and the next commit would take the
    number of one made before. One line naming the file, or None."""
    number = doc["commit"]
    later = [n for n in commit_numbers(store) if n > number]
    if later:
        # zarrfeed before format checks stored the commit object first: one killed in between left just N + 1
        orphan = (f"; or, if a writer older than zarrfeed's format checks was killed while committing, remove "
                  f"{commit_key(later[-1])}") if later == [number + 1] else ""
        return (f"{commit_key(later[-1])}: commit {later[-1]} was made, but {MANIFEST_KEY} says the latest commit "
                f"is {number}: its commit number went backwards (restore it from a copy{orphan})")
    for ref in doc.get("log", []):
        name = ref["key"][len(LOG_PREFIX) + 1:]
        if name[:10].isdigit() and int(name[:10]) > number:
            return (f"{MANIFEST_KEY}: its commit number is {number}, but it lists commit log segment {ref['key']}, "
                    f"made by commit {int(name[:10])}: its commit number went backwards (restore it from a copy)")
    return None


def read_log(store: Store, doc: dict[str, Any]) -> CommitLog:
    """The commit log the manifest `doc` lists, every segment read (concurrently on an object store). A segment
    that is gone raises `KeyError` (a writer merged it since `doc` was read: read the manifest again)."""
    refs = [SegmentRef.from_json(r) for r in doc.get("log", [])]
    keys = [r.key for r in refs]
    got = store.get_many(keys)
    missing = [k for k in keys if k not in got]
    if missing:
        raise KeyError(missing[0])
    contents = {k: Segment.from_json(got[k], k) for k in keys}
    tables = doc["schema"]["tables"]
    for ref in refs:
        segment = contents[ref.key]
        if len(segment) != ref.entries:
            raise FormatError(f"{ref.key}: holds {len(segment)} entries, but {MANIFEST_KEY} lists it with "
                              f"{ref.entries}; the commit log segment is damaged (restore it from a copy)")
        unknown = sorted(set(segment.chunks) - set(tables))
        if unknown:
            raise FormatError(f"{ref.key}: records chunks of table '{unknown[0]}', which the schema does not have; "
                              "the commit log segment is damaged (restore it from a copy)")
    log = CommitLog(refs, contents)
    why = _unrecorded(log, doc)
    if why:
        raise FormatError(why)
    return log


def _unrecorded(log: CommitLog, doc: dict[str, Any]) -> str | None:
    """In a log that records every chunk (`EVERY_CHUNK`), each chunk whose rows are all committed has an entry
    (its record, or None where the writer could not tell which write came last, or the chunk was there before
    zarrfeed's first commit): one without is damage (entries removed), not "unverifiable". Only each table's
    last, partly filled chunk may lack one (its writer rewrites it, and one killed before it closed never sealed
    it). A dataset an earlier zarrfeed adopted from another tool has no such field: its chunks from before read
    as unverifiable, as they did."""
    if doc.get("digest") != DIGEST or not doc.get(EVERY_CHUNK):
        return None
    chunks = log.whole().chunks
    for t, n in doc["committed"].items():
        c = doc["schema"]["tables"][t]["chunk_rows"]
        missing = [i for i in range(n // c) if i not in chunks.get(t, {})]
        if missing:
            where = log.refs[-1].key if log.refs else MANIFEST_KEY
            return (f"{where}: chunk '{t}/{missing[0]}' (of {len(missing)} whose rows are all committed) has no "
                    "record in the commit log; the commit log is damaged (restore it from a copy)")
    return None


def latest_log(store: Store, tries: int = 5) -> tuple[dict[str, Any] | None, CommitLog]:
    """The latest manifest and its commit log, read again if a writer merged a segment away meanwhile. A segment
    missing from a manifest that did not change meanwhile is damage (deleted by hand, a lost object), named."""
    previous: dict[str, Any] | None = None
    missing = ""
    for _ in range(tries):
        doc = read_manifest(store)
        if doc is None:
            return None, CommitLog()
        if doc == previous:  # the same manifest, and a segment it lists is gone: not a merge, damage
            raise FormatError(f"{MANIFEST_KEY}: commit {doc.get('commit')} lists commit log segment {missing!r}, "
                              "which is missing: the dataset is damaged (restore that object from a copy)")
        try:
            return doc, read_log(store, doc)
        except KeyError as exc:
            missing, previous = str(exc.args[0]), doc
    raise FormatError(f"{MANIFEST_KEY}: its commit log keeps changing while it is read ({tries} tries)")


def sealed_chunks(store: Store, rows: dict[str, int], chunk_rows: dict[str, int],
                  commit: int | None = None, tail: bool = True) -> dict[str, dict[int, ChunkRecord]] | None:
    """The size and digest recorded for each chunk of `rows` (a commit's row counts) that no writer changes any
    more: chunks whose rows are all below `rows`, and with `tail` a table's last, partly filled chunk when
    `commit` is the latest and its writer closed (sealed it). A writer that opens the dataset later withdraws
    that seal before it rewrites the chunk, so a reader that keeps these records for long (a loader's disk
    cache) asks for `tail=False`. None for a dataset whose commits record no digests (written by another
    tool or by zarrfeed before format 3): it cannot be verified."""
    doc, log = latest_log(store)
    if doc is None or doc.get("digest") != DIGEST:
        return None
    chunks = log.whole().chunks
    latest = commit is None or commit == doc["commit"]
    out = {}
    for t, n in rows.items():
        c = chunk_rows[t]
        out[t] = {i: r for i, r in chunks.get(t, {}).items()
                  if r is not None and ((i + 1) * c <= n or (tail and latest and i * c < n))}
    return out


def log_keys(store: Store) -> list[str]:
    """The keys of every commit log segment stored, listed or not by the manifest."""
    try:
        return [f"{LOG_PREFIX}/{name}" for name in store.listdir(LOG_PREFIX)]
    except (KeyError, FileNotFoundError):
        return []


def delete(store: Store, keys: list[str]) -> None:
    """Delete `keys`, those already gone included."""
    store.delete(keys)


def put(store: Store, key: str, value: bytes) -> None:
    """Store one key, atomically."""
    store.put(key, value)


def put_all(store: Store, values: dict[str, bytes]) -> None:
    """Store several keys (on an object store as concurrent requests)."""
    store.put_many(values)


def manifest(schema: Schema, committed: dict[str, int], commit: int, dataset_id: str, **extra: Any
             ) -> dict[str, Any]:
    return {"zarrfeed": MANIFEST_VERSION, "commit": commit, "dataset_id": dataset_id, "schema": schema.to_json(),
            "committed": dict(committed), **extra}


def new_dataset_id() -> str:
    """A dataset's identity, new each time one is created (caches of its chunks are keyed on it)."""
    return uuid.uuid4().hex


def create(store: Store, schema: Schema, *, chunks: dict[str, int] | None = None,
           compressor: numcodecs.abc.Codec | None = None) -> tuple[Schema, str]:
    """Create an empty dataset in an empty store (every table with 0 rows, attrs, manifest); return the schema
    as written and the new dataset's id. `chunks` overrides chunk rows per table, `compressor` the schema's."""
    unknown = set(chunks or {}) - set(schema.tables)
    if unknown:
        raise FormatError(f"chunks: no table {sorted(unknown)} in schema '{schema.name}'")
    if ".zgroup" in store or MANIFEST_KEY in store:  # e.g. made by another writer since the caller looked
        raise FormatError("already holds a dataset; append to it or overwrite it")
    schema = Schema(
        tables={n: (t.dtype, (chunks or {}).get(n, t.chunk_rows)) for n, t in schema.tables.items()},
        links=schema.links, attrs=schema.attrs, compressor=compressor or schema.compressor, name=schema.name,
    )
    dataset_id = new_dataset_id()
    # the manifest first: a reader that comes while the arrays are being made finds a zarrfeed dataset with a
    # table missing (a clean error), never a group it would take for another tool's dataset with no tables
    write_manifest(store, manifest(schema, {n: 0 for n in schema.tables}, 0, dataset_id, digest=DIGEST,
                                   **{EVERY_CHUNK: True, TAILS: {}}))
    # the documents are made in memory and stored together (on an object store, concurrent requests)
    made = MemoryStore()
    group = Group.create(made, attrs=schema.attrs)
    for t in schema.tables.values():
        create_table(group, t, schema.compressor)
    put_all(store, made.data)
    return schema, dataset_id


def create_table(group: Group, table: Table, compressor: numcodecs.abc.Codec | None) -> Array:
    """An empty table's array in `group`: 0 rows, the table's chunk rows and dtype, filled with zero bytes
    (the documents zarr 2 wrote, byte for byte)."""
    return group.create_array(table.name, ArrayMeta.new((0,), table.chunk_rows, table.dtype, compressor,
                                                        fill_value=np.zeros(1, table.dtype)[0]))


def consolidate(store: Store) -> None:
    """Write `.zmetadata`, every metadata document in one, as zarr 2's `consolidate_metadata` does (its parts
    read concurrently on an object store)."""
    put(store, ".zmetadata", consolidated(Group(store).consolidated_docs()))


def set_length(array: Array, rows: int) -> None:
    """Set a table's length in its metadata alone (`Array.resize` also deletes every chunk past a shorter end,
    one request each on an object store); call this only when no chunk lies past `rows` (a writer that closes
    cleanly has committed everything it wrote). The rest of the document is kept as it was read."""
    key = f"{array.path}/.zarray"
    meta = json.loads(bytes(array.store[key]))
    meta["shape"] = [int(rows)]
    put(array.store, key, json.dumps(meta, indent=4, sort_keys=True).encode())
    array.meta = array.meta.resized(rows)


def open_tables(group: Group, mode: str = "r") -> tuple[Schema, dict[str, Array], dict[str, str]]:
    """The dataset's schema, the arrays of its tables, and the other arrays in the group (name -> what it is),
    which readers and writers leave alone. Only the tables are opened and checked: an array of the schema
    that is broken refuses the dataset; one that is not in the schema (a user's mask, another tool's data)
    does not."""
    names = sorted(group.array_keys())
    doc = read_manifest(group.store)
    if doc is not None:
        wanted: dict[str, Table] | None = Schema.from_json(doc["schema"]).tables
    elif {"scenes", "frames", "agents"} & set(names) or "format_version" in group.attrs:
        wanted = L5KIT_SCHEMA.tables
    else:
        wanted = None  # no schema to go by: every array of structured records is a table
    arrays, others = {}, {}
    for name in names:
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
        if doc is not None and arrays[name].chunks[0] != table.chunk_rows:  # commits count chunks of the schema's
            raise FormatError(f"table '{name}': {name}/.zarray: field 'chunks' is [{arrays[name].chunks[0]}], but the "
                              f"manifest's schema has {table.chunk_rows} rows per chunk; the array's metadata is "
                              "damaged (restore it from a copy)")
    return schema


def empty_table(table: Table) -> Array:
    """An in-memory table with no rows (L5Kit datasets without traffic-light faces read as this)."""
    warnings.warn(f"table '{table.name}' is missing; reading it as empty", stacklevel=3)
    return Array.create(MemoryStore(), table.name, ArrayMeta.new((0,), table.chunk_rows, table.dtype))
