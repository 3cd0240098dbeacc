"""Ranks on one host: 4 rank processes (1 worker each) against one Loader with 2 workers, and what the host
cache saves them.

    python bench/bench_ranks.py [--scenes 100] [--repeat 3] [--json FILE]

On a synthetic L5Kit dataset (100 scenes = 2.1 M agents), batch 4096 of agents, shuffled:
  single       one Loader(num_workers=2) reading the whole table: its second epoch (decoded chunks cached)
  ranks host   4 processes, Loader(rank=r, world_size=4, num_workers=1), cache="host" (the default): the
               second epoch, from the start of the slowest-starting rank to the end of the last one
  ranks own    the same with cache="process": each rank's cache holds the chunks its own epoch read, and
               the next epoch's order gives it others, which it decodes again
It also reports the chunks decoded by the ranks together in each epoch, the host cache's memory counted once
(PSS, summed over the ranks and their workers) against the decoded table, and the chunks `zarrfeed serve`
decodes for 4 remote ranks over two epochs. Targets: ranks host >= 0.9x single; host cache <= 1.1x the
decoded table; the server decodes each chunk once. Variants alternate; medians of --repeat; ratios last.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import multiprocess as mp
from common import add_json_option, parser, print_ratios, synthetic_dataset, write_json
from zarrfeed.loader import Dataset, Loader

ROOT = Path(__file__).resolve().parents[1]
RANKS, BATCH = 4, 4096


def _cache_pss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        in_cache = False
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            if not line[:1].isupper():
                in_cache = "memfd:zarrfeed-cache" in line
            elif in_cache and line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    return total


def _rank(path: str, rank: int, cache: str, barrier, out) -> None:
    import os

    with Loader(path, "agents", batch_size=BATCH, num_workers=1, seed=0, rank=rank, world_size=RANKS,
                cache=cache) as loader:
        barrier.wait()
        rows = sum(len(b["yaw"]) for b in loader)  # epoch 1
        first = loader.chunks_decoded
        barrier.wait()
        t0 = time.perf_counter()
        rows = sum(len(b["yaw"]) for b in loader)  # epoch 2
        t1 = time.perf_counter()
        pss = _cache_pss([os.getpid(), *loader.worker_pids])
        out.put({"rank": rank, "t0": t0, "t1": t1, "rows": rows, "decoded": [first, loader.chunks_decoded],
                 "pss": pss})
        barrier.wait()  # every rank measured while all still map the cache


def ranks(path: Path, cache: str) -> dict:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(RANKS), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(str(path), r, cache, barrier, out)) for r in range(RANKS)]
    for p in procs:
        p.start()
    got = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    start, end = max(g["t0"] for g in got), max(g["t1"] for g in got)
    return {"seconds": end - start, "rows": sum(g["rows"] for g in got),
            "decoded": [sum(g["decoded"][e] for g in got) for e in (0, 1)], "pss": sum(g["pss"] for g in got)}


def single(path: Path) -> tuple[float, int]:
    with Loader(path, "agents", batch_size=BATCH, num_workers=2, seed=0, cache="process") as loader:
        for _ in loader:
            pass
        t = time.perf_counter()
        rows = sum(len(b["yaw"]) for b in loader)
        return time.perf_counter() - t, rows


def served(path: Path) -> list[int]:
    """Chunks `zarrfeed serve` decodes for 4 remote ranks reading two epochs at once."""
    from pyarrow import flight
    from zarrfeed.flight import RemoteLoader

    server = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "serve", str(path), "--port", "0",
                               "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              cwd=ROOT)
    try:
        url = server.stdout.readline().split()[2]
        client = flight.connect(url)
        loaders = [RemoteLoader(url, "agents", batch_size=BATCH, seed=0, rank=r, world_size=RANKS)
                   for r in range(RANKS)]
        decoded = []
        for _ in range(2):
            threads = [threading.Thread(target=lambda lo=lo: sum(1 for _ in lo)) for lo in loaders]
            for t in threads:
                t.start()
            for t in threads:
                t.join(600)
            status = json.loads(list(client.do_action(flight.Action("status", b"")))[0].body.to_pybytes())
            decoded.append(status["totals"]["chunks_decoded"] - sum(decoded))
        for lo in loaders:
            lo.close()
        return decoded
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    p = parser(__doc__)
    add_json_option(p)
    args = p.parse_args()
    with synthetic_dataset(args.scenes) as path:
        ds = Dataset.open(path)
        n, itemsize = ds.rows["agents"], ds["agents"].dtype.itemsize
        chunks = -(-n // ds["agents"].chunks[0])
        speed: dict[str, list[float]] = {}
        extra: dict[str, list] = {"host": [], "process": []}
        for _ in range(args.repeat):
            s, rows = single(path)
            speed.setdefault("single", []).append(rows / s)
            for name, cache in (("ranks host", "host"), ("ranks own", "process")):
                r = ranks(path, cache)
                speed.setdefault(name, []).append(r["rows"] / r["seconds"])
                extra[cache].append(r)
        rate = {k: statistics.median(v) for k, v in speed.items()}
        write_json(args.json, rate)  # rows/s of the second epoch
        print(f"agents: {n:,} rows of {itemsize} bytes in {chunks} chunks; batch {BATCH}; median of {args.repeat}\n")
        for k, v in rate.items():
            print(f"{k:<12}{v / 1e6:>8.2f} M rows/s (epoch 2)")
        for cache, runs in extra.items():
            dec = [r["decoded"] for r in runs]
            print(f"cache={cache}: chunks decoded by the {RANKS} ranks together, epoch 1 / epoch 2: "
                  f"{', '.join(f'{a}/{b}' for a, b in dec)} (the table has {chunks})")
        pss = statistics.median(r["pss"] for r in extra["host"])
        table = n * itemsize
        print(f"host cache memory (PSS, all ranks and workers): {pss / 2**20:.0f} MiB for a decoded table of "
              f"{table / 2**20:.0f} MiB: {pss / table:.2f}x (target <= 1.1x)")
        dec = served(path)
        print(f"zarrfeed serve, {RANKS} remote ranks: chunks decoded epoch 1 / epoch 2: {dec[0]}/{dec[1]} "
              f"(the table has {chunks}: {'once' if dec == [chunks, 0] else 'NOT once'})")
        print_ratios(rate, [("ranks host", "single", 0.9), ("ranks own", "single", None),
                            ("ranks host", "ranks own", None)])


if __name__ == "__main__":
    sys.exit(main())
