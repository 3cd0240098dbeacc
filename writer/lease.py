"""One writer at a time per dataset (docs/architecture.md#lease): a lease taken before anything changes, kept fresh
by a heartbeat.

The lease document (`zarrfeed.lease` in the dataset: host, pid, process start time, start, heartbeat) says who
holds it. What makes it exclusive depends on the store:
- a local directory: a file lock (fasteners) on `.zarrfeed.lock`, which the kernel drops when its process
  dies; POSIX locks do not exclude two holders in one process, so a registry of this process's leases does;
- S3: the document itself, created only if absent (`If-None-Match: *`), renewed and taken over only if it
  is unchanged (`If-Match: <ETag>`), so two writers can never both believe they hold it;
- other fsspec stores: an exclusive create (mode "xb") where the filesystem supports one.
A lease whose holder is gone (a dead pid on this host, or no heartbeat for `timeout` seconds) is taken over,
with a log line. The document is the truth, the lock file only a hint: a document naming a live process on
this host with a fresh heartbeat is believed even if the lock file was deleted. A holder that finds its lease
taken (or its document gone) stops writing, and never deletes anything: `confirm()` renews the lease on the
store itself (on S3 conditional on its ETag) before a holder removes what it created.

After a power loss or a kernel crash the holder is gone with its machine, so the lease needs no fsync to stay
safe: the reboot drops the file lock, and the document, whatever the disk kept of it (the last one fsynced, an
older one, or torn bytes), names a process that no longer runs (its pid is dead, or reused by a process with
another start time) or is unreadable; either way the next writer takes it over at once (should a process
after the reboot have the holder's pid and start tick, once its heartbeat is `timeout` old). What must
survive, the dataset's own folder, is made durable when the lease is taken (`Store.make_root`).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import fasteners

from ..core._proc.shm import SharedBlock
from ..core.errors import LeaseHeld, LeaseLost
from ..core.bounded_calls import bounded, within
from ..core.errors import FormatError
from ..core.location import Location

log = logging.getLogger("zarrfeed.writer")

LEASE_KEY = "zarrfeed.lease"
LOCK_FILE = ".zarrfeed.lock"
TIMEOUT = 60.0
_held_here: set[str] = set()  # local leases held by this process
_live_tokens: set[str] = set()  # tokens of the leases this process holds now, on any store
_held_lock = threading.Lock()


class Fence:
    """Until when this writer may write: a deadline on `time.monotonic()` (one clock for every process of a
    host, running on while a process is stopped) in shared memory, moved on by each renewal of the lease and
    set to 0 when it is lost, and checked by the writer and its worker processes before they store a chunk:
    a writer that was stopped (SIGSTOP, a long pause) past it stops writing everywhere, not only before its
    next commit. The deadline ends two heartbeats before another writer may take the lease over. It is a
    check, not a fence on the store's side (no store here offers one for chunk writes): a write already sent
    when it passes still lands, so `timeout` must be well above the time one segment takes to store."""

    def __init__(self, block: SharedBlock | None = None) -> None:
        self._block = block or SharedBlock(8)
        self._until: "memoryview[float] | None" = self._block.buf.cast("d")

    def __reduce__(self) -> tuple[Any, ...]:  # a worker gets the same shared deadline
        return Fence, (self._block,)

    @property
    def until(self) -> float:
        """The deadline (`time.monotonic()`) writes may go on until; 0 once revoked or closed."""
        return self._until[0] if self._until is not None else 0.0

    @property
    def closed(self) -> bool:
        """Unmapped by `close` (in this process)."""
        return self._until is None

    def extend(self, until: float) -> None:
        if self._until is not None:
            self._until[0] = until

    def revoke(self) -> None:
        if self._until is not None:
            self._until[0] = 0.0

    def close(self) -> None:
        """Revoke and unmap (the memory goes with the last process that maps it)."""
        self.revoke()
        if self._until is not None:
            self._until.release()
            self._until = None
            self._block.close()

    def check(self, location: Any = "the dataset") -> None:
        """Raise `LeaseLost` if this writer may no longer write."""
        if self._until is None or self._until[0] <= time.monotonic():
            raise LeaseLost(f"{location}: the write lease was lost or has not been renewed in time, so another "
                            "writer may hold it; stopped before writing")


def check_held(store: Any, token: str, location: Any) -> None:
    """Raise `LeaseLost` unless the lease document in `store` (a zarr store of the dataset) names `token`. A
    task on a cluster, which shares no memory with the writer that placed its rows, asks this before it writes
    (one request: a check just before the write, not a fence)."""
    holder = Holder.parse(store.get(LEASE_KEY))
    if holder is None or holder.token != token:
        raise LeaseLost(f"{location}: the writer that placed these rows no longer holds the write lease; "
                        "stopped before writing")


def process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (tells a reused pid apart), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class Holder:
    """Who holds a lease, as stored in its document."""

    host: str
    pid: int
    pid_start: int | None
    started: float
    heartbeat: float
    token: str
    # the holder's own timeout: the one a taker applies, since the holder's fence stops its writes by that one
    # (None: a document written before this field, judged by the taker's timeout)
    timeout: float | None = None

    @classmethod
    def me(cls, timeout: float) -> "Holder":
        now = time.time()
        return cls(socket.gethostname(), os.getpid(), process_start(os.getpid()), now, now, uuid.uuid4().hex,
                   timeout)

    @classmethod
    def parse(cls, raw: bytes | None) -> "Holder | None":
        try:
            holder = cls(**json.loads(bytes(raw))) if raw is not None else None
        except (TypeError, ValueError, RecursionError):
            return None
        if holder is not None and not (holder.timeout is None or (isinstance(holder.timeout, (int, float))
                                                                  and holder.timeout > 0)):
            return None  # unreadable, as a document that is not JSON
        return holder

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    def gone(self, timeout: float) -> str | None:
        """Why this holder is gone (a dead process on this host, a heartbeat older than the holder's own timeout,
        or `timeout` for a document that does not say), or None if it may live."""
        timeout = self.timeout if self.timeout is not None else timeout
        if self.host == socket.gethostname():
            start = process_start(self.pid)
            if self.pid == os.getpid() and start == self.pid_start and self.token not in _live_tokens:
                # this process let it go (a release the store did not answer, or a renewal that landed late)
                return "this process released it"
            if start is None or (self.pid_start is not None and start != self.pid_start):
                return f"process {self.pid} on this host has exited"
        silent = time.time() - self.heartbeat
        if silent > timeout:
            return f"no heartbeat for {silent:.0f} s (timeout {timeout:.0f} s)"
        return None

    def __str__(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return (f"pid {self.pid} on {self.host} (since {since}, last heartbeat "
                f"{max(0.0, time.time() - self.heartbeat):.0f} s ago)")


def _refuse(location: Location, holder: Holder | None, timeout: float, locked: bool = False) -> LeaseHeld:
    """The refusal, saying when the lease can be taken over. `locked`: a local lease whose file lock a live
    process holds, which only that process's exit releases: no timeout applies, however long it is silent (a
    SIGSTOPped writer keeps it), so none is promised."""
    who = str(holder) if holder else "another writer"
    if holder is not None and holder.timeout is not None:
        timeout = holder.timeout
    if not locked:
        return LeaseHeld(f"{location}: being written by {who}; wait for it to finish, or stop it "
                         "(a lease whose holder died is taken over at once on the same host, otherwise after "
                         f"{timeout:.0f} s without a heartbeat)")
    silent = holder is not None and time.time() - holder.heartbeat > timeout
    if silent and holder is not None and holder.host == socket.gethostname() \
            and process_start(holder.pid) == holder.pid_start:
        return LeaseHeld(f"{location}: being written by {who}, which is alive but has not renewed its lease for "
                         f"longer than its {timeout:.0f} s timeout (stopped? `kill -CONT {holder.pid}` resumes it); "
                         "its lease is taken over only once that process exits: let it go on, or stop it")
    return LeaseHeld(f"{location}: being written by {who}; wait for it to finish, or stop it (its lease is taken "
                     "over as soon as its process exits)")


def _s3_code(exc: OSError) -> str | None:
    """The S3 error code that s3fs keeps as the cause of the error it raises (not read from the message's text)."""
    cause = exc.__cause__
    return getattr(cause, "response", {}).get("Error", {}).get("Code") if cause is not None else None


def _rejected(exc: OSError) -> bool:
    """Whether a conditional PUT failed because its condition did not hold (the object changed or is gone)."""
    if _s3_code(exc) == "NoSuchBucket":  # (s3fs raises FileNotFoundError for it too: not a condition)
        return False
    if isinstance(exc, FileNotFoundError):  # If-Match on an object that no longer exists
        return True
    return _s3_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "NoSuchKey", "404")


class Lease:
    """The write lease of the dataset at `location`: `acquire()`, then `release()` (or use `with`)."""

    def __init__(self, location: Location, timeout: float = TIMEOUT, interval: float | None = None) -> None:
        self.location, self.timeout = location, timeout
        self.interval = interval if interval is not None else max(0.05, timeout / 6)
        self.holder = Holder.me(timeout)
        self.lost: str | None = None
        self._backend: _Backend | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed = 0.0  # time.monotonic() of the last successful take or renewal
        self._held = False  # acquired and not released
        self._renewing = threading.Lock()
        self.fence = Fence()  # checked before every chunk write, here and in worker processes

    def _fresh(self) -> None:
        """The lease was just taken or renewed: writes may go on until two heartbeats before it can expire."""
        self._renewed = time.monotonic()
        self.fence.extend(self._renewed + self.timeout - 2 * self.interval)

    def acquire(self) -> None:
        """Take the lease or raise `LeaseHeld` naming its holder; nothing in the dataset changes before."""
        loc = self.location
        self._backend = _BACKENDS[loc.settings.lease](loc)
        backend, limit = self._backend, loc.settings.bound(self.timeout)
        previous = bounded(limit, lambda: backend.take(self.holder, self.timeout), f"{loc}: taking the write lease")
        self._held = True
        _live_tokens.add(self.holder.token)
        self._fresh()
        if previous is not None:
            log.warning("%s: took over the write lease of %s: %s", loc, previous[0], previous[1])
        self._thread = threading.Thread(target=self._beat, name="zarrfeed-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self._renew():
                    return
            except Exception as exc:  # a store that does not answer: try again at the next beat
                log.warning("%s: lease heartbeat failed (%s: %s)", self.location, type(exc).__name__, exc)

    def _renew(self) -> bool:
        """Renew on the store; False (and `lost` set) if the lease is no longer ours. Raises if the store
        does not answer (that says nothing about who holds it)."""
        with self._renewing:  # the heartbeat thread and a commit (check_on_store) may both renew
            return self._renew_now()

    def _renew_now(self) -> bool:
        backend, limit = self._backend, self.location.settings.bound(self.timeout / 2)
        if backend is None or self.lost:
            return False
        self.holder.heartbeat = time.time()
        if not bounded(limit, lambda: backend.renew(self.holder), f"{self.location}: renewing the lease"):
            self.lost = (f"{self.location}: the write lease was taken over by another writer (or its document "
                         f"{LEASE_KEY} was deleted)")
            self.fence.revoke()
            log.error("%s", self.lost)
            return False
        self._fresh()
        return True

    def confirm(self) -> bool:
        """Whether this writer provably holds the lease now: it is renewed on the store itself (on S3 by a PUT
        conditional on the lease's ETag), so no other writer can take it for `timeout` seconds. Anything
        destructive that is not a commit (removing a dataset this writer created) asks this first; a store
        that does not answer counts as no."""
        try:
            return self._held and self._renew()
        except Exception as exc:
            log.debug("%s: cannot confirm the lease (%s: %s)", self.location, type(exc).__name__, exc)
            return False

    def check_on_store(self) -> None:
        """`check()`, then renew the lease on the store itself: raise `LeaseLost` if its document no longer names
        this writer (taken over, or deleted by hand, which admits another writer at once rather than after the
        timeout). A commit asks this just before it is published: one request, so another writer's commit can
        follow this one's only within that moment, not for a whole heartbeat. A store that does not answer
        raises its own error (the commit fails and the next one tries again)."""
        self.check()
        if self._backend is not None and not self._renew():
            raise LeaseLost(self.lost or f"{self.location}: the write lease is no longer held")

    def check(self) -> None:
        """Raise `LeaseLost` if another writer has taken the lease over, or may have: once the lease has not
        been renewed for almost its timeout, another writer is free to take it, so this one must not write or
        commit anything."""
        if self.lost:
            raise LeaseLost(self.lost)
        stale = time.monotonic() - self._renewed
        if self._thread is not None and stale > self.timeout - 2 * self.interval:
            raise LeaseLost(f"{self.location}: the write lease has not been renewed for {stale:.0f} s (the store "
                            "did not answer, or this process was paused), so another writer may have taken it "
                            "over; stopped before writing")

    def release(self, seconds: float | None = None) -> None:
        """Give the lease up (within `seconds`, if given: a store that does not answer lets it expire)."""
        self._stop.set()
        self._held = False
        _live_tokens.discard(self.holder.token)
        self.fence.revoke()
        stuck = False
        if self._thread is not None:
            self._thread.join(seconds if seconds is not None else 5)
            stuck, self._thread = self._thread.is_alive(), None
        if not stuck:  # else a renewal the store never answered may still touch the fence: leave it mapped
            self.fence.close()
        backend, self._backend = self._backend, None
        if backend is not None and not within(seconds, lambda: backend.release(self.holder)):
            log.debug("%s: the write lease was not released; it expires after %.0f s", self.location,
                      self.timeout)

    def __enter__(self) -> "Lease":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class _Backend:
    def take(self, me: Holder, timeout: float) -> tuple[Holder | None, str] | None:
        """Acquire; return (previous holder, why it was gone) on a takeover. Raises `LeaseHeld`."""
        raise NotImplementedError

    def renew(self, me: Holder) -> bool:
        """Write the new heartbeat; False if the lease is no longer ours."""
        raise NotImplementedError

    def release(self, me: Holder) -> None:
        raise NotImplementedError


class _FileBackend(_Backend):
    def __init__(self, location: Location) -> None:
        self.location = location
        self.dir = location.path
        self.key = os.path.realpath(self.dir)
        self.lock: fasteners.InterProcessLock | None = None

    def _doc(self) -> Holder | None:
        try:
            return Holder.parse((self.dir / LEASE_KEY).read_bytes())
        except OSError:
            return None

    def _write(self, me: Holder) -> None:
        tmp = self.dir / f".{LEASE_KEY}.{me.token}"
        try:
            tmp.write_bytes(me.encode())
            os.replace(tmp, self.dir / LEASE_KEY)
        finally:  # a write the system refused (a full disk) leaves no part of it
            tmp.unlink(missing_ok=True)

    def take(self, me: Holder, timeout: float) -> tuple[Holder | None, str] | None:
        with _held_lock:
            if self.key in _held_here:
                raise _refuse(self.location, self._doc(), timeout, locked=True)
            self.location.store("a").make_root()
            lock = fasteners.InterProcessLock(str(self.dir / LOCK_FILE))
            if not lock.acquire(blocking=False):  # a live process holds it: its exit alone releases it
                raise _refuse(self.location, self._doc(), timeout, locked=True)
            previous = self._doc()
            # the document, not the lock file, is the truth: a lock file someone deleted admits a second
            # writer, whose lock is on a new file, while the holder it names is alive and beating
            why = None
            if previous is not None and previous.token != me.token:  # this process's live leases are in _held_here
                why = previous.gone(timeout)
            if previous is not None and previous.token != me.token and why is None:
                lock.release()
                raise _refuse(self.location, previous, timeout)
            _held_here.add(self.key)
        try:
            self._write(me)
        except BaseException:  # not taken (a full disk): nothing of it is left held in this process
            with _held_lock:
                _held_here.discard(self.key)
            lock.release()
            raise
        self.lock = lock
        return (previous, why or "") if previous is not None and previous.token != me.token else None

    def renew(self, me: Holder) -> bool:
        current = self._doc()
        if current is None or current.token != me.token:  # taken over, or removed: not ours any more
            return False
        self._write(me)
        return True

    def release(self, me: Holder) -> None:
        try:
            current = self._doc()
            if current is not None and current.token == me.token:  # never another holder's document
                (self.dir / LEASE_KEY).unlink(missing_ok=True)
        finally:
            with _held_lock:
                _held_here.discard(self.key)
            if self.lock is not None:
                self.lock.release()
                self.lock = None


class _S3Backend(_Backend):
    """Conditional PUTs on the lease object: create-only, then compare-and-swap on its ETag."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.fs, root = location.filesystem()
        self.bucket, _, prefix = root.partition("/")
        self.key = f"{prefix}/{LEASE_KEY}" if prefix else LEASE_KEY  # fsspec's roots end in no "/"
        self.etag: str | None = None

    def _put(self, me: Holder, **condition: str) -> bool:
        try:
            self.etag = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=me.encode(),
                                        **condition)["ETag"]
            return True
        except FileExistsError:  # If-None-Match: an object is there
            return False
        except OSError as exc:
            if _rejected(exc):
                return False
            if _s3_code(exc) == "NoSuchBucket":  # (not a lease another writer holds: no lease can be made)
                raise FormatError(f"{self.location}: the bucket '{self.bucket}' does not exist on this store; create "
                                  f"it first (`aws s3 mb s3://{self.bucket}`, or s3fs's `S3FileSystem.mkdir`)"
                                  ) from None
            raise

    def _get(self) -> tuple[Holder | None, str | None]:
        """The document and its ETag from one GET (two requests could pair an old body with a new ETag)."""
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str]:
            got = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.key)
            async with got["Body"] as body:
                return await body.read(), got["ETag"]

        try:
            body, etag = sync(self.fs.loop, get)
        except FileNotFoundError:
            return None, None
        return Holder.parse(body), etag

    def take(self, me: Holder, timeout: float) -> tuple[Holder | None, str] | None:
        for _ in range(3):
            if self._put(me, IfNoneMatch="*"):
                return None
            holder, etag = self._get()
            if etag is None:
                continue  # released meanwhile: try to create it again
            why = holder.gone(timeout) if holder else "its lease document is unreadable"
            if why is None:
                raise _refuse(self.location, holder, timeout)
            if self._put(me, IfMatch=etag):
                return holder, why
        raise _refuse(self.location, self._get()[0], timeout)

    def renew(self, me: Holder) -> bool:
        if self.etag is not None and self._put(me, IfMatch=self.etag):
            return True
        # refused: taken over, or our own earlier PUT landed and its reply was lost (the client retried it, or
        # the call timed out), which changed the ETag; the document says which (the token is ours alone)
        holder, etag = self._get()
        if holder is not None and holder.token == me.token and etag is not None:
            self.etag = etag
            return self._put(me, IfMatch=etag)
        return False

    def release(self, me: Holder) -> None:
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
        except OSError:  # not ours any more: leave it to its new holder
            pass


class _CreateBackend(_Backend):
    """Other fsspec stores: an exclusive create where supported; renewals rewrite the document after checking
    that it is still ours (not atomic: a takeover during that check is possible, within one heartbeat)."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.fs, root = location.filesystem()
        self.path = f"{root}/{LEASE_KEY}"  # fsspec's roots end in no "/"

    def _create(self, me: Holder) -> bool:
        try:
            with self.fs.open(self.path, "xb") as f:
                f.write(me.encode())
            return True
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError) as exc:
            raise FormatError(f"{self.location}: this store cannot create a file exclusively ({exc}), so "
                              "zarrfeed cannot make sure it is the only writer; write to a local directory "
                              "or S3") from None

    def _doc(self) -> Holder | None:
        try:
            return Holder.parse(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None

    def take(self, me: Holder, timeout: float) -> tuple[Holder | None, str] | None:
        if self.fs.exists(self.path):
            holder = self._doc()
            why = holder.gone(timeout) if holder else "its lease document is unreadable"
            if why is None:
                raise _refuse(self.location, holder, timeout)
            self.fs.rm_file(self.path)
            if self._create(me):
                return holder, why
            raise _refuse(self.location, self._doc(), timeout)
        if not self._create(me):
            raise _refuse(self.location, self._doc(), timeout)
        return None

    def renew(self, me: Holder) -> bool:
        current = self._doc()
        if current is None or current.token != me.token:
            return False
        self.fs.pipe_file(self.path, me.encode())
        return True

    def release(self, me: Holder) -> None:
        current = self._doc()
        if current is not None and current.token == me.token:
            self.fs.rm_file(self.path)


# how each kind of store holds the lease (`StoreSettings.lease`)
_BACKENDS: dict[str, Callable[[Location], _Backend]] = {
    "file": _FileBackend, "s3": _S3Backend, "create": _CreateBackend}
