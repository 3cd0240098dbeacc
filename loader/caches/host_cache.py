"""One decoded copy of a dataset per host: the chunk cache that every loader on the machine reading the same
dataset commit shares, whichever process, rank or server stream it runs in.

The cache is one anonymous memory file per (user, namespace, dataset location, dataset id, commit, recorded
chunk digests), found through `core._proc.rendezvous` (no daemon, no memory on disk; freed when the last
process holding it exits, SIGKILL included). It holds a table of slots and the slots' decoded chunks:

- `directory[chunk]`: the slot holding a chunk (chunks numbered across the tables, in name order), or -1.
- per slot: its chunk, its state (FREE, DECODING, READY, FAILED), a generation bumped at every claim, the
  process that claimed it, the processes pinning it (a bit each) and when it was last unpinned.

Every change of the table happens under one lock held across processes: a byte-range lock on the memory
file itself, taken through an open file description of each process's own (Linux OFD locks: released by the
kernel when the process dies, and excluding other processes even though they share the file). Each process
that uses the cache registers under a lock byte of its own, which says it is alive. A chunk is decoded by a
worker that holds its slot's lock byte and checks that the slot's generation is still the one it was sent:
if the process that claimed a slot dies mid-decode, its slot is claimed again only once no worker holds that
lock, so a half-written chunk is never marked READY and a late worker never writes over a newer chunk.
The process holding the table's lock writes its pid in the header while it holds it (`lock_holder`): an OFD
lock's owner is a file description, which fcntl names by no pid.

A loader never waits silently on another process (see `loader.engine.stalls`): within `watching(waiting)`, a
thread waiting for a lock that another process holds takes it in short steps that call `waiting` between them,
instead of inside fcntl, where a holder that is stopped (SIGSTOP, a debugger) would hold it up for good unseen.

A slot pinned by any live process is never given up; among unpinned ones the one unpinned most recently goes
first (see `loader.caches.chunk_cache`: in a shuffled epoch the chunk just read is the one least needed again).
The table's invariants (`HostSegment.check`): the directory names slot s for chunk c exactly when slot s is
not free and holds c (so no two chunks share a slot, and no slot lies outside the table); a pin is only on a
slot that holds a chunk, by a registered process, and holds the chunk it was pinned for. A request never
counts as room a slot that holds one of its own chunks, and a take or lookup that would break them raises
`CacheInvariantError` with the table as it was.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ...core._proc import rendezvous
from ...core._proc.ofd import ProcessLocks, take_in_steps
from ...core._proc.shm import SharedBlock
from ...core.errors import CacheInvariantError
from ...core.sizes import binary_size
from . import host_budget
from .chunk_cache import Key, Pin

log = logging.getLogger("zarrfeed.loader")

MAGIC = 0x7A66_6863_0001  # "zfhc", format 1
MAX_PROCS = 256  # processes using one cache at once
FREE, DECODING, READY, FAILED = 0, 1, 2, 3
_HEADER = 4096
_LOCK_BASE = 1 << 40  # lock bytes lie beyond the end of the file (see core._proc.ofd)
_GLOBAL = _LOCK_BASE
_PAGE = 4096  # the slots start on a page
_HOLDER = 5  # header word: the pid of the process holding the slot table's lock (0: none)
_PATIENCE = 0.05  # seconds a look that must not wait (`holders`) tries for the table's lock


Waiting = Callable[[float], None]  # called with when the wait began (monotonic); may raise to end it
_WATCH = threading.local()  # .waiting: this thread's, within `watching`


def _unwatch() -> None:
    _WATCH.waiting = None


os.register_at_fork(after_in_child=_unwatch)  # a forked worker's waits are not its parent's


@contextlib.contextmanager
def watching(waiting: Waiting) -> Iterator[None]:
    """Within the block, this thread's waits for a lock of a host cache that another process holds (its slot
    table's, a slot's) take the lock in short steps, calling `waiting(since)` between them (`since`: when the
    wait began, monotonic), which may raise to end the wait without the lock."""
    outer = getattr(_WATCH, "waiting", None)
    _WATCH.waiting = waiting
    try:
        yield
    finally:
        _WATCH.waiting = outer


def _watcher() -> Callable[[], None] | None:
    """This thread's watch (see `watching`) for a wait that begins now, or None: wait inside fcntl."""
    waiting = getattr(_WATCH, "waiting", None)
    if waiting is None:
        return None
    since = time.monotonic()
    return lambda: waiting(since)


def _proc_lock(p: int) -> int:
    return _LOCK_BASE + 1 + p


def _slot_lock(s: int) -> int:
    return _LOCK_BASE + 1 + MAX_PROCS + s


@dataclass(frozen=True)
class CacheKey:
    """What a host cache is for: the chunks of one dataset commit at one location, in slots of `slot_bytes`;
    its directory numbers the chunks of `tables`, in that order (`chunks_per_table` each)."""

    identity: str
    tables: tuple[str, ...]
    chunks_per_table: tuple[int, ...]
    slot_bytes: int

    @classmethod
    def of(cls, ds: Any, slot_bytes: int) -> "CacheKey":
        """The key of dataset `ds` (a `loader.Dataset`) as opened, with slots of `slot_bytes` (a loader's
        cache rows are counted in slots of its table's chunk size, so loaders with other slot sizes keep other
        caches): where it is (`Location.place`), its id, which state of it (`Dataset.version_tag`: a copy
        put in its place, or a dataset without commits rewritten in place, is another cache), and what it
        holds: the size and digest its commits recorded for each chunk (`Dataset.digests`), so that a copy
        with the same id, commit and commit log key but other chunks never shares a cache with it.
        Whether its chunks are checked too (`Dataset.verify_chunks`, for a dataset that records digests): a
        loader with the check off decodes changed chunks into its cache, which a checked one must never read."""
        tables = tuple(sorted(ds.tables))
        chunks = tuple(-(-ds.rows[t] // ds[t].chunks[0]) for t in tables)
        content = _content(ds.digests(), tables)
        what = {"place": ds.location.place(), "dataset_id": ds.dataset_id, "version": ds.version_tag(),
                "rows": {t: ds.rows[t] for t in tables}, "slot_bytes": slot_bytes,
                "chunks": {t: [ds[t].chunks[0], str(ds[t].dtype)] for t in tables},
                "content": content, "checked": bool(ds.verify_chunks) and content is not None}
        digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]
        return cls(digest, tables, chunks, slot_bytes)

    @property
    def n_chunks(self) -> int:
        return sum(self.chunks_per_table)

    def chunk_id(self, table: str, chunk: int) -> int:
        i = self.tables.index(table)
        return sum(self.chunks_per_table[:i]) + chunk


def _content(digests: dict[str, dict[int, tuple[int, str]]] | None, tables: tuple[str, ...]) -> str | None:
    """One digest of every chunk record (index, size, digest) of `tables`; None for a dataset that records
    none (its `version_tag` then digests its files' names, sizes and times)."""
    if digests is None:
        return None
    h = hashlib.sha256()
    for t in tables:
        for i, (size, chunk_digest) in sorted(digests.get(t, {}).items()):
            h.update(f"{t}/{i}:{size}:{chunk_digest}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class _Layout:
    """Where each part of the memory file lies."""

    n_slots: int
    slot_bytes: int
    n_chunks: int

    def offsets(self) -> dict[str, tuple[int, int]]:
        """name -> (offset, int64 count)."""
        out, at = {}, _HEADER
        for name, count in (("procs", MAX_PROCS), ("directory", self.n_chunks), ("chunk", self.n_slots),
                            ("state", self.n_slots), ("gen", self.n_slots), ("owner", self.n_slots),
                            ("unpinned", self.n_slots), ("pins", self.n_slots * (MAX_PROCS // 64))):
            out[name] = (at, count)
            at += 8 * count
        out["data"] = (-(-at // _PAGE) * _PAGE, 0)
        return out

    @property
    def size(self) -> int:
        return self.offsets()["data"][0] + self.n_slots * self.slot_bytes


class HostSegment:
    """The mapped cache of one dataset commit, shared by every loader of this process (see `attach`) and
    mapped by their workers. Methods that change the slot table take the cross-process lock."""

    def __init__(self, block: SharedBlock, layout: _Layout, register: bool) -> None:
        self.block, self.fd, self.layout = block, block.fd, layout
        self._pid, self._locks = os.getpid(), ProcessLocks(block.fd)
        self._thread_lock = threading.RLock()
        self._depth = 0  # how many `locked` blocks the thread holding `_thread_lock` is in
        self.me = -1
        self._my_pins: dict[int, int] = {}  # slot -> pins by this process's loaders
        self._my_chunks: dict[int, int] = {}  # slot -> the chunk this process pinned there
        if register:  # a process number first, before any view of the memory exists: refused, nothing stays
            self.me = self._take_number()
        self.header = np.frombuffer(block.buf, np.int64, _HEADER // 8)
        arrays = {}
        for name, (at, count) in layout.offsets().items():
            if name != "data":
                arrays[name] = np.frombuffer(block.buf, np.int64, count, at)
        self.procs, self.directory = arrays["procs"], arrays["directory"]
        self.chunk, self.state, self.gen = arrays["chunk"], arrays["state"], arrays["gen"]
        self.owner, self.unpinned = arrays["owner"], arrays["unpinned"]
        self.pins = arrays["pins"].view(np.uint64).reshape(layout.n_slots, MAX_PROCS // 64)
        self.data_offset = layout.offsets()["data"][0]
        self.slot_bytes, self.n_slots = layout.slot_bytes, layout.n_slots
        if register:
            with self.locked():
                self._forget(self.me)  # whatever a dead process with this number left
                self.procs[self.me] = os.getpid()

    # ------------------------------------------------------------ locks
    def _own(self) -> ProcessLocks:
        """This process's locks, made anew in a forked worker (which inherits the parent's object)."""
        if self._pid != os.getpid():
            self._pid, self._locks = os.getpid(), ProcessLocks(self.fd)
            self._thread_lock, self.me, self._my_pins, self._my_chunks = threading.RLock(), -1, {}, {}
            self._depth = 0
        return self._locks

    def _lock(self, start: int, wait: bool = True) -> bool:
        return self._own().lock(start, wait)

    def _lock_watched(self, start: int, waiting: Callable[[], None] | None) -> None:
        """Take lock byte `start`, waiting as long as another process holds it: in steps that call `waiting()`
        if given (it may raise: then the byte is not taken), else inside fcntl."""
        if waiting is None:
            self._own().lock(start)
        else:
            self._own().lock_watched(start, waiting)

    def _unlock(self, start: int) -> None:
        self._own().unlock(start)

    def _held(self, start: int) -> bool:
        """Whether another process holds lock byte `start`."""
        return self._own().held(start)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The slot table's lock, across processes and this process's threads (a thread may take it again
        within). A wait for it is watched if this thread is (see `watching`)."""
        self._own()
        self._enter(_watcher())
        try:
            yield
        finally:
            self._leave()

    def _enter(self, waiting: Callable[[], None] | None) -> None:
        """Take this process's thread lock, then, unless this thread holds it already, the table's lock byte,
        and write this process's pid in the header; a wait calls `waiting()` between steps if given (it may
        raise: then nothing is held)."""
        if waiting is None:
            self._thread_lock.acquire()
        else:
            take_in_steps(lambda step: self._thread_lock.acquire(timeout=step), waiting)
        if not self._depth:
            try:
                self._lock_watched(_GLOBAL, waiting)
            except BaseException:
                self._thread_lock.release()
                raise
            self.header[_HOLDER] = self._pid
        self._depth += 1

    def _leave(self) -> None:
        self._depth -= 1
        if not self._depth:
            self.header[_HOLDER] = 0
            self._unlock(_GLOBAL)
        self._thread_lock.release()

    def _enter_now(self) -> bool:
        """Take the table's lock as `locked` does if it is free within `_PATIENCE` seconds, without calling
        this thread's watch (`_leave` if True): for looks the watch itself makes while this thread may be
        waiting for that lock."""
        self._own()
        deadline = time.monotonic() + _PATIENCE

        def waiting() -> None:
            if time.monotonic() > deadline:  # (a builtin: the error family is for what users are told)
                raise TimeoutError("the host cache's table lock was not taken within a look's patience")
        try:
            self._enter(waiting)
        except TimeoutError:
            return False
        return True

    def lock_holder(self) -> int:
        """The pid of the other process that holds the slot table's lock now; 0 if none does (or it has not yet
        written its pid: the few instructions after it took the lock)."""
        pid = int(self.header[_HOLDER])
        return pid if pid and pid != os.getpid() and self._held(_GLOBAL) else 0

    # ------------------------------------------------------------ processes
    def _take_number(self) -> int:
        """A process number of this process's own: its lock byte, free until now (its last holder died or
        left). Mapped memory is not touched here (see __init__)."""
        for p in range(MAX_PROCS):
            if self._lock(_proc_lock(p), wait=False):
                return p
        self._locks.close()
        self.block.close()
        raise rendezvous.RendezvousError(f"more than {MAX_PROCS} processes use one host cache")

    def _alive(self, p: int) -> bool:
        return p == self.me or self._held(_proc_lock(p))

    def _forget(self, p: int) -> None:
        """Drop dead process `p`'s pins, and let its unfinished decodes be claimed again."""
        word, bit = divmod(p, 64)
        self.pins[:, word] &= ~np.uint64(1 << bit)
        for s in np.flatnonzero((self.owner == p) & (self.state == DECODING)):
            if not self._held(_slot_lock(int(s))):
                self.state[s] = FAILED
        self.procs[p] = 0

    def _sweep(self) -> None:
        """Forget every process that died (its lock byte is free), and let decodes be claimed again whose
        claimer is gone (died, or closed while one of its workers was writing) and that no worker writes."""
        for p in np.flatnonzero(self.procs):
            if not self._alive(int(p)):
                self._forget(int(p))
        for slot in np.flatnonzero(self.state == DECODING):
            owner = int(self.owner[slot])
            if not (0 <= owner < MAX_PROCS and self.procs[owner] and self._alive(owner)) and \
                    not self._held(_slot_lock(int(slot))):
                self.state[slot] = FAILED

    # ------------------------------------------------------------ slots
    def _pinned(self) -> np.ndarray:
        return np.asarray(self.pins.any(axis=1))

    def _room(self, keep: set[int]) -> list[int]:
        """The slots new chunks may take, in the order they are taken: free ones, then unpinned ones that no
        decode is writing, the one unpinned most recently first, leaving out those holding a chunk of `keep`
        (the chunks a request pins where they are: counting their slots as room once gave one slot to two
        chunks, and the second a slot of -1)."""
        free = [int(s) for s in np.flatnonzero(self.state == FREE)]
        idle = [int(s) for s in np.flatnonzero(~self._pinned() & (self.state != DECODING) & (self.state != FREE))
                if int(self.chunk[s]) not in keep]
        idle.sort(key=lambda s: -int(self.unpinned[s]))  # stable: among equals, the lowest slot first
        return free + idle

    def _take(self, s: int) -> int:
        """Slot `s` (from `_room`) for a new chunk: its old chunk leaves the directory. Raises
        `CacheInvariantError` for a slot outside the table or one that is not free to take."""
        if not 0 <= s < self.n_slots:
            raise CacheInvariantError(f"host cache: slot {s} is outside the table of {self.n_slots} slots")
        if self.pins[s].any() or self.state[s] == DECODING:
            raise CacheInvariantError(f"host cache: slot {s} (chunk {int(self.chunk[s])}) is taken while "
                                      f"{'pinned' if self.pins[s].any() else 'being decoded'}")
        old = int(self.chunk[s])
        if self.state[s] != FREE and 0 <= old < len(self.directory) and self.directory[old] == s:
            self.directory[old] = -1
        return s

    def _saved(self) -> tuple[list[np.ndarray], dict[int, int], dict[int, int]]:
        """A copy of the slot table and of this process's pins, for `_restore`."""
        return ([a.copy() for a in self._tables()], dict(self._my_pins), dict(self._my_chunks))

    def _restore(self, saved: tuple[list[np.ndarray], dict[int, int], dict[int, int]]) -> None:
        for a, b in zip(self._tables(), saved[0], strict=True):
            a[...] = b
        self._my_pins, self._my_chunks = dict(saved[1]), dict(saved[2])

    def _tables(self) -> list[np.ndarray]:
        return [self.directory, self.chunk, self.state, self.gen, self.owner, self.unpinned, self.pins]

    def _pin_bit(self, s: int, cid: int) -> None:
        word, bit = divmod(self.me, 64)
        self.pins[s, word] |= np.uint64(1 << bit)
        self._my_pins[s] = self._my_pins.get(s, 0) + 1
        self._my_chunks[s] = cid

    def _claim(self, s: int, cid: int) -> int:
        self.chunk[s] = cid
        self.directory[cid] = s
        self.state[s] = DECODING
        self.gen[s] += 1
        self.owner[s] = self.me
        return int(self.gen[s])

    def _found(self, cid: int) -> int:
        """The slot the directory names for chunk `cid`, checked to hold it."""
        s = int(self.directory[cid])
        if not 0 <= s < self.n_slots or int(self.chunk[s]) != cid or self.state[s] == FREE:
            raise CacheInvariantError(f"host cache: the directory names slot {s} for chunk {cid}, which "
                                      f"{'is outside the table' if not 0 <= s < self.n_slots else 'does not hold it'}")
        return s

    def pin_all(self, cids: list[int]) -> list[Pin] | None:
        """Pin chunks `cids` for this process, claiming slots for those not cached; None if there are not
        enough slots that are free or unpinned (then nothing of the table changed, beyond forgetting processes
        that died). Raises `CacheInvariantError`, with the table as it was, if the table contradicts itself."""
        with self.locked():
            for attempt in range(2):
                wanted = list(dict.fromkeys(cids))
                missing = [c for c in wanted if self.directory[c] < 0]
                room = self._room({c for c in wanted if self.directory[c] >= 0})
                if len(missing) <= len(room):
                    break
                if attempt:
                    return None
                self._sweep()
            place = dict(zip(missing, room[:len(missing)], strict=True))
            saved = self._saved()
            try:
                out = []
                for cid in cids:
                    if self.directory[cid] < 0:
                        s = self._take(place[cid])
                        out.append(Pin(s, decode=True, ready=False, token=self._claim(s, cid)))
                    else:
                        s = self._found(cid)
                        out.append(self._status(s))
                    self._pin_bit(s, cid)
                return out
            except BaseException:
                self._restore(saved)
                raise

    def _status(self, s: int) -> Pin:
        state = int(self.state[s])
        if state == READY:
            return Pin(s, decode=False, ready=True, token=int(self.gen[s]))
        if state == FAILED or (state == DECODING and not self._alive(int(self.owner[s])) and
                               not self._held(_slot_lock(s))):
            self.owner[s], self.state[s] = self.me, DECODING  # its decoder is gone: ours to decode
            self.gen[s] += 1
            return Pin(s, decode=True, ready=False, token=int(self.gen[s]))
        return Pin(s, decode=False, ready=False, token=int(self.gen[s]))

    def poll(self, s: int) -> Pin:
        """Where a pinned slot stands: ready, still being decoded, or left by a decoder that died or failed
        (then it is this process's to decode, with the token returned)."""
        with self.locked():
            return self._status(s)

    def holders(self) -> dict[int, int]:
        """pid -> slots pinned, of the other live processes that pin slots of this cache (who holds the room a
        loader waits for). A look of the stall watch's, so it never waits: {} if the table's lock is not free
        within a moment (`lock_holder` then names who holds it)."""
        if not self._enter_now():
            return {}
        try:
            self._sweep()
            bits = np.unpackbits(self.pins.astype("<u8").view(np.uint8).reshape(self.n_slots, -1), axis=1,
                                 bitorder="little")
            out: dict[int, int] = {}
            for p, count in enumerate(bits.sum(axis=0)):
                pid = int(self.procs[p]) if p < MAX_PROCS else 0
                if count and p != self.me and pid:
                    out[pid] = out.get(pid, 0) + int(count)
            return out
        finally:
            self._leave()

    def unpin(self, s: int) -> None:
        with self.locked():
            n = self._my_pins.get(s, 0) - 1
            if n > 0:
                self._my_pins[s] = n
                return
            self._my_pins.pop(s, None)
            self._my_chunks.pop(s, None)
            word, bit = divmod(self.me, 64)
            self.pins[s, word] &= ~np.uint64(1 << bit)
            self.header[4] += 1
            self.unpinned[s] = self.header[4]

    def check(self) -> list[str]:
        """What is wrong with the slot table, one line each (an empty list: nothing), read under its lock: every
        slot and chunk number within the table, the directory and the slots agreeing (the directory names slot
        s for chunk c exactly when slot s holds c and is not free, so no two chunks share a slot), pins only on
        slots that hold a chunk and only by registered processes, and every slot this process pinned holding
        the chunk it pinned there."""
        with self.locked():
            return self._violations()

    def _violations(self) -> list[str]:
        out = []
        n_slots, n_chunks = self.n_slots, len(self.directory)
        for chunk in np.flatnonzero(self.directory != -1):
            c, s = int(chunk), int(self.directory[chunk])
            if not 0 <= s < n_slots:
                out.append(f"the directory names slot {s} for chunk {c}: outside the table of {n_slots} slots")
            elif self.state[s] == FREE or int(self.chunk[s]) != c:
                out.append(f"the directory names slot {s} for chunk {c}, which holds chunk {int(self.chunk[s])} "
                           f"(state {int(self.state[s])})")
        # bit p of a slot's row: pinned by process number p
        bits = np.unpackbits(self.pins.astype("<u8").view(np.uint8).reshape(n_slots, -1), axis=1, bitorder="little")
        for s in range(n_slots):
            state, c = int(self.state[s]), int(self.chunk[s])
            if state not in (FREE, DECODING, READY, FAILED):
                out.append(f"slot {s} has no state ({state})")
            elif state != FREE and not 0 <= c < n_chunks:
                out.append(f"slot {s} holds chunk {c}: outside the {n_chunks} chunks")
            elif state != FREE and int(self.directory[c]) != s:
                out.append(f"slot {s} holds chunk {c}, for which the directory names slot {int(self.directory[c])}")
            pinned_by = [int(p) for p in np.flatnonzero(bits[s])]
            if pinned_by and state == FREE:
                out.append(f"slot {s} is free and pinned by process numbers {pinned_by}")
            for p in pinned_by:
                if not self.procs[p]:
                    out.append(f"slot {s} is pinned by process number {p}, which is not registered")
        word, bit = divmod(self.me, 64)
        for s, c in self._my_chunks.items():
            if not 0 <= s < n_slots:
                out.append(f"this process pinned chunk {c} in slot {s}: outside the table of {n_slots} slots")
            elif int(self.chunk[s]) != c or self.state[s] == FREE:
                out.append(f"this process pinned chunk {c} in slot {s}, which holds chunk {int(self.chunk[s])}")
            elif self.me >= 0 and not int(self.pins[s, word]) >> bit & 1:
                out.append(f"this process pinned chunk {c} in slot {s}, and its pin is not in the table")
        return out

    def is_ready(self, s: int) -> bool:
        return int(self.state[s]) == READY

    def array(self) -> np.ndarray:
        """The decoded chunks, slot after slot, as bytes."""
        return np.frombuffer(self.block.buf, np.uint8, self.n_slots * self.slot_bytes, self.data_offset)

    def give_up(self, claims: dict[int, int]) -> None:
        """Slots this process claimed (slot -> token) and will not decode after all (its loader closed, a
        worker died): let others claim them."""
        with self.locked():
            for s, token in claims.items():
                if self.state[s] == DECODING and self.gen[s] == token and not self._held(_slot_lock(s)):
                    self.state[s] = FAILED

    # ------------------------------------------------------------ a worker's side
    @contextlib.contextmanager
    def writing(self, s: int, token: int) -> Iterator[bool]:
        """Decode into slot `s` if it is still the claim `token`: yields whether to write; marks the slot
        READY if the body finishes, FAILED if it raises. Its waits are watched if this thread is (see
        `watching`: a loader's inline worker)."""
        self._lock_watched(_slot_lock(s), _watcher())
        try:
            with self.locked():
                ours = int(self.gen[s]) == token and int(self.state[s]) == DECODING
            if not ours:
                yield False
                return
            try:
                yield True
            except BaseException:
                with self.locked():
                    if int(self.gen[s]) == token:
                        self.state[s] = FAILED
                raise
            with self.locked():
                if int(self.gen[s]) == token:
                    self.state[s] = READY
        finally:
            self._unlock(_slot_lock(s))

    def __reduce__(self) -> tuple[Any, ...]:
        return HostSegment, (self.block, self.layout, False)  # a worker maps it and takes no part in pinning

    def close(self) -> None:
        """Leave the cache: this process's pins and claims are dropped from the table. If the wait for its lock
        raises (see `watching`), this process leaves as one that died does: its lock bytes are released, and
        the next process to sweep the table drops them."""
        if self._locks.fd < 0:
            return
        try:
            if self.me >= 0:
                with self.locked():
                    self._forget(self.me)  # its pins, and its claims no worker is writing: others may claim them
        finally:
            if self.me >= 0:  # (explicitly: a worker forked from this process shares its file description)
                self._unlock(_proc_lock(self.me))
            self.header = self.procs = self.directory = self.chunk = self.state = None  # type: ignore[assignment]
            self.gen = self.owner = self.unpinned = self.pins = None  # type: ignore[assignment]
            self._locks.close()
            self.block.close()


# ------------------------------------------------------------ one segment per process and key
@dataclass
class _Open:
    segment: HostSegment
    server: rendezvous.Server
    ledger: host_budget.HostBudget
    entry: int  # the segment's entry in the ledger
    users: int  # loaders of this process


_OPEN: dict[str, _Open] = {}
_OPEN_LOCK = threading.Lock()
_SAID: set[str] = set()
_SAID_SHORT: set[str] = set()  # caches whose shortfall this process has said
os.register_at_fork(after_in_child=_OPEN.clear)  # a forked process is another process: it attaches anew


def attach(key: CacheKey, budget: int, want: int, need: int) -> HostSegment | None:
    """This process's handle on the host cache of `key`, or None if the existing cache has fewer than `need`
    slots (the caller keeps a cache of its own). Call `detach` when done. `budget` is the `cache_bytes` this
    process's loader asked for (it sets the host's ceiling if it is the largest asked; see `host_budget`). A new
    cache gets the `want` slots its loaders asked for, within what other caches leave of the host's ceiling,
    but never fewer than `need` (with less, no loader could go on: then the log says by how much it goes
    beyond the ceiling). A process whose cache holds fewer slots than it asked for says so in its log, once per
    cache, whichever process made it."""
    with _OPEN_LOCK:
        held = _OPEN.get(key.identity)
        if held is not None:
            if held.segment.n_slots < need:
                return None
            held.users += 1
            held.ledger.ask(budget)
            _say_short(key, held.segment.n_slots, _asked(key, budget, want), None)
            return held.segment
        ledger = host_budget.acquire(budget)
        seg = server = None
        try:
            with ledger.locked():  # sizing and entering the ledger at once: see host_budget
                ceiling, set_by = ledger.ceiling()
                room = ledger.room()
                opened = _open_segment(key, want, need, room)
                if opened is not None:
                    seg, server, created = opened
                    entry = ledger.enter(key.identity, seg.n_slots * seg.slot_bytes, _asked(key, budget, want))
        except BaseException:
            if seg is not None and server is not None:
                server.close()
                seg.close()
            host_budget.release(ledger)
            raise
        if seg is None or server is None:
            host_budget.release(ledger)
            return None
        _OPEN[key.identity] = _Open(seg, server, ledger, entry, 1)
    beyond = seg.n_slots * seg.slot_bytes - max(room, 0)
    if created and key.identity not in _SAID:
        _SAID.add(key.identity)
        log.info("zarrfeed: host cache of %d chunks (%s, shared by every loader of this dataset commit on this "
                 "machine)", seg.n_slots, binary_size(seg.n_slots * seg.slot_bytes))
    if created and beyond > 0:
        if key.identity in _SAID_SHORT:
            return seg
        _SAID_SHORT.add(key.identity)
        log.warning("zarrfeed: the host's ceiling for decoded chunks (%s) is too small for this dataset; its "
                    "cache takes the %d chunks its loaders need at once, %s beyond it",
                    _ceiling_said(ceiling, set_by, room), seg.n_slots, binary_size(beyond))
    else:
        _say_short(key, seg.n_slots, _asked(key, budget, want), (ceiling, set_by, room) if created else None)
    return seg


def _asked(key: CacheKey, budget: int, want: int) -> int:
    """Bytes of cache `key` that a loader asking for `want` slots within `budget` bytes asked for (whole slots)."""
    return min(want, key.n_chunks, budget // key.slot_bytes) * key.slot_bytes


def _ceiling_said(ceiling: int, set_by: int, room: int) -> str:
    mine = " (this process)" if set_by == os.getpid() else ""
    held = ceiling - room
    return (f"{binary_size(ceiling)}, the largest cache_bytes a process using a host cache asked for, by pid "
            f"{set_by}{mine}" + (f"; the caches of other datasets or jobs hold {binary_size(held)} of it"
                                 if held > 0 else ""))


def _say_short(key: CacheKey, n_slots: int, asked: int, made: tuple[int, int, int] | None) -> None:
    """Say in the log, once per cache and process, that the cache holds less than this process's loader asked
    for (`asked` bytes), and why: the room other caches left of the ceiling when this process made it (`made`:
    ceiling, who set it, room), or another process made it smaller."""
    held = n_slots * key.slot_bytes
    if held >= asked or key.identity in _SAID_SHORT:
        return
    _SAID_SHORT.add(key.identity)
    why = (_ceiling_said(*made) if made is not None else
           "another process made it for loaders that asked for less, or when other caches left less room; a "
           "host cache keeps its size while any process uses it")
    log.warning("zarrfeed: the host cache of this dataset commit holds %d of the %d chunks this loader asked for "
                "(%s of %s): %s. `zarrfeed.loader.caches.host_budget.usage()` shows each cache's share", n_slots,
                asked // key.slot_bytes, binary_size(held), binary_size(asked), why)


def _open_segment(key: CacheKey, want: int, need: int, room: int
                  ) -> tuple[HostSegment, rendezvous.Server, bool] | None:
    """Find or make the memory file of `key` (see `attach`): the segment, its server, and whether this call
    made it."""
    n_slots = max(min(key.n_chunks, want, max(room, 0) // key.slot_bytes), need, 1)
    layout = _Layout(n_slots, key.slot_bytes, key.n_chunks)

    def init(fd: int) -> None:
        os.pwrite(fd, struct.pack("5q", MAGIC, n_slots, key.slot_bytes, key.n_chunks, 0), 0)
        at, count = layout.offsets()["directory"]
        os.pwrite(fd, np.full(count, -1, np.int64).tobytes(), at)

    fd, created, server = rendezvous.find_or_create(f"cache/{key.identity}", layout.size, init)
    magic, n, slot_bytes, n_chunks = struct.unpack("4q", os.pread(fd, 32, 0))
    if (magic, slot_bytes, n_chunks) != (MAGIC, key.slot_bytes, key.n_chunks) or n < need:
        server.close()
        os.close(fd)
        if magic != MAGIC or (slot_bytes, n_chunks) != (key.slot_bytes, key.n_chunks):
            raise rendezvous.RendezvousError(f"the host cache {key.identity} has another format")
        return None
    layout = _Layout(n, slot_bytes, n_chunks)
    try:
        block = SharedBlock(layout.size, fd=fd, populate=False)
    except BaseException:
        server.close()
        os.close(fd)
        raise
    try:
        seg = HostSegment(block, layout, register=True)
    except BaseException:  # (more than MAX_PROCS processes): it closed the block; serve nothing either
        server.close()
        raise
    return seg, server, created


def detach(seg: HostSegment) -> None:
    """One loader of this process is done with `seg`; the last one closes it."""
    with _OPEN_LOCK:
        for ident, held in list(_OPEN.items()):
            if held.segment is seg:
                held.users -= 1
                if held.users:
                    return
                del _OPEN[ident]
                held.server.close()
                try:
                    seg.close()
                finally:
                    held.ledger.leave(held.entry)
                    host_budget.release(held.ledger)
                return


class HostCache:
    """One loader's view of a host cache: the same methods as `ProcessCache` (which windows pin which chunk),
    with the slots, their states and the pins of every other process in the shared segment."""

    shared = True  # others decode too: the scheduler polls the chunks it waits for

    def __init__(self, segment: HostSegment, key: CacheKey) -> None:
        self.segment, self.key = segment, key
        self.memory = segment
        self._users: dict[Key, set[int]] = {}
        self._slots: dict[Key, int] = {}
        self._keys: dict[int, Key] = {}
        self._claims: dict[int, int] = {}  # slot -> token of decodes this loader asked for, not yet done

    def new_epoch(self, keep: bool = True) -> None:
        """Unpin everything (windows are per epoch); decoded chunks stay for every loader on the host."""
        for key in list(self._users):
            self._release(key)

    def pin_window(self, window: int, keys: list[Key]) -> list[Pin] | None:
        new = [key for key in dict.fromkeys(keys) if key not in self._users]
        pins = self.segment.pin_all([self.key.chunk_id(*key) for key in new]) if new else []
        if pins is None:
            return None
        if len({pin.slot for pin in pins}) < len(pins) or any(pin.slot in self._keys for pin in pins):
            raise CacheInvariantError(f"host cache: chunks {new} were given slots {[p.slot for p in pins]}, "
                                      f"shared among them or with chunks this loader holds")
        for key, pin in zip(new, pins, strict=True):
            self._users[key], self._slots[key], self._keys[pin.slot] = set(), pin.slot, key
            if pin.decode:
                self._claims[pin.slot] = pin.token
        fresh: dict[Key, Pin | None] = dict(zip(new, pins, strict=True))
        out = []
        for key in keys:
            self._users[key].add(window)
            slot = self._slots[key]
            out.append(fresh.pop(key, None) or Pin(slot, decode=False, ready=self.segment.is_ready(slot)))
        return out

    def unpin_window(self, window: int, keys: list[Key]) -> None:
        for key in keys:
            users = self._users.get(key)
            if users is not None:
                users.discard(window)
                if not users:
                    self._release(key)

    def _release(self, key: Key) -> None:
        del self._users[key]
        slot = self._slots.pop(key)
        del self._keys[slot]
        self.segment.unpin(slot)

    def poll(self, slot: int) -> Pin:
        if slot in self._claims:  # our own decode: its worker's reply says when it is done
            return Pin(slot, decode=False, ready=self.segment.is_ready(slot))
        pin = self.segment.poll(slot)
        if pin.decode:
            self._claims[slot] = pin.token
        return pin

    def decoded(self, slot: int) -> bool:
        self._claims.pop(slot, None)
        return self.segment.is_ready(slot)

    def slot(self, table: str, chunk: int) -> int:
        return self._slots[(table, chunk)]

    def decoder_of(self, slot: int) -> int:
        """The pid of the process that claimed `slot` for its decode (0 if unknown)."""
        return int(self.segment.procs[int(self.segment.owner[slot])])

    def holders(self) -> dict[int, int]:
        """pid -> slots pinned, of the other processes that pin slots of the host cache."""
        return self.segment.holders()

    def lock_holder(self) -> int:
        """The pid of the other process that holds the host cache's table lock now (0: none)."""
        return self.segment.lock_holder()

    def watching(self, waiting: Waiting) -> contextlib.AbstractContextManager[None]:
        """Within the block, this thread's waits for the host cache's locks held by another process call
        `waiting(since)` between short steps, and end if it raises (see `watching`)."""
        return watching(waiting)

    def slots_needed(self, kept: int, pinned: int) -> int:
        """What it pins at once, at most: the host's cache is shared, and other loaders keep what it holds."""
        return min(kept, pinned)

    def key_of(self, slot: int) -> Key:
        """The (table, chunk) this loader pinned in `slot`."""
        return self._keys[slot]

    def close(self) -> None:
        """Give back unfinished claims and pins; the last loader of this process detaches the segment. If a wait
        for the table's lock raises (see `watching`), what is left stays pinned until that segment is closed."""
        try:
            if self._claims:
                self.segment.give_up(self._claims)
                self._claims = {}
            for key in list(self._users):
                self._release(key)
        finally:
            detach(self.segment)
