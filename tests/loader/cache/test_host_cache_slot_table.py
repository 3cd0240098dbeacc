"""The host cache's slot table under every order of events: pins, releases, decodes that finish or
fail, claims given up, and processes killed (idle or in the middle of a decode), by several processes at once
on budgets of 1 to 3 slots. After every step the table's invariants hold (`HostSegment.check()`, in this
process and in each live one), every chunk read holds its own bytes, and a pin is refused exactly when the
chunks pinned or being decoded leave no slot for it. Then a soak: 4 processes of loaders on 1-slot budgets
check every row they get against its `_row`."""
import hashlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from zarrfeed.loader.caches import host_cache

SLOT_BYTES = 4096
N_CHUNKS = 5
MAX_ACTORS = 3


def pattern(cid: int) -> np.ndarray:
    """What chunk `cid` decodes to: a slot of its own bytes, told apart from every other chunk's."""
    return np.full(SLOT_BYTES // 8, cid * 1_000_003 + 7, np.int64).view(np.uint8)


def cache_key(identity: str) -> host_cache.CacheKey:
    return host_cache.CacheKey(identity, ("agents",), (N_CHUNKS,), SLOT_BYTES)


# ------------------------------------------------------------ a process that uses the cache, driven over a pipe
def actor(conn, identity: str) -> None:
    """Attach to the cache of `identity` and do what the pipe says, replying to each message."""
    seg = host_cache.attach(cache_key(identity), budget=1 << 30, want=1, need=1)
    slots: dict[int, int] = {}  # chunk -> the slot this process pinned it in
    conn.send(seg.me)
    while True:
        op, cid, arg = conn.recv()
        if op == "pin":
            pins = seg.pin_all(arg)
            if pins is not None:
                for c, pin in zip(arg, pins, strict=True):
                    slots[c] = pin.slot
            conn.send(None if pins is None else [(p.slot, p.decode, p.ready, p.token) for p in pins])
        elif op == "unpin":
            seg.unpin(slots[cid])
            conn.send(None)
        elif op == "poll":
            pin = seg.poll(slots[cid])
            conn.send((pin.slot, pin.decode, pin.ready, pin.token))
        elif op == "decode":  # arg: (token, "ok" | "fail" | "die")
            token, how = arg
            s = slots[cid]
            try:
                with seg.writing(s, token) as mine:
                    if mine:
                        view = seg.array()[s * SLOT_BYTES:(s + 1) * SLOT_BYTES]
                        if how == "ok":
                            view[:] = pattern(cid)
                        else:  # half a chunk of another chunk's bytes, then it fails or dies
                            view[:SLOT_BYTES // 2] = pattern(cid + 1)[:SLOT_BYTES // 2]
                            if how == "die":
                                conn.send("inside")
                                time.sleep(600)
                            raise ValueError("a decode that fails")
                    conn.send(mine)
            except ValueError:
                conn.send(True)
        elif op == "give_up":
            seg.give_up({slots[cid]: arg})
            conn.send(None)
        elif op == "read":
            s = slots[cid]
            ready = seg.is_ready(s)
            conn.send((ready, not ready or bool(np.array_equal(seg.array()[s * SLOT_BYTES:(s + 1) * SLOT_BYTES],
                                                               pattern(cid)))))
        elif op == "check":
            conn.send(seg.check())
        elif op == "close":
            host_cache.detach(seg)
            conn.send(None)
            return


class Actor:
    def __init__(self, ctx, identity: str) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=actor, args=(child, identity), daemon=True)
        self.proc.start()
        child.close()
        assert self.conn.poll(60), "an actor did not attach within 60 s"
        self.me = self.conn.recv()
        self.pins: dict[int, int] = {}  # chunk -> times pinned
        self.slot: dict[int, int] = {}

    def ask(self, op: str, cid: int = -1, arg=None):
        self.conn.send((op, cid, arg))
        assert self.conn.poll(60), f"an actor did not answer {op} within 60 s"
        return self.conn.recv()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(30)
        self.conn.close()


class HostCacheMachine(RuleBasedStateMachine):
    """The model: which chunks each live actor pins, and for each chunk the last claim to decode it (actor,
    token) and whether that claim ended (decoded, failed or given up)."""

    def __init__(self) -> None:
        super().__init__()
        self.ctx = multiprocessing.get_context("fork")
        self.actors: list[Actor] = []
        self.claim: dict[int, tuple[Actor, int]] = {}
        self.ended: set[int] = set()
        self.holder: host_cache.HostSegment | None = None

    @initialize(n_slots=st.integers(1, 3))
    def make_cache(self, n_slots: int) -> None:
        identity = hashlib.sha256(f"invariants{os.getpid()}{time.time_ns()}".encode()).hexdigest()[:32]
        self.identity, self.n_slots = identity, n_slots
        self.holder = host_cache.attach(cache_key(identity), budget=1 << 30, want=n_slots, need=n_slots)
        assert self.holder.n_slots == n_slots

    def teardown(self) -> None:
        for a in self.actors:
            a.kill()
        if self.holder is not None:
            host_cache.detach(self.holder)

    # ------------------------------------------------------------ the model
    def needed(self, more: set[int]) -> int:
        """Slots that the chunks pinned by live actors, the chunks claimed by a live actor and neither decoded
        nor given up, and `more` take: one each."""
        pinned = {c for a in self.actors for c, n in a.pins.items() if n}
        claimed = {c for c, (a, _) in self.claim.items() if c not in self.ended and a in self.actors}
        return len(pinned | claimed | more)

    def record(self, a: Actor, cid: int, pin) -> None:
        slot, decode, ready, token = pin
        assert 0 <= slot < self.n_slots, f"chunk {cid} was given slot {slot} of {self.n_slots}"
        a.slot[cid] = slot
        if decode:
            self.claim[cid] = (a, token)
            self.ended.discard(cid)

    def live(self, claimed: bool = False) -> list[tuple[Actor, int]]:
        """(actor, chunk) for every chunk a live actor pins (with `claimed`: that it claimed and has not decoded
        or given up)."""
        out = []
        for a in self.actors:
            for c, n in a.pins.items():
                if n and (not claimed or (self.claim.get(c, (None, 0))[0] is a and c not in self.ended)):
                    out.append((a, c))
        return out

    # ------------------------------------------------------------ rules
    @precondition(lambda self: len(self.actors) < MAX_ACTORS)
    @rule()
    def start(self) -> None:
        self.actors.append(Actor(self.ctx, self.identity))

    @precondition(lambda self: self.actors)
    @rule(data=st.data(), chunks=st.lists(st.integers(0, N_CHUNKS - 1), min_size=1, max_size=3, unique=True))
    def pin(self, data, chunks: list[int]) -> None:
        a = data.draw(st.sampled_from(self.actors))
        fits = self.needed(set(chunks)) <= self.n_slots
        pins = a.ask("pin", arg=chunks)
        assert (pins is not None) == fits, (f"pin {chunks}: {'refused' if pins is None else 'given'} with "
                                            f"{self.needed(set(chunks))} slots needed of {self.n_slots}")
        if pins is not None:
            assert len({p[0] for p in pins}) == len(pins), f"chunks {chunks} share slots: {pins}"
            for c, pin in zip(chunks, pins, strict=True):
                self.record(a, c, pin)
                a.pins[c] = a.pins.get(c, 0) + 1

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def unpin(self, data) -> None:
        a, c = data.draw(st.sampled_from(self.live()))
        a.ask("unpin", c)
        a.pins[c] -= 1

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def poll(self, data) -> None:
        a, c = data.draw(st.sampled_from(self.live()))
        self.record(a, c, a.ask("poll", c))

    @precondition(lambda self: self.live(claimed=True))
    @rule(data=st.data(), how=st.sampled_from(["ok", "ok", "fail", "die"]))
    def decode(self, data, how: str) -> None:
        a, c = data.draw(st.sampled_from(self.live(claimed=True)))
        reply = a.ask("decode", c, (self.claim[c][1], how))
        if how == "die":
            assert reply == "inside", "a current claim was refused its decode"
            self.die(a)
            return
        assert reply is True, "a current claim was refused its decode"
        self.ended.add(c)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def stale_decode(self, data) -> None:
        """A late worker: a decode under an old token (or another actor's) never writes."""
        a, c = data.draw(st.sampled_from(self.live()))
        token = self.claim[c][1]
        if c not in self.ended:  # a current claim, whoever made it: the token before it
            token -= 1
        assert a.ask("decode", c, (token, "ok")) is False, f"a stale decode of chunk {c} wrote into its slot"

    @precondition(lambda self: self.live(claimed=True))
    @rule(data=st.data())
    def give_up(self, data) -> None:
        a, c = data.draw(st.sampled_from(self.live(claimed=True)))
        a.ask("give_up", c, self.claim[c][1])
        self.ended.add(c)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def read(self, data) -> None:
        a, c = data.draw(st.sampled_from(self.live()))
        ready, right = a.ask("read", c)
        assert right, f"chunk {c} is READY in slot {a.slot[c]} with another chunk's bytes"

    @precondition(lambda self: self.actors)
    @rule(data=st.data())
    def kill(self, data) -> None:
        self.die(data.draw(st.sampled_from(self.actors)))

    @precondition(lambda self: self.actors)
    @rule(data=st.data())
    def close(self, data) -> None:
        a = data.draw(st.sampled_from(self.actors))
        a.ask("close")
        a.proc.join(30)
        self.actors.remove(a)

    def die(self, a: Actor) -> None:
        a.kill()
        self.actors.remove(a)

    @invariant()
    def table_holds(self) -> None:
        if self.holder is None:
            return
        assert self.holder.check() == []
        for a in self.actors:
            assert a.ask("check") == [], f"actor {a.me}"


HostCacheMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                                              suppress_health_check=list(HealthCheck))
test_host_cache_state_machine = HostCacheMachine.TestCase


def test_a_cached_chunk_of_the_same_request_is_not_room_for_another():
    """One slot holding chunk 0, unpinned; pinning [1, 0] needs two slots. Today the slot of chunk 0 counts as
    room, chunk 1 takes it, chunk 0 is then handed slot -1 (numpy's last slot) and the directory names the
    slot for two chunks. Expected: refused, and the table as it was."""
    identity = hashlib.sha256(f"same-request{os.getpid()}{time.time_ns()}".encode()).hexdigest()[:32]
    seg = host_cache.attach(cache_key(identity), budget=1 << 30, want=1, need=1)
    try:
        assert seg.n_slots == 1
        [pin] = seg.pin_all([0])
        with seg.writing(pin.slot, pin.token) as mine:
            assert mine
            seg.array()[:SLOT_BYTES] = pattern(0)
        seg.unpin(pin.slot)
        before = [a.copy() for a in (seg.directory, seg.chunk, seg.state, seg.gen, seg.pins)]
        assert seg.pin_all([1, 0]) is None
        assert seg.check() == []
        for a, b in zip((seg.directory, seg.chunk, seg.state, seg.gen, seg.pins), before, strict=True):
            np.testing.assert_array_equal(a, b)
        [again] = seg.pin_all([0])
        assert again.ready and again.slot == pin.slot
        seg.unpin(again.slot)
    finally:
        host_cache.detach(seg)


def test_a_table_that_contradicts_itself_is_refused_and_left_as_it_was():
    """A directory naming a slot that holds another chunk (damage, or a bug) is never handed out as that chunk:
    pin_all raises `CacheInvariantError` naming the slot and the chunk, changes nothing, and check() says
    what is wrong."""
    identity = hashlib.sha256(f"contradicts{os.getpid()}{time.time_ns()}".encode()).hexdigest()[:32]
    seg = host_cache.attach(cache_key(identity), budget=1 << 30, want=2, need=2)
    try:
        pins = seg.pin_all([0, 1])
        for c, p in enumerate(pins):
            with seg.writing(p.slot, p.token) as mine:
                assert mine
                seg.array()[p.slot * SLOT_BYTES:(p.slot + 1) * SLOT_BYTES] = pattern(c)
            seg.unpin(p.slot)
        seg.directory[1] = pins[0].slot  # chunk 1 said to be where chunk 0 is
        before = [a.copy() for a in (seg.directory, seg.chunk, seg.state, seg.gen, seg.pins)]
        with pytest.raises(host_cache.CacheInvariantError, match=f"slot {pins[0].slot} for chunk 1"):
            seg.pin_all([2, 1])
        for a, b in zip((seg.directory, seg.chunk, seg.state, seg.gen, seg.pins), before, strict=True):
            np.testing.assert_array_equal(a, b)
        assert any(f"names slot {pins[0].slot} for chunk 1" in v for v in seg.check())
    finally:
        host_cache.detach(seg)


SOAK = """
import sys, time
import numpy as np
from zarrfeed.loader import Dataset, Loader

if __name__ == "__main__":
    path, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ds = Dataset.open(path)
    agents = ds["agents"][: ds.rows["agents"]]
    rows = bad = epochs = 0
    deadline = time.monotonic() + seconds
    with Loader(path, "agents", cache="host", cache_bytes=1, num_workers=1, row_ids=True, seed=seed,
                start_method="fork") as loader:
        while epochs < 3 and (epochs < 1 or time.monotonic() < deadline):
            for batch in loader:
                want = agents[batch["_row"]]
                for name in want.dtype.names:
                    if not np.array_equal(batch[name], want[name]):
                        bad += 1
                        print(f"batch rows {batch['_row'][:3]}...: field {name} differs", flush=True)
                        break
                rows += len(batch["_row"])
            epochs += 1
    print("rows", rows, "bad", bad, "epochs", epochs, flush=True)
"""


def test_four_processes_on_one_slot_budgets_read_every_row_as_its_id(small_dataset, tmp_path):
    """4 processes (seeds 1-4) read one dataset of 24 scenes with `cache_bytes=1` (the host cache holds only
    what a loader needs at once, about half the table's 100 chunks, so windows evict each other's chunks) and
    `row_ids=True`: every field of every row equals the table's row at its `_row`, for 1 to 3 epochs each
    (bounded by time). Before the fix of `pin_all`, most rounds gave rows that were not their `_row`'s,
    `KeyError` from `HostCache._release` and healthy chunks said to be corrupt."""
    data = small_dataset(24, 35, chunks={"agents": 5000})
    script = tmp_path / "soak.py"
    script.write_text(SOAK)
    procs = [subprocess.Popen([sys.executable, str(script), str(data), str(seed), "20"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in (1, 2, 3, 4)]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        last = out.split()
        assert last[-3] == "0" and int(last[-5]) > 0, out[-3000:]
