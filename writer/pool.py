"""Writer worker processes: each inherits the shared blocks, then writes the segments it is sent.

Only small messages cross processes: (segment id, table, first row, row count, block) in, (segment id) out.
A worker exits when told to, or by itself within half a second once its parent is gone.
"""
from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from typing import Any

import multiprocess as mp
import numpy as np

from .shm import SharedBlock

_POLL = 0.1


class WorkerError(RuntimeError):
    """A writer worker died or failed; the message names it and the episodes whose rows it held."""


def _worker_main(wid: int, root: str, dtypes: dict[str, np.dtype], synchronizer: Any, blocks: list[SharedBlock],
                 tasks: Any, results: Any, parent_pid: int, blosc_threads: int) -> None:
    import numcodecs.blosc
    import zarr

    from .chunkio import write_rows

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the parent's to handle
    numcodecs.blosc.set_nthreads(blosc_threads)
    numcodecs.blosc.use_threads = blosc_threads > 1
    try:
        store = zarr.storage.DirectoryStore(root)
        arrays = {t: zarr.open_array(store, mode="r+", path=t) for t in dtypes}
        locked = {t: zarr.open_array(store, mode="r+", path=t, synchronizer=synchronizer, cache_metadata=False)
                  for t in dtypes}
    except BaseException:
        results.put(("error", wid, None, traceback.format_exc()))
        return
    results.put(("ready", wid, None, None))
    while True:
        try:
            msg = tasks.get(timeout=0.5)
        except queue.Empty:
            if os.getppid() != parent_pid:
                return
            continue
        if msg is None:
            return
        seg_id, table, start, n, block = msg
        try:
            rows = np.frombuffer(blocks[block].buf, dtypes[table], count=n)
            shared = write_rows(arrays[table], locked[table], start, rows)
            del rows
        except BaseException:
            results.put(("error", wid, seg_id, traceback.format_exc()))
            return
        results.put(("done", wid, seg_id, shared))


class WorkerPool:
    """`n` writer processes fed through one task queue each, answering on one result queue."""

    def __init__(self, n: int, root: str, dtypes: dict[str, np.dtype], synchronizer: Any,
                 blocks: list[SharedBlock], start_method: str | None = None) -> None:
        ctx = mp.get_context(start_method)
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(n)]
        threads = max(1, (os.cpu_count() or 1) // max(n, 1))
        self.procs = [ctx.Process(target=_worker_main, name=f"zarrfeed-writer-{i}", daemon=True,
                                  args=(i, root, dtypes, synchronizer, blocks, self.tasks[i], self.results,
                                        os.getpid(), threads))
                      for i in range(n)]
        for p in self.procs:
            p.start()
        ready = 0
        deadline = time.monotonic() + 120
        while ready < n:
            for kind, wid, _, detail in self.poll(timeout=_POLL):
                if kind == "error":
                    self.kill()
                    raise WorkerError(f"writer worker {wid} failed to start:\n{detail}")
                ready += 1
            if time.monotonic() > deadline:
                self.kill()
                raise WorkerError(f"writer workers did not start within 120 s ({ready} of {n} ready)")

    def send(self, wid: int, msg: tuple) -> None:
        self.tasks[wid].put(msg)

    def poll(self, timeout: float) -> list[tuple]:
        """Messages that arrived within `timeout` (all that are waiting, at least one if any comes);
        raises `WorkerError` for a worker that has died."""
        out = []
        try:
            out.append(self.results.get(timeout=timeout))
            while True:
                out.append(self.results.get_nowait())
        except queue.Empty:
            pass
        if not any(kind == "error" for kind, *_ in out):  # a failing worker's own report says more
            self.check_alive()
        return out

    def dead(self) -> list[tuple[int, int, int | None]]:
        """(worker index, pid, exit code) of workers that have exited."""
        return [(i, p.pid, p.exitcode) for i, p in enumerate(self.procs) if p.exitcode is not None]

    def check_alive(self) -> None:
        dead = self.dead()
        if dead:
            raise WorkerError(describe_exit(*dead[0]))

    def stop(self, timeout: float = 10.0) -> None:
        for q in self.tasks:
            q.put(None)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.exitcode is None:
                p.kill()
        for p in self.procs:
            p.join(5)
        for q in [*self.tasks, self.results]:
            q.close()
            q.cancel_join_thread()


def describe_exit(wid: int, pid: int, code: int | None) -> str:
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"writer worker {wid} (pid {pid}) {how}"
