"""One budget for all the host caches of a user on a machine: loaders of several datasets (or commits) on one
host never hold more decoded chunks together than the budget, however many processes they run in.

The ledger is one more shared memory file, found the way the caches are (`core._proc.rendezvous`: no daemon,
nothing on disk), with an entry per live cache: its identity and its bytes. Each process that uses a cache
holds a shared lock on that cache's entry (see `core._proc.ofd`); an entry no process holds is free, since
its cache went with the last of them (the kernel drops the locks of a process that dies, SIGKILL included).
Sizing a new cache and entering it happen under the ledger's lock, so two caches made at once never both
count on the same room. The budget is the one asked for by the process that made the ledger (by default a
quarter of the memory available then); the ledger lasts as long as any process uses a host cache.
"""
from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..core._proc import rendezvous
from ..core._proc.ofd import ProcessLocks
from ..core._proc.shm import SharedBlock

log = logging.getLogger("zarrfeed.loader")

MAGIC = 0x7A66_6862_0001  # "zfhb", format 1
ENTRIES = 1024  # host caches alive at once
_HEADER = 64  # magic, budget, pid of the process that made the ledger
_LOCK_BASE = 1 << 40
_GLOBAL = _LOCK_BASE


def _entry_lock(i: int) -> int:
    return _LOCK_BASE + 1 + i


@dataclass(frozen=True)
class CacheUse:
    """One live host cache: its identity (`host_cache.CacheKey.identity`) and the bytes of its chunk slots."""

    identity: str
    nbytes: int


@dataclass(frozen=True)
class BudgetUse:
    """The host's budget for decoded chunks, who set it, and the live caches that share it."""

    budget: int
    set_by: int
    caches: tuple[CacheUse, ...]

    @property
    def used(self) -> int:
        return sum(c.nbytes for c in self.caches)


class HostBudget:
    """This process's handle on the ledger; `reserve` and `enter` are called under `locked()`."""

    def __init__(self, block: SharedBlock) -> None:
        self.block = block
        self._locks = ProcessLocks(block.fd)
        self._thread_lock = threading.RLock()
        header = np.frombuffer(block.buf, np.int64, _HEADER // 8)
        self.budget, self.set_by = int(header[1]), int(header[2])
        # per entry: bytes, then the identity's 16 bytes as two words
        self._entries = np.frombuffer(block.buf, np.int64, 3 * ENTRIES, _HEADER).reshape(ENTRIES, 3)
        self._mine: dict[int, int] = {}  # entry -> caches of this process in it

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._thread_lock:
            self._locks.lock(_GLOBAL)
            try:
                yield
            finally:
                self._locks.unlock(_GLOBAL)

    def _live(self, i: int) -> bool:
        return i in self._mine or self._locks.held(_entry_lock(i))

    def room(self) -> int:
        """Bytes of the budget that no live cache holds (negative if caches already hold more)."""
        return self.budget - sum(int(self._entries[i, 0]) for i in range(ENTRIES) if self._live(i))

    def enter(self, identity: str, nbytes: int) -> int:
        """Count cache `identity` of `nbytes` as used by this process, in its entry if the cache has one
        (another process made it), else in a free one; returns the entry for `leave`."""
        words = np.frombuffer(bytes.fromhex(identity)[:16].ljust(16, b"\0"), np.int64)
        same = np.flatnonzero((self._entries[:, 1] == words[0]) & (self._entries[:, 2] == words[1]))
        found = [int(i) for i in same if self._live(int(i))]
        if found:
            i = found[0]
        else:
            free = [i for i in range(ENTRIES) if not self._live(i)]
            if not free:
                raise rendezvous.RendezvousError(f"more than {ENTRIES} host caches on this machine at once")
            i = free[0]
            self._entries[i] = (nbytes, words[0], words[1])
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
            caches = tuple(CacheUse(bytes(self._entries[i, 1:].tobytes()).hex(), int(self._entries[i, 0]))
                           for i in range(ENTRIES) if self._live(i))
        return BudgetUse(self.budget, self.set_by, caches)

    def close(self) -> None:
        self._locks.close()
        self._entries = None  # type: ignore[assignment]
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
    """The host's ledger, made with `budget` if no process on this host has one; call `release` when done."""
    with _LOCK:
        held = _HELD.get("ledger")
        if held is not None:
            held.users += 1
            return held.ledger
        size = _HEADER + 8 * 3 * ENTRIES

        def init(fd: int) -> None:
            os.pwrite(fd, struct.pack("3q", MAGIC, budget, os.getpid()), 0)

        fd, created, server = rendezvous.find_or_create("budget", size, init)
        if struct.unpack("q", os.pread(fd, 8, 0))[0] != MAGIC:
            server.close()
            os.close(fd)
            raise rendezvous.RendezvousError("the host caches' budget has another format")
        ledger = HostBudget(SharedBlock(size, fd=fd, populate=False))
        _HELD["ledger"] = _Held(ledger, server, 1)
        if created:
            log.info("zarrfeed: decoded chunks on this machine are kept within %d MiB, shared by every loader of "
                     "this user with cache=\"host\" (set by this process, the first of them)", budget >> 20)
        elif budget > ledger.budget:
            log.info("zarrfeed: this loader asked for %d MiB of decoded chunks; the host caches on this machine "
                     "share %d MiB, set by the first loader (pid %d)", budget >> 20, ledger.budget >> 20,
                     ledger.set_by)
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
    """What the host caches of this user on this machine hold against their budget (None if no process
    uses one)."""
    with _LOCK:
        held = _HELD.get("ledger")
        if held is not None:
            return held.ledger.usage()
    fds = [fd for fd in (rendezvous.ask(s, "budget") for s in rendezvous.served("budget/serve/")) if fd is not None]
    if not fds:
        return None
    for extra in fds[1:]:
        os.close(extra)
    ledger = HostBudget(SharedBlock(_HEADER + 8 * 3 * ENTRIES, fd=fds[0], populate=False))
    try:
        return ledger.usage()
    finally:
        ledger.close()
