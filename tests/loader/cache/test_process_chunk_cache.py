"""Decoded chunks kept across epochs: later epochs decode nothing when the chunks fit, part of them within a
smaller budget, and the batches are the same as without the cache (against a one-process, no-cache loader)."""
import logging
import os

import numpy as np
import pytest
from zarrfeed.loader import Loader, WindowLoader
from zarrfeed.loader.engine import resources
from zarrfeed.loader.caches.chunk_cache import ProcessCache
from zarrfeed.writer import synthetic, write_dataset


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(10, 21, chunks={"agents": 600, "frames": 40, "traffic_light_faces": 300}, frames=70,
                         agents_per_frame=40)


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def chunks_of(loader):
    return len({key for w in loader.plan().window_batches() for key in loader.source.chunks_of(loader.plan(), w)})


@pytest.mark.parametrize("make", [
    lambda p, **kw: Loader(p, "agents", batch_size=300, seed=4, shuffle_window=3, copy=True, **kw),
    lambda p, **kw: WindowLoader(p, history=5, future=5, batch_size=16, seed=4, shuffle_window=2, copy=True, **kw),
], ids=["Loader", "WindowLoader"])
def test_later_epochs_decode_nothing_and_yield_the_same_batches(data, make):
    with make(data, num_workers=0, cache_bytes=0) as plain, make(data, num_workers=2) as cached:
        n = chunks_of(cached)
        for epoch in range(3):
            same(list(cached), list(plain))
            assert cached.chunks_decoded == (n if epoch == 0 else 0)
            assert plain.chunks_decoded == n  # without the cache every epoch decodes every chunk


@pytest.fixture(scope="module")
def larger(tmp_path_factory):
    """A table several times the loader's ring (8 MiB), so that an epoch needs far fewer slots than it reads."""
    path = tmp_path_factory.mktemp("cache") / "larger.zarr"
    write_dataset(path, synthetic.episodes(8, seed=22), chunks={"agents": 2000}, workers=0)
    return path


def test_a_smaller_budget_keeps_what_fits_and_says_so(larger, caplog, monkeypatch):
    monkeypatch.setattr(resources, "_GROUP_ROWS", 4096)  # a smaller ring, so the table is many times its span
    args = dict(batch_size=1000, seed=1, shuffle_window=1, copy=True)
    with Loader(larger, "agents", cache_bytes=0, **args) as plain:
        n, chunk_bytes = chunks_of(plain), plain.source.chunk_bytes
        need = plain.sizing.cache_need(plain.plan())[0]
        expected = [list(plain) for _ in range(3)]
    assert need + 8 < n  # what an epoch needs at once is well below the table
    keep = need + 8
    with caplog.at_level(logging.INFO, logger="zarrfeed.loader"), \
            Loader(larger, "agents", cache_bytes=keep * chunk_bytes, **args) as loader:
        got = []
        for _ in range(3):
            got.append(list(loader))
            assert loader.cache_chunks == keep  # the budget is the cache's size, exactly
        assert 0 < loader.chunks_decoded <= n - (keep - need)  # the chunks kept are not decoded again
    for a, b in zip(got, expected, strict=True):
        same(a, b)
    assert f"{keep} (later epochs decode the rest) of the {n} chunks" in caplog.text


def test_a_loop_left_early_starts_the_cache_anew_and_stays_right(data):
    with Loader(data, "agents", batch_size=300, seed=2, num_workers=0, cache_bytes=0, copy=True) as plain:
        want = [list(plain) for _ in range(2)]
    with Loader(data, "agents", batch_size=300, seed=2, copy=True) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        it.close()  # left mid-epoch: workers stop, the cache goes with them
        same(head + list(loader), want[0])
        same(list(loader), want[1])
        assert loader.chunks_decoded == 0


def test_cache_bytes_must_not_be_negative(data):
    with pytest.raises(ValueError, match="cache_bytes must be an integer >= 0"):
        Loader(data, cache_bytes=-1)


def test_the_most_recently_unpinned_chunk_is_given_up_first():
    slots = ProcessCache(3, 64)
    for epoch_keys in ([("a", 0), ("a", 1), ("a", 2)],):
        for w, key in enumerate(epoch_keys):
            assert slots.pin(key, w)[1]
            slots.decoded(slots.slot(*key))
            slots.unpin(key, w)
    slots.new_epoch()
    assert slots.fits([("a", 3)])
    slot, new = slots.pin(("a", 3), 0)
    assert new and slot == 2  # the slot of ("a", 2), unpinned last; ("a", 0) and ("a", 1) stay cached
    assert slots.cached() == {("a", 0), ("a", 1), ("a", 3)}
    assert slots.pin(("a", 0), 1) == (0, False)
    assert not slots.fits([("a", 4), ("a", 5)])  # one slot is unpinned, two are needed
    slots.close()


def test_a_slot_is_polled_until_decoded_and_names_its_chunk():
    """What a loader asks of a slot it waits for: ready once a worker said it decoded it, never to be decoded
    again by the asker (this loader's workers were asked already), and which chunk it holds."""
    slots = ProcessCache(2, 64)
    pins = slots.pin_window(0, [("a", 5), ("b", 7)])
    assert [(p.slot, p.decode, p.ready) for p in pins] == [(0, True, False), (1, True, False)]
    assert [(p.slot, p.decode, p.ready) for p in (slots.poll(0), slots.poll(1))] == [(0, False, False),
                                                                                      (1, False, False)]
    assert slots.decoded(1)
    assert [(p.slot, p.decode, p.ready) for p in (slots.poll(0), slots.poll(1))] == [(0, False, False),
                                                                                      (1, False, True)]
    assert slots.key_of(0) == ("a", 5) and slots.key_of(1) == ("b", 7) and slots.decoder_of(1) == os.getpid()
    slots.close()


def test_a_slot_given_to_another_chunk_is_not_ready_until_decoded_again():
    """A slot taken from an unpinned chunk kept its "decoded" mark, so the new
    chunk would have been gathered from the old one's bytes."""
    slots = ProcessCache(1, 64)
    [pin] = slots.pin_window(0, [("a", 0)])
    assert slots.decoded(pin.slot)
    slots.unpin_window(0, [("a", 0)])
    [pin] = slots.pin_window(1, [("a", 1)])
    assert pin.decode and not pin.ready and not slots.poll(pin.slot).ready
    assert slots.key_of(pin.slot) == ("a", 1)
    slots.close()
