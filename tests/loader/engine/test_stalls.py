"""Never a silent wait: a loader waiting on a stopped process (its own worker, or another process that pins the
host cache it needs room in) says which one in the log, and when it goes on; with `stall_timeout` it raises
`LoaderStalledError` instead of waiting as long as the process is stopped. Real processes, real SIGSTOP."""
import hashlib
import logging
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
from zarrfeed.core._proc.pool import process_state
from zarrfeed.loader import Dataset, Loader, LoaderStalledError
from zarrfeed.loader.caches import host_cache
from zarrfeed.loader.engine import stalls

CHUNKS = {"agents": 2000, "frames": 200, "traffic_light_faces": 500}
_CALLS = [0]


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(8, 22, chunks=CHUNKS, frames=120, agents_per_frame=30)


def stop_at_third_batch(batch: dict) -> dict:
    """A transform that stops its own worker process at its third batch (the first runs in a sizing process of
    its own): the loader then waits for that worker's batches."""
    _CALLS[0] += 1
    if _CALLS[0] == 3:
        os.kill(os.getpid(), signal.SIGSTOP)
    return batch


def digest(batch) -> str:
    h = hashlib.sha256()
    for name in sorted(batch):
        h.update(name.encode())
        h.update(np.ascontiguousarray(batch[name]).tobytes())
    return h.hexdigest()[:16]


def wait_for(caplog, pattern: str, reader: threading.Thread, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not re.search(pattern, caplog.text) and reader.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)


def cont(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_stopped_worker_is_said_in_the_log_and_the_loader_goes_on_when_it_resumes(data, monkeypatch, caplog):
    """A Loader whose worker was SIGSTOPped waited silently. Now the log names the
    worker, its pid, that it is stopped and `kill -CONT PID`; after SIGCONT it says it goes on, and the batches
    are those of a loader never stopped."""
    monkeypatch.setattr(stalls, "STALL", 0.5)
    with Loader(data, batch_size=256, num_workers=0, seed=4, cache="off") as plain:
        expected = [digest(b) for b in plain]
    loader = Loader(data, batch_size=256, num_workers=1, seed=4, cache="off", transform=stop_at_third_batch)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(digest(b) for b in loader))
    try:
        with caplog.at_level(logging.WARNING, logger="zarrfeed"):
            reader.start()
            wait_for(caplog, r"kill -CONT \d+", reader)
            pids = loader.worker_pids
            assert len(pids) == 1 and reader.is_alive()
            assert re.search(rf"batch \d+ of epoch 0 \(table 'agents'\) has waited \d+ s with nothing moving: "
                             rf"loader worker 0 \(pid {pids[0]}\) is stopped \(`kill -CONT {pids[0]}` resumes it",
                             caplog.text), caplog.text
            assert caplog.text.count("is stopped") == 1  # once per stall
            cont(pids)
            reader.join(120)
            assert not reader.is_alive()
            assert re.search(r"batch \d+ of epoch 0 \(table 'agents'\) goes on after waiting \d+ s", caplog.text)
        assert got == expected
    finally:
        cont(loader.worker_pids)
        reader.join(60)
        loader.close()


def test_stall_timeout_raises_naming_the_stopped_worker(data, caplog):
    """With `stall_timeout`, a batch that waits that long on a stopped worker raises `LoaderStalledError` (a
    `LoaderError`) naming the worker's pid, instead of waiting as long as it is stopped."""
    loader = Loader(data, batch_size=256, num_workers=1, seed=4, cache="off", transform=stop_at_third_batch,
                    stall_timeout=0.5)
    pids: list = []
    try:
        with pytest.raises(LoaderStalledError) as info:
            for _ in loader:
                pass
        pids = info.value.pids
        assert len(pids) == 1
        assert process_state(pids[0]) is None  # the loader's error ended its run: the stopped worker is killed
        assert f"loader worker 0 (pid {pids[0]}) (stopped)" in str(info.value)
        assert f"kill -CONT {pids[0]}" in str(info.value)
    finally:
        cont(pids)
        loader.close()
    with pytest.raises(ValueError, match="stall_timeout"):
        Loader(data, stall_timeout=0)


def test_stall_timeout_raises_when_the_stopped_worker_s_pipe_is_full(small_dataset):
    """A WindowLoader whose only worker was stopped went on sending it messages until
    the pipe was full, then waited inside the send, where neither the log nor `stall_timeout` looked: it hung
    for good, saying nothing (the server's streams too). Sending now waits for room while watching the stall."""
    from zarrfeed.loader import WindowLoader

    data = small_dataset(24, 5, chunks={"agents": 100, "frames": 20, "traffic_light_faces": 200})  # many chunks
    loader = WindowLoader(data, 2, 3, batch_size=64, seed=1, num_workers=1, stall_timeout=2)
    batches = iter(loader)
    next(batches)
    pids = list(loader.worker_pids)
    outcome: dict = {}

    def read() -> None:
        try:
            outcome["batches"] = sum(1 for _ in batches)
        except BaseException as exc:
            outcome["error"] = exc
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(40)
        assert isinstance(outcome.get("error"), LoaderStalledError), outcome or "still waiting after 40 s"
        assert outcome["error"].pids == pids
    finally:
        cont(pids)
        loader.close()


@pytest.mark.parametrize("waits_in", ["the first pin", "the next epoch", "close"])
def test_stall_timeout_raises_when_a_stopped_process_holds_the_host_cache_lock(data, waits_in, monkeypatch, caplog):
    """A process stopped while it held the lock of the host cache's slot table (a SIGSTOP landing there) made
    a loader of that dataset wait for the lock inside fcntl (to pin its first window, to unpin at the next
    epoch, to unpin as it closed), where neither the log nor `stall_timeout` looked: it hung for good, saying
    nothing. Now it waits for the lock in steps its stall watch looks at: the log names the process holding
    the lock, and `LoaderStalledError` is raised naming it."""
    monkeypatch.setattr(stalls, "STALL", 0.5)
    ds = Dataset.open(data)
    key = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize)
    holder = host_cache.attach(key, 1 << 30, key.n_chunks, 1)  # the cache lives while the test runs
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:  # takes the table's lock when told, and stops while it holds it
        try:
            os.close(go_w)
            seg = host_cache.attach(key, 1 << 30, key.n_chunks, 1)
            if os.read(go_r, 1) == b"1":
                with seg.locked():
                    os.kill(os.getpid(), signal.SIGSTOP)
        finally:
            os._exit(1)
    os.close(go_r)
    loader = Loader(data, batch_size=256, num_workers=0, seed=4, shuffle_window=1, stall_timeout=1)
    batches = iter(loader)
    outcome: dict = {}

    def run() -> None:
        try:
            if waits_in == "close":
                loader.close()
            else:  # this epoch and the next (after the first batch, only the next epoch's unpins take the lock)
                outcome["batches"] = sum(1 for _ in batches) + sum(1 for _ in loader)
        except BaseException as exc:
            outcome["error"] = exc
    waiter = threading.Thread(target=run, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="zarrfeed"):
            if waits_in != "the first pin":
                next(batches)
            os.write(go_w, b"1")
            _, status = os.waitpid(child, os.WUNTRACED)
            assert os.WIFSTOPPED(status)
            assert holder.lock_holder() == child
            waiter.start()
            waiter.join(60)
        error = outcome.get("error")
        assert isinstance(error, LoaderStalledError), outcome or "still waiting after 60 s"
        assert error.pids == [child]
        assert f"process {child}, which holds the lock of the host cache's slot table, (stopped)" in str(error)
        assert re.search(rf"has waited \d+ s with nothing moving: process {child}, which holds the lock of the "
                         rf"host cache's slot table, is stopped \(`kill -CONT {child}` resumes it", caplog.text), \
            caplog.text
    finally:
        os.close(go_w)  # (a child not yet told exits)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        if waiter.is_alive():
            waiter.join(60)
        loader.close()
        host_cache.detach(holder)


def test_a_stopped_process_pinning_the_host_cache_is_said_in_the_log(data, monkeypatch, caplog):
    """A process stopped while it pins every slot of a dataset's host cache made
    every other loader of that dataset wait for room silently. Now the log names that process, that it is
    stopped, how many slots it pins, and `kill -CONT PID`; once it is gone the loader goes on (and says so)
    with the right batches."""
    monkeypatch.setattr(stalls, "STALL", 0.5)
    ds = Dataset.open(data)
    key = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize)
    n_slots = key.chunks_per_table[key.tables.index("agents")]  # what the loader needs at once: it shares the cache
    frames = [("frames", c) for c in range(key.chunks_per_table[key.tables.index("frames")])]
    held = (frames + [("agents", c) for c in range(n_slots)])[:n_slots]  # every slot, not every agents chunk
    assert any(t == "frames" for t, _ in held) and len(held) == n_slots
    holder = host_cache.attach(key, 1 << 30, n_slots, 1)  # the cache lives while the test runs
    child = 0
    try:
        assert holder.n_slots == n_slots
        with Loader(data, batch_size=700, num_workers=0, seed=9, shuffle_window=1, cache="process") as plain:
            expected = [digest(b) for b in plain]
        child = os.fork()
        if child == 0:  # pins every slot, gives its decodes up (others decode those chunks), then stops
            try:
                seg = host_cache.attach(key, 1 << 30, n_slots, 1)
                pins = host_cache.HostCache(seg, key).pin_window(0, held)
                seg.give_up({pin.slot: pin.token for pin in pins})
                os.kill(os.getpid(), signal.SIGSTOP)
            finally:
                os._exit(1)
        _, status = os.waitpid(child, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        got: list = []

        def read() -> None:
            with Loader(data, batch_size=700, num_workers=0, seed=9, shuffle_window=1) as loader:
                got.extend(digest(b) for b in loader)

        reader = threading.Thread(target=read)
        with caplog.at_level(logging.WARNING, logger="zarrfeed"):
            reader.start()
            wait_for(caplog, rf"kill -CONT {child}", reader)
            assert reader.is_alive()  # still waiting for room
            assert re.search(rf"has waited \d+ s with nothing moving: process {child}, which pins {n_slots} of the "
                             rf"{n_slots} slots of the host cache this loader waits for room in, is stopped "
                             rf"\(`kill -CONT {child}` resumes it", caplog.text), caplog.text
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            child = 0
            reader.join(120)
            assert not reader.is_alive()
            assert re.search(r"goes on after waiting \d+ s", caplog.text)
        assert got == expected
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        host_cache.detach(holder)
