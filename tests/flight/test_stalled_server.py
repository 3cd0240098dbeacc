"""A `zarrfeed serve` that stops answering while its connections stay open (SIGSTOPped here; a frozen machine, a
network that drops packets silently): its clients notice within 2 x stall_timeout and behave as for a server that
went away, rather than wait silently as long as it is stopped. The server runs in its own process group on
127.0.0.1, port 0, and is SIGKILLed with its workers at the end."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from zarrfeed.flight import RemoteLoader, RemoteWriter
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic, write_dataset


@pytest.fixture
def server(tmp_path):
    """(url, process, dataset path) of `zarrfeed serve --ingest` in its own session, once it listens."""
    path = tmp_path / "d.zarr"
    write_dataset(path, synthetic.episodes(6, seed=0), workers=0)
    proc = subprocess.Popen([sys.executable, "-m", "zarrfeed", "serve", str(path), "--port", "0", "--workers", "1",
                             "--ingest"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving on grpc://127.0.0.1:"), line
        yield line.split()[2], proc, path
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def stop(proc) -> None:
    """SIGSTOP the server's process group, and wait until the server is stopped (a signal is delivered
    asynchronously: a call made right after could still be answered)."""
    os.killpg(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.01)
    raise AssertionError(f"the server (pid {proc.pid}) did not stop")


def resume(proc) -> None:
    os.killpg(proc.pid, signal.SIGCONT)


def test_a_loader_whose_server_stops_answering_raises_connection_error_in_bounded_time(server):
    url, proc, _ = server
    loader = RemoteLoader(url, batch_size=1024, shuffle=False, stall_timeout=1, reconnect_timeout=1)
    it = iter(loader)
    next(it)
    stop(proc)
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=r"the server stopped answering"):
        for _ in it:
            pass
    # 2 x stall_timeout to notice, reconnect_timeout to give up; generous for a loaded machine, far below forever
    assert time.monotonic() - t0 < 20
    loader.close()


def test_a_loader_whose_server_stops_then_wakes_goes_on_with_exactly_the_batches_due(server):
    url, proc, _ = server
    with RemoteLoader(url, batch_size=1024, shuffle=False) as plain:
        expected = [b["track_id"].copy() for b in plain]
    loader = RemoteLoader(url, batch_size=1024, shuffle=False, stall_timeout=1, reconnect_timeout=60)
    got = []
    for i, batch in enumerate(loader):
        got.append(batch["track_id"].copy())
        if i == 2:
            stop(proc)
            threading.Timer(4, resume, (proc,)).start()  # past 2 x stall_timeout: the stream was given up
    assert loader.reconnects >= 1
    assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    loader.close()


def test_a_writer_whose_server_stops_answering_raises_then_writes_each_episode_once(server):
    url, proc, path = server
    eps = list(synthetic.episodes(3, seed=8, frames=12, agents_per_frame=4))
    w = RemoteWriter(url, stall_timeout=1)
    assert w.submit(eps[0], key="e0")
    stop(proc)
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=r"the server stopped answering.*reconnects and re-sends"):
        w.submit(eps[1], key="e1")
    assert time.monotonic() - t0 < 60
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):  # still stopped: the retry says so too, in bounded time
        w.submit(eps[1], key="e1")
    assert time.monotonic() - t0 < 60
    resume(proc)
    w.submit(eps[1], key="e1")
    w.submit(eps[2], key="e2")
    assert w.close()["scenes"] == 6 + 3  # each episode once
    assert Dataset.open(path).rows["scenes"] == 6 + 3


def test_a_writer_left_by_an_exception_while_its_server_is_stopped_lets_go_at_once(server):
    url, proc, _ = server
    eps = list(synthetic.episodes(2, seed=9, frames=12, agents_per_frame=4))
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        with RemoteWriter(url, stall_timeout=1) as w:
            w.submit(eps[0], key="e0")
            stop(proc)
            w.submit(eps[1], key="e1")
    assert time.monotonic() - t0 < 60
