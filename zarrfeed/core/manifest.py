"""The zarrfeed manifest (`zarrfeed.json`) and each numbered commit (`zarrfeed.commits/<n>.json`): what they
hold, and their checks. Readers trust these fields to pick rows, so a wrong type or a missing field is refused
in one line naming the field, never read as a valid dataset."""
from __future__ import annotations

import json
import uuid
from typing import Any

from .commit_log import DIGEST_HEX
from .schema import Schema
from .errors import FormatError


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
# which copy's commit a manifest (and its numbered commit object) publishes: random per commit, so that copies of
# one dataset appended differently to the same commit number are told apart (see Dataset.commit_tag)
COMMIT_TAG = "commit_tag"
# a manifest field of a dataset stored in zarr v3 (`storage_layout.StorageLayout`, as JSON), in its first manifest:
# what a writer finishing an interrupted create makes its arrays with (a v2 dataset's manifests have none)
LAYOUT = "layout"
KEEP_COMMITS = 100  # numbered commits kept for readers that pin one (older ones are deleted as new ones land)


def parse(raw: Any, key: str, tables: dict[str, int] | None = None) -> dict[str, Any]:
    """The manifest stored under `key`, checked; or with `tables` (the manifest's chunk rows per table), a
    numbered commit."""
    try:
        doc = json.loads(bytes(raw))
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: nested too deep to read
        raise FormatError(f"{key}: unreadable manifest ({type(exc).__name__}: {str(exc)[:200]})") from None
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
    if COMMIT_TAG in doc and not isinstance(doc[COMMIT_TAG], str):
        return f"field '{COMMIT_TAG}' is {doc[COMMIT_TAG]!r}, not a string"
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
    if LAYOUT in doc and not (isinstance(doc[LAYOUT], dict) and doc[LAYOUT].get("zarr_format") in (2, 3)
                              and _count(doc[LAYOUT].get("shard_bytes")) and doc[LAYOUT]["shard_bytes"] > 0):
        return f"field '{LAYOUT}' is {doc[LAYOUT]!r}, not {{\"zarr_format\": 2 or 3, \"shard_bytes\": N}}"
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


def new_manifest(schema: Schema, committed: dict[str, int], commit: int, dataset_id: str, **extra: Any
             ) -> dict[str, Any]:
    return {"zarrfeed": MANIFEST_VERSION, "commit": commit, "dataset_id": dataset_id, "schema": schema.to_json(),
            "committed": dict(committed), **extra}


def new_commit_tag() -> str:
    """A commit's tag (`COMMIT_TAG`), new for each commit number a writer publishes."""
    return f"commit-{uuid.uuid4().hex}"


def new_dataset_id() -> str:
    """A dataset's identity, new each time one is created (caches of its chunks are keyed on it)."""
    return uuid.uuid4().hex
