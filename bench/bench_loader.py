"""Loader benchmark: zarrfeed's shuffled batches against what users write today and the decode bound.

    python bench/bench_loader.py [--scenes 100] [--repeat 3]

On a synthetic L5Kit dataset (100 scenes = 2.1 M agents, chunks of 20,000 rows), the agents table:
  zarrfeed    Loader, shuffle on, 2 workers, batch 256 and 4096 (one epoch, after a warm-up epoch)
  (a) pool    a process pool of 2 workers, each item one batch slice `arr[s:s+B]` read with zarr, in
              shuffled order, the batch pickled back (a PyTorch DataLoader over a slicing Dataset)
  (b) zarr    `arr[s:s+chunk]` chunk by chunk in order, one process, no shuffle
  (c) bound   chunk files read and Blosc-decoded into one reused buffer, one process
Targets on 2 cores: batch 4096 >= 0.7x (c); batch 256 >= 100x (a). Medians of --repeat runs.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import multiprocess as mp
import numcodecs
import numpy as np
import zarr

from loader import Dataset, Loader
from writer import synthetic, write_dataset
from writer.chunkio import chunk_key


def _slice_reader(path: str):
    arr = zarr.open_array(path, mode="r")
    return lambda s_b: arr[s_b[0]:s_b[0] + s_b[1]]


_READ = None


def _init(path: str) -> None:
    global _READ
    _READ = _slice_reader(path)


def _item(s_b):
    return _READ(s_b)


def pool_baseline(path: str, batch: int, n_rows: int, max_items: int) -> tuple[float, int]:
    starts = np.random.default_rng(0).permutation(np.arange(0, n_rows, batch))[:max_items]
    with mp.get_context("fork").Pool(2, initializer=_init, initargs=(path,)) as pool:
        list(pool.imap(_item, [(int(s), batch) for s in starts[:4]]))  # start-up
        t = time.perf_counter()
        rows = sum(len(b) for b in pool.imap(_item, [(int(s), batch) for s in starts], chunksize=1))
        return time.perf_counter() - t, rows


def zarr_in_order(path: str) -> tuple[float, int]:
    arr = zarr.open_array(path, mode="r")
    t = time.perf_counter()
    rows = sum(len(arr[s:s + arr.chunks[0]]) for s in range(0, arr.shape[0], arr.chunks[0]))
    return time.perf_counter() - t, rows


def decode_bound(path: str) -> tuple[float, int]:
    arr = zarr.open_array(path, mode="r")
    out = np.empty(arr.chunks[0] * arr.dtype.itemsize, np.uint8)
    codec = arr.compressor
    t = time.perf_counter()
    for i in range(arr.nchunks):
        with open(os.path.join(path, chunk_key(arr, i).split("/")[-1]), "rb") as f:
            codec.decode(f.read(), out=out)
    return time.perf_counter() - t, arr.shape[0]


def zarrfeed(ds: Dataset, batch: int) -> dict:
    t0 = time.perf_counter()
    with Loader(ds, "agents", batch_size=batch, num_workers=2, seed=0) as loader:
        it = iter(loader)
        first = next(it)
        ttfb = time.perf_counter() - t0
        for _ in it:  # warm-up epoch (the rest of it)
            pass
        t = time.perf_counter()
        rows = sum(len(b["yaw"]) for b in loader)
        seconds = time.perf_counter() - t
    del first
    return {"seconds": seconds, "rows": rows, "ttfb": ttfb}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--pool-items", type=int, default=1500, help="items the pool baseline reads per run")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-"))
    try:
        path = tmp / "d.zarr"
        write_dataset(path, synthetic.episodes(args.scenes), workers=2)
        ds = Dataset.open(path)
        n, itemsize = ds.rows["agents"], ds["agents"].dtype.itemsize
        apath = str(path / "agents")
        runs: dict[str, list[tuple[float, int]]] = {}
        ttfb: dict[int, list[float]] = {256: [], 4096: []}
        for _ in range(args.repeat):
            for b in (256, 4096):
                r = zarrfeed(ds, b)
                runs.setdefault(f"zarrfeed batch {b}", []).append((r["seconds"], r["rows"]))
                ttfb[b].append(r["ttfb"])
            runs.setdefault("(a) pool batch 256", []).append(pool_baseline(apath, 256, n, args.pool_items))
            runs.setdefault("(b) zarr in order", []).append(zarr_in_order(apath))
            runs.setdefault("(c) decode bound", []).append(decode_bound(apath))
        rate = {k: statistics.median(r / s for s, r in v) for k, v in runs.items()}
        print(f"agents: {n:,} rows of {itemsize} bytes, chunks of {ds['agents'].chunks[0]:,}; "
              f"median of {args.repeat} runs\n")
        print(f"{'':<22}{'M rows/s':>10}{'MB/s':>8}")
        for k, v in rate.items():
            print(f"{k:<22}{v / 1e6:>10.2f}{v * itemsize / 1e6:>8.0f}")
        self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"\ntime to first batch: {statistics.median(ttfb[256]):.3f} s (batch 256), "
              f"{statistics.median(ttfb[4096]):.3f} s (batch 4096)")
        print(f"peak RSS: this process {self_rss:.0f} MB, largest worker {child_rss:.0f} MB")
        print("\nratios:")
        for a, b, target in [("zarrfeed batch 4096", "(c) decode bound", 0.7),
                             ("zarrfeed batch 256", "(a) pool batch 256", 100),
                             ("zarrfeed batch 4096", "(b) zarr in order", None)]:
            ratio = rate[a] / rate[b]
            goal = f"  (target >= {target}x: {'met' if ratio >= target else 'NOT met'})" if target else ""
            print(f"  {a} / {b}: {ratio:.2f}x{goal}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
