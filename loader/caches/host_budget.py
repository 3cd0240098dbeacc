"""Per-job budgets for the host caches of a user on a machine, within one ceiling: each dataset's cache gets
what its loaders asked for (`cache_bytes`), as long as the caches together stay within the host's ceiling,
the largest `cache_bytes` that any live process using a host cache asked for. So one job's small budget never
shrinks another's (a job asking for 1 byte does not cap every cache on the host at what its loaders need at
once), and several jobs asking for a quarter of the memory each still hold a quarter together.

A cache counts against the ceiling what it holds up to what its loaders asked for; a cache that holds more (its
loaders asked for less than the chunks they need at once) says so in its log and takes nothing from the
others.

The ledger is one more shared memory file, found the way the caches are (`core._proc.rendezvous`: no daemon,
nothing on disk), with an entry per process that uses a host cache (its pid and the bytes it asked for) and
an entry per live cache (its identity, its bytes and the bytes its loaders asked for). Each process holds a
lock on its own process entry and a shared lock on the entry of each cache it uses (see `core._proc.ofd`);
an entry no process holds is free, since its process died or its cache went with the last of them (the
kernel drops the locks of a process that dies, SIGKILL included). Sizing a new cache and entering it happen
under the ledger's lock, so two caches made at once never both count on the same room. The ledger lasts as
long as any process uses a host cache.
"""
from __future__ import annotations

import contextlib
import os
import struct
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ...core._proc import rendezvous
from ...core._proc.ofd import ProcessLocks
from ...core._proc.shm import SharedBlock

MAGIC = 0x7A66_6862_0002  # "zfhb", format 2: per-job budgets
ENTRIES = 1024  # host caches alive at once
PROCS = 1024  # processes using host caches at once
_HEADER = 64  # magic
_LOCK_BASE = 1 << 40
_GLOBAL = _LOCK_BASE
_CACHE_WORDS = 4  # per cache entry: bytes, the identity's 16 bytes as two words, bytes asked for
_PROC_WORDS = 2  # per process entry: pid, bytes asked for
_SIZE = _HEADER + 8 * (_CACHE_WORDS * ENTRIES + _PROC_WORDS * PROCS)


def _entry_lock(i: int) -> int:
    return _LOCK_BASE + 1 + i


def _proc_lock(i: int) -> int:
    return _LOCK_BASE + 1 + ENTRIES + i


@dataclass(frozen=True)
class CacheUse:
    """One live host cache: its identity (`host_cache.CacheKey.identity`), the bytes of its chunk slots, and
    the bytes its loaders asked for (what it would hold if other caches left room: `short` is the gap)."""

    identity: str
    nbytes: int
    asked: int = 0

    @property
    def short(self) -> int:
        """Bytes it holds below what its loaders asked for (0: it has all it asked)."""
        return max(self.asked - self.nbytes, 0)


@dataclass(frozen=True)
class BudgetUse:
    """The host's ceiling for decoded chunks (`budget`: the largest `cache_bytes` a live process asked for,
    `set_by` that process), and the live caches within it, each with its share."""

    budget: int
    set_by: int
    caches: tuple[CacheUse, ...]

    @property
    def used(self) -> int:
        return sum(c.nbytes for c in self.caches)


class HostBudget:
    """This process's handle on the ledger; `room` and `enter` are called under `locked()`."""

    def __init__(self, block: SharedBlock) -> None:
        self.block = block
        self._locks = ProcessLocks(block.fd)
        self._thread_lock = threading.RLock()
        self._entries = np.frombuffer(block.buf, np.int64, _CACHE_WORDS * ENTRIES, _HEADER).reshape(
            ENTRIES, _CACHE_WORDS)
        self._procs = np.frombuffer(block.buf, np.int64, _PROC_WORDS * PROCS,
                                    _HEADER + 8 * _CACHE_WORDS * ENTRIES).reshape(PROCS, _PROC_WORDS)
        self._mine: dict[int, int] = {}  # entry -> caches of this process in it
        self._me = -1  # this process's entry
        self.asked = 0  # the most this process's loaders asked for

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._thread_lock:
            self._locks.lock(_GLOBAL)
            try:
                yield
            finally:
                self._locks.unlock(_GLOBAL)

    def ask(self, nbytes: int) -> None:
        """Count `nbytes` as asked for by this process (its entry holds the most its loaders asked for)."""
        with self.locked():
            if self._me < 0:
                for i in range(PROCS):
                    if self._locks.lock(_proc_lock(i), wait=False):
                        self._me = i
                        break
                else:
                    raise rendezvous.RendezvousError(f"more than {PROCS} processes use host caches on this machine")
            self.asked = max(self.asked, int(nbytes))
            self._procs[self._me] = (os.getpid(), self.asked)

    def ceiling(self) -> tuple[int, int]:
        """(bytes, pid): the largest `cache_bytes` a live process asked for, and that process."""
        live = [i for i in range(PROCS) if i == self._me or self._locks.held(_proc_lock(i))]
        if not live:
            return 0, 0
        i = max(live, key=lambda i: int(self._procs[i, 1]))
        return int(self._procs[i, 1]), int(self._procs[i, 0])

    def _live(self, i: int) -> bool:
        return i in self._mine or self._locks.held(_entry_lock(i))

    def room(self) -> int:
        """Bytes of the ceiling that no live cache counts against it (negative if caches already count more).
        A cache counts what it holds up to what its loaders asked for: the slots beyond (the few chunks that
        loaders with a smaller `cache_bytes` need at once, said in their log) are not taken from other jobs."""
        return self.ceiling()[0] - sum(min(int(self._entries[i, 0]), int(self._entries[i, 3]))
                                       for i in range(ENTRIES) if self._live(i))

    def enter(self, identity: str, nbytes: int, asked: int) -> int:
        """Count cache `identity` of `nbytes` as used by this process, whose loaders asked for `asked` bytes of
        it, in its entry if the cache has one (another process made it), else in a free one; returns the entry
        for `leave`."""
        words = np.frombuffer(bytes.fromhex(identity)[:16].ljust(16, b"\0"), np.int64)
        same = np.flatnonzero((self._entries[:, 1] == words[0]) & (self._entries[:, 2] == words[1]))
        found = [int(i) for i in same if self._live(int(i))]
        if found:
            i = found[0]
            self._entries[i, 3] = max(int(self._entries[i, 3]), asked)
        else:
            free = [i for i in range(ENTRIES) if not self._live(i)]
            if not free:
                raise rendezvous.RendezvousError(f"more than {ENTRIES} host caches on this machine at once")
            i = free[0]
            self._entries[i] = (nbytes, words[0], words[1], asked)
        if i not in self._mine:
            self._locks.lock(_entry_lock(i), shared=True)
        self._mine[i] = self._mine.get(i, 0) + 1
        return i

    def leave(self, entry: int) -> None:
        """This process no longer uses the cache of `entry`."""
        with self._thread_lock:
            n = self._mine.get(entry, 0) - 1
            if n > 0:
                self._mine[entry] = n
                return
            self._mine.pop(entry, None)
            self._locks.unlock(_entry_lock(entry))

    def usage(self) -> BudgetUse:
        with self.locked():
            caches = tuple(CacheUse(bytes(self._entries[i, 1:3].tobytes()).hex(), int(self._entries[i, 0]),
                                    int(self._entries[i, 3])) for i in range(ENTRIES) if self._live(i))
            ceiling, pid = self.ceiling()
        return BudgetUse(ceiling, pid, caches)

    def close(self) -> None:
        self._locks.close()
        self._entries = self._procs = None  # type: ignore[assignment]
        self.block.close()


# ------------------------------------------------------------ one ledger per process
@dataclass
class _Held:
    ledger: HostBudget
    server: rendezvous.Server
    users: int  # caches of this process open


_HELD: dict[str, _Held] = {}  # "ledger" while any host cache of this process is open
_LOCK = threading.Lock()


def _forget_in_child() -> None:
    """A forked process is another process: it finds the ledger anew if it uses a host cache."""
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def acquire(budget: int) -> HostBudget:
    """The host's ledger (made if no process on this host has one), with `budget` counted as asked for by this
    process; call `release` when done."""
    with _LOCK:
        held = _HELD.get("ledger")
        if held is not None:
            held.users += 1
            held.ledger.ask(budget)
            return held.ledger

        def init(fd: int) -> None:
            os.pwrite(fd, struct.pack("q", MAGIC), 0)

        fd, created, server = rendezvous.find_or_create("budget", _SIZE, init)
        if struct.unpack("q", os.pread(fd, 8, 0))[0] != MAGIC:
            server.close()
            os.close(fd)
            raise rendezvous.RendezvousError("the host caches' budget has another format (a process of another "
                                             "zarrfeed version holds it)")
        ledger = HostBudget(SharedBlock(_SIZE, fd=fd, populate=False))
        try:
            ledger.ask(budget)
        except BaseException:
            server.close()
            ledger.close()
            raise
        _HELD["ledger"] = _Held(ledger, server, 1)
        return ledger


def release(ledger: HostBudget) -> None:
    with _LOCK:
        held = _HELD.get("ledger")
        if held is None or held.ledger is not ledger:
            return
        held.users -= 1
        if held.users == 0:
            del _HELD["ledger"]
            held.server.close()
            ledger.close()


def usage() -> BudgetUse | None:
    """What the host caches of this user on this machine (in this process's namespace) hold, each against what
    its loaders asked for, within the host's ceiling (None if no process uses one)."""
    with _LOCK:
        held = _HELD.get("ledger")
        if held is not None:
            return held.ledger.usage()
    fds = [fd for fd in (rendezvous.ask(s, "budget") for s in rendezvous.served("budget/serve/")) if fd is not None]
    if not fds:
        return None
    for extra in fds[1:]:
        os.close(extra)
    if struct.unpack("q", os.pread(fds[0], 8, 0))[0] != MAGIC:
        os.close(fds[0])
        raise rendezvous.RendezvousError("the host caches' budget has another format (a process of another "
                                         "zarrfeed version holds it)")
    ledger = HostBudget(SharedBlock(_SIZE, fd=fds[0], populate=False))
    try:
        return ledger.usage()
    finally:
        ledger.close()
