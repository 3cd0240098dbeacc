"""Loader benchmark: zarrfeed's shuffled batches against what users write today and the decode bound.

    python bench/bench_loader.py [--scenes 100] [--repeat 3] [--plot loader.png] [--check-only]

On a synthetic L5Kit dataset (100 scenes = 2.1 M agents, chunks of 20,000 rows), the agents table:
  zarrfeed    Loader, shuffle on, 2 workers, batch 256 and 4096: the second epoch (decoded chunks kept
              from the first: it only gathers), the first (start-up included), and batch 4096 with
              cache_bytes=0 (every epoch decodes) and with cache="process" (a cache of its own, not the
              host's: what the host cache costs a single loader), and batch 4096 with cache_bytes=0 reading
              with verify_chunks=False (what checking every chunk read against its digest costs an uncached
              epoch; cached epochs read no chunk, so they check none)
  (a) pool    a process pool of 2 workers, each item one batch slice `arr[s:s+B]` read with zarr, in
              shuffled order, the batch pickled back (a PyTorch DataLoader over a slicing Dataset)
  (b) zarr    `arr[s:s+chunk]` chunk by chunk in order, one process, no shuffle
  (c) bound   chunk files read and Blosc-decoded into one reused buffer, one process
and L5Kit-style windows (history 10, future 50) from the frames, agents and faces tables:
  zarrfeed    WindowLoader, batch 32, 2 workers (the second epoch; also with cache_bytes=0)
  (l) L5Kit   per sample, the way L5Kit reads it: bisect the scene, read its frames, one agents slice and
              one faces slice with zarr (one process; L5Kit's DataLoader workers each do the same)
  memcpy      the agent rows/s a plain memory copy of 116-byte rows reaches, the bound for gathering them
Targets on 2 cores: batch 4096 epoch 2 >= 1.2x (c), epoch 1 >= 0.5x (c); batch 256 >= 100x (a); windows
>= 20x (l); uncached epochs with the chunk check >= 0.97x without it, in the same run. Medians of --repeat.
"""
from __future__ import annotations

import bisect
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import multiprocess as mp
import numpy as np
import zarr
from common import (add_json_option, add_plot_option, check_plot_option, copy_bytes_per_s, parser, plot_panels,
                    print_ratios, smaller_than_documented, synthetic_dataset, write_json)
from zarrfeed.loader import Dataset, Loader, WindowLoader



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
        with open(os.path.join(path, str(i)), "rb") as f:  # a 1-D array's chunk key
            codec.decode(f.read(), out=out)
    return time.perf_counter() - t, arr.shape[0]


def zarrfeed(ds: Dataset, batch: int, cache_bytes: int | None = None, cache: str = "host") -> dict:
    """The first epoch (start-up included) and the second, of a Loader with `cache_bytes` (None: default,
    decoded chunks kept across epochs; 0: every epoch decodes) and `cache` (the host's, or its own)."""
    t0 = time.perf_counter()
    with Loader(ds, "agents", batch_size=batch, num_workers=2, seed=0, cache_bytes=cache_bytes,
                cache=cache) as loader:
        it = iter(loader)
        first = next(it)
        ttfb = time.perf_counter() - t0
        rows = len(first["yaw"]) + sum(len(b["yaw"]) for b in it)
        epoch1 = time.perf_counter() - t0
        t = time.perf_counter()
        rows2 = sum(len(b["yaw"]) for b in loader)
        epoch2 = time.perf_counter() - t
    del first
    return {"epoch1": (epoch1, rows), "epoch2": (epoch2, rows2), "ttfb": ttfb}


def windows_zarrfeed(ds: Dataset, cache_bytes: int | None = None, cache: str = "host") -> tuple[float, int, int]:
    # whole windows, as the L5Kit-style baseline below reads them (and as compare_revisions.py's older revisions do)
    with WindowLoader(ds, history=10, future=50, batch_size=32, num_workers=2, seed=0, whole_windows=True,
                      cache_bytes=cache_bytes, cache=cache) as loader:
        for _ in loader:  # the first epoch
            pass
        t = time.perf_counter()
        samples = agents = 0
        for b in loader:
            samples += len(b["frame_row"] if "frame_row" in b else b["frame_index"])  # (0.2's name)
            agents += len(b["agents/centroid"])
        return time.perf_counter() - t, samples, agents


def windows_l5kit(path: Path, n: int) -> tuple[float, int, int]:
    g = zarr.open_group(str(path), mode="r")
    bounds = g["scenes"][:]["frame_index_interval"]
    starts = bounds[:, 0].tolist()
    valid = np.concatenate([np.arange(s + 10, e - 50) for s, e in bounds.tolist()])
    frames, agents, faces = g["frames"], g["agents"], g["traffic_light_faces"]
    t0 = time.perf_counter()
    rows = 0
    for t in np.random.default_rng(0).choice(valid, n, replace=False).tolist():
        scene = bisect.bisect_right(starts, t) - 1
        s, e = bounds[scene]
        f = frames[max(s, t - 10):min(e, t + 51)]
        a = agents[f["agent_index_interval"][0, 0]:f["agent_index_interval"][-1, 1]]
        faces[f["traffic_light_faces_index_interval"][0, 0]:f["traffic_light_faces_index_interval"][-1, 1]]
        rows += len(a)
    return time.perf_counter() - t0, n, rows


def memcpy_rows_per_s(itemsize: int) -> float:
    return copy_bytes_per_s() / itemsize


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--pool-items", type=int, default=1500, help="items the pool baseline reads per run")
    p.add_argument("--check-only", action="store_true",
                   help="only the uncached epochs with and without the chunk check (their ratios)")
    add_plot_option(p)
    add_json_option(p)
    args = p.parse_args()
    check_plot_option(args.plot)
    with synthetic_dataset(args.scenes) as path:
        ds = Dataset.open(path)
        unchecked = Dataset.open(path, verify_chunks=False)
        n, itemsize = ds.rows["agents"], ds["agents"].dtype.itemsize
        apath = str(path / "agents")
        runs: dict[str, list[tuple[float, int]]] = {}
        ttfb: dict[int, list[float]] = {256: [], 4096: []}
        paired: dict[str, list[float]] = {}  # checked / unchecked, per repeat
        for rep in range(args.repeat):
            for b in () if args.check_only else (256, 4096):
                r = zarrfeed(ds, b)
                runs.setdefault(f"zarrfeed batch {b}", []).append(r["epoch2"])
                runs.setdefault(f"zarrfeed batch {b} epoch 1", []).append(r["epoch1"])
                ttfb[b].append(r["ttfb"])
            checking = [("zarrfeed 4096 no cache", ds), ("zarrfeed 4096 unchecked", unchecked)]
            pair = {}
            for name, d in checking if rep % 2 == 0 else checking[::-1]:  # one after the other, alternating
                r = pair[name] = zarrfeed(d, 4096, cache_bytes=0)
                runs.setdefault(name, []).append(r["epoch2"])
                runs.setdefault(name.replace("no cache", "no cache ep1").replace("unchecked", "unchecked ep1"),
                                []).append(r["epoch1"])
            for epoch in ("epoch1", "epoch2"):  # each run's ratio to its neighbour: drift between runs cancels
                (sc, rc), (su, ru) = pair["zarrfeed 4096 no cache"][epoch], pair["zarrfeed 4096 unchecked"][epoch]
                paired.setdefault(epoch, []).append((rc / sc) / (ru / su))
            if args.check_only:
                continue
            r = zarrfeed(ds, 4096, cache="process")  # a cache of the loader's own, not the host's
            runs.setdefault("zarrfeed 4096 own cache", []).append(r["epoch2"])
            runs.setdefault("zarrfeed 4096 own epoch 1", []).append(r["epoch1"])
            runs.setdefault("(a) pool batch 256", []).append(pool_baseline(apath, 256, n, args.pool_items))
            runs.setdefault("(b) zarr in order", []).append(zarr_in_order(apath))
            runs.setdefault("(c) decode bound", []).append(decode_bound(apath))
            for name, nbytes, cache in (("zarrfeed windows", None, "host"), ("zarrfeed windows no cache", 0, "host"),
                                        ("zarrfeed windows own cache", None, "process")):
                s, samples, agents = windows_zarrfeed(ds, nbytes, cache)
                runs.setdefault(name, []).append((s, samples))
                runs.setdefault(name.replace("windows", "window agents"), []).append((s, agents))
            s, samples, agents = windows_l5kit(path, 300)
            runs.setdefault("(l) L5Kit windows", []).append((s, samples))
        rate = {k: statistics.median(r / s for s, r in v) for k, v in runs.items()}
        # first batches as a speed (per second, higher is faster), as every figure of --json is
        firsts = {f"first batches/s {b}": 1 / statistics.median(v) for b, v in ttfb.items() if v}
        write_json(args.json, {**rate, **firsts})
        if args.check_only:
            print(f"agents: {n:,} rows; {args.repeat} repeats, checked and unchecked alternating which goes first")
            for epoch, ratios in paired.items():
                print(f"  {epoch}: checked / unchecked per repeat, median {statistics.median(ratios):.3f}x "
                      f"(from {min(ratios):.3f}x to {max(ratios):.3f}x)")
            print_ratios(rate, [("zarrfeed 4096 no cache", "zarrfeed 4096 unchecked", 0.97),
                                ("zarrfeed 4096 no cache ep1", "zarrfeed 4096 unchecked ep1", 0.97)])
            return
        print(f"agents: {n:,} rows of {itemsize} bytes, chunks of {ds['agents'].chunks[0]:,}; "
              f"median of {args.repeat} runs\n")
        print(f"{'':<24}{'M rows/s':>10}{'MB/s':>8}")
        for k, v in rate.items():
            if "window" not in k:
                print(f"{k:<24}{v / 1e6:>10.2f}{v * itemsize / 1e6:>8.0f}")
        copy_rate = memcpy_rows_per_s(itemsize)
        print(f"{'memcpy bound':<24}{copy_rate / 1e6:>10.2f}{copy_rate * itemsize / 1e6:>8.0f}")
        print(f"\nwindows (history 10, future 50, batch 32): zarrfeed {rate['zarrfeed windows']:,.0f} samples/s "
              f"({rate['zarrfeed window agents'] / 1e6:.1f} M agent rows/s, "
              f"{rate['zarrfeed window agents'] / copy_rate:.2f}x the memcpy bound); "
              f"L5Kit-style {rate['(l) L5Kit windows']:,.0f} samples/s; zarrfeed with cache_bytes=0 "
              f"{rate['zarrfeed windows no cache']:,.0f} samples/s")
        self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"\ntime to first batch: {statistics.median(ttfb[256]):.3f} s (batch 256), "
              f"{statistics.median(ttfb[4096]):.3f} s (batch 4096)")
        print(f"peak RSS: this process {self_rss:.0f} MB, largest worker {child_rss:.0f} MB")
        print_ratios(rate, [("zarrfeed batch 4096", "(c) decode bound", 1.2),
                            ("zarrfeed batch 4096 epoch 1", "(c) decode bound", 0.5),
                            ("zarrfeed 4096 no cache", "(c) decode bound", None),
                            ("zarrfeed 4096 no cache", "zarrfeed 4096 unchecked", 0.97),
                            ("zarrfeed 4096 no cache ep1", "zarrfeed 4096 unchecked ep1", 0.97),
                            ("zarrfeed batch 256", "(a) pool batch 256", 100),
                            ("zarrfeed windows", "(l) L5Kit windows", 20),
                            ("zarrfeed windows no cache", "(l) L5Kit windows", None),
                            ("zarrfeed batch 4096", "(b) zarr in order", None),
                            ("zarrfeed batch 4096", "zarrfeed 4096 own cache", None),
                            ("zarrfeed batch 4096 epoch 1", "zarrfeed 4096 own epoch 1", None),
                            ("zarrfeed windows", "zarrfeed windows own cache", None)])
        if args.plot:
            m = {k: v / 1e6 for k, v in rate.items()}
            plot_panels(args.plot, f"Loader: {n:,} agent rows of {itemsize} bytes, 2 workers, median of {args.repeat}",
                        [("shuffled batches of agents against the decode bound and the peers", "M rows/s", {
                            "zarrfeed batch 4096, cached epoch (2nd)": m["zarrfeed batch 4096"],
                            "zarrfeed batch 4096, first epoch (start-up incl.)": m["zarrfeed batch 4096 epoch 1"],
                            "zarrfeed batch 4096, cache_bytes=0 (decodes)": m["zarrfeed 4096 no cache"],
                            "zarrfeed batch 4096, cache='process' (2nd)": m["zarrfeed 4096 own cache"],
                            "zarrfeed batch 256, cached epoch (2nd)": m["zarrfeed batch 256"],
                            "zarrfeed batch 256, first epoch": m["zarrfeed batch 256 epoch 1"],
                            "(c) decode bound: Blosc into one buffer, 1 process": m["(c) decode bound"],
                            "(b) zarr arr[s:s+chunk] in order, 1 process": m["(b) zarr in order"],
                            "(a) process pool, a zarr slice of 256 per item": m["(a) pool batch 256"],
                            "memcpy bound of 116-byte rows": copy_rate / 1e6}),
                         ("L5Kit windows: history 10, future 50, batch 32", "samples/s", {
                            "zarrfeed WindowLoader, cached epoch": rate["zarrfeed windows"],
                            "zarrfeed WindowLoader, cache_bytes=0": rate["zarrfeed windows no cache"],
                            "zarrfeed WindowLoader, cache='process'": rate["zarrfeed windows own cache"],
                            "(l) L5Kit's way: zarr slices per sample": rate["(l) L5Kit windows"]})],
                        smoke=smaller_than_documented(p, args))


if __name__ == "__main__":
    sys.exit(main())
