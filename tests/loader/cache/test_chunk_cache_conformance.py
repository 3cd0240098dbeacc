"""Every chunk cache keeps the `ChunkCache` protocol the scheduler relies on: the same tests (`Conformance`) run
against a loader's own (`ProcessCache`) and the host's (`HostCache`, on a host segment of its own), as zarr-python
tests every store against one base. Pins and their slots, decodes and polls, a pinned slot never given to
another chunk, no room -> None with nothing pinned, a new epoch that unpins everything and keeps what is
decoded, and the sizes a cache asks for."""
import hashlib
import os
import time

import numpy as np
import pytest
from zarrfeed.loader.caches import host_cache
from zarrfeed.loader.caches.chunk_cache import ProcessCache

SLOT_BYTES = 4096
N_SLOTS = 3
N_CHUNKS = 8


def keys(*chunks: int) -> list[tuple[str, int]]:
    return [("agents", c) for c in chunks]


class Conformance:
    """The protocol's tests; a subclass says how to make a cache of N_SLOTS slots of SLOT_BYTES (`make`)."""

    def make(self):
        raise NotImplementedError

    @pytest.fixture
    def cache(self):
        made = self.make()
        yield made
        made.close()

    @staticmethod
    def decode(cache, pin, value: int) -> None:
        """What a worker does: write the chunk into its slot under its claim, then the scheduler hears of it."""
        with cache.memory.writing(pin.slot, pin.token) as ours:
            assert ours
            cache.memory.array()[pin.slot * SLOT_BYTES:][:SLOT_BYTES] = value
        assert cache.decoded(pin.slot)

    def test_memory_holds_the_slots(self, cache):
        assert cache.memory.slot_bytes == SLOT_BYTES
        assert cache.memory.array().size >= N_SLOTS * SLOT_BYTES
        assert isinstance(cache.shared, bool)

    def test_new_chunks_get_slots_of_their_own_to_decode(self, cache):
        pins = cache.pin_window(0, keys(0, 1, 2))
        assert pins is not None and len(pins) == 3
        assert len({p.slot for p in pins}) == 3 and all(0 <= p.slot < N_SLOTS for p in pins)
        assert all(p.decode and not p.ready for p in pins)
        for (table, chunk), pin in zip(keys(0, 1, 2), pins, strict=True):
            assert cache.slot(table, chunk) == pin.slot
            assert cache.key_of(pin.slot) == (table, chunk)
            assert cache.decoder_of(pin.slot) == os.getpid()

    def test_a_decoded_chunk_is_ready_and_shared_by_the_next_window(self, cache):
        [pin] = cache.pin_window(0, keys(5))
        assert not cache.poll(pin.slot).ready
        self.decode(cache, pin, 5)
        polled = cache.poll(pin.slot)
        assert polled.ready and not polled.decode and polled.slot == pin.slot
        [again] = cache.pin_window(1, keys(5))  # another window reading it: same slot, nothing to decode
        assert (again.slot, again.decode, again.ready) == (pin.slot, False, True)

    def test_no_room_is_none_and_pins_nothing(self, cache):
        assert cache.pin_window(0, keys(0, 1, 2, 3)) is None  # more new chunks than slots
        pins = cache.pin_window(1, keys(0, 1, 2))  # nothing was taken by the refused window
        assert pins is not None and all(p.decode for p in pins)

    def test_a_pinned_slot_is_never_given_to_another_chunk(self, cache):
        pins = cache.pin_window(0, keys(0, 1, 2))
        for c, pin in enumerate(pins):
            self.decode(cache, pin, c)
        assert cache.pin_window(1, keys(3)) is None  # every slot is pinned
        cache.unpin_window(0, keys(0, 1, 2))
        [new] = cache.pin_window(1, keys(3))  # now one is given up for it
        assert new.decode and new.slot in {p.slot for p in pins}
        gone = [c for c, p in enumerate(pins) if p.slot == new.slot]
        assert cache.key_of(new.slot) == ("agents", 3)
        [back] = cache.pin_window(2, keys(*gone))  # the chunk given up is decoded again, elsewhere
        assert back.decode and back.slot != new.slot

    def test_a_chunk_stays_decoded_while_a_window_still_pins_it(self, cache):
        [pin] = cache.pin_window(0, keys(4))
        cache.pin_window(1, keys(4))
        self.decode(cache, pin, 4)
        cache.unpin_window(0, keys(4))
        cache.pin_window(2, keys(0, 1))  # fills the other slots; chunk 4's is still window 1's
        assert cache.pin_window(3, keys(6)) is None
        assert cache.slot("agents", 4) == pin.slot and cache.poll(pin.slot).ready

    def test_a_new_epoch_unpins_everything_and_keeps_what_is_decoded(self, cache):
        pins = cache.pin_window(0, keys(0, 1, 2))
        for c, pin in enumerate(pins):
            self.decode(cache, pin, c)
        cache.new_epoch(keep=True)
        again = cache.pin_window(0, keys(0, 1, 2))
        assert [(p.slot, p.decode, p.ready) for p in again] == [(p.slot, False, True) for p in pins]
        cache.new_epoch(keep=True)
        assert cache.pin_window(1, keys(5, 6, 7)) is not None  # nothing is pinned any more

    def test_slots_needed_lies_between_what_is_pinned_and_what_is_kept(self, cache):
        for kept, pinned in ((10, 4), (4, 4), (3, 10)):
            assert min(kept, pinned) <= cache.slots_needed(kept, pinned) <= kept

    def test_no_other_process_holds_it_here(self, cache):
        cache.pin_window(0, keys(0))
        assert cache.holders() == {}


class TestChunkSlots(Conformance):
    def make(self):
        return ProcessCache(N_SLOTS, SLOT_BYTES)

    def test_a_new_epoch_that_does_not_keep_forgets(self, cache):
        [pin] = cache.pin_window(0, keys(0))
        self.decode(cache, pin, 0)
        cache.new_epoch(keep=False)
        [again] = cache.pin_window(0, keys(0))
        assert again.decode and not again.ready


class TestHostSlots(Conformance):
    def make(self):
        identity = hashlib.sha256(f"conformance{os.getpid()}{time.time()}".encode()).hexdigest()[:32]
        key = host_cache.CacheKey(identity, ("agents",), (N_CHUNKS,), SLOT_BYTES)
        segment = host_cache.attach(key, budget=1 << 30, want=N_SLOTS, need=1)
        assert segment is not None and segment.n_slots == N_SLOTS
        return host_cache.HostCache(segment, key)

    def test_a_new_epoch_that_does_not_keep_leaves_the_chunks_to_the_host(self, cache):
        [pin] = cache.pin_window(0, keys(0))
        self.decode(cache, pin, 0)
        cache.new_epoch(keep=False)  # other loaders on the host may read them: they stay
        [again] = cache.pin_window(0, keys(0))
        assert again.ready and not again.decode
        np.testing.assert_array_equal(cache.memory.array()[again.slot * SLOT_BYTES:][:SLOT_BYTES], 0)
