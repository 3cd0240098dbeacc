"""The host cache at its edges: copies put in a dataset's place, one relative path in two directories, a plain
zarr rewritten in place, another user serving a cache, the 257th process, a loader left open at exit, a
stopped holder. The docstrings say what is expected."""
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from zarrfeed.core._proc import rendezvous
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array, Group
from zarrfeed.loader import Dataset, Loader
from zarrfeed.loader.caches import host_cache
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


def rewritten_copy(src, dst, chunk: int, shift: float):
    """A copy of `src` whose agents chunk `chunk` holds other centroids, its commit log recording that chunk's
    new size and digest under the same segment key: the same id, commit, commit log key and row counts as
    `src`, and other content (a copy re-encoded by another tool, a restore of another branch of the data)."""
    import json

    from zarrfeed.core.chunks import digest
    shutil.copytree(src, dst)
    agents = Array.open(DirectoryStore(dst), "agents")
    c = agents.chunks[0]
    rows = agents[chunk * c:(chunk + 1) * c]
    rows["centroid"] += shift
    agents[chunk * c:(chunk + 1) * c] = rows
    raw = (dst / "agents" / str(chunk)).read_bytes()
    patched = 0
    for seg in (dst / "zarrfeed.log").iterdir():
        doc = json.loads(seg.read_text())
        for rec in doc["chunks"].get("agents", []):
            if rec[0] == chunk:
                rec[1:] = [len(raw), digest(raw)]
                patched += 1
        seg.write_text(json.dumps(doc))
    assert patched


def test_a_copy_with_the_same_id_commit_and_log_key_but_other_chunks_has_a_cache_of_its_own(data, tmp_path):
    """A dataset replaced at its path by a copy with the same id, commit number and commit log key, whose
    chunk 1 of agents holds other rows (its digests recorded as such), while a loader of the old one holds
    the host cache: a new loader must read the new rows, as cache="process" does. Today the key is place, id,
    version tag and rows, all the same: the new loader reads the old copy's decoded chunk."""
    path, other = tmp_path / "d.zarr", tmp_path / "other.zarr"
    shutil.copytree(data, path)
    rewritten_copy(data, other, 1, 1000.0)
    before, after = Dataset.open(data), Dataset.open(other)
    assert (before.dataset_id, before.commit, before.version_tag()) == (after.dataset_id, after.commit,
                                                                         after.version_tag())
    assert before.digests() != after.digests()
    old, it = hold(path)
    try:
        shutil.rmtree(path)
        shutil.copytree(other, path)
        want = centroids(path, "process")
        assert not np.array_equal(want, centroids(data, "process"))
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
        group = Group.open(DirectoryStore(path))
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
            rendezvous._lookup_lock = lambda name, uid: contextlib.nullcontext()  # it cannot take the victim's
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

    from zarrfeed.loader.caches import host_budget
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


HOLD_IN = """
import sys
from zarrfeed.loader import Loader
if __name__ == "__main__":
    with Loader(sys.argv[1], batch_size=1000, num_workers=0, shuffle=False) as loader:
        batches = iter(loader)
        for _ in range(len(loader)):
            next(batches)
        print(loader.chunks_decoded, flush=True)
        sys.stdin.readline()
"""


def test_a_namespace_sees_only_its_own_caches_and_budget(data, tmp_path, monkeypatch, caplog):
    """A process in another namespace (`ZARRFEED_CACHE_NAMESPACE`) holds the host cache of this dataset: this
    process (the test session's namespace) sees neither that cache nor its budget ledger, and decodes the
    dataset itself; a process in that namespace shares it. A namespace that is not a name is said in one line
    and the loader keeps a cache of its own."""
    from zarrfeed.loader.caches import host_budget
    script = tmp_path / "hold.py"
    script.write_text(HOLD_IN)
    env = {**os.environ, "ZARRFEED_CACHE_NAMESPACE": f"other-{os.getpid()}"}
    holder = subprocess.Popen([sys.executable, str(script), str(data)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        n = int(holder.stdout.readline())
        assert n > 0
        assert host_budget.usage() is None and rendezvous.served("cache/") == []
        with Loader(data, batch_size=1000, num_workers=0, shuffle=False) as loader:
            list(loader)
            assert loader.chunks_decoded == n  # not the other namespace's cache
        joined = subprocess.run([sys.executable, str(script), str(data)], input="\n", capture_output=True,
                                text=True, env=env, timeout=300)
        assert joined.returncode == 0 and joined.stdout.split() == ["0"], joined.stderr[-3000:]
    finally:
        holder.communicate("\n", timeout=60)
    monkeypatch.setenv("ZARRFEED_CACHE_NAMESPACE", "a/b")
    with caplog.at_level(logging.WARNING, logger="zarrfeed"):
        with Loader(data, batch_size=1000, num_workers=0, shuffle=False) as loader:
            list(loader)
    assert "ZARRFEED_CACHE_NAMESPACE='a/b': a namespace is 1 to 64 letters" in caplog.text


def as_nobody(body) -> tuple[int, int]:
    """Run `body()` in a child process as user 65534 (nobody), until the caller writes to the returned pipe;
    returns (pid, write end). The child writes one byte to say `body` ran."""
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(ready_r)
            os.close(stop_w)
            os.setgid(65534)
            os.setuid(65534)
            keep = body()  # noqa: F841 (what it holds stays held until the parent says stop)
            os.write(ready_w, b"1")
            os.read(stop_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(stop_r)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return child, stop_w


@pytest.mark.skipif(os.geteuid() != 0, reason="another user needs root")
def test_another_user_cannot_hold_the_lookup_of_this_users_caches(data, caplog):
    """Another user binds the abstract socket names that served as the lookup locks of this dataset's cache and
    of the budget ledger (abstract names have no permissions, and they are in /proc/net/unix for all to see),
    and keeps them. Today this user's loader waits 10 s for each, then gives the host cache up ("cannot use
    the host cache"). Expected: the lock is this user's own; the loader uses the host cache at once."""
    from zarrfeed.loader.caches import host_budget
    ds = Dataset.open(data)
    key = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize)
    uid, ns = os.geteuid(), os.environ.get("ZARRFEED_CACHE_NAMESPACE", "")
    names = [f"\0zarrfeed/{uid}/{pre}{name}/lock" for pre in ("", f"ns={ns}/")
             for name in (f"cache/{key.identity}", "budget")]

    def squat():
        socks = []
        for name in names:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.bind(name)
            except OSError as e:  # a second copy of the suite squats the default namespace's names too
                if e.errno != errno.EADDRINUSE:
                    raise
                s.close()
                continue
            socks.append(s)
        return socks

    child, stop = as_nobody(squat)
    try:
        with caplog.at_level(logging.INFO, logger="zarrfeed"):
            with Loader(data, batch_size=1000, num_workers=0, shuffle=False) as loader:
                batches = iter(loader)
                next(batches)
                use = host_budget.usage()
                batches.close()
        assert "cannot use the host cache" not in caplog.text
        assert use is not None and key.identity in {u.identity for u in use.caches}
    finally:
        os.close(stop)
        os.waitpid(child, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user needs root")
def test_a_lock_directory_or_file_of_another_user_is_never_used(data, request, monkeypatch, caplog):
    """Another user makes the lock directory first (in a shared /tmp, world-writable: anyone may), puts a lock
    file in it and locks every byte of it. This user's lookups must not use that directory (it could hold
    them all), nor a lock file of another user's in a directory of this user's: they use the next directory
    that is this user's only, and the host cache works."""
    from zarrfeed.core._proc.ofd import ProcessLocks
    from zarrfeed.loader.caches import host_budget
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="zarrfeed-test-"))  # where user nobody can go (tmp_path is root's only)
    request.addfinalizer(lambda: shutil.rmtree(base))
    base.chmod(0o755)
    shared, own, home = base / "tmp", base / "own", base / "home"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    own.mkdir(mode=0o700)
    uid = os.geteuid()
    dirs = [shared / f"zarrfeed-{uid}", own, home / ".cache" / "zarrfeed"]
    monkeypatch.setattr(rendezvous, "lock_dirs", lambda u: [str(d) for d in dirs])
    foreign = own / "lookup.lock"
    foreign.touch()
    os.chown(foreign, 65534, 65534)

    def squat():
        dirs[0].mkdir(mode=0o777)
        dirs[0].chmod(0o777)
        fd = os.open(dirs[0] / "lookup.lock", os.O_RDWR | os.O_CREAT, 0o666)
        locks = ProcessLocks(fd)
        fcntl.fcntl(locks.fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        return locks

    child, stop = as_nobody(squat)
    try:
        with caplog.at_level(logging.INFO, logger="zarrfeed"):
            with Loader(data, batch_size=1000, num_workers=0, shuffle=False) as loader:
                batches = iter(loader)
                next(batches)
                use = host_budget.usage()
                batches.close()
        assert "cannot use the host cache" not in caplog.text
        assert use is not None and use.caches
        mine = dirs[2] / "lookup.lock"
        assert mine.stat().st_uid == uid and (dirs[2].stat().st_mode & 0o777) == 0o700
        assert foreign.stat().st_uid == 65534
    finally:
        os.close(stop)
        os.waitpid(child, 0)
