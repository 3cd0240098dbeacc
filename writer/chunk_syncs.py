"""`ChunkSyncs`: the fsyncs of chunk files a writer stored without waiting for the disk, done beside the writing.

A writer's workers store each whole chunk (one no commit names yet) and go on compressing the next, instead of
waiting about a millisecond per file for the disk (a fifth of their time on this machine's disk). Two threads
of the writer's process fsync those files meanwhile, and a segment's rows count as stored, and so can be
committed, only once all its files are synced: a commit waits for what it publishes, and nothing else.
Threads, not a process: an fsync waits on the disk with the GIL released.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from ..core.bounded_calls import bounded
from ..core.stores import Store


@dataclass(frozen=True)
class StoredRows:
    """Rows [start, end) of `table`."""

    table: str
    start: int
    end: int


class ChunkSyncs:
    """Syncs of `store`'s objects (`Store.sync_objects`), each for the rows it makes durable."""

    THREADS = 2  # two fsyncs at once: a file system's journal commits them together

    def __init__(self, store: Store, what: str) -> None:
        self._store, self._what = store, what
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[Future, StoredRows]] = []
        self._ready: list[StoredRows] = []  # synced, found by a call that then raised: the next call's

    def add(self, keys: list[str], rows: StoredRows) -> None:
        """Sync objects `keys`, which hold `rows`."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.THREADS, thread_name_prefix="zarrfeed-fsync")
        self._pending.append((self._pool.submit(self._store.sync_objects, keys), rows))

    def synced(self, wait: bool, timeout: float | None = None) -> list[StoredRows]:
        """The rows whose objects are now synced (`wait`: all of them, each wait bounded by `timeout` seconds);
        they are no longer pending. A sync that failed (an EIO, a full disk) raises its error here, and its rows
        are never returned (those synced before it are, by the next call)."""
        done, self._ready = self._ready, []
        for entry in list(self._pending):
            future, rows = entry
            if not (wait or future.done()):
                continue
            self._pending.remove(entry)
            try:
                bounded(timeout, future.result, f"{self._what}: syncing rows [{rows.start:,}, {rows.end:,}) of "
                                                f"{rows.table}")
            except BaseException:
                self._ready = done
                raise
            done.append(rows)
        return done

    def close(self) -> None:
        """Stop the threads once their syncs are done; pending rows are not taken (a writer that failed)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._pending, self._ready = [], []
