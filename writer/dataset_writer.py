"""`DatasetWriter`: append episodes to one dataset with a pool of writer processes, committing as it goes.

How it works. The writer first takes the dataset's lease (one writer at a time, on any store). The parent
checks each episode, reserves its rows in every table (so its intervals can be relocated at once) and copies
its records into shared-memory segments, one table's row stream at a time. A segment ends on a chunk
boundary, so whole chunks have exactly one writer and need no lock. Full segments go to the least busy
worker, which compresses and writes them; only the parent touches the metadata. Every `commit_interval`
seconds the parent also sends partly filled segments (so little is ever uncommitted); the chunk such a
segment shares with the next one is written under zarr's per-chunk file lock, in a folder outside the
dataset. When every row of an episode is written, the episode is committed: a new manifest holding the row
counts and the journal of episode keys is published in one atomic write. Readers trust those counts, never
the array shapes.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sized
from typing import Any, Iterable, Mapping

import numcodecs
import numpy as np
import zarr
from tqdm.auto import tqdm

from ..core import dataset_format
from ..core._proc.pool import WorkerError, WorkerPool, describe_exit
from ..core._proc.shm import SharedBlock, check_room
from ..core.commit_log import CommitLog, Segment
from ..core.keys import Key, Position, check_key, fingerprint
from ..core.schema import L5KIT_SCHEMA, Schema
from ..core.store import FormatError, Location, bounded, within
from . import write_worker
from .chunk_write import ChunkWrite, write_rows
from .commit import ChunkDigests, CommitTracker
from .coordinator import Coordinator, LocalCoordinator
from .episode import check_episode, relocate
from .journal import Journal
from .lease import LEASE_KEY, LOCK_FILE, TIMEOUT, Lease

log = logging.getLogger("zarrfeed.writer")
_FAIL_SECONDS = 2.0  # after an error, the last commit and the lease's release may take this long (a store that
                     # does not answer would otherwise hold the user for every retry of every call)


class _Segment:
    __slots__ = ("id", "table", "start", "n", "capacity", "block", "worker", "sent")

    def __init__(self, id: int, table: str, start: int, capacity: int, block: int) -> None:
        self.id, self.table, self.start, self.capacity, self.block = id, table, start, capacity, block
        self.n = 0
        self.worker: int | None = None
        self.sent = 0.0


def _key_order(key: Key) -> tuple:
    return (0, key.input, key.index, "") if isinstance(key, Position) else (1, "", 0, repr(key))


class DatasetWriter:
    """Writes episodes to the dataset at `path` (a directory or any fsspec URL, with `storage_options`) with
    `workers` processes (0: in this process).

    mode "w" creates the dataset (refusing a non-empty location unless `overwrite`, and refusing to overwrite
    anything that is not a zarr dataset); mode "a" appends to it, first dropping rows that were written but
    never committed. Either way the writer holds the dataset's lease until it is closed: a second writer is
    refused. Episodes land in submission order, so the dataset is the same for any number of workers.
    Use as a context manager, or call `close()`.
    """

    def __init__(self, path: str | os.PathLike | Location, schema: Schema = L5KIT_SCHEMA, workers: int = 2,
                 mode: str = "w", compressor: numcodecs.abc.Codec | None = None,
                 chunks: Mapping[str, int] | None = None, on_error: str = "raise", progress: bool = False,
                 overwrite: bool = False, commit_interval: float = 1.0, segment_bytes: int | None = None,
                 coordinator: Coordinator | None = None, synchronizer: Any = None,
                 start_method: str | None = None, storage_options: Mapping[str, Any] | None = None,
                 lease_timeout: float = TIMEOUT, stall_timeout: float = 120.0) -> None:
        if mode not in ("w", "a"):
            raise ValueError(f"mode must be 'w' or 'a', got {mode!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if workers < 0:
            raise ValueError(f"workers must be >= 0 (0: write in this process), got {workers}")
        self.location = Location.of(path, storage_options)
        self.path = self.location.url
        self.on_error, self.progress, self.commit_interval = on_error, progress, commit_interval
        self.stall_timeout = stall_timeout
        # the parent's own calls on an object store, bounded like the workers' (see store.bounded)
        self._store_timeout = None if self.location.is_local else stall_timeout
        self._published: tuple | None = None  # what the last commit published (the same again is not written)
        self._closed = True
        self._blocks: list[SharedBlock] = []
        self._lock_dir: str | None = None
        self._pool: WorkerPool | None = None
        store = self.location.store("w")  # a zip, a missing fsspec backend: one line, nothing changed
        # a dataset created here is removed again if it never gets a commit (see _fail); a directory that was
        # there, empty, stays
        self._created = mode == "w" and not self.location.exists()
        self._had_root = self.location.is_local and self.location.path.is_dir()
        if mode == "w":
            self._check_new(store, overwrite)
        self._lease = Lease(self.location, lease_timeout)
        self._lease.acquire()
        try:
            self._store = store
            if mode == "w":
                if overwrite:
                    self._clear()
                self.schema, self._dataset_id = dataset_format.create(store, schema, chunks=dict(chunks or {}) or None,
                                                                      compressor=compressor)
                committed, self._journal, self._commit_no = {t: 0 for t in self.schema.tables}, Journal(), 0
                self._log = CommitLog()
                self._published = (dict(committed), self._journal.to_json())
            else:
                self.schema, committed = self._open_existing(schema)
            # zarr's per-chunk locks, for chunks two segments share: outside the dataset, gone at close
            self._lock_dir = tempfile.mkdtemp(prefix="zarrfeed-chunk-locks-")
            self._sync = synchronizer or zarr.ProcessSynchronizer(self._lock_dir)
            # the tables were checked (or just made): open them directly, without zarr's checks for a group
            self._arrays = {t: zarr.Array(store, path=t) for t in self.schema.tables}
            self._locked = {t: zarr.Array(store, path=t, synchronizer=self._sync, cache_metadata=False)
                            for t in self.schema.tables}
            for t, n in committed.items():  # rows past the committed count were never committed: drop them
                if self._arrays[t].shape[0] != n:
                    self._locked[t].resize(n)
            self._length = dict(committed)  # the arrays' lengths: only this process resizes them
            self._coordinator = coordinator or LocalCoordinator(committed)
            self._tracker = CommitTracker(committed)
            self._digests = ChunkDigests({t: tab.chunk_rows for t, tab in self.schema.tables.items()})
            self._tails = self._withdraw_tails(committed)  # sealed again at close if no write changed them
            self._withdrawn = dict(self._tails)  # withdrawn by the next commit
            self._submitted: set[Key] = set()  # keys submitted by this writer and not yet committed
            self._external: dict[Key, tuple[dict[str, int], dict[str, int]]] = {}  # reserved, not yet written
            self._input: str | None = None  # the fingerprint of the input that keyless submits continue
            self._position = 0
            self._error: BaseException | None = None

            # Shared-memory segments: one open per table in the parent, two in flight per worker. On an object
            # store larger ones, so that each worker sends several chunks at once (its PUTs run concurrently).
            if segment_bytes is None:
                segment_bytes = (4 << 20) if self.location.is_local else (16 << 20)
            chunk_bytes = [t.chunk_rows * t.dtype.itemsize for t in self.schema.tables.values()]
            self._block_bytes = max(segment_bytes, 2 * max(chunk_bytes))
            n_blocks = len(self.schema.tables) + 2 * max(workers, 1)
            check_room(n_blocks * self._block_bytes, f"the writer's {n_blocks} segment buffers")
            self._blocks = [SharedBlock(self._block_bytes) for _ in range(n_blocks)]
            self._block_bytes_view = [np.frombuffer(b.buf, np.uint8) for b in self._blocks]
            self._free = list(range(n_blocks))[::-1]
            self._open: dict[str, _Segment | None] = {t: None for t in self.schema.tables}
            self._inflight: dict[int, _Segment] = {}
            self._seg_ids = 0
            self._shared_chunks = 0
            if workers > 0:
                dtypes = {n: t.dtype for n, t in self.schema.tables.items()}
                self._pool = WorkerPool(workers, write_worker.setup,
                                        (self.location, dtypes, self._sync, self._blocks, self._lease.fence),
                                        "writer worker", start_method)
            self._load = [0] * max(workers, 1)
        except BaseException as exc:
            self._error = exc
            self._remove_if_created()
            self._release()
            raise
        self._closed = False
        self._last_flush = self._last_commit = time.monotonic()
        if self._withdrawn:  # before any write can change those chunks
            try:
                self._commit(force=True)
            except BaseException as exc:
                self._fail(exc)
                raise
        self._rows_in = {t: 0 for t in self.schema.tables}
        self._episodes_in = 0

    # ---------------------------------------------------------------- opening
    def _check_new(self, store: zarr.storage.BaseStore, overwrite: bool) -> None:
        """Mode "w": refuse, before anything changes, a location that holds something we may not replace."""
        if not self.location.exists():
            return
        if not overwrite:
            raise FormatError(f"{self.location}: already exists and is not empty; append to it (mode='a'), "
                              "resume an interrupted ingest into it, or overwrite it")
        if ".zgroup" not in store:
            held = self.location.entries(4)
            raise FormatError(f"{self.location}: not a zarr dataset (it holds {', '.join(held)}"
                              f"{', ...' if len(held) == 4 else ''}); refusing to overwrite it")

    def _clear(self) -> None:
        """Delete the dataset being overwritten (everything but the lease we hold)."""
        self.location.clear(lambda name: name in (LEASE_KEY, LOCK_FILE) or name.startswith(f".{LEASE_KEY}."))

    def _open_existing(self, schema: Schema) -> tuple[Schema, dict[str, int]]:
        group = dataset_format.open_group(self.location, mode="a")
        found, arrays, _ = dataset_format.open_tables(group)  # other arrays are left as they are
        for name, table in schema.tables.items():
            if name not in found.tables or found.tables[name].dtype != table.dtype:
                raise FormatError(f"{self.location}: table '{name}' does not match the schema to append")
        if [str(x) for x in found.links] != [str(x) for x in schema.links]:
            raise FormatError(f"{self.location}: its links differ from the schema to append")
        for name, table in found.tables.items():
            if name not in arrays:  # e.g. an L5Kit dataset without traffic_light_faces
                group.create_dataset(name, shape=(0,), chunks=(table.chunk_rows,), dtype=table.dtype,
                                     compressor=found.compressor, fill_value=np.zeros(1, table.dtype)[0])
        doc = dataset_format.read_manifest(group.store)
        self._log = CommitLog()
        if doc is None:  # written by another tool: its shapes are its rows
            self._journal, self._commit_no, self._dataset_id = Journal(), 0, dataset_format.new_dataset_id()
            return found, {n: group[n].shape[0] for n in found.tables}
        try:
            self._log = dataset_format.read_log(group.store, doc)  # no other writer: nothing merges it meanwhile
        except KeyError as exc:
            raise FormatError(f"{self.location}: commit log segment {exc} is missing; the dataset is damaged") \
                from None
        listed = {ref.key for ref in self._log.refs}  # segments of commits that never published: not needed
        orphans = [k for k in dataset_format.log_keys(group.store) if k not in listed]
        if orphans:
            within(_FAIL_SECONDS, lambda: dataset_format.delete(group.store, orphans))
        logged = self._log.whole()
        self._journal = Journal.from_json(doc.get("journal"), logged.committed, logged.skipped)
        self._commit_no = doc["commit"]
        self._dataset_id = doc.get("dataset_id") or dataset_format.new_dataset_id()
        return found, doc["committed"]

    def _withdraw_tails(self, committed: Mapping[str, int]) -> dict[str, tuple[int, tuple[int, str]]]:
        """The digests of each table's last, partly filled chunk that the log records (sealed when the last
        writer closed): this writer's first write there changes the chunk, so the next commit withdraws them
        (until this writer closes and seals the chunk again)."""
        if not self._log.refs:
            return {}
        chunks = self._log.whole().chunks
        out = {}
        for t, n in committed.items():
            c = self.schema.tables[t].chunk_rows
            record = chunks.get(t, {}).get(n // c) if n % c else None
            if record is not None:
                out[t] = (n // c, record)
        return out

    # ---------------------------------------------------------------- public API
    @property
    def committed(self) -> dict[str, int]:
        """Rows per table that are committed (readers see these)."""
        return dict(self._tracker.committed)

    @property
    def worker_pids(self) -> list[int]:
        """The writer processes' pids (empty with workers=0): for monitoring, or a test that kills one."""
        return self._pool.pids() if self._pool else []

    @property
    def dataset_id(self) -> str:
        """The dataset's identity (new with each dataset made or overwritten)."""
        return self._dataset_id

    @property
    def lease_token(self) -> str:
        """The token of this writer's lease: a task elsewhere writing rows it placed checks the dataset's lease
        document still names it (`lease.check_held`)."""
        return self._lease.holder.token

    @property
    def commit(self) -> int:
        """The number of the last commit (readers may pin it: `Dataset.open(path, commit=n)`)."""
        return self._commit_no

    def is_committed(self, key: Key) -> bool:
        """Whether the episode with this key is committed (or was skipped as bad input)."""
        return self._journal.done(key)

    def missing(self) -> list[Key]:
        """Keys of episodes submitted but not committed: by this writer, or by an interrupted one up to its
        last commit. Re-send them, or run the same input again with `ingest(..., resume=True)`."""
        return sorted((k for k in self._journal.pending if not self._journal.done(k)), key=_key_order)

    def submit(self, episode: Mapping[str, np.ndarray], key: Key | None = None) -> bool:
        """Check the episode, place it after everything submitted so far and start writing it.

        `key` (a str or an int) identifies the episode: one whose key is committed, or already submitted to
        this writer, is passed over (returns False), so retries never duplicate it. Without a key, the episode
        is the next of the current input (see `ingest`). Returns at once unless every segment buffer is busy
        (back-pressure). Bad input raises `ValueError` naming table, field and row, with nothing written, or
        with `on_error="skip"` is logged and skipped (returns False).
        """
        self._check_open()
        if key is None:
            if self._input is None:
                self._begin_input(episode, resume=False)
            assert self._input is not None  # set by _begin_input
            key = Position(self._input, self._position)
            self._position += 1
        key = check_key(key)
        if self._journal.done(key) or key in self._submitted:
            return False
        digest = fingerprint(episode)
        earlier = self._journal.pending.get(key)
        if earlier is not None and earlier != digest:
            raise ValueError(f"episode {key}: not the episode submitted under this key before the interruption "
                             f"(fingerprint {digest}, was {earlier}); resume with the same input")
        try:
            tables = check_episode(episode, self.schema)
        except ValueError as exc:
            if self.on_error == "raise":
                raise ValueError(f"episode {key}: {exc}") from None
            log.warning("skipping episode %s: %s", key, exc)
            self._journal.skip(key)
            return False
        self._journal.pending[key] = digest
        self._submitted.add(key)
        rows = {t: len(a) for t, a in tables.items()}
        offsets = self._coordinator.reserve(rows)
        tables = relocate(tables, self.schema, offsets)
        try:
            for t, arr in tables.items():
                self._append(t, offsets[t], arr)
            self._tracker.add_episode(key, offsets, {t: offsets[t] + rows[t] for t in rows})
            for t, n in rows.items():
                self._rows_in[t] += n
            self._episodes_in += 1
            now = time.monotonic()
            if now - self._last_flush >= self.commit_interval:
                self._flush()
            self._collect(timeout=0)
        except BaseException as exc:
            self._fail(exc)
            raise
        return True

    def ingest(self, episodes: Iterable[Mapping[str, np.ndarray]], resume: bool = False,
               keys: Iterable[Key] | None = None) -> dict[str, Any]:
        """Submit every episode, wait until all are written and commit; return a summary.

        Without `keys`, each episode's key is its position in `episodes` with the input's fingerprint (the
        digest of its first episode). An input this dataset has seen before is refused unless `resume=True`,
        which passes over its committed episodes and writes the rest; resuming with an input the dataset has
        not seen, while it records another one, is refused. Nothing is written before either refusal.
        With `keys` (one str or int per episode), committed keys are passed over, resume or not.
        """
        self._check_open()
        t0 = time.perf_counter()
        rows0, eps0 = dict(self._rows_in), self._episodes_in
        total = len(episodes) if isinstance(episodes, Sized) else None
        bar = tqdm(total=total, unit="episode", desc="ingest", disable=not self.progress, smoothing=0.1)
        last = time.monotonic()
        given = iter(keys) if keys is not None else None
        self._input = None
        try:
            for i, episode in enumerate(episodes):
                if given is not None:
                    key = next(given, None)
                    if key is None:
                        raise ValueError(f"keys: fewer keys than episodes (none for episode {i})")
                else:
                    if i == 0:
                        self._begin_input(episode, resume)
                    assert self._input is not None  # set by _begin_input at the first episode
                    key, self._position = Position(self._input, i), i + 1
                if resume and self._journal.done(key):
                    bar.update(1)
                    continue
                self.submit(episode, key=key)
                bar.update(1)
                if self.progress and time.monotonic() - last > 0.5:
                    last = time.monotonic()
                    bar.set_postfix_str(self._rate(t0, rows0), refresh=False)
            self.sync()
            bar.set_postfix_str(self._rate(t0, rows0), refresh=False)
        finally:
            bar.close()
        rows = {t: self._rows_in[t] - rows0[t] for t in rows0}
        return {"episodes": self._episodes_in - eps0, "rows": rows, "bytes": self._bytes(rows),
                "seconds": time.perf_counter() - t0}

    def _begin_input(self, first: Any, resume: bool) -> None:
        """Start an input whose first episode is `first`: refuse a repeat without resume, or a resume of an
        input this dataset has not seen; record it (with one commit) before any of its rows are written."""
        self.begin_input(fingerprint(first), resume, "its first episode has fingerprint", "episodes")

    def begin_input(self, input_id: str, resume: bool, what: str = "its fingerprint is", unit: str = "parts"
                    ) -> None:
        """Start the input `input_id` (see `ingest`), whose keys are `Position(input_id, i)`; `what` introduces
        the id and `unit` names its parts in messages. For committers of rows written elsewhere (`reserve`),
        such as `zarrfeed.writer.dask`."""
        self._check_open()
        j = self._journal
        if resume and not j.known_input(input_id) and (j.inputs or j.legacy):
            last = j.last_input or "unknown"
            raise ValueError(f"{self.location}: cannot resume with this input ({what} {input_id}): the "
                             f"interrupted ingest had another ({last}); resume with the same input, or append "
                             "this one without resume (--append)")
        if not resume and j.known_input(input_id):
            done = len(j.inputs[input_id][0])
            raise ValueError(f"{self.location}: this input was ingested before ({done} of its {unit} are "
                             f"committed; {what} {input_id}); resume it to finish it (resume=True, --resume), "
                             "or pass keys= to write it again")
        j.add_input(input_id)
        j.last_input = input_id
        self._input, self._position = input_id, 0
        self._commit(force=True)

    def reserve(self, key: Key, rows: Mapping[str, int], digest: str = "") -> dict[str, int]:
        """Place rows that another process writes (a task on a cluster) under `key`, after everything placed
        so far, and grow the arrays to hold them; return the first row per table. They commit, in the order
        placed, once `written(key)` says they are stored. Only this writer, holding the lease, places rows."""
        self._check_open()
        key = check_key(key)
        if self._journal.done(key) or key in self._submitted:
            raise ValueError(f"key {key}: already committed or placed")
        rows = {t: int(rows.get(t, 0)) for t in self.schema.tables}
        starts = self._coordinator.reserve(rows)
        ends = {t: starts[t] + rows[t] for t in rows}
        try:
            for t in rows:
                self._grow(t, ends[t])
            self._commit()
        except BaseException as exc:
            self._fail(exc)
            raise
        self._journal.pending[key] = digest
        self._submitted.add(key)
        self._tracker.add_episode(key, starts, ends)
        self._external[key] = (starts, ends)
        return starts

    def written(self, key: Key, writes: Iterable[ChunkWrite] = ()) -> None:
        """The rows placed under `key` by `reserve` are stored, as `writes` say (what `chunk_write.write_rows`
        returned): they commit with everything placed before, with the digests of their chunks."""
        starts, ends = self._external.pop(key)
        self._digests.add(writes)
        for t in starts:
            if ends[t] > starts[t]:
                self._tracker.segment_done(t, starts[t], ends[t])
        for t, n in ((t, ends[t] - starts[t]) for t in starts):
            self._rows_in[t] += n
        self._episodes_in += 1
        try:
            self._commit()
        except BaseException as exc:
            self._fail(exc)
            raise

    def skip(self, key: Key) -> None:
        """Record `key` as skipped (bad input): resume passes over it, as over a committed key."""
        self._journal.skip(check_key(key))

    def sync(self) -> None:
        """Write everything submitted so far and commit it."""
        self._check_open()
        try:
            self._flush()
            while self._inflight:
                self._collect(timeout=0.1)
            self._commit(force=True)
        except BaseException as exc:
            self._fail(exc)
            raise

    def close(self) -> dict[str, int]:
        """Write and commit everything, stop the workers, trim the arrays, consolidate the metadata and
        release the lease. Returns the committed rows per table."""
        if self._closed:
            return self.committed
        try:
            self.sync()
            if self._pool:
                self._pool.stop()
            self._lease.check()
            for t, n in self._tracker.committed.items():  # nothing lies past the committed rows: trim the shape
                if self._length[t] != n:
                    self._bounded(lambda: dataset_format.set_length(self._arrays[t], n), f"setting the length of {t}")
            self._write_manifest(seal_tail=True)
            self._bounded(lambda: dataset_format.consolidate(self._store), "consolidating the metadata")
        finally:
            self._shutdown()
        return self.committed

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._fail(exc)

    def abort(self) -> None:
        """Stop at once (for example on Ctrl+C): kill the workers and commit what is already written."""
        self._fail(KeyboardInterrupt("aborted"))

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):  # never closed: stop the workers and free memory, commit nothing
            try:
                if self._pool:
                    self._pool.kill()
                self._shutdown()
            except Exception:  # at interpreter exit, modules it needs may be gone already
                pass

    # ---------------------------------------------------------------- segments
    def _append(self, table: str, offset: int, rows: np.ndarray) -> None:
        seg = self._open[table]
        if seg is not None and seg.start + seg.n != offset:  # a reservation that does not follow on
            self._dispatch(table)
        if not len(rows):
            return
        src = np.ascontiguousarray(rows).view(np.uint8)
        size = rows.dtype.itemsize
        done = 0
        while done < len(rows):
            seg = self._open[table] or self._new_segment(table, offset + done)
            take = min(seg.capacity - seg.n, len(rows) - done)
            # bytes, not records: a uint8 copy runs at memcpy speed, a structured one ~30x slower
            self._block_bytes_view[seg.block][seg.n * size:(seg.n + take) * size] = \
                src[done * size:(done + take) * size]
            seg.n += take
            done += take
            if seg.n == seg.capacity:
                self._dispatch(table)

    def _new_segment(self, table: str, start: int) -> _Segment:
        while not self._free:
            self._collect(timeout=0.1)
        c = self.schema.tables[table].chunk_rows
        fits = self._block_bytes // self.schema.tables[table].dtype.itemsize
        end = (start + fits) // c * c  # end on a chunk boundary: its chunks have no other writer
        seg = _Segment(self._seg_ids, table, start, (end if end > start else start + fits) - start, self._free.pop())
        self._seg_ids += 1
        self._open[table] = seg
        return seg

    def _dispatch(self, table: str) -> None:
        seg, self._open[table] = self._open[table], None
        if seg is None:
            return
        if seg.n == 0:
            self._free.append(seg.block)
            return
        end = seg.start + seg.n
        self._lease.check()  # a writer that lost its lease, or was paused past it, writes nothing more
        self._grow(table, end)
        self._inflight[seg.id] = seg
        if self._pool is None:
            rows = np.frombuffer(self._blocks[seg.block].buf, self._arrays[table].dtype, count=seg.n)
            writes = write_rows(self._arrays[table], seg.start, rows, self._sync, self._lease.check)
            self._shared_chunks += sum(w.shared for w in writes)
            self._digests.add(writes)
            del rows
            self._done(seg.id)
            return
        seg.worker = min(range(len(self._load)), key=self._load.__getitem__)
        seg.sent = time.monotonic()
        self._load[seg.worker] += 1
        self._pool.send(seg.worker, (seg.id, table, seg.start, seg.n, seg.block))

    def _flush(self) -> None:
        for t in self._open:
            self._dispatch(t)
        self._last_flush = time.monotonic()

    def _done(self, seg_id: int) -> None:
        seg = self._inflight.pop(seg_id)
        if seg.worker is not None:
            self._load[seg.worker] -= 1
        self._free.append(seg.block)
        self._tracker.segment_done(seg.table, seg.start, seg.start + seg.n)

    def _collect(self, timeout: float) -> None:
        """Take finished segments from the workers; commit when it is time. Raises `WorkerError`."""
        if self._pool is not None:
            for kind, wid, seg_id, detail in self._pool.poll(timeout):
                if kind == "error":
                    self._lease.check()  # a worker stopped by the lease's fence: say that, not "worker failed"
                    seg = self._inflight.get(seg_id[0]) if seg_id else None
                    where = f" writing {seg.table} rows [{seg.start}, {seg.start + seg.n})" if seg else ""
                    raise WorkerError(f"writer worker {wid} failed{where}: {detail}", detail) from detail.exc
                self._shared_chunks += sum(w.shared for w in detail)
                self._digests.add(detail)
                self._done(seg_id)
            if self._pool.dead():
                raise WorkerError(self._lost())
            stalled = [seg for seg in self._inflight.values() if time.monotonic() - seg.sent > self.stall_timeout]
            if stalled:  # alive but stuck: a store that accepts connections and never answers
                seg = stalled[0]
                raise WorkerError(f"writer worker {seg.worker} has not finished writing {seg.table} rows "
                                  f"[{seg.start}, {seg.start + seg.n}) in {self.stall_timeout:.0f} s: "
                                  f"{self.location} does not answer")
        self._commit()

    def _grow(self, table: str, end: int) -> None:
        """Make the array at least `end` rows long, in large steps (each is a metadata write)."""
        if end > self._length[table]:
            self._lease.check()
            step = 4 if self.location.is_local else 64
            n = self._length[table] = max(end, 2 * self._length[table], step * self._arrays[table].chunks[0])
            self._bounded(lambda: dataset_format.set_length(self._arrays[table], n), f"growing {table} to {n:,} rows")

    def _lost(self) -> str:
        """The message for a dead worker: who, and which episodes' rows it held."""
        assert self._pool is not None  # only a pool's worker can be lost
        wid, pid, code = self._pool.dead()[0]
        lost = sorted({k for seg in self._inflight.values() if seg.worker == wid
                       for k in self._tracker.episodes_touching(seg.table, seg.start, seg.start + seg.n)},
                      key=_key_order)
        what = f"episodes {lost[0]} to {lost[-1]}" if len(lost) > 1 else f"episode {lost[0]}" if lost else "nothing"
        rows = ", ".join(f"{n:,} {t}" for t, n in self._tracker.committed.items())
        return (f"{describe_exit('writer worker', wid, pid, code)} while writing {what}; "
                f"{self._journal.committed_count()} episodes are committed ({rows}). "
                "Reopen with mode='a' and re-send missing() (or ingest(..., resume=True)).")

    # ---------------------------------------------------------------- commit
    def _commit(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_commit < self.commit_interval:
            return
        for key in self._tracker.advance():
            self._journal.commit(key)
            self._submitted.discard(key)
        self._write_manifest()
        self._last_commit = time.monotonic()

    def _write_manifest(self, seal_tail: bool = False) -> None:
        """Publish a commit: the committed rows, the journal, and in a new log segment the caller's keys and the
        digests of the chunks sealed since the last commit (`seal_tail`: the last chunk of each table too, when
        the writer closes). If it fails, nothing of it counts: the same is published by the next commit."""
        self._lease.check()  # never publish a commit once another writer holds the dataset, or may
        committed = dict(self._tracker.committed)
        chunks = self._digests.seal(committed, seal_tail)
        for t, (index, record) in self._tails.items():
            if seal_tail and committed[t] // self.schema.tables[t].chunk_rows == index:
                chunks.setdefault(t, {}).setdefault(index, record)  # no write changed it: sealed again as it was
            elif t in self._withdrawn:
                chunks.setdefault(t, {}).setdefault(index, None)
        new_keys = self._journal.take_new()
        segment = Segment(new_keys[0], new_keys[1], chunks)
        state = (committed, self._journal.to_json())
        if state == self._published and not len(segment):
            return
        before = (list(self._log.refs), dict(self._log.contents))
        try:
            objects, doomed = self._log.add(segment, self._commit_no + 1)
            doc = dataset_format.manifest(self.schema, committed, self._commit_no + 1, self._dataset_id,
                                          journal=state[1], log=self._log.to_json(), digest=dataset_format.DIGEST)
            self._bounded(lambda: dataset_format.write_manifest(self._store, doc, objects),
                          f"publishing commit {self._commit_no + 1}")
        except BaseException:
            self._log.refs, self._log.contents = before
            self._journal.give_back(new_keys)
            raise
        self._commit_no += 1
        self._digests.forget(chunks)
        self._withdrawn = {}
        self._published = state
        if doomed:  # merged into the new segment; the manifest that listed them is replaced
            within(_FAIL_SECONDS, lambda: dataset_format.delete(self._store, doomed))

    def _bounded(self, fn: Any, what: str) -> Any:
        return bounded(self._store_timeout, fn, f"{self.location}: {what}")

    def _fail(self, exc: BaseException | None) -> None:
        """Stop at once after an error: kill the workers, commit what is durable, free the buffers. A dataset
        this writer created that holds no commit is removed (an ingest whose input fails at once leaves
        nothing, and the next run needs no --overwrite), unless the stop was asked for (Ctrl+C, `abort()`) or
        a worker died: those runs are resumed, as their messages say."""
        if self._closed:
            return
        self._error = exc
        try:
            if self._pool:
                self._pool.kill()
            for key in self._tracker.advance():
                self._journal.commit(key)
            if not self._lease.lost and not within(_FAIL_SECONDS, self._write_manifest):
                log.debug("%s: no last commit after %s (the store does not answer)", self.location, exc)
            if not isinstance(exc, (KeyboardInterrupt, WorkerError)) and not any(self.committed.values()):
                self._remove_if_created()
        finally:
            self._shutdown()

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
        within(_FAIL_SECONDS, lambda: self.location.remove(keep_root=self._had_root))

    def _shutdown(self) -> None:
        self._closed = True
        self._release()

    def _release(self) -> None:
        """Free the shared memory, the chunk locks and the lease."""
        self._block_bytes_view = []
        for b in self._blocks:
            b.close()
        self._blocks = []
        if self._lock_dir:
            shutil.rmtree(self._lock_dir, ignore_errors=True)
            self._lock_dir = None
        lease = getattr(self, "_lease", None)
        if lease is not None:
            lease.release(_FAIL_SECONDS if self._error is not None else None)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"DatasetWriter for {self.path} is closed"
                               + (f" after an error: {self._error}" if self._error else ""))

    # ---------------------------------------------------------------- reporting
    def _bytes(self, rows: Mapping[str, int]) -> int:
        return sum(n * self.schema.tables[t].dtype.itemsize for t, n in rows.items())

    def _rate(self, t0: float, rows0: Mapping[str, int]) -> str:
        dt = max(time.perf_counter() - t0, 1e-9)
        rows = {t: self._rows_in[t] - rows0[t] for t in rows0}
        return f"{sum(rows.values()) / dt / 1e6:.2f} M rows/s, {self._bytes(rows) / dt / 1e6:.0f} MB/s"
