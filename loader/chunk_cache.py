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
        self.slots: dict[Key, int] = {}
        self.decoded: set[int] = set()
        self.users: dict[Key, set[int]] = {}
        self._free = list(range(n))[::-1]
        self._idle: dict[Key, None] = {}  # unpinned and still cached, in the order they were unpinned

    def new_epoch(self, keep: bool = True) -> None:
        """Unpin everything (windows are per epoch); slots whose decode never finished become free, and all
        of them without `keep`."""
        for key, slot in list(self.slots.items()):
            if not keep or slot not in self.decoded:
                self.decoded.discard(slot)
                del self.slots[key]
                self._free.append(slot)
        self.users = {key: set() for key in self.slots}
        self._idle = dict.fromkeys(self.slots)

    def fits(self, keys: list[Key]) -> bool:
        """Whether `keys` can all be held at once with what is free or unpinned now."""
        new = sum(key not in self.slots for key in keys)
        if new <= len(self._free):
            return True
        needed = set(keys)
        return new <= len(self._free) + sum(1 for key in self._idle if key not in needed)

    def pin(self, key: Key, window: int) -> tuple[int, bool]:
        """The slot of `key`, taken if needed (call `fits` first), pinned by `window`; and whether it is new
        (its decode must be asked for)."""
        new = key not in self.slots
        if new:
            if self._free:
                slot = self._free.pop()
            else:
                gone, _ = self._idle.popitem()  # the most recently unpinned (see the module docstring)
                slot = self.slots.pop(gone)
                del self.users[gone]
                self.decoded.discard(slot)
            self.slots[key] = slot
            self.users[key] = set()
        self._idle.pop(key, None)
        self.users[key].add(window)
        return self.slots[key], new

    def unpin(self, key: Key, window: int) -> None:
        users = self.users[key]
        users.discard(window)
        if not users:
            self._idle[key] = None
