"""Reading a dataset's commit log (the segments its manifest lists) and what it records: each chunk's size
and digest, and whether the commit numbers went backwards."""
from __future__ import annotations

from typing import Any

from .commit_log import LOG_PREFIX, ChunkRecord, CommitLog, Segment, SegmentRef
from .manifest_io import commit_numbers, read_manifest
from .manifest import DIGEST, EVERY_CHUNK, MANIFEST_KEY, commit_key
from .errors import FormatError
from .stores import Store


def history_problem(store: Store, doc: dict[str, Any]) -> str | None:
    """Whether the manifest's commit number is below what its commits have reached (a commit object, or a log
    segment it lists, numbered above it): the number went backwards, and the next commit would take the
    number of one made before. One line naming the file, or None."""
    number = doc["commit"]
    later = [n for n in commit_numbers(store) if n > number]
    if later:
        # a writer older than zarrfeed's format checks stores the commit object first: killed then, it leaves N + 1
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
