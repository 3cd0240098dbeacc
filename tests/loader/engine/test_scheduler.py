"""The scheduler (`Run`, `Epoch`) on its own, against fakes: a pool that runs the real worker in this process and
records every message (and can play a dead worker), and a chunk cache of the test's own (`FakeCache`, the
`ChunkCache` protocol) whose chunks are decoded by the loader's worker at once, by "another process" after some
polls, or never, and which can have no room. Batches come out in plan order, each gather message goes only once
every chunk its windows read is pinned and decoded, a window is unpinned only once its batches are made, a full
cache and a chunk never decoded hold batches back, and a dead worker is reported (or restarted)."""
import contextlib
import os
from types import SimpleNamespace

import numpy as np
import pytest
from zarrfeed.core.errors import LoaderError
from zarrfeed.loader import Dataset, Loader
from zarrfeed.loader.caches.chunk_cache import Key, Pin, ProcessCacheMemory
from zarrfeed.loader.engine.messages import Decode, GatherRows
from zarrfeed.loader.options import WorkerOptions
from zarrfeed.loader.ordering.plan import EpochPlan
from zarrfeed.loader.engine.resources import Sizing
from zarrfeed.loader.engine.scheduler import Epoch, Run
from zarrfeed.loader.engine.worker_pools import InlinePool

CHUNK_ROWS = 30


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(2, 3, chunks={"agents": CHUNK_ROWS}, frames=20, agents_per_frame=5)  # 7 chunks


class FakeCache:
    """The `ChunkCache` protocol over `n` slots in memory of this process. `decoder`: who decodes a chunk not
    cached ("workers": the loader's, at once; "others": another process, seen after `polls` polls; "never").
    `room=False` refuses every pin that needs a new slot. Records pins and unpins; `on_unpin(window)` is called
    at each unpin."""

    def __init__(self, n: int, slot_bytes: int, decode, decoder: str = "workers", polls: int = 3) -> None:
        self.memory = ProcessCacheMemory(slot_bytes, n)
        self.shared = decoder != "workers"
        self.decode, self.decoder, self.polls = decode, decoder, polls
        self.room = True
        self.on_unpin = lambda window: None
        self._slots: dict[Key, int] = {}
        self._users: dict[Key, set[int]] = {}
        self._ready: set[int] = set()
        self._free = list(range(n))[::-1]
        self._idle: list[Key] = []  # unpinned, still cached: given up oldest first
        self._countdown: dict[int, int] = {}
        self.pins: list[tuple[int, list[Key]]] = []
        self.unpins: list[tuple[int, list[Key]]] = []

    def new_epoch(self, keep: bool = True) -> None:
        for key in list(self._users):
            self._users[key] = set()
            if key not in self._idle:
                self._idle.append(key)
        if not keep:
            for key in list(self._slots):
                self._give_up(key)

    def _give_up(self, key: Key) -> None:
        slot = self._slots.pop(key)
        del self._users[key]
        self._idle.remove(key)
        self._ready.discard(slot)
        self._free.append(slot)

    def pin_window(self, window: int, keys: list[Key]) -> list[Pin] | None:
        new = [key for key in keys if key not in self._slots]
        if new and (not self.room or len(new) > len(self._free) + len([k for k in self._idle if k not in keys])):
            return None
        self.pins.append((window, list(keys)))
        out = []
        for key in keys:
            if key not in self._slots:
                if not self._free:
                    self._give_up(next(k for k in self._idle if k not in keys))
                self._slots[key], self._users[key] = self._free.pop(), set()
                slot = self._slots[key]
                if self.decoder == "workers":
                    out.append(Pin(slot, decode=True, ready=False))
                else:
                    self._countdown[slot] = self.polls
                    out.append(Pin(slot, decode=False, ready=False))
            else:
                slot = self._slots[key]
                out.append(Pin(slot, decode=False, ready=slot in self._ready))
            if key in self._idle:
                self._idle.remove(key)
            self._users[key].add(window)
        return out

    def unpin_window(self, window: int, keys: list[Key]) -> None:
        self.on_unpin(window)
        self.unpins.append((window, list(keys)))
        for key in keys:
            self._users[key].discard(window)
            if not self._users[key]:
                self._idle.append(key)

    def poll(self, slot: int) -> Pin:
        if self.decoder == "others" and slot not in self._ready:
            self._countdown[slot] -= 1
            if self._countdown[slot] <= 0:  # "another process" finished its decode
                self.decode(self.key_of(slot), slot)
                self._ready.add(slot)
        return Pin(slot, decode=False, ready=slot in self._ready)

    def decoded(self, slot: int) -> bool:
        self._ready.add(slot)
        return True

    def slot(self, table: str, chunk: int) -> int:
        return self._slots[(table, chunk)]

    def key_of(self, slot: int) -> Key:
        return next(key for key, s in self._slots.items() if s == slot)

    def decoder_of(self, slot: int) -> int:
        return os.getpid()

    def holders(self) -> dict[int, int]:
        return {}

    def lock_holder(self) -> int:
        return 0

    def watching(self, waiting):
        return contextlib.nullcontext()

    def slots_needed(self, kept: int, pinned: int) -> int:
        return kept

    def close(self) -> None:
        self.memory.close()

    # the test's own look
    def pinned(self, key: Key, window: int) -> bool:
        return window in self._users.get(key, ())

    def ready(self, key: Key) -> bool:
        return key in self._slots and self._slots[key] in self._ready


class RecordingPool(InlinePool):
    """The real worker in this process; records what is sent and calls `before(msg)` first. With `dead`, worker
    0 is reported dead (pid 4242, SIGKILL) and drops what it is sent until it is restarted."""

    def __init__(self, handle, before, dead: bool = False) -> None:
        super().__init__(handle)
        self.before, self.is_dead, self.sent, self.restarts = before, dead, [], 0

    def send(self, wid, msg, waiting=None) -> None:
        self.before(msg)
        self.sent.append(msg)
        if not self.is_dead:
            super().send(wid, msg, waiting)

    def dead(self):
        return [(0, 4242, -9)] if self.is_dead else []

    def restart(self, wid: int) -> None:
        self.is_dead = False
        self.restarts += 1


class SmallSizing(Sizing):
    """One batch per gather message and a ring of 3 slots, so that windows come and go within an epoch."""

    def group(self) -> int:
        return 1

    def ring_slots(self) -> int:
        return 3


class GroupSizing(Sizing):
    """Gather messages of 8 batches (a group spans several windows) and a ring of 16 slots."""

    def group(self) -> int:
        return 8

    def ring_slots(self) -> int:
        return 16


class FakeRun(Run):
    """A `Run` with the test's cache and pool (and `sizing`, a `Sizing` class)."""

    def __init__(self, loader: Loader, plan, make_cache, before, dead: bool = False, restart: bool = False,
                 sizing: type[Sizing] = SmallSizing) -> None:
        self.make_cache, self.before, self.dead = make_cache, before, dead
        workers = WorkerOptions(num_workers=0, restart_workers=restart)
        sizing = sizing(loader.source, workers, 0, remote_store=False, host=False)
        super().__init__(loader.source, sizing, None, plan)

    def _cache(self, plan, need):
        return self.make_cache(self.chunk_slots)

    def _pool(self, setup, args):
        return RecordingPool(setup(0, *args), self.before, self.dead)


class Harness:
    """A loader's source and plan over `data`, a `FakeRun` over them, and the checks every message passes."""

    def __init__(self, data, decoder: str = "workers", slots: int | None = None, **run) -> None:
        self.ds = Dataset.open(data)
        self.loader = Loader(data, "agents", batch_size=16, seed=1, shuffle_window=2, num_workers=0)
        self.plan = self.loader.plan()
        self.source = self.loader.source
        self.decoder, self.slots = decoder, slots
        self.gathers: list[int] = []
        self.current = self.plan  # the epoch being read
        self.run = FakeRun(self.loader, self.plan, self.make_cache, self.before, **run)
        self.cache: FakeCache = self.run.cache  # type: ignore[assignment]

    def decode(self, key: Key, slot: int) -> None:
        """What another process decodes into `slot`: chunk `key`'s records."""
        table, chunk = key
        rows = self.ds.read_rows(table, chunk * CHUNK_ROWS, min((chunk + 1) * CHUNK_ROWS, self.ds.rows[table]))
        raw = rows.view(np.uint8).reshape(-1)
        self.cache.memory.array()[slot * self.cache.memory.slot_bytes:][:raw.size] = raw

    def make_cache(self, n: int) -> FakeCache:
        return FakeCache(self.slots or n, self.source.chunk_bytes, self.decode, self.decoder)

    def before(self, msg) -> None:
        """Every gather message is sent only once every chunk of the windows it reads is pinned and decoded."""
        if isinstance(msg, GatherRows):
            plan = self.current
            assert msg.epoch == plan.epoch
            windows = plan.group_windows(msg.first, msg.count)
            assert sorted(msg.regions) == sorted(windows)
            for w in windows:
                for key in self.source.chunks_of(plan, w):
                    assert self.cache.pinned(key, w), f"chunk {key} of window {w} not pinned before its gather"
                    assert self.cache.ready(key), f"chunk {key} of window {w} not decoded before its gather"
            self.gathers.append(msg.first)

    def epoch(self, plan=None, keep: bool = True) -> Epoch:
        self.current = plan = plan or self.plan
        self.gathers = []
        epoch = Epoch(self.run, plan, 0, keep_cache=keep)

        def on_unpin(w: int) -> None:  # a window is unpinned only once all its batches are made
            first, last = epoch.windows[w]
            assert epoch.done[first:last + 1].all(), f"window {w} unpinned before its batches were made"
        self.cache.on_unpin = on_unpin
        return epoch

    def expected(self, k: int, plan=None) -> np.ndarray:
        return self.ds.read_coordinates("agents", (plan or self.plan).batch_row_ids(k))

    def read_all(self, epoch: Epoch, plan=None) -> None:
        plan = plan or self.plan
        for k in range(len(plan)):
            batch = epoch.get(k)
            want = self.expected(k, plan)
            for name, column in batch.items():
                np.testing.assert_array_equal(column, want[name], err_msg=f"batch {k}, field {name}")
        epoch.drain()

    def close(self) -> None:
        self.run.free()
        self.loader.close()


@pytest.fixture
def harness(data):
    made = []

    def make(**kw) -> Harness:
        made.append(Harness(data, **kw))
        return made[-1]
    yield make
    for h in made:
        h.close()


def test_batches_come_out_in_plan_order_with_every_window_pinned_then_unpinned(harness):
    h = harness(slots=4)  # two windows' chunks: a window is unpinned to make room for the next
    assert h.run.ring.n_slots == 3 and len(h.plan.window_batches()) > 1  # windows come and go
    h.read_all(h.epoch())
    assert h.gathers == list(range(len(h.plan)))  # one message per batch, in order
    assert {w for w, _ in h.cache.unpins}, "no window was unpinned within the epoch"
    for w, keys in h.cache.unpins:
        assert keys == h.source.chunks_of(h.plan, w)
    assert h.run.chunks_decoded == len({k for w in h.plan.window_batches() for k in h.source.chunks_of(h.plan, w)})


def test_the_ring_is_never_written_ahead_of_its_free_slots(harness):
    h = harness()
    epoch = h.epoch()
    for k in range(len(h.plan)):
        epoch.get(k)
        assert epoch.k_issue <= h.run.ring.end(k)  # batch k's slot is still the user's
    epoch.drain()


def test_chunks_another_process_decodes_are_waited_for_by_polling(harness):
    h = harness(decoder="others")
    h.read_all(h.epoch())
    assert h.run.chunks_decoded == 0  # none asked of this loader's workers
    assert not any(isinstance(m, Decode) for m in h.run.pool.sent)


def test_a_chunk_never_decoded_holds_its_batches_back(harness):
    h = harness(decoder="never")
    epoch = h.epoch()
    for _ in range(20):
        epoch._receive(0)
        epoch._issue()
    assert not h.gathers and not epoch.done.any()
    assert any(epoch.pending.values())


def test_a_batch_waited_for_goes_once_its_own_windows_are_decoded_not_its_whole_group(harness):
    """The first batch of a group that spans several windows is gathered as soon as its own windows are decoded,
    not once every window of the group is (four windows of video frames before a LeRobot first batch)."""
    h = harness(sizing=GroupSizing)
    first_windows = set(h.plan.group_windows(0, 1))
    assert len(h.plan.group_windows(0, 8)) > len(first_windows)  # the group reads windows batch 0 does not
    pin = h.cache.pin_window

    def later_windows_never_decode(window, keys):
        h.cache.decoder = "workers" if window in first_windows else "never"
        return pin(window, keys)
    h.cache.shared = True  # (the scheduler polls for chunks others decode)
    h.cache.pin_window = later_windows_never_decode
    epoch = h.epoch()
    for _ in range(20):
        epoch._receive(0)
        epoch._issue()
    assert h.gathers and h.gathers[0] == 0 and epoch.done[0]
    assert not epoch.done[-1]  # the batches of the undecoded windows wait


def test_a_gather_message_holds_at_most_8_mib_of_batches_so_the_ring_stays_small():
    """Batches of camera frames (3.5 MB each, 25 rows touched per sample) go at most 8 MiB to a message, so the
    ring (two messages per worker, mapped before the first batch) stays small; small batches keep their groups."""
    def sizing(rows: int, slot_bytes: int) -> Sizing:
        source = SimpleNamespace(rows_touched=lambda: rows, layout=SimpleNamespace(slot_bytes=slot_bytes))
        return Sizing(source, WorkerOptions(num_workers=2), 0, remote_store=False)  # type: ignore[arg-type]
    frames = sizing(64 * 25, 3_600_000)
    assert frames.group() == 2
    assert frames.ring_slots() * 3_600_000 <= 64 << 20
    assert sizing(4096, 400_000).group() == 8  # 32,768 rows a message, as before
    assert sizing(64 * 25, 64 << 20).group() == 1


def test_a_cache_with_no_room_waits_and_goes_on_once_there_is(harness):
    h = harness()
    h.cache.room = False
    epoch = h.epoch()
    for _ in range(5):
        epoch._receive(0)
        epoch._issue()
    assert epoch.no_room and not h.gathers and not h.cache.pins
    h.cache.room = True
    h.read_all(epoch)
    assert not epoch.no_room and h.gathers == list(range(len(h.plan)))


def test_an_epoch_that_keeps_the_cache_decodes_nothing_again_and_one_that_forgets_decodes_all(harness):
    h = harness(slots=64)  # room for every chunk
    h.read_all(h.epoch())
    n = h.run.chunks_decoded
    assert n > 0
    plan = EpochPlan(h.plan.config, 1, h.source.selection)
    h.read_all(h.epoch(plan, keep=True), plan)
    assert h.run.chunks_decoded == 0
    plan = EpochPlan(h.plan.config, 2, h.source.selection)
    h.read_all(h.epoch(plan, keep=False), plan)
    assert h.run.chunks_decoded == n


def test_a_dead_worker_is_reported(harness):
    h = harness(dead=True)
    with pytest.raises(LoaderError, match=r"loader worker 0 \(pid 4242\) killed by SIGKILL during epoch 0"):
        h.epoch().get(0)


def test_a_dead_worker_is_restarted_and_sent_its_messages_again(harness):
    h = harness(dead=True, restart=True)
    h.read_all(h.epoch())
    assert h.run.pool.restarts == 1
