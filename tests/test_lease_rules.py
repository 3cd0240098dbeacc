"""The lease's rules, tested in this process, one by one (issue 26): who is gone and why, what each store's
backend does on take, renew and release, the fence, the messages. tests/test_lease.py tries the same end to end
with writers in their own processes; a wrong line here lets two writers into one dataset, or none ever again."""
import json
import logging
import os
import pickle
import socket
import subprocess
import sys
import time
import uuid

import pytest
from zarrfeed.writer.lease import (
    LEASE_KEY,
    LOCK_FILE,
    Fence,
    Holder,
    Lease,
    LeaseHeld,
    LeaseLost,
    _process_start,
    _refuse,
    _rejected,
    check_held,
)

from zarrfeed.core.store import FormatError, Location

HOST = socket.gethostname()


@pytest.fixture
def memory():
    """A fresh place on fsspec's in-memory store (it lives as long as the process: each test has its own)."""
    return f"memory://lease-{uuid.uuid4().hex}.zarr"


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def holder(host: str = "another-host", pid: int = 4242, age: float = 0.0, token: str = "t0k3n",
           timeout: float | None = 60.0, pid_start: int | None = None) -> Holder:
    at = time.time() - age
    return Holder(host, pid, pid_start, at, at, token, timeout)


# ---------------------------------------------------------------- the holder document
def test_a_holder_is_this_process_and_its_document_round_trips():
    me = Holder.me(30.0)
    assert (me.host, me.pid, me.pid_start, me.timeout) == (HOST, os.getpid(), _process_start(os.getpid()), 30.0)
    assert me.started == me.heartbeat and abs(me.heartbeat - time.time()) < 5 and len(me.token) == 32
    assert Holder.me(30.0).token != me.token
    assert Holder.parse(me.encode()) == me and Holder.parse(bytearray(me.encode())) == me
    assert json.loads(me.encode())["timeout"] == 30.0


@pytest.mark.parametrize("raw", [None, b"", b"not json", b"[1, 2]", b'{"host": "h"}',
                                 json.dumps({**json.loads(holder().encode()), "extra": 1}).encode()])
def test_an_unreadable_document_is_no_holder(raw):
    assert Holder.parse(raw) is None


@pytest.mark.parametrize("timeout, readable", [(None, True), (60, True), (0.5, True), (0, False), (-1, False),
                                               ("60", False)])
def test_a_holders_timeout_must_be_positive_or_absent(timeout, readable):
    doc = json.loads(holder().encode())
    doc["timeout"] = timeout
    parsed = Holder.parse(json.dumps(doc).encode())
    assert (parsed is not None) == readable and (parsed is None or parsed.timeout == timeout)


def test_who_is_gone_and_why(memory):
    assert holder(age=1).gone(60) is None  # another host, beating
    assert holder(age=120).gone(300) == "no heartbeat for 120 s (timeout 60 s)"  # by the holder's own timeout
    assert holder(age=50, timeout=None).gone(40) == "no heartbeat for 50 s (timeout 40 s)"  # or the taker's
    assert holder(age=50, timeout=None).gone(60) is None
    assert holder(age=59).gone(1) is None and holder(age=61).gone(1000) is not None
    pid = dead_pid()
    assert holder(HOST, pid, age=0).gone(60) == f"process {pid} on this host has exited"
    start = _process_start(os.getpid())
    assert holder(HOST, os.getpid(), pid_start=start + 1, token="x").gone(60) == \
        f"process {os.getpid()} on this host has exited"  # the pid was reused
    assert holder(HOST, os.getpid(), pid_start=start, token="x").gone(60) == "this process released it"
    assert holder(HOST, os.getpid(), pid_start=None, token="x").gone(60) is None  # who knows which process
    parent = holder(HOST, os.getppid(), pid_start=_process_start(os.getppid()))
    assert parent.gone(60) is None and holder(HOST, os.getppid(), age=61).gone(60) is not None
    with Lease(Location.of(memory), timeout=60) as live:  # this process's live lease
        assert live.holder.gone(60) is None


def test_a_holder_and_a_refusal_say_who_and_how_long(memory):
    h = holder(age=125)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.started))
    assert str(h) == f"pid 4242 on another-host (since {since}, last heartbeat 125 s ago)"
    assert str(holder(age=-30)).endswith("last heartbeat 0 s ago)")  # a clock ahead: not negative
    loc = Location.of(memory)
    msg = str(_refuse(loc, h, 10))
    assert msg == (f"{loc}: being written by {h}; wait for it to finish, or stop it (a lease whose holder died "
                   "is taken over at once on the same host, otherwise after 60 s without a heartbeat)")
    assert isinstance(_refuse(loc, h, 10), LeaseHeld) and isinstance(_refuse(loc, h, 10), FormatError)
    assert "after 10 s without" in str(_refuse(loc, holder(timeout=None), 10))
    assert str(_refuse(loc, None, 10)).startswith(f"{loc}: being written by another writer; ")


def test_the_start_time_of_a_process():
    with open(f"/proc/{os.getpid()}/stat") as f:
        assert _process_start(os.getpid()) == int(f.read().rsplit(")", 1)[1].split()[19])
    assert _process_start(dead_pid()) is None


class Refused(OSError):
    pass


def s3_error(code: str | None) -> OSError:
    exc = Refused("refused")
    if code is not None:
        cause = Exception()
        cause.response = {"Error": {"Code": code}}
        exc.__cause__ = cause
    return exc


@pytest.mark.parametrize("code", ["PreconditionFailed", "412", "ConditionalRequestConflict", "NoSuchKey", "404"])
def test_a_put_refused_by_its_condition_is_told_by_the_s3_code(code):
    assert _rejected(s3_error(code))


@pytest.mark.parametrize("exc", [s3_error("AccessDenied"), s3_error("500"), s3_error(None), OSError("timed out")])
def test_other_store_errors_are_not_refusals(exc):
    assert not _rejected(exc)
    assert _rejected(FileNotFoundError("gone"))


def test_a_cluster_task_checks_the_document_names_its_writer():
    store = {LEASE_KEY: holder(token="mine").encode()}
    check_held(store, "mine", "d.zarr")
    for doc in ({LEASE_KEY: holder(token="theirs").encode()}, {LEASE_KEY: b"junk"}, {}):
        with pytest.raises(LeaseLost, match=r"^d\.zarr: the writer that placed these rows no longer holds the "
                                            "write lease; stopped before writing$"):
            check_held(type("S", (), {"get": lambda self, k, d=doc: d.get(k)})(), "mine", "d.zarr")


# ---------------------------------------------------------------- the fence
def test_the_fence_lets_writes_through_until_its_deadline():
    fence = Fence()
    with pytest.raises(LeaseLost, match="^the dataset: the write lease was lost or has not been renewed in time"):
        fence.check()  # a new fence lets nothing through
    fence.extend(time.monotonic() + 60)
    fence.check("d.zarr")
    shared = pickle.loads(pickle.dumps(fence))  # what a worker process gets: the same deadline
    shared.check()
    fence.extend(time.monotonic() - 1)
    with pytest.raises(LeaseLost, match="^d.zarr: the write lease was lost"):
        shared.check("d.zarr")
    fence.extend(time.monotonic() + 60)
    fence.revoke()
    with pytest.raises(LeaseLost):
        shared.check()
    fence.extend(time.monotonic() + 60)
    shared.close()
    with pytest.raises(LeaseLost):
        fence.check()  # close revokes for everyone
    with pytest.raises(LeaseLost):
        shared.check()  # and a closed fence lets nothing through
    shared.extend(time.monotonic() + 60)
    shared.revoke()
    shared.close()  # all harmless once closed


# ---------------------------------------------------------------- a local directory
def test_a_local_lease_is_taken_held_renewed_and_released(tmp_path):
    loc = Location.of(tmp_path / "d.zarr")
    lease = Lease(loc, timeout=60)
    assert lease.interval == 10 and Lease(loc, timeout=0.1).interval == 0.05 and Lease(loc, 60, 3).interval == 3
    lease.acquire()
    try:
        doc = Holder.parse((tmp_path / "d.zarr" / LEASE_KEY).read_bytes())
        assert doc == lease.holder and (tmp_path / "d.zarr" / LOCK_FILE).exists()
        lease.fence.check()
        lease.check()
        lease.check_on_store()
        assert lease.confirm() and not lease.lost
        with pytest.raises(LeaseHeld, match=rf"being written by pid {os.getpid()} on {HOST} "):
            Lease(loc, timeout=60).acquire()  # this process's own second writer
        lease.release()
        assert not (tmp_path / "d.zarr" / LEASE_KEY).exists() and not lease.confirm()
        with pytest.raises(LeaseLost):
            lease.fence.check()
        lease.release()  # twice: harmless
        with Lease(loc, timeout=60) as again:  # free again
            assert Holder.parse((tmp_path / "d.zarr" / LEASE_KEY).read_bytes()).token == again.holder.token
    finally:
        lease.release()


def test_a_local_lease_taken_from_under_its_holder(tmp_path, caplog):
    """Its document replaced (another writer's) or deleted: the holder finds out at its next renewal, stops
    (fence revoked, checks raise), and never deletes the new holder's document."""
    loc = Location.of(tmp_path / "d.zarr")
    for how in ("replaced", "deleted"):
        lease = Lease(loc, timeout=60)
        lease.acquire()
        other = holder(HOST, os.getppid(), token="other")
        if how == "replaced":
            (tmp_path / "d.zarr" / LEASE_KEY).write_bytes(other.encode())
        else:
            (tmp_path / "d.zarr" / LEASE_KEY).unlink()
        with caplog.at_level(logging.ERROR, logger="zarrfeed.writer"):
            assert not lease.confirm()
        lost = (f"{loc}: the write lease was taken over by another writer (or its document {LEASE_KEY} was "
                "deleted)")
        assert lease.lost == lost and lost in caplog.messages and not lease.confirm()
        for check in (lease.check, lease.check_on_store, lease.fence.check):
            with pytest.raises(LeaseLost):
                check()
        lease.release()
        doc = tmp_path / "d.zarr" / LEASE_KEY
        assert (Holder.parse(doc.read_bytes()).token == "other") if how == "replaced" else not doc.exists()
        doc.unlink(missing_ok=True)


def test_a_commit_asks_the_store_itself(tmp_path):
    """check_on_store renews on the store: a deleted document is found at once, not at the next heartbeat."""
    loc = Location.of(tmp_path / "d.zarr")
    with Lease(loc, timeout=60) as lease:
        (tmp_path / "d.zarr" / LEASE_KEY).unlink()
        lease.check()  # the heartbeat has not noticed
        with pytest.raises(LeaseLost, match="taken over by another writer"):
            lease.check_on_store()


def test_a_lease_not_renewed_for_nearly_its_timeout_stops_its_writer(tmp_path):
    loc = Location.of(tmp_path / "d.zarr")
    with Lease(loc, timeout=10.0, interval=4.0) as lease:  # no beat in this test; stale after 2 s
        lease.check()
        time.sleep(0.2)
        lease.check()
    with Lease(loc, timeout=1.0, interval=0.45) as lease:  # unrenewed for more than timeout - 2 heartbeats
        time.sleep(0.3)
        with pytest.raises(LeaseLost, match=r"has not been renewed for 0 s \(the store did not answer, or this "
                                            r"process was paused\)"):
            lease.check()


def test_the_heartbeat_renews_the_document(tmp_path):
    loc = Location.of(tmp_path / "d.zarr")
    with Lease(loc, timeout=0.6) as lease:  # a beat every 0.1 s
        first = Holder.parse((tmp_path / "d.zarr" / LEASE_KEY).read_bytes()).heartbeat
        deadline = time.monotonic() + 10
        while Holder.parse((tmp_path / "d.zarr" / LEASE_KEY).read_bytes()).heartbeat == first:
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.05)
        time.sleep(0.5)  # past the timeout: renewed all along
        lease.check()
        lease.fence.check()


def test_a_local_lease_of_a_dead_holder_is_taken_over_and_a_live_ones_never(tmp_path, caplog):
    loc = Location.of(tmp_path / "d.zarr")
    (tmp_path / "d.zarr").mkdir()
    pid = dead_pid()
    (tmp_path / "d.zarr" / LEASE_KEY).write_bytes(holder(HOST, pid).encode())
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"), Lease(loc, timeout=60) as lease:
        assert Holder.parse((tmp_path / "d.zarr" / LEASE_KEY).read_bytes()).token == lease.holder.token
    assert any(m.startswith(f"{loc}: took over the write lease of pid {pid} on {HOST} (since ")
               and m.endswith(f": process {pid} on this host has exited") for m in caplog.messages), caplog.messages
    live = holder(HOST, os.getppid(), pid_start=_process_start(os.getppid()), token="live")
    (tmp_path / "d.zarr" / LEASE_KEY).write_bytes(live.encode())  # its lock file deleted: the document rules
    with pytest.raises(LeaseHeld, match=f"pid {os.getppid()} on {HOST}"):
        Lease(loc, timeout=60).acquire()
    assert Holder.parse((tmp_path / "d.zarr" / LEASE_KEY).read_bytes()).token == "live"


def test_a_local_lease_refused_by_the_lock_of_another_process(tmp_path):
    loc = Location.of(tmp_path / "d.zarr")
    code = ("import sys, time; from zarrfeed.writer.lease import Lease; from zarrfeed.core.store import Location\n"
            f"lease = Lease(Location.of({str(tmp_path / 'd.zarr')!r}), timeout=60); lease.acquire()\n"
            "print('held', flush=True); sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld, match=f"pid {child.pid} on {HOST}"):
            Lease(loc, timeout=60).acquire()
    finally:
        child.kill()
        child.wait()
    with Lease(loc, timeout=60):  # its process died: the kernel dropped the lock, the pid is gone
        pass


# ---------------------------------------------------------------- other fsspec stores (exclusive create)
def test_a_lease_on_a_store_with_exclusive_create(memory, caplog):
    loc = Location.of(memory)
    fs, root = loc.filesystem()
    path = f"{root}/{LEASE_KEY}"
    lease = Lease(loc, timeout=60)
    lease.acquire()
    assert Holder.parse(fs.cat_file(path)) == lease.holder and lease.confirm()
    with pytest.raises(LeaseHeld, match=rf"pid {os.getpid()} on {HOST}"):
        Lease(loc, timeout=60).acquire()
    fs.pipe_file(path, holder(token="other").encode())  # taken over
    assert not lease.confirm() and lease.lost
    lease.release()
    assert Holder.parse(fs.cat_file(path)).token == "other"  # not its document: left alone
    fs.pipe_file(path, holder(age=300, token="stale").encode())
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"), Lease(loc, timeout=60) as taker:
        assert Holder.parse(fs.cat_file(path)).token == taker.holder.token
    assert any("took over the write lease of pid 4242 on another-host" in m and
               m.endswith("no heartbeat for 300 s (timeout 60 s)") for m in caplog.messages)
    assert not fs.exists(path)  # released: its own document removed
    fs.pipe_file(path, b"junk")
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"), Lease(loc, timeout=60):
        pass
    assert caplog.messages[-1] == f"{loc}: took over the write lease of None: its lease document is unreadable"
    fs.pipe_file(path, holder(age=1, token="fresh").encode())
    with pytest.raises(LeaseHeld, match="pid 4242 on another-host"):
        Lease(loc, timeout=60).acquire()
    assert Holder.parse(fs.cat_file(path)).token == "fresh"


def test_a_store_without_exclusive_create_is_refused(memory, monkeypatch):
    loc = Location.of(memory)
    fs, _ = loc.filesystem()

    def no_x(path, mode="rb", **kw):
        raise ValueError(f"mode {mode} not supported")
    monkeypatch.setattr(fs, "open", no_x)
    with pytest.raises(FormatError, match=r"this store cannot create a file exclusively \(mode xb not supported\), "
                                          "so zarrfeed cannot make sure it is the only writer"):
        Lease(loc, timeout=60).acquire()


# ---------------------------------------------------------------- S3 (conditional PUTs)
def test_an_s3_lease_taken_renewed_and_released(s3, caplog):
    bucket, server = s3
    loc = Location.of(f"{bucket}/x.zarr", server.options)
    fs, key = server.fs(), f"{bucket}/x.zarr/{LEASE_KEY}"
    lease = Lease(loc, timeout=60)
    lease.acquire()
    assert Holder.parse(fs.cat(key)) == lease.holder and lease.confirm()
    with pytest.raises(LeaseHeld, match=rf"pid {os.getpid()} on {HOST}"):
        Lease(loc, timeout=60).acquire()
    stale = lease._backend.etag
    assert lease.confirm() and lease._backend.etag != stale  # each renewal is a new version
    lease._backend.etag = stale  # a renewal whose reply was lost: the document is still its own
    assert lease.confirm()
    lease.release()
    assert not fs.exists(key)
    # a stale holder is taken over (conditional on the ETag read), with why
    fs.pipe(key, holder(age=90, token="stale").encode())
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"), Lease(loc, timeout=60) as taker:
        assert Holder.parse(fs.cat(key)).token == taker.holder.token
        fs.pipe(key, holder(token="thief").encode())  # then taken from it
        assert not taker.confirm() and taker.lost
    assert any(m.endswith("no heartbeat for 90 s (timeout 60 s)") for m in caplog.messages)
    assert Holder.parse(fs.cat(key)).token == "thief"  # its release left the new holder's document
    fs.pipe(key, b"junk")
    with Lease(loc, timeout=60) as taker:
        assert Holder.parse(fs.cat(key)).token == taker.holder.token
    fs.pipe(key, holder(age=1, token="fresh").encode())
    with pytest.raises(LeaseHeld, match="pid 4242 on another-host"):
        Lease(loc, timeout=60).acquire()
    assert Holder.parse(fs.cat(key)).token == "fresh"
