"""Every chunk a reader reads, checked against the size and digest its commit recorded (on by default;
docs/architecture.md#chunk-checks).

A reader takes, when it opens a dataset, the records of the chunks below its rows (`ChunkCheck`) and the
identity of what it opened: the dataset's id, its commit, and the newest commit then. Each chunk it reads
later is hashed (XXH3-64 of the stored bytes, before anything is decoded: a small fraction of the decode's cost, which
bench/bench_loader.py measures) and compared. A chunk that was changed, swapped with another, or is another dataset's
(one put in this one's place since it was opened, by `ingest --overwrite` or `mv`) raises `ChunkError`, one line
naming table, chunk key and place; nothing of it reaches a batch. HDFS and ZFS check every read too.

A table's last, partly filled chunk is rewritten by a writer that appends (its rows below the reader's stay
as they were), so the writer withdraws its record first and seals it again when it closes; one killed before
it closes never does. Each commit also records the digest of that chunk's committed rows, decoded
(`manifest.TAILS`): a last chunk that does not match its stored bytes' record (or has none) is decoded
and its rows below the reader's count compared with that digest, whatever writer changed the chunk since.

Chunks with no record are read unchecked: datasets written by other tools (L5Kit's) or by a zarrfeed
whose format records no digests, and the last chunk of a commit made before its rows were
recorded: that one is read only once the latest manifest shows the dataset the reader opened (the same id,
no older commit, no fewer rows, every chunk the reader has a record of recorded alike); then its bytes
must match the latest record if there is one. A dataset put in its place raises `ChunkError`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


from .chunks import digest, rows_digest
from .commit_log import ChunkRecord
from .manifest import DIGEST, TAILS
from .commit_log_reads import latest_log
from .errors import ChunkChanged, ChunkError, FormatError
from .stores import Store
from .zarr_array import Array

RECHECKS = 4  # reads of the manifest and the chunk when a writer rewrites the last chunk meanwhile


@dataclass(frozen=True)
class Opened:
    """What a reader opened: the dataset's id, its commit number and row counts, and the newest commit then
    with the key of its newest commit log segment (`tag`, unique to that commit of that dataset)."""

    dataset_id: str | None
    commit: int
    rows: dict[str, int]
    latest: int
    tag: str | None


@dataclass
class ChunkCheck:
    """The records a reader checks the chunks it reads against (picklable: workers get their parent's).

    `records[table][index]`: size and digest of each chunk with a record, `chunk_rows[table]`, `where` (the
    dataset's place, for messages) and `tails[table]`: the digest of the rows of the reader's commit in the
    table's last, partly filled chunk (`manifest.TAILS`; absent for commits that did not record it)."""

    where: str
    opened: Opened
    records: dict[str, dict[int, ChunkRecord]]
    chunk_rows: dict[str, int]
    tails: dict[str, str] = field(default_factory=dict)
    _later: dict[tuple[str, int], ChunkRecord] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_later": {}}  # what one process learnt is rechecked by another

    def part(self, table: str | list[str], start: int, stop: int) -> "ChunkCheck":
        """This check with the records of rows [start, stop) of `table` (or of each of several tables) only:
        what a task that reads them needs (a dataset's records pickled into each of thousands of tasks would
        cost more than the rows)."""
        tables = [table] if isinstance(table, str) else table
        mine = {}
        for t in tables:
            c = self.chunk_rows[t]
            first, last = start // c, (stop - 1) // c
            mine[t] = {i: r for i, r in self.records.get(t, {}).items() if first <= i <= last}
        return ChunkCheck(self.where, self.opened, mine, self.chunk_rows,
                          {t: d for t, d in self.tails.items() if t in tables})

    def tail(self, table: str, index: int) -> bool:
        """Whether chunk `index` of `table` is the last one and partly filled in the reader's rows."""
        c, n = self.chunk_rows[table], self.opened.rows.get(table, 0)
        return index * c < n < (index + 1) * c

    def recorded(self, table: str, index: int) -> bool:
        """Whether the reader's commit records chunk `index` of `table` as stored (its digest, or for the last,
        partly filled chunk that of its rows): missing, it is lost, even in a table whose chunks holding only the
        fill value another tool left out (`missing_is_fill`), which have no record."""
        return index in self.records.get(table, {}) or (self.tail(table, index) and table in self.tails)

    def check(self, array: Array, index: int, key: str, raw: bytes | None) -> bytes | None:
        """The bytes to decode for chunk `index` of `array` (stored under `key`), read as `raw` (None: missing,
        which the decoder refuses); `ChunkError` if they are not the chunk the reader's commit holds."""
        table = array.table
        record = self.records.get(table, {}).get(index)
        if raw is None:
            self._same_dataset(array.store, table, key)  # a dataset put in its place says so, not "missing"
            if array.missing_is_fill and self.recorded(table, index):  # (else the decoder refuses it)
                raise ChunkError(f"table '{table}': chunk '{key}' of {self.where} is missing, though its commit "
                                 "recorded it as stored; the dataset is incomplete (zarrfeed validate lists every "
                                 "missing chunk)")
            return None
        if record is not None and len(raw) == record[0] and digest(raw) == record[1]:
            return raw
        if not self.tail(table, index):
            if record is None:
                return raw  # nothing recorded: read unchecked (see the module docstring)
            raise _changed(table, key, raw, record, self.where)
        if table in self.tails:  # the rows read are those committed (the rest of the chunk is no commit's)
            self._rows_check(array, index, key, raw)
            return raw
        later = self._later.get((table, index))
        if later is not None and len(raw) == later[0] and digest(raw) == later[1]:
            return raw
        return self._recheck(array, index, key, raw)

    def _rows_check(self, array: Array, index: int, key: str, raw: bytes) -> None:
        """`ChunkError` unless the rows of the last chunk `raw` below the reader's count are those its commit
        recorded (a decode more, of one chunk per table): another dataset's (said so), or changed."""
        table, c = array.table, self.chunk_rows[array.table]
        rows = self.opened.rows[table] - index * c
        got = rows_digest(array, key, raw, rows)
        if got == self.tails[table]:
            return
        self._same_dataset(array.store, table, key)  # another dataset put in its place is said so
        raise ChunkChanged(f"table '{table}': chunk '{key}' of {self.where} is not the chunk that was committed (its "
                           f"rows {index * c}-{index * c + rows} have digest {got}; the commit recorded "
                           f"{self.tails[table]}): the file was changed or replaced, or another dataset was put in "
                           "its place")

    def _recheck(self, array: Array, index: int, key: str, raw: bytes) -> bytes:
        """The last chunk, which a writer may have rewritten since the reader opened: read again after the
        latest manifest, accepted if that is the same dataset and the bytes match its record (or it has none).
        Read through its array: an inner chunk of a v3 shard is no object of its own."""
        table = array.table
        for attempt in range(RECHECKS):
            if attempt:
                time.sleep(0.05 * attempt)
            latest = self._same_dataset(array.store, table, key).get(table, {}).get(index)
            now = array.read_chunks([index])[0]
            if now is None:
                raise ChunkError(f"table '{table}': chunk '{key}' of {self.where} is missing, below the rows "
                                 "read; the dataset is incomplete (zarrfeed validate lists every missing chunk)")
            if latest is None:
                return now  # a writer is in it, its record withdrawn: unchecked
            if len(now) == latest[0] and digest(now) == latest[1]:
                self._later[(table, index)] = latest
                return now
            raw = now
        raise _changed(table, key, raw, latest, self.where)

    def _same_dataset(self, store: Store, table: str, key: str) -> dict[str, dict[int, ChunkRecord | None]]:
        """The latest chunk records, if the latest manifest is the dataset the reader opened, grown or not;
        else `ChunkError`: another dataset is in its place."""
        doc, log = latest_log(store)
        why = _other(doc, self.opened)
        chunks = log.whole().chunks if why is None else {}
        for t, recs in self.records.items():
            changed = [i for i, r in recs.items() if not self.tail(t, i) and chunks.get(t, {}).get(i) != r]
            if why is None and changed:
                why = f"chunk '{t}/{changed[0]}' is recorded with another digest"
        if why is not None:
            o = self.opened
            raise ChunkChanged(f"table '{table}': chunk '{key}' of {self.where} cannot be read as "
                             f"the dataset opened (commit {o.commit}): another dataset was put in its place since "
                             f"({why}); open it again")
        return chunks


def _other(doc: dict[str, Any] | None, o: Opened) -> str | None:
    """Why the manifest `doc` is not (a later commit of) the dataset opened as `o`; None if it is."""
    if doc is None:
        return "no zarrfeed manifest is there now"
    if doc.get("dataset_id") != o.dataset_id:
        return f"dataset id {doc.get('dataset_id')} instead of {o.dataset_id}"
    if doc["commit"] < o.latest:
        return f"its latest commit is {doc['commit']}, older than commit {o.latest} seen when it was opened"
    if doc["commit"] == o.latest and o.tag is not None and (doc.get("log") or [{}])[-1].get("key") != o.tag:
        return f"its commit {o.latest} is another one (a copy's)"
    fewer = [t for t, n in o.rows.items() if doc["committed"].get(t, 0) < n]
    if fewer:
        return f"table '{fewer[0]}' has {doc['committed'].get(fewer[0], 0)} rows, fewer than {o.rows[fewer[0]]}"
    return None


def _changed(table: str, key: str, raw: bytes, record: ChunkRecord | None, where: str) -> ChunkChanged:
    what = f"the commit recorded {record[0]} bytes, digest {record[1]}" if record else "no record"
    return ChunkChanged(f"table '{table}': chunk '{key}' of {where} is not the chunk that was committed "
                      f"({len(raw)} bytes, digest {digest(raw)}; {what}): the file was changed or replaced, or "
                      "another dataset was put in its place")


def read(store: Store, where: str, doc: dict[str, Any] | None, rows: dict[str, int],
         chunk_rows: dict[str, int]) -> ChunkCheck | None:
    """The check of a dataset opened at manifest `doc` with the row counts `rows` (its commit's), or None if
    its commits record no digests. The records are those of the latest manifest's log, which must be the same
    dataset as `doc` (else `FormatError`: another was put in its place while it was being opened)."""
    if doc is None or doc.get("digest") != DIGEST:
        return None
    latest, log = latest_log(store)
    why = _other(latest, Opened(doc.get("dataset_id"), int(doc["commit"]), rows, int(doc["commit"]), None))
    if why is not None:
        raise FormatError(f"{where}: another dataset was put in its place while it was being opened ({why}); "
                          "open it again")
    assert latest is not None  # else `why`
    refs = latest.get("log") or []
    opened = Opened(doc.get("dataset_id"), int(doc["commit"]), dict(rows), int(latest["commit"]),
                    refs[-1]["key"] if refs else None)
    chunks = log.whole().chunks
    records = {}
    for t, n in rows.items():
        c = chunk_rows[t]  # the last, partly filled chunk: recorded if sealed at the reader's commit
        records[t] = {i: r for i, r in chunks.get(t, {}).items()
                      if r is not None and ((i + 1) * c <= n or (opened.commit == opened.latest and i * c < n))}
    return ChunkCheck(where, opened, records, dict(chunk_rows), dict(doc.get(TAILS) or {}))
