"""`DatasetWriter`: append episodes to one dataset with a pool of writer processes, committing as it goes.

How it works. The writer first takes the dataset's lease (docs/architecture.md#lease). The parent
checks each episode, reserves its rows in every table (so its intervals can be relocated at once) and copies
its records into shared-memory segments, one table's row stream at a time. A segment ends on a chunk
boundary, so whole chunks have exactly one writer and need no lock. Full segments go to the least busy
worker, which compresses and writes them; only the parent touches the metadata. Every `commit_interval`
seconds the parent also sends partly filled segments (so little is ever uncommitted); the chunk such a
segment shares with the next one is written under zarr's per-chunk file lock, in a folder outside the
dataset. When every row of an episode is written, the episode is committed: a new manifest holding the row
counts and the journal of episode keys is published in one atomic write (docs/architecture.md#commits).
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import replace
import shutil
import time
from collections.abc import Sized
from typing import Any, Iterable, Iterator, Mapping, Unpack

import numpy as np

from ..core.keywords import count, seconds, spelled_out
from ..core._proc.pool import SAY_STALL_AFTER, Failed, WorkerPool, describe_exit, start_fork_server_early
from ..core.errors import WorkerError, WriteRefused
from ..core.keys import Key, Position, check_key, fingerprint
from . import chunk_locks
from .chunk_locks import ChunkLocks
from ..core.schema import Schema
from ..core.sizes import decimal_size
from ..core.refusals import FULL, refusal, write_refused
from ..core.location import Location
from . import write_worker
from .write_worker import WriteSegment
from .chunk_write import ChunkWrite, write_rows
from .committer import Committer, key_order
from .coordinator import Coordinator
from .episode import as_tables, check_episode, relocate
from .options import WriteOptions, Writes
from .segments import SegmentBuffers
from .lease import TIMEOUT

log = logging.getLogger("zarrfeed.writer")
_WATCH_SECONDS = 0.05  # how often `_collect` looks for dead or stalled workers: a death is said within this


@spelled_out(WriteOptions, Writes)
class DatasetWriter:
    """Writes episodes to the dataset at `path` (a directory or any fsspec URL, with `storage_options`) with
    `workers` processes (0: in this process).

    It holds the dataset's lease until it is closed: a second writer is refused. Episodes land in submission
    order, so the dataset is the same for any number of workers (docs/architecture.md#episodes). Use as a
    context manager, or call `close()`. What is committed, and when, is its `committer`'s. Every argument
    after `path` and `schema` is keyword-only, and it takes every writer's options
    ([`WriteOptions`][zarrfeed.writer.WriteOptions], listed below: `mode` creates or appends, `durable`, ...).

    Args:
        path: Where the dataset is: a local directory, any fsspec URL (`s3://bucket/prefix`), or a `Location`.
        schema: The tables (record dtypes, chunk rows), links, attrs and compressor of a new dataset (default
            L5Kit's; a replay buffer's: `replay_buffer_schema`). With mode "a" (default: the dataset's own) its
            tables' dtypes and its links must be the dataset's, else `FormatError`.
        workers: Writer processes that compress and store segments (default 2); 0 writes in this process. More
            compress more in parallel (on an object store: more PUTs at once); each adds two segment buffers.
        segment_bytes: Bytes of each shared-memory segment buffer (default 4 MiB on a local disk, 16 MiB on an
            object store; at least twice the largest chunk's bytes). The writer holds (tables + 2 x workers) of
            them; larger ones let each worker send more chunks at once.
        coordinator: Hands out each episode's rows in every table (`Coordinator.reserve`); default a
            `LocalCoordinator`, which appends in submission order. Pass one to share row ranges with other
            writers of the dataset's rows (a cluster-wide counter).
        synchronizer: The locks under which a chunk that two segments share is written (`synchronizer[key]`, as
            zarr's synchronizers); default `ChunkLocks` over a temporary folder of file locks, removed at close.
            It must lock across the writer's processes.
        start_method: How worker processes start ("fork", "spawn" or "forkserver"); default "forkserver" where
            the platform has it. "fork" starts faster, but a child of a process with threads may deadlock.
        lease_timeout: Seconds (default 60) after which another writer may take over the lease of a writer
            whose heartbeat stopped (renewed every sixth of it); this writer stops writing two heartbeats
            before. Raise it if storing one segment can take longer. On an object store it also bounds taking
            the lease.
        stall_timeout: Seconds (default 120) a worker may take to store one segment before the writer stops
            with `WorkerError` (a store that accepts connections and never answers); on an object store it
            also bounds each of this process's metadata calls.
    """

    def __init__(self, path: str | os.PathLike | Location, schema: Schema | None = None, *, workers: int = 2,
                 segment_bytes: int | None = None, coordinator: Coordinator | None = None, synchronizer: Any = None,
                 start_method: str | None = None, lease_timeout: float = TIMEOUT, stall_timeout: float = 120.0,
                 **options: Unpack[WriteOptions]) -> None:
        o = Writes.of(options, "DatasetWriter.__init__")
        if schema is not None and not isinstance(schema, Schema):
            raise TypeError(f"schema must be a zarrfeed Schema (such as L5KIT_SCHEMA) or None, got {schema!r}")
        mode, compressor, chunks, on_error, progress = o.mode, o.compressor, o.chunks, o.on_error, o.progress
        overwrite, commit_interval, storage_options, durable = o.overwrite, o.commit_interval, o.storage_options, \
            o.durable
        workers = count(workers, "workers (0: write in this process)", 0)
        segment_bytes = count(segment_bytes, "segment_bytes", 1, "the store's default")
        lease_timeout, stall_timeout = seconds(lease_timeout, "lease_timeout"), seconds(stall_timeout, "stall_timeout")
        self.location = replace(Location.of(path, storage_options), durable=durable)
        self.path = self.location.url
        self.on_error, self.progress, self.commit_interval = on_error, progress, commit_interval
        self.stall_timeout = stall_timeout
        self._closed = True
        self._buffers: SegmentBuffers | None = None
        self._lock_dir: str | None = None
        self._pool: WorkerPool | None = None
        # the parent's own calls on an object store are bounded like the workers' (see bounded_calls.bounded)
        self.committer = Committer(self.location, schema, mode=mode, overwrite=overwrite, chunks=chunks,
                                   compressor=compressor, coordinator=coordinator, lease_timeout=lease_timeout,
                                   store_timeout=self.location.settings.bound(stall_timeout),
                                   commit_interval=commit_interval, layout=o.layout)
        self.schema = self.committer.schema
        try:
            # per-chunk locks, for chunks two segments share: outside the dataset, gone at close
            self._lock_dir = chunk_locks.private_folder()
            self._sync = synchronizer or ChunkLocks(self._lock_dir)
            self._arrays = self.committer.arrays
            self._input: str | None = None  # the fingerprint of the input that keyless submits continue
            self._position = 0

            # Shared-memory segments: one open per table in the parent, two in flight per worker. On an object
            # store larger ones, so that each worker sends several chunks at once (its PUTs run concurrently).
            if segment_bytes is None:
                segment_bytes = self.location.settings.segment_bytes
            chunk_bytes = [t.chunk_rows * t.dtype.itemsize for t in self.schema.tables.values()]
            align = {n: a.meta.shard_rows for n, a in self._arrays.items() if a.sharding is not None}
            shard_bytes = [align[n] * self.schema.tables[n].dtype.itemsize for n in align]
            self._buffers = SegmentBuffers(self.schema.tables, len(self.schema.tables) + 2 * max(workers, 1),
                                           max(segment_bytes, 2 * max(chunk_bytes), *shard_bytes), align)
            self._shared_chunks = 0
            if workers > 0:
                self._pool = WorkerPool(workers, write_worker.setup,
                                        (self.location, self.schema.tables, self._sync, self._buffers.blocks,
                                         self.committer.fence),
                                        "writer worker", start_method)
            self._load = [0] * max(workers, 1)
            self._next_watch = 0.0  # when `_collect` next looks for dead or stalled workers
            self._said_stopped: set[int] = set()  # pids of stopped workers said in the log
        except BaseException:
            self._free_memory()
            self.committer.abandon()
            raise
        self._closed = False
        self._last_flush = time.monotonic()
        self._rows_in = {t: 0 for t in self.schema.tables}
        self._episodes_in = 0

    # ---------------------------------------------------------------- public API
    @property
    def committed(self) -> dict[str, int]:
        """Rows per table that are committed (readers see these)."""
        return self.committer.committed

    @property
    def worker_pids(self) -> list[int]:
        """The writer processes' pids (empty with workers=0): for monitoring, or a test that kills one."""
        return self._pool.pids() if self._pool else []

    @property
    def dataset_id(self) -> str:
        """The dataset's identity (new with each dataset made or overwritten)."""
        return self.committer.dataset_id

    @property
    def shared_chunks(self) -> int:
        """Chunks stored so far that two segments shared (read, merged and written back under their lock)."""
        return self._shared_chunks

    @property
    def lease_token(self) -> str:
        """The token of this writer's lease (see `Committer.lease_token`)."""
        return self.committer.lease_token

    @property
    def commit(self) -> int:
        """The number of the last commit (readers may pin it: `Dataset.open(path, commit=n)`)."""
        return self.committer.commit_number

    def is_committed(self, key: Key) -> bool:
        """Whether the episode with this key is committed (or was skipped as bad input)."""
        return self.committer.is_committed(key)

    def missing(self) -> list[Key]:
        """Keys of episodes submitted but not committed: by this writer, or by an interrupted one up to its
        last commit. Re-send them, or run the same input again with `ingest(..., resume=True)`."""
        return self.committer.missing()

    def submit(self, episode: Mapping[str, np.ndarray], key: Key | None = None) -> bool:
        """Check the episode, place it after everything submitted so far and start writing it.

        `key` (a str or an int) identifies the episode: one whose key is committed, or already submitted to
        this writer, is passed over (returns False), so retries never duplicate it. Without a key, the episode
        is the next of the current input (see `ingest`): it takes that position once it is accepted, passed
        over or skipped; a refused one takes none, so fixed and submitted again it keeps its place. Returns at
        once unless every segment buffer is busy (back-pressure). Bad input raises `ValueError` naming table,
        field and row, with nothing written, or with `on_error="skip"` is logged and skipped (returns False).
        """
        self._check_open()
        if key is None:
            return self._submit_next(episode)
        return self._submit(episode, check_key(key))

    def _submit_next(self, episode: Mapping[str, np.ndarray]) -> bool:
        """A key-less submit: the episode at the current input's next position, which it takes only if it is not
        refused. An input begins with its first episode that is not refused (with on_error="skip" a bad one is
        skipped in its place, as `ingest` of the same episodes would)."""
        checked = None
        if self._input is None:
            if self.on_error == "raise":  # a refused first episode begins no input
                checked = self._checked(episode, 0)
            self._begin_input(episode, resume=False)
        assert self._input is not None  # set by _begin_input
        taken = self._submit(episode, Position(self._input, self._position), checked)
        self._position += 1  # not reached if refused
        return taken

    def _checked(self, episode: Any, index: Key) -> dict[str, np.ndarray]:
        """The episode's tables, or `ValueError` naming the episode (its key, or its index in the input)."""
        try:
            return check_episode(episode, self.schema)
        except ValueError as exc:
            raise ValueError(f"episode {index}: {exc}") from None

    def _submit(self, episode: Mapping[str, np.ndarray], key: Key,
                checked: dict[str, np.ndarray] | None = None) -> bool:
        """Place and start writing the episode under `key` (`checked`: its tables, if checked already)."""
        if self.committer.is_known(key):
            return False
        digest = fingerprint(as_tables(episode, self.schema))
        self.committer.check_resubmitted(key, digest)
        tables = checked
        if tables is None:
            try:
                tables = self._checked(episode, key)
            except ValueError as exc:
                if self.on_error == "raise":
                    raise
                log.warning("skipping %s", exc)
                self.committer.skip(key)
                return False
        rows = {t: len(a) for t, a in tables.items()}
        with self._stopping(every_error=False):
            offsets = self.committer.place(key, rows, digest)
        tables = relocate(tables, self.schema, offsets)
        with self._stopping():
            for t, arr in tables.items():
                self._append(t, offsets[t], arr)
            for t, n in rows.items():
                self._rows_in[t] += n
            self._episodes_in += 1
            now = time.monotonic()
            if now - self._last_flush >= self.commit_interval:
                self._flush()
            self._collect(timeout=0)
        return True

    def ingest(self, episodes: Iterable[Mapping[str, np.ndarray]], resume: bool = False,
               keys: Iterable[Key] | None = None) -> dict[str, Any]:
        """Submit every episode, wait until all are written and commit; return a summary.

        Without `keys`, each episode's key is its position in `episodes` with the input's fingerprint (the
        digest of its first episode). An input this dataset has seen before is refused unless `resume=True`,
        which passes over its committed episodes and writes the rest; resuming with an input the dataset has
        not seen, while it records another one, is refused. Nothing is written before either refusal.
        With `keys` (one str or int per episode), committed keys are passed over, resume or not. A bad episode
        raises `ValueError` (with `on_error="raise"`) and takes no position: the episodes before it are written,
        and a key-less `submit` of it fixed takes its place (a refused first episode begins no input).
        """
        self._check_open()
        t0 = time.perf_counter()
        rows0, eps0 = dict(self._rows_in), self._episodes_in
        total = len(episodes) if isinstance(episodes, Sized) else None
        from tqdm.auto import tqdm  # (imported here: a fortieth of a second that a script's import need not pay)

        bar = tqdm(total=total, unit=" episodes", desc="ingest", disable=not self.progress, smoothing=0.1)
        last = time.monotonic()
        given = iter(keys) if keys is not None else None
        self._input = None
        try:
            for i, episode in enumerate(episodes):
                checked = None  # the episode's tables, if checked already
                if given is not None:
                    key = next(given, None)
                    if key is None:
                        raise ValueError(f"keys: fewer keys than episodes (none for episode {i})")
                    key = check_key(key)
                else:
                    if i == 0:  # a refused first episode begins no input
                        checked = self._checked(episode, 0) if self.on_error == "raise" else None
                        self._begin_input(episode, resume)
                    assert self._input is not None  # set by _begin_input at the first episode
                    key = Position(self._input, i)
                if not (resume and self.committer.is_committed(key)):
                    self._check_open()
                    self._submit(episode, key, checked)
                if given is None:  # taken (not refused): a key-less submit after a refusal takes its place
                    self._position = i + 1
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
        """Start an input whose first episode is `first` (see `begin_input`)."""
        self.begin_input(fingerprint(as_tables(first, self.schema)), resume, "its first episode has fingerprint",
                         "episodes")

    def begin_input(self, input_id: str, resume: bool, what: str = "its fingerprint is", unit: str = "parts"
                    ) -> None:
        """Start the input `input_id`, whose keys are `Position(input_id, i)`: refused if this dataset has
        seen it, unless `resume` (see `Committer.begin_input`); keyless submits continue it."""
        self._check_open()
        with self._stopping(every_error=False, resumable=False):
            self.committer.begin_input(input_id, resume, what, unit)
        self._input, self._position = input_id, 0

    def sync(self) -> None:
        """Write everything submitted so far and commit it."""
        self._check_open()
        with self._stopping():
            self._flush()
            while self._segments.in_flight:
                self._collect(timeout=0.1)
            self.committer.commit(force=True)

    def close(self) -> dict[str, int]:
        """Write and commit everything, stop the workers, trim the arrays, consolidate the metadata and
        release the lease. Returns the committed rows per table."""
        if self._closed:
            return self.committed
        try:
            self.sync()
            if self._pool:
                self._pool.stop()
            with self._stopping(every_error=False):
                self.committer.close()
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
    @property
    def _segments(self) -> SegmentBuffers:
        assert self._buffers is not None  # made when opened, until the memory is freed
        return self._buffers

    def _append(self, table: str, offset: int, rows: np.ndarray) -> None:
        segments = self._segments
        seg = segments.open_segment(table)
        if seg is not None and seg.end != offset:  # a reservation that does not follow on
            self._dispatch(table)
        rows = np.ascontiguousarray(rows)
        done = 0
        while done < len(rows):
            seg = segments.open_segment(table)
            if seg is None:
                while not segments.has_free_block():
                    self._collect(timeout=0.1)
                seg = segments.begin(table, offset + done)
            done += segments.fill(seg, rows[done:])
            if segments.is_full(seg):
                self._dispatch(table)

    def _dispatch(self, table: str) -> None:
        seg = self._segments.end(table)
        if seg is None:
            return
        self.committer.check_lease()  # a writer that lost its lease, or was paused past it, writes nothing more
        self.committer.grow(table, seg.end)
        if self._pool is None:
            rows = self._segments.rows(seg)
            writes = write_rows(self._arrays[table], seg.start, rows, self._sync, self.committer.check_lease,
                                sync_later=True)
            self._shared_chunks += sum(w.shared for w in writes)
            del rows
            self._done(seg.id, writes)
            return
        seg.worker = min(range(len(self._load)), key=self._load.__getitem__)
        seg.sent = time.monotonic()
        self._load[seg.worker] += 1
        self._pool.send(seg.worker, WriteSegment(seg.id, table, seg.start, seg.n, seg.block))

    def _flush(self) -> None:
        for t in self.schema.tables:
            self._dispatch(t)
        self._last_flush = time.monotonic()

    def _done(self, seg_id: int, writes: list[ChunkWrite]) -> None:
        seg = self._segments.stored(seg_id)
        if seg.worker is not None:
            self._load[seg.worker] -= 1
        self.committer.stored(seg.table, seg.start, seg.end, writes)

    def _collect(self, timeout: float) -> None:
        """Take finished segments from the workers; commit when it is time. Raises `WorkerError`."""
        if self._pool is not None:
            for reply in self._pool.poll(timeout):
                if isinstance(reply, Failed):
                    self.committer.check_lease()  # stopped by the lease's fence: say that, not "worker failed"
                    seg = self._segments.in_flight.get(reply.message.segment) if reply.message is not None else None
                    where = f" writing {seg.table} rows [{seg.start}, {seg.end})" if seg else ""
                    raise WorkerError(f"writer worker {reply.worker} failed{where}: {reply.error}", reply.error) \
                        from reply.error.exc
                self._shared_chunks += sum(w.shared for w in reply.writes)
                self._done(reply.segment, reply.writes)
            now = time.monotonic()
            if now >= self._next_watch:  # (not at every call: asking a worker's state is a syscall and a selector)
                self._next_watch = now + _WATCH_SECONDS
                self._watch_workers(now)
        self.committer.commit()

    def _watch_workers(self, now: float) -> None:
        """Raise `WorkerError` if a worker died, or has not finished a segment within `stall_timeout`; say in the
        log, once, a worker that is stopped (SIGSTOP, a debugger) with a segment unwritten for `SAY_STALL_AFTER`
        seconds: it is not dead, and goes on when continued, so the writer waits for it, but not silently."""
        assert self._pool is not None
        if self._pool.dead():
            raise WorkerError(self._lost(), cli=self._lost("Run the same command again with --resume to "
                                                           "finish."))
        late = [seg for seg in self._segments.in_flight.values()
                if now - seg.sent > min(SAY_STALL_AFTER, self.stall_timeout)]
        if not late:
            return
        stopped = dict(self._pool.stopped())
        for seg in late:
            pid = stopped.get(seg.worker)
            if pid is not None and pid not in self._said_stopped:
                self._said_stopped.add(pid)
                log.warning("zarrfeed: writer worker %d (pid %d) is stopped with %s rows [%d, %d) unwritten; the "
                            "writer waits for it (`kill -CONT %d` resumes it; stall_timeout=%.0f s ends the wait)",
                            seg.worker, pid, seg.table, seg.start, seg.end, pid, self.stall_timeout)
        stalled = [seg for seg in late if now - seg.sent > self.stall_timeout]
        if stalled:
            seg = stalled[0]
            pid = stopped.get(seg.worker)
            why = (f"it is stopped (pid {pid}: SIGSTOP, Ctrl+Z or a debugger)" if pid is not None else
                   f"{self.location} does not answer")  # alive, running, stuck: a store that never answers
            said = (f"writer worker {seg.worker} has not finished writing {seg.table} rows [{seg.start}, {seg.end}) "
                    f"in {self.stall_timeout:.0f} s: {why}; {self._kept()}.")
            raise WorkerError(f"{said} Reopen with mode='a' and re-send missing() (or ingest(..., resume=True)).",
                              cli=f"{said} Run the same command again with --resume to finish.")

    def _lost(self, remedy: str = "Reopen with mode='a' and re-send missing() (or ingest(..., resume=True)).") -> str:
        """The message for a dead worker: who, and which episodes' rows it held; then `remedy`."""
        assert self._pool is not None  # only a pool's worker can be lost
        wid, pid, code = self._pool.dead()[0]
        lost = sorted({k for seg in self._segments.in_flight.values() if seg.worker == wid
                       for k in self.committer.episodes_touching(seg.table, seg.start, seg.end)},
                      key=key_order)
        what = f"episodes {lost[0]} to {lost[-1]}" if len(lost) > 1 else f"episode {lost[0]}" if lost else "nothing"
        return f"{describe_exit('writer worker', wid, pid, code)} while writing {what}; {self._kept()}. {remedy}"

    def _kept(self) -> str:
        """What is committed: "3 episodes are committed (3 scenes, 744 frames, ...)"."""
        episodes, committed = self.committer.published
        rows = ", ".join(f"{n:,} {t}" for t, n in committed.items())
        return f"{episodes} episode{' is' if episodes == 1 else 's are'} committed ({rows})"

    @contextmanager
    def _stopping(self, every_error: bool = True, resumable: bool = True) -> Iterator[None]:
        """An error inside stops the writer (`_fail`; with `every_error` False only a refusal does); a write the
        system refused, here or in a worker (a full disk, a read-only one, no permission) is raised as
        `WriteRefused` (see `_refusal`). Not `resumable`: nothing of the input is recorded yet, and a dataset
        made for it goes."""
        try:
            yield
        except BaseException as exc:
            if refusal(_cause(exc), self.location) is None:
                if every_error:
                    self._fail(exc)
                raise
            self._fail(exc, remove=None if resumable else True)
            refused = self._refusal(exc, resumable)  # once failed: what the last commit left
            assert refused is not None
            raise refused from None

    def _refusal(self, exc: BaseException, resumable: bool) -> WriteRefused | None:
        """The refusal `exc` in one line naming the dataset, what is committed and how to finish (`resumable`:
        with resume; else what this writer was given is not recorded, and is written again); None if `exc` is
        no refusal."""
        cause = _cause(exc)
        fix = "Free space on it" if getattr(cause, "errno", None) in FULL else "Make it writable"
        if not resumable:
            return write_refused(cause, self.location, "the episodes cannot be written to it",
                                 f"; nothing of this input is recorded. {fix}, then write it again.",
                                 f"; nothing of this input is recorded. {fix}, then run the same command again.")
        return write_refused(cause, self.location, "the episodes cannot be written to it",
                             f"; {self._kept()}. {fix}, then reopen with mode='a' and re-send missing() (or "
                             "ingest(..., resume=True)).",
                             f"; {self._kept()}. {fix}, then run the same command again with --resume to finish.")

    def _fail(self, exc: BaseException | None, remove: bool | None = None) -> None:
        """Stop at once after an error: kill the workers, commit what is durable, free the buffers. A dataset
        this writer created that holds no commit is removed (an ingest whose input fails at once leaves
        nothing, and the next run needs no --overwrite), unless the stop was asked for (Ctrl+C, `abort()`) or
        a worker died, or the system refused a write (`remove` None; else as it says): those runs are resumed,
        as their messages say."""
        if self._closed:
            return
        self._error = exc
        refused = exc is not None and refusal(_cause(exc), self.location) is not None
        if remove is None:
            remove = not isinstance(exc, (KeyboardInterrupt, WorkerError)) and not refused
        try:
            if self._pool:
                self._pool.kill()
            self.committer.fail(exc, remove=remove, said=refused)  # a refusal says what is committed
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._closed = True
        self._free_memory()
        self.committer.release()

    def _free_memory(self) -> None:
        """Free the shared memory and the chunk locks."""
        if self._buffers is not None:
            self._buffers.close()
            self._buffers = None
        if self._lock_dir:
            shutil.rmtree(self._lock_dir, ignore_errors=True)
            self._lock_dir = None

    def _check_open(self) -> None:
        if self._closed:
            error = self.committer.error
            raise RuntimeError(f"DatasetWriter for {self.path} is closed"
                               + (f" after an error: {error}" if error else ""))

    # ---------------------------------------------------------------- reporting
    def _bytes(self, rows: Mapping[str, int]) -> int:
        return sum(n * self.schema.tables[t].dtype.itemsize for t, n in rows.items())

    def _rate(self, t0: float, rows0: Mapping[str, int]) -> str:
        dt = max(time.perf_counter() - t0, 1e-9)
        rows = {t: self._rows_in[t] - rows0[t] for t in rows0}
        return f"{sum(rows.values()) / dt:,.0f} rows/s, {decimal_size(self._bytes(rows) / dt, 'B/s')}"


def _cause(exc: BaseException) -> BaseException:
    """The error that stopped a writer: a worker's own, when it raised one (a full disk there), else `exc`."""
    if isinstance(exc, WorkerError) and exc.remote is not None and exc.remote.exc is not None:
        return exc.remote.exc
    return exc


start_fork_server_early()  # (see there: the first writer of a process does not wait for it)
