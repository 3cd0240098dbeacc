"""A writer's workers start in the background (`PoolStart`) while its own process writes the first episodes: in a
fresh process the fork server starts first (a new interpreter importing numpy and zarrfeed, about 0.25 s, a
third of a gigabyte's ingest open to close). Nothing is committed before they are started, so a start that fails
leaves what a failed start always left: nothing."""
import threading

import numpy as np
import pytest
from expected import expected_tables
from zarrfeed.core._proc import pool as pool_module
from zarrfeed.core._proc.pool import PoolStart
from zarrfeed.core._proc.shm import SharedBlock
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

from pool_echo import echo_setup


def gate_pool_starts(monkeypatch) -> threading.Event:
    """Every pool started in the background waits for the returned event before it starts."""
    go = threading.Event()
    real = PoolStart._start

    def gated(self, *pool_args):
        assert go.wait(60), "the test never let the pool start"
        real(self, *pool_args)
    monkeypatch.setattr(PoolStart, "_start", gated)
    return go


def test_episodes_are_written_while_the_workers_start_and_committed_once_they_are(tmp_path, monkeypatch):
    go = gate_pool_starts(monkeypatch)
    episodes = list(synthetic.episodes(6, seed=3, frames=30, agents_per_frame=40))
    w = DatasetWriter(tmp_path / "d.zarr", workers=2, segment_bytes=1 << 16, commit_interval=0.0)
    try:
        for i, ep in enumerate(episodes):
            w.submit(ep, key=i)
        chunk_files = [p for p in (tmp_path / "d.zarr" / "agents").iterdir() if not p.name.startswith(".")]
        assert chunk_files, "nothing written while the workers started"
        assert not any(w.committed.values())  # (commits wait for the workers)
        go.set()
        w.sync()
        assert w.committed["scenes"] == 6 and len(w.worker_pids) == 2
    finally:
        go.set()
        w.close()
    ds = Dataset.open(tmp_path / "d.zarr")
    for table, want in expected_tables(episodes).items():
        np.testing.assert_array_equal(ds.read_rows(table, 0, ds.rows[table]), want, err_msg=table)


def test_workers_that_cannot_start_leave_no_dataset_and_say_why(tmp_path, monkeypatch):
    go = gate_pool_starts(monkeypatch)

    def cannot_start(*args, **kwargs):
        raise pool_module.WorkerError("writer worker 0 failed to start: (the test's)")
    monkeypatch.setattr(pool_module, "WorkerPool", cannot_start)
    w = DatasetWriter(tmp_path / "d.zarr", workers=2, segment_bytes=1 << 16)
    w.submit(synthetic.episode(0, seed=1, frames=10, agents_per_frame=5), key=0)
    go.set()
    with pytest.raises(pool_module.WorkerError, match="failed to start: \\(the test's\\)"):
        w.sync()
    assert not (tmp_path / "d.zarr").exists()
    with pytest.raises(RuntimeError, match="is closed"):
        w.submit(synthetic.episode(1, seed=1, frames=10, agents_per_frame=5), key=1)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_pool_cancelled_while_it_starts_is_killed_once_started(method):
    block = SharedBlock(64)
    started = PoolStart(1, echo_setup, (lambda m: m, block), "echo worker", start_method=method)
    started.cancel()
    assert started._thread is not None
    started._thread.join(60)
    assert started.done() and started._pool is None  # (killed as it came up; never handed out)
    block.close()


def test_with_fork_the_pool_is_started_at_once_in_the_callers_thread():
    """Forking while another thread of the process works may copy a lock held there into the child."""
    block = SharedBlock(64)
    started = PoolStart(1, echo_setup, (lambda m: m, block), "echo worker", start_method="fork")
    try:
        assert started._thread is None and started.done()
        pool = started.result()
        pool.send(0, 3)
        replies = []
        for _ in range(300):
            replies += pool.poll(0.1)
            if replies:
                break
        assert replies == [(3, b"\x00")]
    finally:
        started.cancel()
        block.close()
