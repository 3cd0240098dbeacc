"""Which decoded chunk is in which slot of a loader's shared chunk cache, kept from one epoch to the next.

A chunk is pinned while a resident window reads it. Unpinned chunks stay decoded in their slots, so a later
window or a later epoch that reads them again only gathers; a slot is taken back only when a chunk that is not
cached needs one and no slot is free. The chunk given up is the one unpinned most recently (MRU), not the
least recently: an epoch visits every chunk once in a shuffled order, so a chunk just read is the one least
likely to be read again soon, while those kept since an earlier epoch are read again in every epoch. When the
whole selection fits, nothing is given up and epochs after the first decode nothing.
"""
from __future__ import annotations

Key = tuple[str, int]  # (table, chunk)


class ChunkSlots:
    """`n` cache slots: the chunk each holds, whether it is decoded, and which windows pin it."""

    def __init__(self, n: int) -> None:
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

    def is_decoded(self, slot: int) -> bool:
        return slot in self._decoded

    def mark_decoded(self, slot: int) -> None:
        """A worker finished decoding into `slot`."""
        self._decoded.add(slot)

    def unpin(self, key: Key, window: int) -> None:
        users = self._users[key]
        users.discard(window)
        if not users:
            self._idle[key] = None
