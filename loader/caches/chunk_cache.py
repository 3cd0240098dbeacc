"""Which decoded chunk is in which slot of a loader's shared chunk cache, kept from one epoch to the next.

A chunk is pinned while a resident window reads it. Unpinned chunks stay decoded in their slots, so a later
window or a later epoch that reads them again only gathers; a slot is taken back only when a chunk that is not
cached needs one and no slot is free. The chunk given up is the one unpinned most recently (MRU), not the
least recently: an epoch visits every chunk once in a shuffled order, so a chunk just read is the one least
likely to be read again soon, while those kept since an earlier epoch are read again in every epoch. When the
whole selection fits, nothing is given up and epochs after the first decode nothing.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import numpy as np

from ...core._proc.shm import SharedBlock, check_room

Key = tuple[str, int]  # (table, chunk)


class ChunkMemory(Protocol):
    """The shared memory decoded chunks live in: one slot each (`ProcessCacheMemory`, `host_cache.HostSegment`)."""

    @property
    def slot_bytes(self) -> int:
        ...

    def array(self) -> np.ndarray:
        """The slots as one array of bytes, a row per slot."""
        ...

    def writing(self, slot: int, token: int) -> contextlib.AbstractContextManager[bool]:
        """Held while a worker decodes into `slot`; whether its claim `token` still holds (else it skips)."""
        ...

    def close(self) -> None:
        ...


class ChunkCache(Protocol):
    """Which chunk is in which slot, as the scheduler sees a cache (`ProcessCache`: a loader's own;
    `host_cache.HostCache`: the host's, shared by every loader of a dataset commit on the machine; both pass
    tests/loader/cache/test_chunk_cache_conformance.py). Fetched bytes kept on disk are a layer below, in the
    workers (`fetch.DiskCache`)."""

    @property
    def memory(self) -> ChunkMemory:
        """Where the chunks are decoded."""
        ...

    @property
    def shared(self) -> bool:
        """Other processes decode into it too: the scheduler polls the chunks it waits for."""
        ...

    def new_epoch(self, keep: bool = True) -> None:
        """An epoch begins: nothing is pinned; with `keep=False` this loader keeps nothing decoded (its own
        cache forgets it; the host's keeps it for the other loaders of the machine)."""
        ...

    def pin_window(self, window: int, keys: list[Key]) -> list["Pin"] | None:
        """Pin the chunks a window reads (None: no room now, try again once windows are unpinned)."""
        ...

    def unpin_window(self, window: int, keys: list[Key]) -> None:
        ...

    def poll(self, slot: int) -> "Pin":
        """Where a slot whose decode was asked for stands."""
        ...

    def decoded(self, slot: int) -> bool:
        """A worker says it decoded `slot`; whether it is ready."""
        ...

    def slot(self, table: str, chunk: int) -> int:
        ...

    def key_of(self, slot: int) -> Key:
        ...

    def decoder_of(self, slot: int) -> int:
        """The pid of the process decoding `slot` (0 if unknown)."""
        ...

    def holders(self) -> dict[int, int]:
        """pid -> slots pinned, of other processes that pin slots of this cache (none for a loader's own)."""
        ...

    def lock_holder(self) -> int:
        """The pid of another process that holds this cache's lock now (0: none; a loader's own has no lock)."""
        ...

    def watching(self, waiting: Callable[[float], None]) -> contextlib.AbstractContextManager[None]:
        """Within the block, this thread's waits for another process's lock on this cache call `waiting(since)`
        between short steps (`since`: when the wait began, monotonic), and end if it raises: the scheduler's
        stall watch (`loader.engine.stalls`). A loader's own cache never waits on another process."""
        ...

    def slots_needed(self, kept: int, pinned: int) -> int:
        """Slots this cache needs for epochs that keep `kept` chunks and pin `pinned` at once."""
        ...

    def close(self) -> None:
        ...


@dataclass(frozen=True, slots=True)
class Pin:
    """A chunk pinned in cache slot `slot`: whether its decode is to be asked for now (`decode`, with
    `token`: the claim the worker checks before writing), or whether it is decoded already (`ready`)."""

    slot: int
    decode: bool
    ready: bool
    token: int = 0


class ProcessCacheMemory:
    """The decoded chunks of one loader alone (cache="process"): `n_slots` slots of `slot_bytes` in shared
    memory that this loader's workers map."""

    def __init__(self, slot_bytes: int, n_slots: int) -> None:
        check_room(slot_bytes * n_slots, f"the loader's chunk cache ({n_slots} chunks)")
        self.slot_bytes, self.n_slots = slot_bytes, n_slots
        # the pages are mapped as workers first decode into them, in parallel, not all at the start
        # (populating the whole cache in the parent and in each worker would delay the first batch)
        self.block = SharedBlock(slot_bytes * n_slots, populate=False)

    def array(self) -> np.ndarray:
        """The decoded chunks, slot after slot, as bytes."""
        return np.frombuffer(self.block.buf, np.uint8)

    @contextlib.contextmanager
    def writing(self, slot: int, token: int) -> Iterator[bool]:
        """A worker decodes into `slot` (always: only this loader's scheduler hands slots out)."""
        yield True

    def close(self) -> None:
        self.block.close()


class ProcessCache:
    """`n` cache slots of `slot_bytes`: the chunk each holds, whether it is decoded, which windows pin it, and
    the shared memory they are in (`memory`, freed by `close`)."""

    shared = False  # only this loader's workers decode into it

    def __init__(self, n: int, slot_bytes: int) -> None:
        self.memory = ProcessCacheMemory(slot_bytes, n)
        self._slots: dict[Key, int] = {}
        self._decoded: set[int] = set()
        self._users: dict[Key, set[int]] = {}
        self._free = list(range(n))[::-1]
        self._idle: dict[Key, None] = {}  # unpinned and still cached, in the order they were unpinned

    def new_epoch(self, keep: bool = True) -> None:
        """Unpin everything (windows are per epoch); slots whose decode never finished become free, and all
        of them without `keep`."""
        for key, slot in list(self._slots.items()):
            if not keep or slot not in self._decoded:
                self._decoded.discard(slot)
                del self._slots[key]
                self._free.append(slot)
        self._users = {key: set() for key in self._slots}
        self._idle = dict.fromkeys(self._slots)

    def pin_window(self, window: int, keys: list[Key]) -> list[Pin] | None:
        """Pin `keys` for `window`, taking slots for those not cached; None (nothing pinned) if they do not fit."""
        if not self.fits(keys):
            return None
        out = []
        for key in keys:
            slot, new = self.pin(key, window)
            out.append(Pin(slot, decode=new, ready=slot in self._decoded))
        return out

    def unpin_window(self, window: int, keys: list[Key]) -> None:
        for key in keys:
            self.unpin(key, window)

    def poll(self, slot: int) -> Pin:
        """Where a slot whose decode was asked for stands (here: decoded when its worker said so)."""
        return Pin(slot, decode=False, ready=slot in self._decoded)

    def key_of(self, slot: int) -> Key:
        """The chunk in `slot`."""
        return next(key for key, s in self._slots.items() if s == slot)

    def decoder_of(self, slot: int) -> int:
        """This process: only its own workers decode into this cache."""
        return os.getpid()

    def holders(self) -> dict[int, int]:
        """None: no other process pins this loader's own cache."""
        return {}

    def lock_holder(self) -> int:
        """0: this loader's own cache has no lock."""
        return 0

    def watching(self, waiting: Callable[[float], None]) -> contextlib.AbstractContextManager[None]:
        """Nothing to watch: this loader's own cache never waits on another process."""
        return contextlib.nullcontext()

    def slots_needed(self, kept: int, pinned: int) -> int:
        """All it keeps: this cache is the only one that holds them."""
        return kept

    def decoded(self, slot: int) -> bool:
        """A worker says it decoded `slot`; whether it is ready."""
        self._decoded.add(slot)
        return True

    def close(self) -> None:
        self.memory.close()

    def fits(self, keys: list[Key]) -> bool:
        """Whether `keys` can all be held at once with what is free or unpinned now."""
        new = sum(key not in self._slots for key in keys)
        if new <= len(self._free):
            return True
        needed = set(keys)
        return new <= len(self._free) + sum(1 for key in self._idle if key not in needed)

    def pin(self, key: Key, window: int) -> tuple[int, bool]:
        """The slot of `key`, taken if needed (call `fits` first), pinned by `window`; and whether it is new
        (its decode must be asked for)."""
        new = key not in self._slots
        if new:
            if self._free:
                slot = self._free.pop()
            else:
                gone, _ = self._idle.popitem()  # the most recently unpinned (see the module docstring)
                slot = self._slots.pop(gone)
                del self._users[gone]
                self._decoded.discard(slot)
            self._slots[key] = slot
            self._users[key] = set()
        self._idle.pop(key, None)
        self._users[key].add(window)
        return self._slots[key], new

    def slot(self, table: str, chunk: int) -> int:
        """The slot holding chunk `chunk` of `table` (it must be pinned)."""
        return self._slots[(table, chunk)]

    def cached(self) -> set[Key]:
        """The chunks in the cache, decoded or being decoded."""
        return set(self._slots)

    def unpin(self, key: Key, window: int) -> None:
        users = self._users[key]
        users.discard(window)
        if not users:
            self._idle[key] = None
