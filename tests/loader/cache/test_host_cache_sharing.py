"""One decoded copy per host: ranks in separate processes share one chunk cache, a decode is done
once per host, a process that dies mid-decode leaves nothing read as decoded, nothing outlives the last
process, datasets and commits never mix, and another user cannot open the cache."""
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from expected import dev_shm_held, session, shared_memory_held
from repo_paths import SUPPORT
from zarrfeed.core._proc import rendezvous
from zarrfeed.loader import Dataset, Loader, WindowLoader
from zarrfeed.loader.caches import host_budget, host_cache
from zarrfeed.writer import DatasetWriter, synthetic

HERE = Path(__file__).resolve().parent
CHUNKS = {"agents": 2000, "frames": 200, "traffic_light_faces": 500}


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(8, 22, chunks=CHUNKS, frames=120, agents_per_frame=30)


def digest(batch) -> str:
    h = hashlib.sha256()
    for name in sorted(batch):
        h.update(name.encode())
        h.update(np.ascontiguousarray(batch[name]).tobytes())
    return h.hexdigest()[:16]


def reference(path, rank, world, epochs, **kw):
    """Each epoch's batch digests for one rank, from a loader with a cache of its own, in this process."""
    with Loader(path, num_workers=0, cache="process", rank=rank, world_size=world, **kw) as loader:
        return [[digest(b) for b in loader] for _ in range(epochs)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_pss(pids) -> int:
    """Bytes of the host caches' pages these processes map, each shared page counted once (PSS)."""
    total = 0
    for pid in pids:
        in_cache = False
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            if not line[:1].isupper():  # a mapping's header line: address range, perms, ..., path
                in_cache = "memfd:zarrfeed-cache" in line
            elif in_cache and line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    return total


def rank_epochs(path, rank: int, world: int, url: str, cache: str) -> dict:
    """One rank of a gloo group on 127.0.0.1: 3 epochs' batch digests and chunks decoded, then the PSS of
    the host cache's pages in this rank and its workers (measured while every rank still maps the cache)."""
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=url)
    loader = Loader(path, batch_size=1000, num_workers=1, seed=5, cache=cache)
    loader.use_ranks(dist.get_rank(), dist.get_world_size())
    dist.barrier()
    out: dict = {"epochs": []}
    for _ in range(3):
        digests = [digest(b) for b in loader]
        out["epochs"].append({"decoded": loader.chunks_decoded, "digests": digests})
        dist.barrier()
    out["pss"] = cache_pss([os.getpid(), *loader.worker_pids])
    dist.barrier()
    loader.close()
    dist.destroy_process_group()
    return out


SPAWNED = """
import json, sys
sys.path[:0] = [{tests!r}, {support!r}]
from test_host_cache_sharing import rank_epochs
if __name__ == "__main__":
    print(json.dumps(rank_epochs({path!r}, int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])))
"""

FORKED = """
import json, sys
import torch.multiprocessing as mp
sys.path[:0] = [{tests!r}, {support!r}]
from test_host_cache_sharing import rank_epochs

def rank_main(rank, world, url, cache, out):
    with open(f"{{out}}/{{rank}}.json", "w") as f:
        json.dump(rank_epochs({path!r}, rank, world, url, cache), f)

if __name__ == "__main__":
    mp.start_processes(rank_main, args=(4, sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=4,
                       start_method=sys.argv[4])
"""


def run_ranks(how: str, data, tmp_path, cache: str) -> list[dict]:
    """4 ranks, started as separate processes ("shells": as torchrun or a user in 4 shells does) or by
    torch.multiprocessing from one parent ("fork", "spawn": as mp.spawn does)."""
    url = f"tcp://127.0.0.1:{free_port()}"
    script = tmp_path / "ranks.py"
    script.write_text((SPAWNED if how == "shells" else FORKED).format(tests=str(HERE), support=str(SUPPORT),
                                                                             path=str(data)))
    if how == "shells":
        cmds = [[sys.executable, str(script), str(r), "4", url, cache] for r in range(4)]
    else:
        cmds = [[sys.executable, str(script), url, cache, str(tmp_path), how]]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cmd in cmds]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:  # a rank that failed leaves the others waiting in gloo: never leave them behind
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    if how == "shells":
        return [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(4)]


@pytest.mark.parametrize("how, mode", [("shells", "host"), ("shells", "process"), ("fork", "host"),
                                       ("spawn", "host")])
def test_four_torch_ranks_decode_each_chunk_once_per_host(data, tmp_path, how, mode):
    """4 ranks (gloo on 127.0.0.1; separate processes, or forked by torch.multiprocessing), 3 epochs: each
    rank's batches are today's; with the host cache the chunks decoded summed over ranks are the table's in
    epoch 1 and none after, and the cache's pages are counted once; with cache="process" every rank decodes
    the chunks it reads itself (what the host cache is for)."""
    pytest.importorskip("torch")
    results = run_ranks(how, data, tmp_path, mode)
    ds = Dataset.open(data)
    table_chunks = -(-ds.rows["agents"] // CHUNKS["agents"])
    for rank, res in enumerate(results):
        ref = reference(data, rank, 4, 3, batch_size=1000, seed=5)
        assert [e["digests"] for e in res["epochs"]] == ref
    decoded = [sum(r["epochs"][e]["decoded"] for r in results) for e in range(3)]
    table_bytes = ds.rows["agents"] * ds["agents"].dtype.itemsize
    pss = sum(r["pss"] for r in results)
    if mode == "host":
        assert decoded == [table_chunks, 0, 0]
        assert 0.9 * table_bytes <= pss <= 1.1 * table_bytes + (1 << 20)
    else:
        # each rank decodes the chunks it reads itself (with the whole table one window: every chunk, kept)
        assert decoded[0] == 4 * table_chunks
        assert pss == 0


KILLED_RANK = """
import sys, time
from zarrfeed.loader import Loader
if __name__ == "__main__":
    loader = Loader({path!r}, batch_size=500, num_workers=1, seed=1, rank=int(sys.argv[1]), world_size=3)
    for i, batch in enumerate(loader):
        if i == 0:
            print("reading", flush=True)
        time.sleep(float(sys.argv[2]))
    for batch in loader:
        pass
    print("done", flush=True)
"""


def test_a_rank_killed_mid_epoch_leaves_the_others_right_and_nothing_behind(data, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(KILLED_RANK.format(path=str(data)))
    slow = [subprocess.Popen([sys.executable, str(script), str(r), "0.02"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True) for r in (0, 1)]
    victim = subprocess.Popen([sys.executable, str(script), "2", "1"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert victim.stdout.readline().strip() == "reading"

    def ours() -> list[int]:  # this test's processes, workers included (other jobs may run on the machine)
        return [pid for p in (*slow, victim) for pid in session(p.pid)]
    assert dev_shm_held(ours()) == []  # its memory is in memfds, never in /dev/shm
    victim.kill()
    victim.wait(timeout=10)
    outs = [p.communicate(timeout=300) for p in slow]
    assert all(p.returncode == 0 for p in slow), [o[1][-3000:] for o in outs]
    assert all(o[0].split()[-1] == "done" for o in outs)
    ds = Dataset.open(data)
    ident = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize).identity
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (held := [h for h in shared_memory_held(ours()) if ident in h]):
        time.sleep(0.2)  # the victim's worker notices its parent's death
    assert not held
    assert not rendezvous.served(f"cache/{ident}")


def test_ranks_batches_are_right_with_a_killed_neighbour(data, tmp_path):
    """Checked in process: while another process holds the host cache and dies mid-decode, a loader here
    decodes what it left and yields exactly the batches of a loader with a cache of its own."""
    ds = Dataset.open(data)
    key = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize)
    holder = host_cache.attach(key, 1 << 30, 1 << 20, 1)  # keeps the cache alive while the child comes and dies
    try:
        child = os.fork()
        if child == 0:  # claims chunks 0-2, writes garbage into chunk 0's slot mid-"decode", and is killed
            try:
                seg = host_cache.attach(key, 1 << 30, 1 << 20, 1)
                slots = host_cache.HostCache(seg, key)
                pins = slots.pin_window(0, [("agents", 0), ("agents", 1), ("agents", 2)])
                with seg.writing(pins[0].slot, pins[0].token):
                    seg.array()[pins[0].slot * seg.slot_bytes:][:1000] = 0xFF
                    os.kill(os.getpid(), signal.SIGSTOP)
            finally:
                os._exit(1)
        _, status = os.waitpid(child, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        with Loader(data, batch_size=700, num_workers=2, seed=9) as loader:
            got = [digest(b) for b in loader]
            assert loader.chunks_decoded == -(-ds.rows["agents"] // CHUNKS["agents"])
        assert got == reference(data, 0, 1, 1, batch_size=700, seed=9)[0]
    finally:
        host_cache.detach(holder)


def test_two_datasets_and_two_commits_side_by_side_never_mix(data, tmp_path):
    """Copies of one dataset keep its id; appended differently they reach the same commit number. Loaders
    of both copies at both commits, all alive at once, each read exactly their own rows."""
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    shutil.copytree(data, a)
    shutil.copytree(data, b)
    first = Dataset.open(a).commit
    for path, seed in ((a, 1), (b, 2)):
        with DatasetWriter(path, mode="a", workers=0) as writer:
            writer.ingest(synthetic.episodes(2, seed=seed, frames=120, agents_per_frame=30))
    assert Dataset.open(a).commit == Dataset.open(b).commit
    loaders = {(p.name, c): Loader(p, batch_size=900, num_workers=1, seed=3, commit=c)
               for p in (a, b) for c in (first, None)}
    try:
        got = {k: [digest(x) for x in loader] for k, loader in loaders.items()}
        for (name, c), digests in got.items():
            with Loader(tmp_path / name, batch_size=900, num_workers=0, seed=3, commit=c, cache="process") as ref:
                assert digests == [digest(x) for x in ref], (name, c)
        assert got[("a.zarr", None)] != got[("b.zarr", None)]
    finally:
        for loader in loaders.values():
            loader.close()


def test_window_loaders_share_the_host_cache_too(data):
    with WindowLoader(data, history=3, future=3, batch_size=64, num_workers=1, seed=2) as one, \
            WindowLoader(data, history=3, future=3, batch_size=64, num_workers=1, seed=2) as two:
        first = [digest(x) for x in one]
        assert one.chunks_decoded > 0
        assert [digest(x) for x in two] == first
        assert two.chunks_decoded == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_cannot_open_the_cache(data):
    with Loader(data, batch_size=500, num_workers=0) as loader:
        batches = iter(loader)
        next(batches)  # the loader holds the host cache while its iteration is open
        servers = rendezvous.served("cache/")
        assert servers
        assert rendezvous.ask(servers[0]) is not None  # this user is served
        child = os.fork()
        if child == 0:
            os.setgid(65534)
            os.setuid(65534)
            os._exit(0 if all(rendezvous.ask(s) is None for s in servers) else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_cache_option_is_checked(data):
    with pytest.raises(ValueError, match="cache must be one of 'host', 'process', 'off'"):
        Loader(data, cache="shared")
    with Loader(data, batch_size=500, num_workers=0, cache="off") as off:
        list(off)
        list(off)
        assert off.chunks_decoded == -(-Dataset.open(data).rows["agents"] // CHUNKS["agents"])


def test_a_decode_sent_again_after_its_worker_wrote_it_and_died_is_answered(data):
    """A restarted worker gets the dead worker's unanswered Decode again; if the dead one had written a slot
    (READY) before it died, the new one skips it but must still answer for every slot of the message, or the
    scheduler waits for that slot for ever (found: test_loader's worker restart hung with the host cache)."""
    from zarrfeed.loader.engine import read_worker
    from zarrfeed.loader.engine.fetch import FetchOptions
    from zarrfeed.loader.engine.messages import Decode, DecodeItem

    ds = Dataset.open(data)
    key = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize)
    seg = host_cache.attach(key, 1 << 30, 1 << 20, 1)
    try:
        slots = host_cache.HostCache(seg, key)
        pins = slots.pin_window(0, [("agents", 0), ("agents", 1)])
        msg = Decode(tuple(DecodeItem("agents", c, p.slot, p.token) for c, p in enumerate(pins)))
        shared = read_worker.Shared(seg, 0, 0, 64, 1)
        opener = read_worker.DatasetOpener.of(ds, FetchOptions())
        decode = read_worker.ChunkDecoder(opener, ["agents"], shared)
        assert decode(msg) == tuple(p.slot for p in pins)  # the dead worker's work
        assert decode(msg) == tuple(p.slot for p in pins)  # sent again: nothing to write, every slot answered
        assert all(slots.decoded(p.slot) for p in pins)
        shared.close()
        slots.close()
    finally:
        host_cache.detach(seg)


def test_four_remote_ranks_through_one_server_decode_each_chunk_once(data):
    """The server serves all its streams from the host cache: 4 ranks reading one dataset through
    `zarrfeed serve` decode each chunk once in their first epoch and none in the next (the server's status
    counts what its streams decoded)."""
    import threading

    from serve_process import Server
    from zarrfeed.flight import RemoteLoader
    from zarrfeed.flight.protocol import call_options, connect

    s = Server(data)
    try:
        client = connect(s.url)

        def decoded() -> int:
            from pyarrow import flight
            doc = json.loads(list(client.do_action(flight.Action("status", b""), call_options(None)))[0].body
                             .to_pybytes())
            return doc["totals"]["chunks_decoded"]

        loaders = [RemoteLoader(s.url, "agents", batch_size=1000, seed=5, rank=r, world_size=4) for r in range(4)]
        got: dict[int, list] = {}

        def epoch(r: int) -> None:
            got.setdefault(r, []).append([digest(b) for b in loaders[r]])

        table_chunks = -(-Dataset.open(data).rows["agents"] // CHUNKS["agents"])
        for expected in (table_chunks, table_chunks):  # the second epoch adds nothing
            threads = [threading.Thread(target=epoch, args=(r,)) for r in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert decoded() == expected
        for r in range(4):
            assert got[r] == reference(data, r, 4, 2, batch_size=1000, seed=5)
        for loader in loaders:
            loader.close()
    finally:
        s.stop()


def test_a_stopped_decoder_is_said_in_the_log_and_its_chunk_decoded_once_it_dies(data, monkeypatch, caplog):
    """Another process stopped (SIGSTOP) while decoding a chunk makes a loader wait for it: the wait is said
    in the log, naming the chunk and the process, never silent; once that process dies the loader decodes
    the chunk itself and its batches are right."""
    import logging
    import threading

    from zarrfeed.loader.engine import scheduler

    monkeypatch.setattr(scheduler, "_SLOW_DECODE", 0.5)
    ds = Dataset.open(data)
    key = host_cache.CacheKey.of(ds, CHUNKS["agents"] * ds["agents"].dtype.itemsize)
    holder = host_cache.attach(key, 1 << 30, 1 << 20, 1)
    try:
        child = os.fork()
        if child == 0:
            try:
                seg = host_cache.attach(key, 1 << 30, 1 << 20, 1)
                pins = host_cache.HostCache(seg, key).pin_window(0, [("agents", c) for c in range(3)])
                with seg.writing(pins[0].slot, pins[0].token):
                    os.kill(os.getpid(), signal.SIGSTOP)
            finally:
                os._exit(1)
        _, status = os.waitpid(child, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        got: list = []
        with caplog.at_level(logging.WARNING, logger="zarrfeed"):
            def read() -> None:
                with Loader(data, batch_size=700, num_workers=0, seed=9) as loader:
                    got.extend(digest(b) for b in loader)

            reader = threading.Thread(target=read)
            reader.start()
            deadline = time.monotonic() + 30
            while "which process" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
            assert re.search(r"waiting for chunk \d+ of table 'agents', which process \d+ is decoding", caplog.text)
            assert reader.is_alive()  # still waiting: the stopped process holds the chunk
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            reader.join(60)
        assert not reader.is_alive()
        assert got == reference(data, 0, 1, 1, batch_size=700, seed=9)[0]
    finally:
        host_cache.detach(holder)


HOLD_KEY = """
import sys
from zarrfeed.loader.caches import host_cache
if __name__ == "__main__":
    key = host_cache.CacheKey(sys.argv[1], ("agents",), (int(sys.argv[2]),), int(sys.argv[3]))
    seg = host_cache.attach(key, budget=int(sys.argv[4]), want=10**6, need=1)
    print(seg.n_slots, flush=True)
    sys.stdin.readline()
"""


def test_caches_of_several_datasets_share_one_budget_per_host(tmp_path, caplog):
    """The host's ceiling holds across datasets and processes: a cache made while others live gets what they
    leave of it (and never less than the slots its loaders need at once, said in the log), and the room of a
    cache whose processes all died, SIGKILL included, is free again. `usage()` shows each cache's share
    against what its loaders asked for."""
    def key(name: str, chunks: int) -> host_cache.CacheKey:
        return host_cache.CacheKey(hashlib.sha256(f"{name}{os.getpid()}{tmp_path}".encode()).hexdigest()[:32],
                                   ("agents",), (chunks,), 1000)
    a, b, c, d = key("a", 100), key("b", 100), key("c", 100), key("d", 100)
    if host_budget.usage() is not None:
        pytest.fail(f"processes of this user already hold host caches: {host_budget.usage()}")
    script = tmp_path / "hold.py"
    script.write_text(HOLD_KEY)
    holder = subprocess.Popen([sys.executable, str(script), a.identity, "100", "1000", "150000"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    segs = []
    try:
        assert holder.stdout.readline().strip() == "100"  # all its chunks fit
        use = host_budget.usage()
        assert (use.budget, use.set_by, use.used) == (150_000, holder.pid, 100_000)
        segs.append(host_cache.attach(b, budget=150_000, want=100, need=10))  # more than the ceiling left
        assert segs[-1].n_slots == 50  # what the other dataset's cache left
        assert "holds 50 of the 100 chunks this loader asked for" in caplog.text
        segs.append(host_cache.attach(c, budget=150_000, want=100, need=10))
        assert segs[-1].n_slots == 10  # nothing left: only what its loaders need at once, and said so
        assert "beyond it" in caplog.text and "other datasets or jobs hold" in caplog.text
        assert {(u.identity, u.nbytes, u.short) for u in host_budget.usage().caches} == \
            {(a.identity, 100_000, 0), (b.identity, 50_000, 50_000), (c.identity, 10_000, 90_000)}
        holder.kill()
        holder.wait()
        assert {u.identity for u in host_budget.usage().caches} == {b.identity, c.identity}
        segs.append(host_cache.attach(d, budget=150_000, want=100, need=1))
        assert segs[-1].n_slots == 90  # the dead process's room is free again
        assert host_budget.usage().used == 150_000
    finally:
        holder.kill()
        for seg in segs:
            host_cache.detach(seg)
    assert host_budget.usage() is None  # the last process gone: no ledger left
    assert not rendezvous.served("budget") and not any(rendezvous.served(f"cache/{k.identity}") for k in (a, b, c, d))


def test_a_process_joining_a_smaller_cache_than_it_asked_for_says_so(tmp_path, caplog):
    """Another process made a dataset's cache with 20 slots (it asked for 20 kB); a loader here asks for
    100 kB of it. The cache keeps its size while the other process holds it: this process's log says that it
    holds less than was asked for here, and why; `usage()` shows the cache short of the larger ask."""
    key = host_cache.CacheKey(hashlib.sha256(f"join{os.getpid()}{tmp_path}".encode()).hexdigest()[:32],
                              ("agents",), (100,), 1000)
    script = tmp_path / "hold.py"
    script.write_text(HOLD_KEY)
    holder = subprocess.Popen([sys.executable, str(script), key.identity, "100", "1000", "20000"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "20"
        caplog.set_level(logging.WARNING, logger="zarrfeed")
        seg = host_cache.attach(key, budget=100_000, want=100, need=1)
        try:
            assert seg.n_slots == 20
            assert "holds 20 of the 100 chunks this loader asked for (19.5 KiB of 97.7 KiB): another process " \
                "made it" in caplog.text
            [use] = host_budget.usage().caches
            assert (use.nbytes, use.asked, use.short) == (20_000, 100_000, 80_000)
        finally:
            host_cache.detach(seg)
    finally:
        holder.kill()
        holder.wait()


HOLD_LOADER = """
import sys
from zarrfeed.loader import Loader
if __name__ == "__main__":
    with Loader(sys.argv[1], batch_size=1000, num_workers=0, seed=1, cache_bytes=int(sys.argv[2])) as loader:
        batches = iter(loader)
        for _ in range(len(loader)):
            next(batches)
        print("ready", flush=True)
        sys.stdin.readline()
"""


def test_a_job_with_a_small_budget_does_not_shrink_another_jobs_cache(small_dataset, tmp_path, caplog):
    """Job A holds `Loader(..., cache_bytes=1)` open on one dataset; job B then reads another with a budget
    for all its chunks: B's cache holds them all (each chunk decoded once, none in the next epoch), not the
    few chunks that A's 1 byte left (today the first job's budget caps every cache on the host: B re-decodes
    nearly everything every epoch). `usage()` shows each job's share. Job C then asks for as much as B: the
    host's ceiling (the largest asked) is taken, so C's cache holds only what its loaders need at once, and
    C's log (not B's) says so."""
    small = small_dataset(4, 24, chunks=CHUNKS, frames=120, agents_per_frame=30)
    third = small_dataset(8, 25, chunks=CHUNKS, frames=120, agents_per_frame=30)
    big = small_dataset(24, 35, chunks={"agents": 5000})  # 100 chunks: a loader needs about half at once
    if host_budget.usage() is not None:
        pytest.fail(f"processes of this user already hold host caches: {host_budget.usage()}")
    ds = Dataset.open(big)
    slot = 5000 * ds["agents"].dtype.itemsize
    n = -(-ds.rows["agents"] // 5000)
    script = tmp_path / "hold.py"
    script.write_text(HOLD_LOADER)
    a = subprocess.Popen([sys.executable, str(script), str(small), "1"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert a.stdout.readline().strip() == "ready"
        caplog.set_level(logging.WARNING, logger="zarrfeed")
        with Loader(big, num_workers=1, seed=5, cache_bytes=n * slot) as b:
            decoded = []
            for _ in range(2):
                for _ in b:
                    pass
                decoded.append(b.chunks_decoded)
            assert decoded == [n, 0]
            use = host_budget.usage()
            assert (use.budget, use.set_by) == (n * slot, os.getpid())
            b_key = host_cache.CacheKey.of(ds, slot).identity
            shares = {u.identity: u for u in use.caches}
            assert shares[b_key].nbytes == n * slot and shares[b_key].short == 0
            assert len(shares) == 2  # and job A's, at what its loader needs at once
            c = subprocess.run([sys.executable, str(script), str(third), str(n * slot)], input="\n",
                               capture_output=True, text=True, timeout=300)
            assert c.returncode == 0, c.stderr[-3000:]
            assert "too small for this dataset" in c.stderr and "beyond it" in c.stderr, c.stderr[-3000:]
            assert "zarrfeed.loader" not in caplog.text  # B has all it asked for: nothing to say
    finally:
        _, a_err = a.communicate("\n", timeout=60)
    assert a.returncode == 0, a_err[-3000:]
    assert "too small for this dataset" in a_err  # A asked for 1 byte: told its cache goes beyond it


def test_loaders_of_two_datasets_keep_within_one_budget(data, small_dataset, caplog):
    """Loaders of two datasets in one process: the second dataset's cache is sized by what the first left."""
    other = small_dataset(8, 23, chunks=CHUNKS, frames=120, agents_per_frame=30)
    if host_budget.usage() is not None:
        pytest.fail(f"processes of this user already hold host caches: {host_budget.usage()}")
    slot = CHUNKS["agents"] * Dataset.open(data)["agents"].dtype.itemsize
    n = -(-Dataset.open(data).rows["agents"] // CHUNKS["agents"])
    budget = (n + n // 2) * slot  # the first table and half of the second
    with Loader(data, batch_size=1000, num_workers=1, seed=5, cache_bytes=budget) as first, \
            Loader(other, batch_size=1000, num_workers=1, seed=5, cache_bytes=budget) as second:
        for loader in (first, second):
            for _ in loader:
                pass
        use = host_budget.usage()
        assert use.budget == budget
        sizes = sorted(u.nbytes for u in use.caches)
        assert sizes[-1] == n * slot  # the first: all its chunks
        # the second: what was left, unless its loaders need more at once (then said in the log)
        assert sizes[0] == n // 2 * slot or ("beyond it" in caplog.text and sizes[0] > n // 2 * slot)
        assert first.chunks_decoded == n and second.chunks_decoded == n


def one_slot_cache(name: str) -> host_cache.HostSegment:
    """A host cache of its own (a key no loader uses) with one slot for two chunks: every claim reuses it."""
    key = host_cache.CacheKey(hashlib.sha256(f"{name}{os.getpid()}{time.time()}".encode()).hexdigest()[:32],
                              ("agents",), (2,), 4096)
    seg = host_cache.attach(key, budget=1 << 30, want=1, need=1)
    assert seg.n_slots == 1
    return seg


def test_a_late_decode_with_a_claim_given_up_and_claimed_again_writes_nothing():
    """A worker that was sent a decode of slot s under claim token t may come late: its loader gave the claim
    up (closed, or thought the worker dead) and the slot was claimed again, under a new token. `writing(s, t)`
    must then say no (the slot is the new claim's), or the late worker's bytes are marked READY as the new
    claim's; the new claim's own decode goes ahead."""
    seg = one_slot_cache("late")
    try:
        [pin] = seg.pin_all([0])
        assert pin.decode
        seg.give_up({pin.slot: pin.token})
        again = seg.poll(pin.slot)  # given up: ours to decode again, under a new token
        assert again.decode and again.token != pin.token
        with seg.writing(pin.slot, pin.token) as ours:
            assert not ours, "a decode under a claim given up was let write into the slot"
        assert not seg.is_ready(pin.slot)
        with seg.writing(again.slot, again.token) as ours:
            assert ours
            seg.array()[again.slot * seg.slot_bytes:][:seg.slot_bytes] = 7
        assert seg.is_ready(again.slot)
    finally:
        host_cache.detach(seg)


def test_a_slot_reused_for_another_chunk_is_no_longer_the_first_chunks():
    """One slot, two chunks: chunk 0 is decoded and unpinned, then chunk 1 takes its slot. Pinning chunk 0
    again must ask for a decode; if the directory still named the slot for chunk 0, it would be reported
    ready and a reader would get chunk 1's bytes as chunk 0."""
    seg = one_slot_cache("reuse")
    try:
        for cid in (0, 1):
            [pin] = seg.pin_all([cid])
            assert pin.decode, f"chunk {cid} is not cached yet"
            with seg.writing(pin.slot, pin.token) as ours:
                assert ours
                seg.array()[pin.slot * seg.slot_bytes:][:seg.slot_bytes] = 10 + cid
            seg.unpin(pin.slot)
        [pin] = seg.pin_all([0])
        assert pin.decode and not pin.ready, "chunk 0 reported cached in the slot that now holds chunk 1"
        seg.unpin(pin.slot)
    finally:
        host_cache.detach(seg)
