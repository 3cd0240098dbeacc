"""`Committer`: the commit protocol of one dataset, for the one writer that holds its lease.

It owns everything that decides what readers see, and nothing that moves rows: the lease (taken first,
checked before every metadata write, released last), the journal of inputs and episode keys, the placement
of each episode's rows (`place`, or `reserve` for rows another process writes), the tracking of which rows
are durable, the digests of the chunks written, and the manifest each commit publishes in one atomic write.
`DatasetWriter` adds episode checks, shared-memory segments and worker processes on top; Dask ingestion
places rows here and writes them on the cluster; the server's ingestion writes through a DatasetWriter.

Commit protocol. Rows are placed in order; an episode is committed once every row of it, in every table, is
stored, and only after every episode placed before it. A commit publishes the committed row counts, the
journal, and in a new commit log segment the keys and the digests of the chunks sealed since the last
commit. Readers trust those counts, never the array shapes (docs/architecture.md#commits).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterable, Mapping, TypeVar

import numcodecs
import numpy as np

from ..core import dataset_format

from ..core import manifest

from ..core import commit_log_reads

from ..core import manifest_io
from ..core.chunks import digest, read_rows, rows_digest, rows_digests
from ..core.commit_log import CommitLog, Segment
from ..core.keys import Key, Position, check_key
from ..core.links import require_link
from ..core.schema import L5KIT_SCHEMA, Schema
from ..core.storage_layout import StorageLayout
from ..core.refusals import refusal, refused_writes
from ..core.bounded_calls import bounded, within
from ..core.errors import FormatError
from ..core.location import Location
from ..core.manifest import MANIFEST_KEY
from ..core.stores import PARTIAL, Store
from ..core.zarr_array import Array
from .chunk_syncs import ChunkSyncs, StoredRows
from .chunk_write import ChunkWrite
from .commit_tracking import ChunkDigests, CommitTracker
from .coordinator import Coordinator, LocalCoordinator
from .journal import Journal
from .lease import LEASE_KEY, LOCK_FILE, TIMEOUT, Fence, Lease

log = logging.getLogger("zarrfeed.writer")
T = TypeVar("T")
FAIL_SECONDS = 2.0  # after an error, the last commit and the lease's release may take this long (a store that
                    # does not answer would otherwise hold the user for every retry of every call)


class Committer:
    """The commit protocol of the dataset at `location`: mode "w" creates it (refusing a non-empty location
    unless `overwrite`, and anything that is not a zarr dataset even then), mode "a" opens it and drops rows
    that were written but never committed. Holds the dataset's lease from here until `close()` or `fail()`.
    `store_timeout` bounds each metadata call on an object store (None: unbounded); commits are published at
    most every `commit_interval` seconds unless forced."""

    def __init__(self, location: Location, schema: Schema | None = None, *, mode: str = "w",
                 overwrite: bool = False, chunks: Mapping[str, int] | None = None,
                 compressor: numcodecs.abc.Codec | None = None, coordinator: Coordinator | None = None,
                 lease_timeout: float = TIMEOUT, store_timeout: float | None = None,
                 commit_interval: float = 1.0, layout: StorageLayout = StorageLayout()) -> None:
        if mode not in ("w", "a"):
            raise ValueError(f"mode must be 'w' or 'a', got {mode!r}")
        self.location, self.commit_interval, self._store_timeout = location, commit_interval, store_timeout
        self._published: tuple | None = None  # what the last commit published (the same again is not written)
        self._attempted = -1  # the number of the last commit this writer tried to publish
        self._tag = manifest.new_commit_tag()  # that commit's tag (manifest.COMMIT_TAG)
        # chunks whose rows were all there before this dataset's first commit with digests (another tool's, an
        # older zarrfeed's), per table: the first commit records them as unknown (None), as every full chunk
        # of a log with digests has an entry (see `commit_log_reads.read_log`)
        self._adopted: dict[str, int] = {}
        # whether the log records every chunk whose rows are all committed (see manifest.EVERY_CHUNK): a
        # dataset this zarrfeed made or adopted; not one an earlier zarrfeed adopted without recording its chunks
        self._every_chunk = True
        # per table, the committed rows and their digest in its last, partly filled chunk (`manifest.TAILS`)
        # as the last commit recorded them: the next commit checks them before it records anything new there
        self._tail_digests: dict[str, tuple[int, str]] = {}
        self.error: BaseException | None = None
        store = location.store("w")  # a zip, a missing fsspec backend: one line, nothing changed
        # refused before the lease's files are written there
        if mode == "a" and not self._holds_data():
            raise FormatError(f"{location}: no dataset to append to or resume (nothing is stored there)")
        if mode == "a" and dataset_format.interrupted_create(store) is None:
            dataset_format.open_group(location)  # not a zarr dataset: one line, nothing written into the folder
        self._had_root = location.existing_folder()
        if mode == "w":
            self._check_new(store, overwrite)
            # what cannot be made is refused before the lease, and before an overwrite clears the old dataset
            dataset_format.new_schema(schema or L5KIT_SCHEMA, chunks, compressor, layout)
        self.store = store
        self._created = False  # until known with the lease held (see below)
        self._lease = Lease(location, lease_timeout)
        what = "written" if mode == "a" else "replaced" if overwrite and self._holds_data() else "created"
        with refused_writes(location, f"the dataset cannot be {what}"):  # in the user's words, not a lock file's
            self._open(mode, schema, overwrite, chunks, compressor, coordinator, layout)
        self.closed = False
        self._last_commit = time.monotonic()

    # ---------------------------------------------------------------- opening
    def _open(self, mode: str, schema: Schema | None, overwrite: bool, chunks: Mapping[str, int] | None,
              compressor: numcodecs.abc.Codec | None, coordinator: Coordinator | None, layout: StorageLayout) -> None:
        """Take the lease, then make the dataset (mode "w") or open it and drop what was never committed. A
        failure leaves nothing this writer made: a folder it created holding no more than the lease's files
        goes (see `_abandon_root`)."""
        location, store = self.location, self.store
        try:
            self._lease.acquire()
        except OSError as exc:
            if refusal(exc, location):
                self._abandon_root()
            raise
        try:
            # a dataset created here is removed again if it never gets a commit (see fail); a directory that was
            # there, empty, stays. Decided with the lease held: a dataset another writer made since the check
            # above is its, never removed by this one
            self._created = mode == "w" and not self._holds_data()
            if mode == "w":
                if overwrite or (self._created and self._had_root):  # a dataset, or a killed writer's leftovers
                    self._clear()
                self.schema, self._dataset_id = dataset_format.create(store, schema or L5KIT_SCHEMA,
                                                                      chunks=dict(chunks or {}) or None,
                                                                      compressor=compressor, layout=layout)
                committed, self._journal, self._commit_no = {t: 0 for t in self.schema.tables}, Journal(), 0
                self._log = CommitLog()
                self._published = (dict(committed), self._journal.to_json())
            else:
                self.schema, committed = self._open_existing(schema)
            # the tables were checked (or just made): open them directly, without zarr's checks for a group
            self.arrays = {n: dataset_format.table_array(store, t) for n, t in self.schema.tables.items()}
            for t, n in committed.items():  # rows past the committed count were never committed: drop them
                if self.arrays[t].shape[0] != n:
                    self.arrays[t].resize(n)
            self._length = dict(committed)  # the arrays' lengths: only this writer resizes them
            self._coordinator = coordinator or LocalCoordinator(committed)
            self._tracker = CommitTracker(committed)
            self._syncs = ChunkSyncs(store, str(location))  # chunks stored before their bytes were durable
            self._kept = (self._journal.committed_count(), dict(committed))  # as published (see `published`)
            self._digests = ChunkDigests({t: tab.chunk_rows for t, tab in self.schema.tables.items()})
            self._tails = self._withdraw_tails(committed)  # sealed again at close if no write changed them
            self._withdrawn = dict(self._tails)  # withdrawn by the commit before the first write there (see place)
            self._withdrawing = False
            self._placed: set[Key] = set()  # keys placed by this writer and not yet committed
            self._external: dict[Key, tuple[dict[str, int], dict[str, int]]] = {}  # reserved, not yet written
        except BaseException as exc:
            self.error = exc
            self.abandon()
            raise

    def _abandon_root(self) -> None:
        """The system refused the lease's files: remove the folder this writer made for them, if it holds nothing
        but those (on a full disk, a new dataset's folder and lock file are made, its document not). Another
        writer cannot hold a lease there: the same refusal stops it."""
        if self._had_root or not self.location.existing_folder():
            return
        if all(_leftover(name) for name in self.location.entries(16)):
            within(FAIL_SECONDS, lambda: self.location.remove())

    def _holds_data(self) -> bool:
        return holds_data(self.location)

    def _check_new(self, store: Store, overwrite: bool) -> None:
        """Mode "w": refuse, before anything changes, a location that holds something we may not replace."""
        if not self._holds_data():
            return
        if not overwrite:
            said = f"{self.location}: already exists and is not empty; "
            raise FormatError(said + "append to it (mode='a'), finish an interrupted ingest into it (mode='a' and "
                              "ingest(..., resume=True)), or replace it (overwrite=True)",
                              cli=said + "append to it (--append), finish an interrupted ingest into it "
                              "(--resume), or replace it (--overwrite)")
        if not any(name in store for name in DATASET_MARKS):
            held = self.location.entries(4)
            raise FormatError(f"{self.location}: not a zarr dataset (it holds {', '.join(held)}"
                              f"{', ...' if len(held) == 4 else ''}); refusing to overwrite it")

    def _clear(self) -> None:
        """Delete the dataset being overwritten, or a killed writer's temporary files (everything but the lease
        we hold). What marks the place as a dataset goes last: an overwrite killed while it clears leaves a
        place that `overwrite=True` still recognises, and finishes."""
        self.location.clear(_lease_file, last=DATASET_MARKS)

    def _open_existing(self, schema: Schema | None) -> tuple[Schema, dict[str, int]]:
        """Open the dataset to append to, refusing (one line, before anything changes) one that does not match
        `schema` (None: the dataset's own), one whose commits or log are damaged, and one whose links do not
        hold: rows appended onto it would be placed after rows that are not there, or under numbers of commits
        made before."""
        interrupted = dataset_format.interrupted_create(self.store)
        if interrupted is not None:  # nothing was committed: nothing is lost by finishing the create
            dataset_format.create_documents(self.store, interrupted)
        group = dataset_format.open_group(self.location, mode="a")
        found, arrays, _ = dataset_format.open_tables(group)  # other arrays are left as they are
        schema = schema or found
        for name, table in schema.tables.items():
            if name not in found.tables or found.tables[name].dtype != table.dtype:
                raise FormatError(f"{self.location}: table '{name}' does not match the schema to append")
        if [str(x) for x in found.links] != [str(x) for x in schema.links]:
            raise FormatError(f"{self.location}: its links differ from the schema to append")
        doc = manifest_io.read_manifest(group.store)
        self._log = CommitLog()
        if doc is None:  # written by another tool: its shapes are its rows
            for name, arr in arrays.items():
                why = dataset_format.codecs_problem(name, arr, found.codec_of(name))
                if why:
                    raise FormatError(f"{self.location}: {why}; zarrfeed appends to a dataset whose tables share "
                                      "one compressor and have no filters (what its manifest records for every "
                                      "table): copy it first, re-encoded with zarrfeed's compressor, with "
                                      f"`zarrfeed ingest NEW --from {self.location}`, then append to the copy")
            committed = dataset_format.readable_rows(found, arrays, None)
            committed.update({n: 0 for n in found.tables if n not in arrays})  # (made below)
        else:
            committed = {name: doc["committed"][name] for name in found.tables}  # every table's (read_manifest checks)
            for name, n in committed.items():  # checked before anything changes, as a reader refuses it
                held = arrays[name].shape[0] if name in arrays else 0
                if n > held:
                    raise FormatError(f"{self.location}: table '{name}': {n} rows committed but the array holds "
                                      f"{held}; the dataset is damaged")
            why = commit_log_reads.history_problem(group.store, doc)
            if why:
                raise FormatError(f"{self.location}: {why}; nothing is appended to it")
            try:
                self._log = commit_log_reads.read_log(group.store, doc)  # no other writer: nothing merges it meanwhile
            except KeyError as exc:
                raise FormatError(f"{self.location}: commit log segment {exc} is missing; the dataset is damaged") \
                    from None
            self._check_tails(arrays, committed, doc.get(manifest.TAILS) or {})
        self._check_links(found, arrays, committed)
        if doc is None or doc.get("digest") != manifest.DIGEST:
            self._adopted = {t: n // found.tables[t].chunk_rows for t, n in committed.items()}
        else:
            self._every_chunk = bool(doc.get(manifest.EVERY_CHUNK))
        for name, table in found.tables.items():
            if name not in arrays:  # e.g. an L5Kit dataset without traffic_light_faces
                dataset_format.create_table(group, table, found.codec_of(name))
        if doc is None:
            self._journal, self._commit_no, self._dataset_id = Journal(), 0, manifest.new_dataset_id()
            return found, committed
        # a writer stopped just after publishing left no commit object; one of a zarrfeed that kept no tags, none
        manifest_io.tag_latest_commit(group.store, doc)
        listed = {ref.key for ref in self._log.refs}  # segments of commits that never published: not needed
        orphans = [k for k in commit_log_reads.log_keys(group.store) if k not in listed]
        if orphans:
            within(FAIL_SECONDS, lambda: group.store.delete(orphans))
        logged = self._log.whole()
        self._journal = Journal.from_json(doc.get("journal"), logged.committed, logged.skipped)
        self._commit_no = doc["commit"]
        self._dataset_id = doc.get("dataset_id") or manifest.new_dataset_id()
        return found, committed

    def _check_tails(self, arrays: Mapping[str, Array], committed: Mapping[str, int], tails: Mapping[str, str]
                     ) -> None:
        """Each table's last, partly filled chunk, which the append reads back and rewrites with its rows: it must
        be there (else its rows would be rewritten as zeros) and hold the committed rows its commit recorded
        (`tails`, which hold whether or not a writer withdrew the chunk's record or was killed before it sealed
        it), or for a commit made before those, be the chunk recorded: else the changed rows would be sealed again
        under a fresh digest, the change laundered. Sets the tails the first commit checks (`_committed_tails`)."""
        chunks = self._log.whole().chunks
        for t, n in committed.items():
            arr = arrays.get(t)
            if arr is None or n % arr.chunks[0] == 0:
                continue  # no rows, or no chunk partly filled: the append writes only new chunks
            index = n // arr.chunks[0]
            key = arr.chunk_key(index)
            raw = arr.read_chunks([index])[0]
            if raw is None:
                raise FormatError(f"{self.location}: table '{t}': chunk '{key}' is missing, below the {n} rows "
                                  "committed; the dataset is damaged, nothing is appended (zarrfeed validate "
                                  "lists every missing chunk)")
            record = chunks.get(t, {}).get(index)
            if t not in tails and record is not None and (len(raw) != record[0] or digest(raw) != record[1]):
                raise FormatError(f"{self.location}: table '{t}': chunk '{key}' is not the chunk that was committed "
                                  f"({len(raw)} bytes, digest {digest(raw)}; the commit recorded {record[0]} bytes, "
                                  f"digest {record[1]}): the file was changed or replaced; nothing is appended "
                                  "(zarrfeed validate --deep lists every changed chunk)")
            # its rows are what counts (the rest of the chunk is no commit's: a later writer's, if any)
            got = rows_digest(arr, key, raw, n - index * arr.chunks[0])
            if t in tails and got != tails[t]:
                raise FormatError(f"{self.location}: table '{t}': chunk '{key}' does not hold the rows that were "
                                  f"committed (rows {index * arr.chunks[0]}-{n}: digest {got}, the commit "
                                  f"recorded {tails[t]}): the file was changed or replaced; nothing is appended "
                                  "(zarrfeed validate lists every changed chunk)")
            self._tail_digests[t] = (n, got)  # as checked here (a commit of format 3 recorded none): the first
            # commit checks the chunk still holds them (`_committed_tails`)

    def _check_links(self, schema: Schema, arrays: Mapping[str, Array], committed: Mapping[str, int]) -> None:
        """Every link's intervals over the committed rows must tile its child's committed rows (L5Kit's rule), as
        `validate` checks them: reads only the parents' interval fields (for 2 M agents, the 25 k frames)."""
        for link in schema.links:
            parent = arrays.get(link.parent)
            intervals = read_rows(parent, 0, committed[link.parent], [link.field])[link.field] \
                if parent is not None else np.zeros((0, 2), np.int64)
            require_link(link, intervals, committed[link.child],
                         f"the dataset does not validate, so nothing is appended to {self.location}")

    def _withdraw_tails(self, committed: Mapping[str, int]) -> dict[str, tuple[int, tuple[int, str]]]:
        """The digests of each table's last, partly filled chunk that the log records (sealed when the last
        writer closed): this writer's first write there changes the chunk, so a commit withdraws them just
        before it (until this writer closes and seals the chunk again)."""
        if not self._log.refs:
            return {}
        chunks = self._log.whole().chunks
        out = {}
        for t, n in committed.items():
            c = self.schema.tables[t].chunk_rows
            record = chunks.get(t, {}).get(n // c)  # none where n % c == 0: a chunk past the rows is never sealed
            if record is not None:
                out[t] = (n // c, record)
        return out

    # ---------------------------------------------------------------- what is committed
    @property
    def committed(self) -> dict[str, int]:
        """Rows per table that are committed (readers see these)."""
        return dict(self._tracker.committed)

    @property
    def commit_number(self) -> int:
        """The number of the last commit published."""
        return self._commit_no

    @property
    def dataset_id(self) -> str:
        """The dataset's identity (new with each dataset made or overwritten)."""
        return self._dataset_id

    @property
    def lease_token(self) -> str:
        """The token of the lease held: a task elsewhere writing rows placed here checks that the dataset's
        lease document still names it (`lease.check_held`)."""
        return self._lease.holder.token

    @property
    def fence(self) -> Fence:
        """The lease's deadline in shared memory: worker processes check it before every chunk write."""
        return self._lease.fence

    @property
    def committed_episodes(self) -> int:
        return self._journal.committed_count()

    @property
    def published(self) -> tuple[int, dict[str, int]]:
        """The episodes and the rows per table of the last commit published: what the store holds for readers,
        whatever commit after an error did not land."""
        return self._kept[0], dict(self._kept[1])

    def check_lease(self) -> None:
        """Raise `LeaseLost` if the lease is lost or may be (before a write that others must not see)."""
        self._lease.check()

    def is_committed(self, key: Key) -> bool:
        """Whether the episode with this key is committed (or was skipped as bad input)."""
        return self._journal.done(key)

    def is_known(self, key: Key) -> bool:
        """Whether the key is committed, skipped, or placed by this writer: a second episode under it would be
        a duplicate."""
        return self._journal.done(key) or key in self._placed

    def missing(self) -> list[Key]:
        """Keys placed (by this writer, or by an interrupted one up to its last commit) and not committed."""
        return sorted((k for k in self._journal.pending if not self._journal.done(k)), key=key_order)

    def episodes_touching(self, table: str, start: int, end: int) -> list[Key]:
        """Keys of the placed, uncommitted episodes with rows of `table` in [start, end)."""
        return self._tracker.episodes_touching(table, start, end)

    # ---------------------------------------------------------------- inputs and placement
    def begin_input(self, input_id: str, resume: bool, what: str = "its fingerprint is", unit: str = "parts"
                    ) -> None:
        """Start the input `input_id`, whose keys are `Position(input_id, i)`: refuse a repeat without
        `resume`, or a resume with an input this dataset has not seen; record it with one commit before any of
        its rows are written. `what` introduces the id and `unit` names its parts in messages."""
        self._check_open()
        j = self._journal
        last = j.other_input(input_id)
        if resume and last is not None:
            raise ValueError(f"{self.location}: cannot resume with this input ({what} {input_id}): the "
                             f"interrupted ingest had another ({last}); resume with the same input, or append "
                             "this one without resume (--append)")
        if not resume and j.known_input(input_id):
            done = len(j.inputs[input_id][0])
            said = (f"{self.location}: this input was ingested before ({done} of its {unit} are committed; "
                    f"{what} {input_id}); ")
            raise FormatError(said + "finish it (resume=True), or give its episodes other keys (keys=) to write "
                              "them a second time", cli=said + "finish it (--resume); writing the same episodes "
                              "a second time takes other keys, which only Python's ingest(..., keys=) gives")
        j.add_input(input_id)
        j.last_input = input_id
        self.commit(force=True)

    def check_resubmitted(self, key: Key, fingerprint: str) -> None:
        """Refuse an episode under a key that an interrupted writer placed with another fingerprint (one placed
        with none, "", cannot be checked)."""
        earlier = self._journal.pending.get(key)
        if earlier and earlier != fingerprint:
            raise ValueError(f"episode {key}: not the episode submitted under this key before the interruption "
                             f"(fingerprint {fingerprint}, was {earlier}); resume with the same input")

    def place(self, key: Key, rows: Mapping[str, int], fingerprint: str = "") -> dict[str, int]:
        """Place an episode of `rows[t]` rows per table under `key`, after everything placed so far; return its
        first row per table. The caller writes the rows and reports them with `stored`."""
        self._check_open()
        key = check_key(key)
        if self.is_known(key):
            raise ValueError(f"key {key}: already committed or placed")
        rows = {t: int(rows.get(t, 0)) for t in self.schema.tables}
        if any(rows[t] for t in self._withdrawn):
            # the caller is about to write into a last chunk whose digest the log records: withdraw it first
            # (only now: a writer that writes nothing, refused or resumed with nothing left, leaves it sealed)
            self._withdrawing = True
            self.guarded(lambda: self.commit(force=True))
        starts = self._coordinator.reserve(rows)
        self._journal.pending[key] = fingerprint
        self._placed.add(key)
        self._tracker.add_episode(key, starts, {t: starts[t] + rows[t] for t in rows})
        return starts

    def reserve(self, key: Key, rows: Mapping[str, int], fingerprint: str = "") -> dict[str, int]:
        """Place rows that another process writes (a task on a cluster) under `key` and grow the arrays to hold
        them; return the first row per table. They commit, in the order placed, once `written(key)` says
        they are stored."""
        starts = self.place(key, rows, fingerprint)
        ends = {t: starts[t] + int(rows.get(t, 0)) for t in starts}
        self._external[key] = (starts, ends)

        def grow_and_commit() -> None:
            for t in ends:
                self.grow(t, ends[t])
            self.commit()
        self.guarded(grow_and_commit)
        return starts

    def skip(self, key: Key) -> None:
        """Record `key` as skipped (bad input): resume passes over it, as over a committed key."""
        self._journal.skip(check_key(key))

    # ---------------------------------------------------------------- rows stored
    def grow(self, table: str, end: int) -> None:
        """Make the array at least `end` rows long, in large steps (each is a metadata write); a replay buffer's
        arrays are made as long as each commit instead (see `_lengths_as_committed`)."""
        if end > self._length[table] and not self.schema.tables[table].path:
            self._lease.check()
            step = self.location.settings.growth_chunks
            n = self._length[table] = max(end, 2 * self._length[table], step * self.arrays[table].chunks[0])
            self._bounded(lambda: dataset_format.set_length(self.arrays[table], n), f"growing {table} to {n:,} rows")

    def stored(self, table: str, start: int, end: int, writes: Iterable[ChunkWrite]) -> None:
        """Rows [start, end) of `table` are stored, as `writes` say (what `chunk_write.write_rows` returned).
        Chunks stored before their bytes were durable (`ChunkWrite.unsynced`) are synced in the background
        first: the rows are committed once they are (see `ChunkSyncs`)."""
        writes = list(writes)
        self._digests.add(writes)
        unsynced = [self.arrays[w.table].chunk_key(w.index) for w in writes if w.unsynced]
        if unsynced:
            self._syncs.add(unsynced, StoredRows(table, start, end))
        elif end > start:
            self._tracker.segment_done(table, start, end)

    def _take_synced(self, wait: bool) -> None:
        """The rows whose chunks are synced now count as stored (`wait`: wait for every sync)."""
        for rows in self._syncs.synced(wait, self._store_timeout):
            if rows.end > rows.start:
                self._tracker.segment_done(rows.table, rows.start, rows.end)

    def written(self, key: Key, writes: Iterable[ChunkWrite] = ()) -> dict[str, int]:
        """The rows reserved under `key` are stored, as `writes` say: they commit with everything placed before,
        with the digests of their chunks. Returns their rows per table."""
        starts, ends = self._external.pop(key)
        self._digests.add(writes)
        for t in starts:
            self.stored(t, starts[t], ends[t], ())
        self.guarded(self.commit)
        return {t: ends[t] - starts[t] for t in starts}

    # ---------------------------------------------------------------- commits
    def commit(self, force: bool = False) -> None:
        """Publish a commit of every episode now durable (at most every `commit_interval` s unless `force`)."""
        if not force and time.monotonic() - self._last_commit < self.commit_interval:
            return
        self._take_synced(wait=force)
        for key in self._tracker.advance():
            self._journal.commit(key)
            self._placed.discard(key)
        self._write_manifest()
        self._last_commit = time.monotonic()

    def _write_manifest(self, seal_tail: bool = False) -> None:
        """Publish a commit: the committed rows, the journal, and in a new log segment the caller's keys and the
        digests of the chunks sealed since the last commit (`seal_tail`: the last chunk of each table too, when
        the writer closes). If it fails, nothing of it counts: the same is published by the next commit."""
        self._lease.check_on_store()  # never publish a commit once another writer holds the dataset, or may
        committed = dict(self._tracker.committed)
        chunks = self._digests.seal(committed, seal_tail)
        for t, (index, record) in self._tails.items():
            if seal_tail and committed[t] // self.schema.tables[t].chunk_rows == index:
                chunks.setdefault(t, {}).setdefault(index, record)  # no write changed it: sealed again as it was
            elif self._withdrawing and t in self._withdrawn:
                chunks.setdefault(t, {}).setdefault(index, None)
        for t, full in self._adopted.items():
            for index in range(full):
                chunks.setdefault(t, {}).setdefault(index, None)
        new_keys = self._journal.take_new()
        segment = Segment(new_keys[0], new_keys[1], chunks)
        state = (committed, self._journal.to_json())
        if state == self._published and not len(segment):
            return
        before = (list(self._log.refs), dict(self._log.contents))
        doc: dict[str, Any] | None = None  # the manifest, once made
        try:
            tails = self._bounded(lambda: self._committed_tails(committed, chunks),
                                  "reading the last chunks' committed rows")
            objects, doomed = self._log.add(segment, self._commit_no + 1)
            if self._attempted != self._commit_no + 1:  # (an earlier call for this number may have landed: its tag)
                self._tag = manifest.new_commit_tag()
            doc = manifest.new_manifest(self.schema, committed, self._commit_no + 1, self._dataset_id,
                                          **{manifest.COMMIT_TAG: self._tag},
                                          journal=state[1], log=self._log.to_json(), digest=manifest.DIGEST,
                                          **({manifest.EVERY_CHUNK: True} if self._every_chunk else {}),
                                          **{manifest.TAILS: {t: d for t, (_, d) in tails.items()}})
            retry = self._attempted == self._commit_no + 1  # an earlier call that failed may have landed
            self._attempted = self._commit_no + 1
            # the names of the chunks the commit records first (their bytes are durable already: put_chunks),
            # then the documents that name them
            self._bounded(lambda: self.store.sync_names(t.array_path for t in self.schema.tables.values()),
                          "syncing the chunks' names")
            self._lengths_as_committed(committed)
            self._bounded(lambda: manifest_io.write_manifest(self.store, doc, objects, retry=retry),
                          f"publishing commit {self._commit_no + 1}")
        except BaseException:
            self._log.refs, self._log.contents = before
            self._journal.give_back(new_keys)
            if doc is not None and self._landed(doc):  # its manifest was stored, then a later write failed (a
                self._kept = (self._journal.committed_count(), dict(committed))  # full disk): readers see it
            raise
        self._commit_no += 1
        self._kept = (self._journal.committed_count(), dict(committed))
        self._tail_digests = tails
        self._adopted = {}
        self._digests.forget(chunks)
        if self._withdrawing:
            self._withdrawn, self._withdrawing = {}, False
        self._published = state
        if doomed:  # merged into the new segment; the manifest that listed them is replaced
            within(FAIL_SECONDS, lambda: self.store.delete(doomed))

    def _landed(self, doc: Mapping[str, Any]) -> bool:
        """Whether the manifest stored is `doc` (a commit whose publication failed after its manifest; the next
        writer records its number, see `_open_existing`). A store that cannot say counts as no."""
        try:
            return manifest_io.read_manifest(self.store) == json.loads(json.dumps(doc))
        except Exception:
            return False

    def _lengths_as_committed(self, committed: Mapping[str, int]) -> None:
        """A replay buffer's arrays are made as long as the steps and episodes a commit is about to publish,
        just before its manifest, as Diffusion Policy's readers require (its `ReplayBuffer` asserts every data
        array is `episode_ends[-1]` long): the data arrays first, `episode_ends` last, each a metadata write,
        and every row below is stored already. Before the manifest, so that zarrfeed's readers never find more
        rows committed than an array holds. A writer killed among these writes leaves a buffer that zarrfeed
        reads by its last manifest and the next writer sets right (Diffusion Policy's reader refuses it until
        then); one killed after them, before its manifest, a buffer whose arrays hold the commit that did not
        publish: Diffusion Policy reads it whole, zarrfeed without it, and the next writer drops it (`resume`
        writes its episodes again). Other datasets' arrays grow ahead (see `grow`)."""
        changed = {t: committed[t] for t in reversed(list(self.schema.tables))
                   if self.schema.tables[t].path and self._length[t] != committed[t]}
        if changed:  # all documents at once: on a local disk written aside, then renamed one after the other
            self._bounded(lambda: dataset_format.set_lengths(self.arrays, changed), "setting the arrays' lengths")
            self._length.update(changed)

    def _committed_tails(self, committed: Mapping[str, int], sealed: Mapping[str, Mapping[int, object]]
                         ) -> dict[str, tuple[int, str]]:
        """`manifest.TAILS` of a commit of `committed` rows that records the chunks `sealed`: per table whose
        last chunk they fill partly, the rows and the digest of its committed rows, read back from the store
        (every version of the chunk holds them: they are stored, and a writer that shares the chunk merges its
        rows in under the chunk's lock).
        Where this commit records anything new of the chunk that the last commit's tail was in (a new digest of
        its rows, or its seal), that chunk must still hold the rows the last commit recorded: a chunk changed or
        removed under this writer (which merges its new rows into whatever it reads there, zeros for a missing
        chunk) would otherwise be recorded as committed. `FormatError` (or `ChunkError`, for a chunk missing or
        that cannot be decoded) naming table and chunk, and nothing more is committed.
        Both digests of one chunk come from one read of it: a change between two reads would pass the check
        and be recorded."""
        out: dict[str, tuple[int, str]] = {}
        for t, n in committed.items():
            c = self.schema.tables[t].chunk_rows
            last = self._tail_digests.get(t)
            check = last is not None and (last[0] != n or last[0] // c in sealed.get(t, {}))
            fresh = n % c != 0 and (last is None or last[0] != n)
            got = self._rows_digests(t, ([last[0]] if check and last else []) + ([n] if fresh else []))
            if check and last is not None and got[last[0]] != last[1]:
                key = self.arrays[t].chunk_key(last[0] // c)
                raise FormatError(f"{self.location}: table '{t}': chunk '{key}' no longer holds the rows that "
                                  f"were committed (rows {last[0] // c * c}-{last[0]}: digest {got[last[0]]}, "
                                  f"commit {self._commit_no} recorded {last[1]}): it was changed or removed while "
                                  "this writer appended; nothing more is committed (zarrfeed validate lists every "
                                  "changed chunk)")
            if fresh:
                out[t] = (n, got[n])
            elif n % c and last is not None:
                out[t] = last
        return out

    def _rows_digests(self, table: str, counts: list[int]) -> dict[int, str]:
        """For each n of `counts`, the digest of rows [n // c * c, n) of `table` (chunks of c rows), decoded from
        that chunk as it is stored now; each chunk read once (`chunks.rows_digests`)."""
        arr = self.arrays[table]
        c = arr.chunks[0]
        out: dict[int, str] = {}
        for index in sorted({n // c for n in counts}):
            mine = [n for n in counts if n // c == index]
            key = arr.chunk_key(index)
            raw = arr.read_chunks([index])[0]
            out.update(zip(mine, rows_digests(arr, key, raw, [n - index * c for n in mine]), strict=True))
        return out

    def close(self) -> dict[str, int]:
        """Everything placed is stored (the caller waited for it): commit it, trim the arrays to the committed
        rows, seal the last chunks, consolidate the metadata and release the lease. The committed rows."""
        if self.closed:
            return self.committed
        try:
            self.commit(force=True)
            self._lease.check()
            for t, n in self._tracker.committed.items():  # nothing lies past the committed rows: trim the shape
                if self._length[t] != n:
                    self._bounded(lambda: dataset_format.set_length(self.arrays[t], n), f"setting the length of {t}")
            self._write_manifest(seal_tail=True)
            self._bounded(lambda: dataset_format.consolidate(self.store), "consolidating the metadata")
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.release()
        return self.committed

    def guarded(self, call: Callable[[], T]) -> T:
        """`call()`; if it raises, stop as `fail` does, then raise."""
        try:
            return call()
        except BaseException as exc:
            self.fail(exc)
            raise

    def fail(self, exc: BaseException | None, remove: bool = True, said: bool = False) -> None:
        """Stop after an error (whatever wrote rows has stopped): commit what is durable, then release the
        lease. With `remove`, a dataset this writer created that holds no commit is removed (an ingest whose
        input fails at once leaves nothing, and the next run needs no --overwrite); runs meant to be resumed
        (Ctrl+C, a dead worker) pass remove=False. `said`: the caller's error says what is committed (`published`),
        so a last commit that does not land (on a full disk) is not logged as well."""
        if self.closed:
            return
        self.error = exc
        try:
            while True:  # what is durable already (a failed sync's rows are not; the others still count)
                try:
                    self._take_synced(wait=False)
                    break
                except Exception:
                    continue
            for key in self._tracker.advance():
                self._journal.commit(key)
            if not self._lease.lost and not within(FAIL_SECONDS, self._write_manifest) and not said:
                log.warning("%s: the last commit after the error did not land; what was stored since commit %d "
                            "is not committed (resume to write it)", self.location, self._commit_no)
            if not self._lease.lost:  # what a worker killed while it wrote a chunk left (on a full disk: space)
                folders = [t.array_path for t in self.schema.tables.values()]
                within(FAIL_SECONDS, lambda: self.store.remove_partial(folders))
            if remove and not any(self.committed.values()):
                self._remove_if_created()
        finally:
            self.release()

    def abandon(self) -> None:
        """Give up before anything was placed: remove the dataset if this writer created it, release (even if
        the removal was interrupted: a lease left held would keep its heartbeat running in this process)."""
        try:
            self._remove_if_created()
        finally:
            self.release()

    def _remove_if_created(self) -> None:
        """Remove the dataset this writer created, only while it provably holds the lease (renewed on the store
        just before; the lease is released only after the removal): a writer that lost its lease must never
        delete what the writer that took it over has written."""
        if not self._created:
            return
        if not self._lease.confirm():
            log.warning("%s: not removing the dataset this writer created: its lease is no longer held",
                        self.location)
            return
        within(FAIL_SECONDS, lambda: self.location.remove(keep_root=self._had_root))

    def release(self) -> None:
        """Release the lease (within FAIL_SECONDS after an error). Idempotent, as `Lease.release` is."""
        self.closed = True
        if hasattr(self, "_syncs"):  # (not made if the dataset could not be opened)
            self._syncs.close()
        self._lease.release(FAIL_SECONDS if self.error is not None else None)

    # ---------------------------------------------------------------- helpers
    def _bounded(self, fn: Callable[[], Any], what: str) -> Any:
        return bounded(self._store_timeout, fn, f"{self.location}: {what}")

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"the writer of {self.location} is closed"
                               + (f" after an error: {self.error}" if self.error else ""))


# each says that a place holds a dataset (of zarrfeed, of zarr v2, of zarr v3: its root group's document)
DATASET_MARKS = (MANIFEST_KEY, ".zgroup", "zarr.json")


def holds_data(location: Location) -> bool:
    """Whether anything but a lease's files and temporary files is stored at `location` (a writer that failed or
    was killed while it started may leave only those behind: they are no dataset, and no reason to refuse a new
    one; the lease decides whether their holder is gone)."""
    return location.exists() and any(not _leftover(name) for name in location.entries(16))


def _leftover(name: str) -> bool:
    """Whether `name` (at a dataset's root) is what a writer killed before its first commit may leave: the
    lease's files, or a document it was writing (a temporary file)."""
    return _lease_file(name) or name.endswith(PARTIAL)


def _lease_file(name: str) -> bool:
    """Whether `name` (at a dataset's root) is one of the lease's files: its document, lock file, or a
    document being written."""
    return name in (LEASE_KEY, LOCK_FILE) or name.startswith(f".{LEASE_KEY}.")


def key_order(key: Key) -> tuple:
    """Keys in a stable order: positions (by input, then index), then int keys by value, then str keys (ints and
    strs do not compare with each other)."""
    if isinstance(key, Position):
        return (0, key.input, key.index)
    return (1, key) if isinstance(key, int) else (2, key)
