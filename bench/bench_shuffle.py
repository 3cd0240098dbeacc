"""How mixed zarrfeed's shuffled batches are, against a true shuffle and MosaicML Streaming's, and what mixing costs.

    python bench/bench_shuffle.py [--scenes 100] [--repeat 3]

On a synthetic L5Kit dataset stored scene after scene (as L5Kit's is), the agents table, batches of 4,096 and 256:
  mixing  distinct scenes and distinct chunks per batch (median and minimum over an epoch) of
          zarrfeed's default epoch order (order 2: stratified blocks, the whole table one window when it fits
              shuffle_bytes), the default with shuffle_bytes a tenth and a hundredth of the table's decoded
              bytes (a table 10x and 100x the budget), and order 1 (before 2026-11-27) with shuffle_window 8
              (its default), 32 and the whole table (from the loader's plan: every batch's rows, unloaded)
          a uniform permutation of the epoch (what torch's RandomSampler gives)
          MosaicML Streaming's default shuffle (py1e, blocks of 4 M samples, one node, shards of 500,000
              samples), if it is installed
              (pip install mosaicml-streaming)
  cost    cached-epoch rows/s of each with 2 workers, in the same run, and their ratio to order 1's window 8
Issue 38's targets: as mixed as the uniform permutation whenever the epoch fits the loader's memory, at >= 0.9x
order 1's window 8 (the old default) cached throughput. Medians of --repeat for speeds.
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from common import machine, parser, synthetic_dataset
from zarrfeed.loader import Dataset, Loader

BATCHES = (4096, 256)


def scene_of_rows(ds: Dataset) -> np.ndarray:
    """The scene of every agent row."""
    scenes = ds.read_rows("scenes", 0, ds.rows["scenes"])["frame_index_interval"]
    frames = ds.read_rows("frames", 0, ds.rows["frames"], ["agent_index_interval"])["agent_index_interval"]
    frame = np.searchsorted(frames[:, 1], np.arange(ds.rows["agents"]), side="right")
    return np.searchsorted(scenes[:, 1], frame, side="right")


def mixing(order: np.ndarray, batch: int, scene: np.ndarray, chunk_rows: int) -> dict[str, float]:
    """Distinct scenes and chunks per full batch of `order` (row ids in epoch order): median and minimum."""
    full = len(order) // batch * batch
    rows = order[:full].reshape(-1, batch)
    scenes = [len(np.unique(scene[r])) for r in rows]
    chunks = [len(np.unique(r // chunk_rows)) for r in rows]
    return {"scenes median": statistics.median(scenes), "scenes min": min(scenes),
            "chunks median": statistics.median(chunks), "chunks min": min(chunks)}


def zarrfeed_order(ds: Dataset, batch: int, options: dict) -> np.ndarray:
    with Loader(ds, "agents", batch_size=batch, num_workers=0, seed=0, **options) as loader:
        plan = loader.plan(0)
        return np.concatenate([plan.batch_row_ids(k) for k in range(len(loader))])


def streaming_order(n: int) -> np.ndarray | None:
    """MosaicML Streaming's py1e shuffle of `n` samples in shards of 500,000, one canonical node; None if the
    package is not installed."""
    try:
        from streaming.base.shuffle import get_shuffle
    except ImportError:
        return None
    shards = [500_000] * (n // 500_000) + ([n % 500_000] if n % 500_000 else [])
    # StreamingDataset's default shuffle block: 4,000,000 samples divided by the canonical nodes
    return np.asarray(get_shuffle("py1e", np.array(shards), 1, 9176, 0, block_size=4_000_000))


def cached_rows_per_s(ds: Dataset, batch: int, options: dict) -> tuple[float, int]:
    """(seconds, rows) of the second epoch (the first decoded every chunk into the cache)."""
    with Loader(ds, "agents", batch_size=batch, num_workers=2, seed=0, **options) as loader:
        for _ in loader:
            pass
        t = time.perf_counter()
        rows = sum(len(b["centroid"]) for b in loader)
        return time.perf_counter() - t, rows


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--mixing-only", action="store_true", help="only how mixed the batches are (no timing)")
    args = p.parse_args()
    with synthetic_dataset(args.scenes) as path:
        ds = Dataset.open(path)
        n, c = ds.rows["agents"], ds["agents"].chunks[0]
        whole = -(-n // c)
        table_bytes = whole * c * ds["agents"].dtype.itemsize
        base = "order 1, window 8"
        windows = {"default (order 2)": {}, "default, table 10x budget": {"shuffle_bytes": table_bytes // 10},
                   "default, table 100x budget": {"shuffle_bytes": table_bytes // 100},
                   base: {"shuffle_window": 8, "order": 1}, "order 1, window 32": {"shuffle_window": 32, "order": 1},
                   f"order 1, whole table ({whole})": {"shuffle_window": whole, "order": 1}}
        scene = scene_of_rows(ds)
        print(machine())
        print(f"agents: {n:,} rows in {ds.rows['scenes']} scenes, stored scene after scene, chunks of {c:,} "
              f"({whole} chunks)\n")
        uniform = np.random.default_rng(0).permutation(n)
        theirs = streaming_order(n)
        for batch in BATCHES:
            print(f"batch {batch}: distinct scenes (median, min) | distinct chunks (median, min)")
            orders = {f"zarrfeed {k}": zarrfeed_order(ds, batch, w) for k, w in windows.items()}
            orders["uniform permutation"] = uniform
            if theirs is not None:
                orders["MosaicML Streaming py1e"] = theirs
            for name, order in orders.items():
                m = mixing(order, batch, scene, c)
                print(f"  {name:<32}{m['scenes median']:>7.0f} {m['scenes min']:>5} |{m['chunks median']:>7.0f} "
                      f"{m['chunks min']:>5}")
            if theirs is None:
                print("  (MosaicML Streaming is not installed: pip install mosaicml-streaming)")
        if args.mixing_only:
            return
        runs: dict[str, list[tuple[float, int]]] = {}
        for rep in range(args.repeat):
            items = list(windows.items())
            for name, w in items if rep % 2 == 0 else items[::-1]:  # alternating which goes first
                for batch in BATCHES:
                    runs.setdefault(f"{name}, batch {batch}", []).append(cached_rows_per_s(ds, batch, w))
        rate = {k: statistics.median(r / s for s, r in v) for k, v in runs.items()}
        print(f"\ncached epoch, 2 workers, median of {args.repeat}:")
        for k, v in rate.items():
            print(f"  {k:<36}{v / 1e6:>8.2f} M rows/s")
        print(f"\nratios to {base} (speed, higher is faster):")
        for batch in BATCHES:
            for name in windows:
                if name != base:
                    print(f"  {name}, batch {batch} / {base}: "
                          f"{rate[f'{name}, batch {batch}'] / rate[f'{base}, batch {batch}']:.3f}x")


if __name__ == "__main__":
    sys.exit(main())
