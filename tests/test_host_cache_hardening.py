"""The host cache where an adversarial pass broke it (issue 22): copies put in a dataset's place, one relative
path in two directories, a plain zarr rewritten in place, another user serving a cache, the 257th process, a
loader left open at exit, a stopped holder. Each failed before its fix; the docstrings say what is expected."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr
from zarrfeed.core._proc import rendezvous
from zarrfeed.loader import Dataset, Loader, host_cache
from zarrfeed.writer import DatasetWriter, synthetic

CHUNKS = {"agents": 2000, "frames": 200, "traffic_light_faces": 500}


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(4, 22, chunks=CHUNKS, frames=120, agents_per_frame=30)


def centroids(path, cache, **kw):
    with Loader(path, batch_size=1000, num_workers=0, shuffle=False, cache=cache, **kw) as loader:
        return np.concatenate([b["centroid"].copy() for b in loader])


def hold(path):
    """A loader of `path` that has decoded every chunk into the host cache and keeps holding it."""
    loader = Loader(path, batch_size=1000, num_workers=0, shuffle=False)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    return loader, it


def appended_copy(src, dst, shift):
    """A copy of `src` with two more episodes (the same for every `shift` but the agents' centroids): copies
    appended this way have the same id, commit number and row counts, and other rows."""
    shutil.copytree(src, dst)

    def episodes():
        for ep in synthetic.episodes(2, seed=1, frames=120, agents_per_frame=30):
            agents = ep["agents"].copy()
            agents["centroid"] += shift
            yield {**ep, "agents": agents}

    with DatasetWriter(dst, mode="a", workers=0) as writer:
        writer.ingest(episodes())


def test_a_dataset_replaced_by_a_copy_appended_otherwise_is_not_read_from_the_old_cache(data, tmp_path):
    """A dataset replaced at its path by another copy appended differently to the same commit (a restore, an
    rsync from another machine) while a loader of the old one still runs: a new loader must read the new
    files, as cache="process" does. The host cache's key lacks what tells such copies apart (the state's
    `log` key does), so today the new loader reads the old copy's rows."""
    one, two, path = tmp_path / "one.zarr", tmp_path / "two.zarr", tmp_path / "d.zarr"
    appended_copy(data, one, 0.0)
    appended_copy(data, two, 1000.0)
    shutil.copytree(one, path)
    old, it = hold(path)
    try:
        shutil.rmtree(path)
        shutil.copytree(two, path)
        want = centroids(path, "process")
        assert not np.array_equal(want, centroids(one, "process"))
        np.testing.assert_array_equal(centroids(path, "host"), want)
    finally:
        it.close()
        old.close()


def test_the_same_relative_path_in_two_directories_names_two_datasets(data, tmp_path, monkeypatch):
    """Two ranks started in two directories (two experiments) each open "data.zarr", copies appended
    differently to the same commit: the host cache is keyed by the path as given, not resolved, so the second
    reads the first one's chunks."""
    for name, shift in (("a", 0.0), ("b", 1000.0)):
        (tmp_path / name).mkdir()
        appended_copy(data, tmp_path / name / "data.zarr", shift)
    monkeypatch.chdir(tmp_path / "a")
    old, it = hold("data.zarr")
    try:
        monkeypatch.chdir(tmp_path / "b")
        np.testing.assert_array_equal(centroids("data.zarr", "host"), centroids("data.zarr", "process"))
    finally:
        it.close()
        old.close()


def test_a_plain_zarr_rewritten_in_place_is_not_read_from_the_old_cache(data, tmp_path):
    """A plain L5Kit zarr (no zarrfeed manifest: no id, no commit) rewritten in place with other values, same
    row counts, while a loader of the old values runs: a loader made after the rewrite must read the new
    values (cache="process" does); its host cache is named by location and row counts only."""
    path = tmp_path / "plain.zarr"
    shutil.copytree(data, path)
    for name in ("zarrfeed.json", "zarrfeed.log", "zarrfeed.commits", ".zarrfeed.lock"):
        p = path / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    assert Dataset.open(path).dataset_id is None
    old, it = hold(path)
    try:
        group = zarr.open_group(str(path), mode="r+")
        agents = group["agents"][:]
        agents["centroid"] += 1000.0
        group["agents"][:] = agents
        want = centroids(path, "process")
        np.testing.assert_array_equal(centroids(path, "host"), want)
    finally:
        it.close()
        old.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_cannot_serve_its_memory_as_this_users_cache(data):
    """Another user binds an abstract socket under this user's names (abstract sockets have no permissions,
    and the names are in /proc/net/unix for all to see) and serves a memory file of its own laid out as the
    cache, with every chunk marked READY and filled with 0x41. This user's loaders must not take it (check the
    server's SO_PEERCRED / the file's owner): today they read the other user's bytes as the dataset's rows
    (and would decode their own chunks into memory that user reads)."""
    ds = Dataset.open(data)
    key = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize)
    want = centroids(data, "process")
    victim = os.geteuid()
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(ready_r)
            os.close(stop_w)
            os.setgid(65534)
            os.setuid(65534)
            os.geteuid = lambda: victim  # names the sockets as the victim's; serves the victim
            seg = host_cache.attach(key, 1 << 30, key.n_chunks, key.n_chunks)
            for pin in seg.pin_all(list(range(key.n_chunks))):
                with seg.writing(pin.slot, pin.token) as mine:
                    if mine:
                        seg.array()[pin.slot * seg.slot_bytes:(pin.slot + 1) * seg.slot_bytes] = 0x41
                seg.unpin(pin.slot)
            os.write(ready_w, b"1")
            os.read(stop_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(stop_r)
    try:
        assert os.read(ready_r, 1) == b"1"
        np.testing.assert_array_equal(centroids(data, "host"), want)
    finally:
        os.close(stop_w)
        os.waitpid(child, 0)


def test_a_process_refused_by_a_full_host_cache_keeps_nothing_of_it(data):
    """The 257th process on one host cache falls back to a cache of its own (logged); once its loader is
    closed it must hold nothing of the host cache. Today `_open_segment` leaves the rendezvous server (a
    listening socket and a thread serving the memfd) and the descriptors open when registering fails: the
    process keeps the cache's memory alive, outside the host's budget, for as long as it lives."""
    ds = Dataset.open(data)
    key = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize)
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    kids = []
    try:
        for _ in range(host_cache.MAX_PROCS):
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(stop_w)
                    seg = host_cache.attach(key, 1 << 30, 64, 1)
                    os.write(ready_w, b"1" if seg is not None else b"0")
                    os.read(stop_r, 1)
                finally:
                    os._exit(0)
            kids.append(pid)
        got = b""
        while len(got) < len(kids):
            got += os.read(ready_r, 4096)
        assert got.count(b"1") == host_cache.MAX_PROCS
        with Loader(data, batch_size=1000, num_workers=0) as loader:
            assert sum(1 for _ in loader) == len(loader)

        def memfds():
            out = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    out.append(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    pass
            return [t for t in out if f"zarrfeed-cache/{key.identity}" in t]  # this cache: others may live

        assert [s for s in rendezvous.served("cache/") if f"/serve/{os.getpid()}-" in s] == []
        assert memfds() == []
    finally:
        os.close(stop_w)
        for pid in kids:
            os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)
        os.close(stop_r)


def test_a_loader_left_open_at_exit_leaves_quietly(data, tmp_path):
    """A script that exits with a loader mid-epoch (never closed: a rank that crashes out of its loop, a
    notebook) must exit without a traceback, as with cache="process". Today, with the host cache, Python
    prints "Exception ignored in: <generator object Loader._iterate ...> ... host_cache.py ... in close:
    TypeError: 'NoneType' object is not callable" at shutdown."""
    script = tmp_path / "left_open.py"
    script.write_text(f"""
from zarrfeed.loader import Loader
if __name__ == "__main__":
    loader = Loader({str(data)!r}, batch_size=1000, num_workers=0)
    batches = iter(loader)
    next(batches)
    next(batches)
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def test_a_stopped_holder_does_not_make_a_second_budget_and_cache(data, tmp_path):
    """A process holding the host's ledger and a dataset's cache is stopped (Ctrl-Z, SIGSTOP, a debugger): its
    serving thread cannot answer, so today the next process, after a 1 s timeout, creates a second ledger (with
    the whole budget again: "set by this process, the first of them") and a second cache of the same dataset
    commit, decoding every chunk again: together the host's processes then hold more than the budget. Expected:
    one ledger per host while any holder lives (e.g. take the descriptor from /proc/<pid>/fd of a holder that
    does not answer, same user), so the newcomer sees the stopped holder's cache in `usage()`."""
    import signal
    import time

    from zarrfeed.loader import host_budget
    script = tmp_path / "holder.py"
    script.write_text(f"""
import os, signal
from zarrfeed.loader import Loader
loader = Loader({str(data)!r}, batch_size=1000, num_workers=0, cache_bytes=4 << 20)
batches = iter(loader)
for _ in range(len(loader)):
    next(batches)
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
""")
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while open(f"/proc/{holder.pid}/stat").read().split(")")[1].split()[0] != "T":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with Loader(data, batch_size=1000, num_workers=0, cache_bytes=4 << 20) as loader:
            batches = iter(loader)
            for _ in range(len(loader)):
                next(batches)
            use = host_budget.usage()
            decoded = loader.chunks_decoded
            batches.close()
        assert use.set_by == holder.pid, use
        assert decoded == 0
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
