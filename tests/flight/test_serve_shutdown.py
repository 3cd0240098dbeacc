"""How a `zarrfeed serve` process and its streams end: SIGTERM stops it within 2 s whatever its clients do, a
trainer that leaves frees its stream, a trainer survives a server restart mid-epoch, and a stopped or dead
worker of the server fails its stream in one line and leaves no process."""
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from zarrfeed.core._proc.pool import process_state
from zarrfeed.loader import Dataset, Loader, LoaderError, WindowLoader
from zarrfeed.writer import synthetic

from zarrfeed.flight import RemoteLoader, RemoteWindowLoader
from repo_paths import ROOT
from serve_process import TRANSFORMS, Server


def test_a_trainer_that_leaves_mid_epoch_frees_its_stream(server):
    with RemoteLoader(server.url, "agents", batch_size=1000) as warm:  # starts the fork server, which stays
        list(warm)
    time.sleep(1)
    base = len(server.descendants())
    fds, rss = len(os.listdir(f"/proc/{server.proc.pid}/fd")), server.rss()
    for i in range(100):  # bounded: 100 connects, each leaving mid-epoch after 2 batches
        with RemoteLoader(server.url, "agents", batch_size=100, seed=i) as remote:
            it = iter(remote)
            next(it)
            next(it)
            if i % 25 == 0:
                assert len(server.descendants()) > 1  # the fork server and this stream's loader workers
            it.close()
    # the server may run to an epoch's end ahead of a trainer that leaves (gRPC buffers what it sends, and this
    # table is small); a finished epoch's loader is kept for that ticket's next stream: at most IdleLoaders'
    # limit of them, one worker and a few descriptors each. Anything more is a stream that was not freed.
    from zarrfeed.flight.feeding import IdleLoaders
    parked = IdleLoaders().limit
    deadline = time.monotonic() + 10
    while len(server.descendants()) > base + parked and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(server.descendants()) <= base + parked  # every other stream's loader workers are gone
    time.sleep(1)
    assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) <= fds + 4 + 8 * parked  # no growth with connections
    assert server.rss() < rss + (32 << 20) + parked * (16 << 20), (rss, server.rss())  # a kept one: its ring


def test_sigterm_stops_the_server_within_two_seconds_mid_stream(data):
    s = Server(data)
    remote = RemoteLoader(s.url, "agents", batch_size=50)
    it = iter(remote)
    next(it)  # a stream is open
    seconds = s.stop()
    assert seconds < 2.0 and s.proc.returncode == 0, s.err()


TRAINER = """
import os, signal, sys
from zarrfeed.flight import RemoteLoader
it = iter(RemoteLoader(sys.argv[1], "agents", batch_size=50))
next(it)
print("reading", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # a trainer that stopped reading mid-stream
"""


def test_sigterm_stops_within_two_seconds_whatever_the_clients_do(data, target):
    """With a trainer stopped mid-stream (SIGSTOP: it never reads again) the server kept serving
    after SIGTERM, and an idle producer held it until it left. Now it commits what it acknowledged, ends the
    streams it can, and exits within 2 s."""
    from zarrfeed.flight import RemoteWriter

    s = Server(target, "--ingest")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, s.url], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert trainer.stdout.readline() == "reading\n"
        with pytest.raises(ConnectionError, match="the server went away"), RemoteWriter(s.url) as producer:
            eps = list(synthetic.episodes(3, seed=31, frames=20, agents_per_frame=5))
            assert producer.submit(eps[0], key="a") and producer.submit(eps[1], key="b")  # acknowledged; idle
            seconds = s.stop()
            err = s.err()
            assert seconds < 2.0 and s.proc.returncode == 0, err
            assert "committed 3 scenes" in err and "Traceback" not in err, err
            producer.submit(eps[2], key="c")  # the producer hears of it at once, it does not hang
    finally:
        trainer.kill()
        trainer.wait()
    assert Dataset.open(target).rows["scenes"] == 3 and Dataset.open(target).validate().ok


def test_a_stream_ends_with_server_shutting_down(data):
    """A trainer still reading when the server stops gets "server shutting down", not a cut connection."""
    from zarrfeed.flight import FeedServer
    with FeedServer(data, port=0, workers=1) as server:
        remote = RemoteLoader(server.url, "agents", batch_size=20, reconnect_timeout=0)  # no waiting for it
        it = iter(remote)
        next(it)
        server.feeding.close()  # what stop() does first
        with pytest.raises(ConnectionError, match="server shutting down"):
            for _ in it:
                pass


@pytest.mark.parametrize("windows", [False, True])
def test_a_trainer_survives_a_server_restart_mid_epoch(data, windows):
    """A server restarted mid-epoch ended the trainer's epoch with an error. Now RemoteLoader and
    RemoteWindowLoader reconnect and go on from the batch after the last one they yielded: the epoch is
    exactly the local loader's."""
    import serve_transforms

    from zarrfeed.flight import RemoteWindowLoader
    s = Server(data, "--transforms", str(TRANSFORMS))
    # batches made slowly (10 ms each), so that the server dies before it has sent the epoch
    args = dict(batch_size=4 if windows else 20, seed=3)
    slow = dict(transform="slow", transform_args={"seconds": 0.01}, reconnect_timeout=30)
    remote = RemoteWindowLoader(s.url, 2, 3, **args, **slow) if windows else \
        RemoteLoader(s.url, "agents", **args, **slow)
    restarted = None
    try:
        got = []
        for i, batch in enumerate(remote):
            got.append(batch)
            if i == 3:  # mid-epoch: the server dies and a new one starts on the same port a second later
                s.kill()
                time.sleep(1.0)
                restarted = Server(data, "--port", s.port, "--transforms", str(TRANSFORMS))
        local_cls = WindowLoader if windows else Loader
        local_args = (data, 2, 3) if windows else (data, "agents")
        with local_cls(*local_args, **args, num_workers=0, copy=True,
                       transform=functools.partial(serve_transforms.slow, seconds=0)) as local:
            want = list(local)
        assert remote.reconnects == 1 and len(got) == len(want) > 4
        for a, b in zip(got, want, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
    finally:
        remote.close()
        if restarted is not None:
            restarted.stop()


def test_sigterm_ends_the_server_even_when_a_writer_worker_died(target):
    """With a producer connected and a writer worker SIGKILLed (as the OOM
    killer might), the last commit at SIGTERM raised, the shutdown after it never ran, and the server served
    on. Now it stops within seconds all the same, says in one line that the last commit failed, exits 1."""
    from zarrfeed.flight import RemoteWriter

    s = Server(target, "--ingest")
    w = RemoteWriter(s.url)
    try:
        for i, ep in enumerate(synthetic.episodes(2, seed=8, frames=30, agents_per_frame=20)):
            w.submit(ep, key=f"e{i}")
        stat = {pid: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] for pid in s.descendants()}
        workers = [pid for pid, parent in stat.items() if int(parent) != s.proc.pid]  # forked by the fork server
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        took = s.stop()  # the producer stays connected, idle
        assert took < 5 and s.proc.returncode == 1, (took, s.err()[-2000:])
        assert "the last commit failed" in s.err() and "Traceback" not in s.err()
    finally:
        if s.proc.poll() is None:
            s.kill()


def stream_with_its_workers_signalled(s: "Server", sig: int) -> tuple:
    """A RemoteWindowLoader stream of batches of 1 from server `s`, one batch read, then `sig` sent to the
    loader processes the stream started: (the remote loader, its batches, their pids)."""
    before = set(s.descendants())
    remote = RemoteWindowLoader(s.url, 2, 3, batch_size=1, seed=1)
    batches = iter(remote)
    next(batches)
    hit = sorted(set(s.descendants()) - before)
    assert hit, "no loader workers seen"
    for pid in hit:
        os.kill(pid, sig)
    return remote, batches, hit


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_stopped_or_dead_server_worker_fails_the_stream_in_one_line_for_the_client(small_dataset, sig):
    """A server's loader worker stopped (SIGSTOP) mid-stream left the remote client
    waiting for good with nothing raised (the server answered its probes; the server's loader waited as long as
    the worker was stopped, saying so only in the server's log). The stream now fails after the server's
    --stream-stall-timeout, and the client raises its one line, naming the stopped process. A worker killed
    was reported, but advised `restart_workers=True`, which a remote loader refuses (the server's to decide)."""
    data = small_dataset(8, 9, chunks={"agents": 900}, frames=100, agents_per_frame=40)  # 800 batches of 1
    s = Server(data, "--stream-stall-timeout", "2", "--kept-loaders", "0")
    hit: list[int] = []
    try:
        remote, batches, hit = stream_with_its_workers_signalled(s, sig)
        outcome: dict[str, BaseException | int] = {}

        def read() -> None:
            try:
                outcome["batches"] = sum(1 for _ in batches)
            except BaseException as exc:
                outcome["error"] = exc
        reader = threading.Thread(target=read, daemon=True)
        t0 = time.monotonic()
        reader.start()
        reader.join(60)
        assert "error" in outcome, f"after {time.monotonic() - t0:.0f} s: {outcome or 'still waiting'}"
        error = str(outcome["error"])
        assert isinstance(outcome["error"], LoaderError), repr(outcome["error"])
        assert any(f"(pid {p})" in error for p in hit), error
        if sig == signal.SIGSTOP:
            assert "--stream-stall-timeout of 2 s" in error and "kill -CONT" in error, error
        else:
            assert "loader worker" in error, error
        assert "restart_workers" not in error and "stall_timeout=None" not in error, error
        remote.close()
        status = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", s.url], capture_output=True,
                                text=True, timeout=60, cwd=ROOT).stdout
        assert "a stream waiting on a stopped process fails after 2 s" in status, status
    finally:
        for pid in hit:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        s.stop()
    assert "--stream-stall-timeout" in subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", "--help"],
                                                      capture_output=True, text=True, cwd=ROOT).stdout
    assert "stall_timeout=None" not in s.err()  # the server's log says its own option too
    bad = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(data), "--stream-stall-timeout", "inf"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "expected a finite number of seconds > 0, got 'inf'" in bad.stderr, bad.stderr


def test_a_server_stopped_with_a_stream_held_up_by_a_stopped_worker_leaves_no_process(small_dataset):
    """SIGTERM while a stream waited on a stopped loader worker: the server exited,
    but the stopped worker stayed, and with it the fork server and resource tracker (they wait for it)."""
    data = small_dataset(8, 9, chunks={"agents": 900}, frames=100, agents_per_frame=40)
    s = Server(data, "--stream-stall-timeout", "60", "--kept-loaders", "0")
    hit: list[int] = []
    try:
        remote, batches, hit = stream_with_its_workers_signalled(s, signal.SIGSTOP)
        everything = s.descendants()

        def read() -> None:
            with contextlib.suppress(Exception):
                sum(1 for _ in batches)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(2)
        assert s.stop() < 10.0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and [p for p in everything if process_state(p) not in (None, "Z")]:
            time.sleep(0.1)
        assert [p for p in everything if process_state(p) not in (None, "Z")] == []
    finally:
        for pid in hit:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        s.stop()
