"""The lease's rules, tested in this process, one by one: who is gone and why, what each store's
backend does on take, renew and release, the fence, the messages. test_lease_between_processes.py tries the same
end to end with writers in their own processes; a wrong line here lets two writers into one dataset, or none ever
again."""
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from expected import ticked
from zarrfeed.writer.lease import (
    LEASE_KEY,
    LOCK_FILE,
    Fence,
    Holder,
    Lease,
    LeaseHeld,
    LeaseLost,
    process_start,
    _refuse,
    _rejected,
    check_held,
)

from zarrfeed.core.errors import FormatError
from zarrfeed.core.location import Location

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
    assert (me.host, me.pid, me.pid_start, me.timeout) == (HOST, os.getpid(), process_start(os.getpid()), 30.0)
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
    t0 = time.monotonic()
    assert holder(age=1).gone(60) is None  # another host, beating
    why = holder(age=120).gone(300)  # by the holder's own timeout
    assert why.startswith("no heartbeat for ") and ticked(why, "no heartbeat for {} s (timeout 60 s)", 120, t0)
    why = holder(age=50, timeout=None).gone(40)  # or the taker's
    assert why.startswith("no heartbeat for ") and ticked(why, "no heartbeat for {} s (timeout 40 s)", 50, t0)
    assert holder(age=50, timeout=None).gone(60) is None
    assert holder(age=59).gone(1) is None and holder(age=61).gone(1000) is not None
    pid = dead_pid()
    assert holder(HOST, pid, age=0).gone(60) == f"process {pid} on this host has exited"
    start = process_start(os.getpid())
    assert holder(HOST, os.getpid(), pid_start=start + 1, token="x").gone(60) == \
        f"process {os.getpid()} on this host has exited"  # the pid was reused
    assert holder(HOST, os.getpid(), pid_start=start, token="x").gone(60) == "this process released it"
    assert holder(HOST, os.getpid(), pid_start=None, token="x").gone(60) is None  # who knows which process
    parent = holder(HOST, os.getppid(), pid_start=process_start(os.getppid()))
    assert parent.gone(60) is None and holder(HOST, os.getppid(), age=61).gone(60) is not None
    with Lease(Location.of(memory), timeout=60) as live:  # this process's live lease
        assert live.holder.gone(60) is None


def test_a_holder_and_a_refusal_say_who_and_how_long(memory):
    t0 = time.monotonic()
    h = holder(age=125)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.started))
    head = f"pid 4242 on another-host (since {since}, last heartbeat "
    assert str(h).startswith(head) and ticked(str(h), f"{head}{{}} s ago)", 125, t0)
    assert str(holder(age=-30)).endswith("last heartbeat 0 s ago)")  # a clock ahead: not negative
    loc = Location.of(memory)
    msg = str(_refuse(loc, h, 10))
    tail = ("; wait for it to finish, or stop it (a lease whose holder died is taken over at once on the same "
            "host, otherwise after 60 s without a heartbeat)")
    assert msg.startswith(f"{loc}: being written by {head}") and msg.endswith(tail)
    assert ticked(msg.removesuffix(tail), f"{head}{{}} s ago)", 125, t0)
    assert isinstance(_refuse(loc, h, 10), LeaseHeld) and isinstance(_refuse(loc, h, 10), FormatError)
    assert "after 10 s without" in str(_refuse(loc, holder(timeout=None), 10))
    assert str(_refuse(loc, None, 10)).startswith(f"{loc}: being written by another writer; ")


def test_the_start_time_of_a_process():
    with open(f"/proc/{os.getpid()}/stat") as f:
        assert process_start(os.getpid()) == int(f.read().rsplit(")", 1)[1].split()[19])
    assert process_start(dead_pid()) is None


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
    with pytest.raises(LeaseLost, match="^the dataset: the write lease was lost or has not been renewed in time, so "
                                        "another writer may hold it; stopped before writing$"):
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
        lease._stop.set()  # no beat from here on, however slowly this test runs (a busy machine: a beat at 0.45 s
        lease._thread.join()  # renewed it before the check, which then found it fresh)
        time.sleep(0.3)
        with pytest.raises(LeaseLost, match=r"has not been renewed for \d+ s \(the store did not answer, or this "
                                            r"process was paused\), so another writer may have taken it over; "
                                            "stopped before writing$"):
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
    live = holder(HOST, os.getppid(), pid_start=process_start(os.getppid()), token="live")
    (tmp_path / "d.zarr" / LEASE_KEY).write_bytes(live.encode())  # its lock file deleted: the document rules
    with pytest.raises(LeaseHeld, match=f"pid {os.getppid()} on {HOST}"):
        Lease(loc, timeout=60).acquire()
    assert Holder.parse((tmp_path / "d.zarr" / LEASE_KEY).read_bytes()).token == "live"


def test_a_local_lease_refused_by_the_lock_of_another_process(tmp_path):
    loc = Location.of(tmp_path / "d.zarr")
    code = ("import sys, time; from zarrfeed.writer.lease import Lease; from zarrfeed.core.location import Location\n"
            f"lease = Lease(Location.of({str(tmp_path / 'd.zarr')!r}), timeout=60); lease.acquire()\n"
            "print('held', flush=True); sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld, match=f"^{loc}: being written by pid {child.pid} on {HOST} "):
            Lease(loc, timeout=60).acquire()
    finally:
        child.kill()
        child.wait()
    with Lease(loc, timeout=60):  # its process died: the kernel dropped the lock, the pid is gone
        pass


def test_a_stopped_local_holder_is_not_promised_a_takeover_that_never_comes(tmp_path):
    """A SIGSTOPped writer keeps its file lock, so its lease is not taken over while it lives, however
    long it is silent; the refusal promised a takeover "after 1 s without a heartbeat" all the same. It says
    what is true: the holder is alive but silent, how to resume it, and that only its exit frees the lease."""
    loc = Location.of(tmp_path / "d.zarr")
    code = ("import sys; from zarrfeed.writer.lease import Lease; from zarrfeed.core.location import Location\n"
            f"Lease(Location.of({str(tmp_path / 'd.zarr')!r}), timeout=1, interval=0.1).acquire()\n"
            "print('held', flush=True); sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld) as held:  # beating: it is taken over when its process exits
            Lease(loc, timeout=1).acquire()
        assert str(held.value).startswith(f"{loc}: being written by pid {child.pid} on {HOST} (since ")
        assert str(held.value).endswith("; wait for it to finish, or stop it (its lease is taken over as soon as "
                                        "its process exits)")
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while time.time() - Holder.parse((tmp_path / "d.zarr" / LEASE_KEY).read_bytes()).heartbeat <= 1.5:
            assert time.monotonic() < deadline, "the stopped holder's heartbeat did not age"
            time.sleep(0.1)
        for _ in range(2):  # silent past its timeout, and still not taken over
            with pytest.raises(LeaseHeld) as held:
                Lease(loc, timeout=1).acquire()
            msg = str(held.value)
            assert msg.startswith(f"{loc}: being written by pid {child.pid} on {HOST} (since "), msg
            assert "without a heartbeat" not in msg and "after 1 s" not in msg, msg
            assert msg.endswith(", which is alive but has not renewed its lease for longer than its 1 s timeout "
                                f"(stopped? `kill -CONT {child.pid}` resumes it); its lease is taken over only once "
                                "that process exits: let it go on, or stop it"), msg
            time.sleep(1.1)
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()
    with Lease(loc, timeout=1):  # and once it has exited, at once
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
    t0 = time.monotonic()
    fs.pipe_file(path, holder(age=300, token="stale").encode())
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"), Lease(loc, timeout=60) as taker:
        assert Holder.parse(fs.cat_file(path)).token == taker.holder.token
    assert any("took over the write lease of pid 4242 on another-host" in m and
               ticked(m, "no heartbeat for {} s (timeout 60 s)", 300, t0) for m in caplog.messages)
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
                                          "so zarrfeed cannot make sure it is the only writer; write to a local "
                                          "directory or S3$"):
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
    t0 = time.monotonic()
    fs.pipe(key, holder(age=90, token="stale").encode())
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"), Lease(loc, timeout=60) as taker:
        assert Holder.parse(fs.cat(key)).token == taker.holder.token
        fs.pipe(key, holder(token="thief").encode())  # then taken from it
        assert not taker.confirm() and taker.lost
    assert any(ticked(m, "no heartbeat for {} s (timeout 60 s)", 90, t0) for m in caplog.messages)
    assert Holder.parse(fs.cat(key)).token == "thief"  # its release left the new holder's document
    fs.pipe(key, b"junk")
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"), Lease(loc, timeout=60) as taker:
        assert Holder.parse(fs.cat(key)).token == taker.holder.token
    assert caplog.messages[-1] == f"{loc}: took over the write lease of None: its lease document is unreadable"
    fs.pipe(key, holder(age=1, token="fresh").encode())
    with pytest.raises(LeaseHeld, match="pid 4242 on another-host"):
        Lease(loc, timeout=60).acquire()
    assert Holder.parse(fs.cat(key)).token == "fresh"


# ---------------------------------------------------------------- the rest of the rules, line by line
LEGACY = {"timeout": None}  # a document written before holders recorded their timeout: the taker's applies


def where(kind, tmp_path, memory, request):
    """A dataset location of each kind of store, and a function that writes its lease document."""
    if kind == "local":
        loc = Location.of(tmp_path / "d.zarr")
        (tmp_path / "d.zarr").mkdir()
        return loc, lambda raw: (tmp_path / "d.zarr" / LEASE_KEY).write_bytes(raw)
    if kind == "memory":
        loc = Location.of(memory)
        fs, root = loc.filesystem()
        return loc, lambda raw: fs.pipe_file(f"{root}/{LEASE_KEY}", raw)
    bucket, server = request.getfixturevalue("s3")
    loc = Location.of(f"{bucket}/x.zarr", server.options)
    return loc, lambda raw: server.fs().pipe(f"{bucket}/x.zarr/{LEASE_KEY}", raw)


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_a_document_without_a_timeout_is_judged_by_the_takers(kind, tmp_path, memory, request, caplog):
    loc, put = where(kind, tmp_path, memory, request)
    put(holder(age=1, **LEGACY).encode())
    with pytest.raises(LeaseHeld) as held:
        Lease(loc, timeout=45).acquire()
    assert str(held.value).startswith(f"{loc}: being written by pid 4242 on another-host (since ")
    assert str(held.value).endswith("otherwise after 45 s without a heartbeat)")
    t0 = time.monotonic()
    put(holder(age=90, **LEGACY).encode())
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"), Lease(loc, timeout=45) as lease:
        assert lease.holder.timeout == 45 and Holder.parse(lease.holder.encode()).timeout == 45
    assert ticked([m for m in caplog.messages if "took over" in m][-1], ": no heartbeat for {} s (timeout 45 s)", 90,
                  t0)


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_a_fresh_lease_logs_no_takeover_and_runs_a_named_daemon_heartbeat(kind, tmp_path, memory, request, caplog):
    import threading
    loc, _ = where(kind, tmp_path, memory, request)
    before = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="zarrfeed.writer"), Lease(loc, timeout=10, interval=1) as lease:
        after = time.monotonic()
        beat = [t for t in threading.enumerate() if t.name == "zarrfeed-lease"]
        assert len(beat) == 1 and beat[0].daemon and beat[0].is_alive()
        assert before + 8 <= lease.fence.until <= after + 8  # two heartbeats before the timeout
    assert not [m for m in caplog.messages if "took over" in m or "not released" in m], caplog.messages
    assert lease.fence.closed and lease.fence.until == 0.0 and not beat[0].is_alive()


def test_a_lease_never_acquired_is_harmless_to_check_and_release(tmp_path):
    lease = Lease(Location.of(tmp_path / "d.zarr"), timeout=60)
    lease.check()
    lease.check_on_store()
    assert not lease.confirm() and lease.lost is None
    lease.release()
    assert lease.fence.closed


def test_a_lost_lease_is_said_once_and_then_nothing_more_is_asked(tmp_path, caplog):
    path = tmp_path / "100%s full.zarr"  # a % in a path is not a format
    loc = Location.of(path)
    lease = Lease(loc, timeout=60)
    lease.acquire()
    (path / LEASE_KEY).unlink()
    with caplog.at_level(logging.ERROR, logger="zarrfeed.writer"):
        assert not lease.confirm() and not lease.confirm()
        with pytest.raises(LeaseLost) as lost:
            lease.check()
    assert str(lost.value) == lease.lost == caplog.messages[0] and len(caplog.messages) == 1
    assert lease.lost.startswith(f"{loc}: the write lease was taken over")
    lease.release()


def test_a_lease_whose_store_fails_says_so(memory, monkeypatch, caplog):
    loc = Location.of(memory)
    fs, _ = loc.filesystem()
    with Lease(loc, timeout=0.6) as lease:  # a heartbeat every 0.1 s
        def broken(*a, **kw):
            raise OSError("the store is down")
        monkeypatch.setattr(fs, "cat_file", broken)
        with caplog.at_level(logging.DEBUG, logger="zarrfeed.writer"):
            assert not lease.confirm()
            deadline = time.monotonic() + 5
            while not any("heartbeat failed" in m for m in caplog.messages) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert f"{loc}: cannot confirm the lease (OSError: the store is down)" in caplog.messages
        assert f"{loc}: lease heartbeat failed (OSError: the store is down)" in caplog.messages
        assert lease.lost is None  # a store that does not answer says nothing of who holds the lease
        monkeypatch.undo()


def test_a_release_the_store_does_not_answer_leaves_the_lease_to_expire(memory, monkeypatch, caplog):
    loc = Location.of(memory)
    fs, _ = loc.filesystem()
    lease = Lease(loc, timeout=60)
    lease.acquire()
    monkeypatch.setattr(fs, "rm_file", lambda *a, **kw: time.sleep(1.0))
    with caplog.at_level(logging.DEBUG, logger="zarrfeed.writer"):
        started = time.monotonic()
        lease.release(0.2)
    assert time.monotonic() - started < 0.9
    assert f"{loc}: the write lease was not released; it expires after 60 s" in caplog.messages
    doc = Holder.parse(fs.cat_file(f"{fs._strip_protocol(memory)}/{LEASE_KEY}"))
    assert doc.token == lease.holder.token and doc.gone(60) == "this process released it"


def test_a_local_lease_on_a_path_not_made_yet_and_two_datasets_in_one_process(tmp_path):
    with Lease(Location.of(tmp_path / "a" / "b" / "d.zarr"), timeout=60):
        with Lease(Location.of(tmp_path / "e.zarr"), timeout=60):  # another dataset: no conflict
            pass
    assert (tmp_path / "a" / "b" / "d.zarr" / LOCK_FILE).exists()


def test_a_local_lease_whose_document_is_gone_is_still_this_processes(tmp_path):
    """The registry of this process's leases refuses a second writer even when the document is gone (the
    lock file does not exclude within a process); and the refusal says 'another writer', and no timeout after
    which it would be taken over: the registry holds it until it is released, however silent."""
    loc = Location.of(tmp_path / "d.zarr")
    with Lease(loc, timeout=60):
        (tmp_path / "d.zarr" / LEASE_KEY).unlink()
        with pytest.raises(LeaseHeld) as held:
            Lease(loc, timeout=30).acquire()
        assert str(held.value) == (f"{loc}: being written by another writer; wait for it to finish, or stop it "
                                   "(its lease is taken over as soon as its process exits)")


def test_a_released_local_lease_lets_another_process_in(tmp_path):
    code = ("from zarrfeed.writer.lease import Lease; from zarrfeed.core.location import Location\n"
            f"with Lease(Location.of({str(tmp_path / 'd.zarr')!r}), timeout=60): print('taken')")
    with Lease(Location.of(tmp_path / "d.zarr"), timeout=60):
        held = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert held.returncode != 0 and "LeaseHeld" in held.stderr
        (tmp_path / "d.zarr" / LEASE_KEY).unlink()  # the lock alone keeps it out
        held = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert held.returncode != 0 and "being written by another writer" in held.stderr
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert free.returncode == 0 and free.stdout.strip() == "taken", free.stderr


def test_the_start_of_a_process_whose_name_holds_parentheses(tmp_path):
    odd = tmp_path / "x) y (z"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        with open(f"/proc/{child.pid}/stat") as f:
            stat = f.read()
        assert "(x) y (z)" in stat
        assert process_start(child.pid) == int(stat[stat.rindex(")") + 2:].split(" ")[19])
    finally:
        child.kill()
        child.wait()


def test_causes_without_an_s3_reply_are_not_refusals():
    for cause in (Exception("no response"), type("R", (Exception,), {"response": {}})()):
        exc = Refused("refused")
        exc.__cause__ = cause
        assert not _rejected(exc)


def test_exclusive_create_racing_another_writer(memory, monkeypatch):
    """Between looking and creating, another writer creates the document, or takes a stale one first: this
    writer is refused, naming that writer, never both holding it."""
    loc = Location.of(memory)
    fs, root = loc.filesystem()
    path = f"{root}/{LEASE_KEY}"
    winner = holder(age=0, token="winner", **LEGACY)
    real_exists = fs.exists

    def created_meanwhile(p, **kw):
        found = real_exists(p, **kw)
        if p == path and not found:
            fs.pipe_file(path, winner.encode())
        return found
    monkeypatch.setattr(fs, "exists", created_meanwhile)
    with pytest.raises(LeaseHeld) as held:
        Lease(loc, timeout=45).acquire()
    assert str(held.value).startswith(f"{loc}: being written by pid 4242 on another-host")
    assert str(held.value).endswith("after 45 s without a heartbeat)")
    monkeypatch.undo()
    fs.pipe_file(path, holder(age=300, token="stale").encode())
    real_rm = fs.rm_file

    def taken_meanwhile(p, **kw):
        real_rm(p, **kw)
        fs.pipe_file(path, winner.encode())
    monkeypatch.setattr(fs, "rm_file", taken_meanwhile)
    with pytest.raises(LeaseHeld) as held:
        Lease(loc, timeout=45).acquire()
    assert str(held.value).startswith(f"{loc}: being written by pid 4242 on another-host")
    assert str(held.value).endswith("after 45 s without a heartbeat)")
    assert Holder.parse(fs.cat_file(path)).token == "winner"


@pytest.mark.parametrize("name", ["", "BOX", "a/b/c.zarr"])
def test_an_s3_lease_lies_in_its_dataset_wherever_that_is(s3, name):
    bucket, server = s3
    url = f"{bucket}/{name}" if name else bucket
    with Lease(Location.of(url, server.options), timeout=60) as lease:
        assert Holder.parse(server.fs().cat(f"{url}/{LEASE_KEY}")).token == lease.holder.token
        assert lease.confirm()
    assert not server.fs().exists(f"{url}/{LEASE_KEY}")


def test_an_s3a_url_gets_conditional_puts(s3):
    bucket, server = s3
    url = f"s3a://{bucket.removeprefix('s3://')}/x.zarr"
    with Lease(Location.of(url, server.options), timeout=60) as lease:
        assert type(lease._backend).__name__ == "_S3Backend"
        assert Holder.parse(server.fs().cat(f"{bucket}/x.zarr/{LEASE_KEY}")).token == lease.holder.token


def test_s3_takeover_races(s3):
    """Conditional PUTs decide every race: a document deleted between the refused create and the read is
    created again; one that keeps changing is given up after three tries, naming its holder; a renewal whose
    document another writer replaced after it was read is refused."""
    from zarrfeed.writer.lease import _S3Backend

    bucket, server = s3
    loc = Location.of(f"{bucket}/x.zarr", server.options)
    fs, key = server.fs(), f"{bucket}/x.zarr/{LEASE_KEY}"
    fs.pipe(key, holder(age=1).encode())
    backend = _S3Backend(loc)
    real_get = backend._get

    def released_meanwhile():
        fs.rm(key)
        return None, None
    backend._get = released_meanwhile
    me = Holder.me(45)
    assert backend.take(me, 45) is None and Holder.parse(fs.cat(key)).token == me.token

    fs.pipe(key, holder(age=300, token="stale", **LEGACY).encode())
    tries = []

    def replaced_each_time():
        got = real_get()
        fs.pipe(key, holder(age=300, token=f"stale{len(tries)}", **LEGACY).encode())  # another taker, stale too
        tries.append(got)
        return got
    backend = _S3Backend(loc)
    backend._get = replaced_each_time
    with pytest.raises(LeaseHeld) as held:
        backend.take(Holder.me(45), 45)
    assert len(tries) == 4  # three tries, then the holder it names
    assert str(held.value).startswith(f"{loc}: being written by pid 4242 on another-host")
    assert str(held.value).endswith("after 45 s without a heartbeat)")

    fs.rm(key)
    backend = _S3Backend(loc)
    me = Holder.me(45)
    assert backend.take(me, 45) is None
    me.heartbeat += 1
    fs.pipe(key, me.encode())  # its own renewal whose reply was lost: a new ETag
    real_get = backend._get

    def stolen_after_reading():
        got = real_get()
        fs.pipe(key, holder(token="thief").encode())
        return got
    backend._get = stolen_after_reading
    assert backend.renew(me) is False and Holder.parse(fs.cat(key)).token == "thief"


def test_a_lease_document_lies_in_its_dataset_on_other_stores(memory):
    loc = Location.of(memory.replace(".zarr", "-BOX"))  # a name ending in X, not a dataset's usual .zarr
    fs, root = loc.filesystem()
    with Lease(loc, timeout=60) as lease:
        assert Holder.parse(fs.cat_file(f"{root}/{LEASE_KEY}")).token == lease.holder.token
