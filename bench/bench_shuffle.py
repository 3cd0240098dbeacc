"""How mixed zarrfeed's shuffled batches are, against a true shuffle and MosaicML Streaming's, for memory budgets
from the whole table down to a hundredth of it, and what mixing costs.

    python bench/bench_shuffle.py [--scenes 100] [--repeat 3] [--mixing-only] [--plot FILE.png] [--json FILE]

On a synthetic L5Kit dataset stored scene after scene (as L5Kit's is), the agents table, batches of 4,096 and 256:
  mixing  per batch, median and least over an epoch: distinct scenes and distinct chunks; and MosaicML's own
          measure of an order, the entropy (bits) of the differences between consecutive sample indices plus
          that of consecutive shard (here: chunk) indices, higher is more mixed. For
          zarrfeed's default order (order 2, stratified blocks) with `shuffle_bytes` the table's decoded bytes,
              a tenth and a hundredth of them (a table 1x, 10x and 100x the memory the loader may use; the
              window never goes below 8 chunks, so at 100x it holds 8 chunks, what order 1 always held)
          MosaicML Streaming's py1e (its default) and py1br at the same memory: a shuffle block of as many
              samples as the budget holds (one node, shards of a chunk's rows), if it is installed
              (pip install mosaicml-streaming)
          order 1 (one Fisher-Yates shuffle per window; states saved in it resume in it) with its window of 8
              chunks, and a uniform permutation of the epoch (what torch's RandomSampler gives)
  cost    cached-epoch rows/s with 2 workers, in the same run, of the default at each budget and of order 1's
          window 8, and their ratio to the latter
Targets: as mixed as the uniform permutation whenever the epoch fits the loader's memory, at >= 0.9x
order 1's window 8 cached throughput; zarrfeed's mixing at least Streaming's at every budget. Medians of
--repeat for speeds. --plot draws mixing against memory and the throughput.
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from common import (add_json_option, add_plot_option, check_plot_option, machine, parser, plot_panels,
                    synthetic_dataset, write_json)
from zarrfeed.loader import Dataset, Loader

BATCHES = (4096, 256)
BUDGETS = {"1x": 1, "10x": 10, "100x": 100}  # the table's decoded bytes over the memory the loader may use


def scene_of_rows(ds: Dataset) -> np.ndarray:
    """The scene of every agent row."""
    scenes = ds.read_rows("scenes", 0, ds.rows["scenes"])["frame_index_interval"]
    frames = ds.read_rows("frames", 0, ds.rows["frames"], ["agent_index_interval"])["agent_index_interval"]
    frame = np.searchsorted(frames[:, 1], np.arange(ds.rows["agents"]), side="right")
    return np.searchsorted(scenes[:, 1], frame, side="right")


def entropy(order: np.ndarray) -> float:
    """Bits of the distribution of |differences| between consecutive entries (MosaicML's simulator measures a
    shuffle so; written here from its description, not its code)."""
    counts = np.bincount(np.abs(np.diff(order)))
    p = counts[counts > 0] / max(len(order) - 1, 1)
    return float(-(p * np.log2(p)).sum())


def mixing(order: np.ndarray, batch: int, scene: np.ndarray, chunk_rows: int) -> dict[str, float]:
    """Distinct scenes and chunks per full batch of `order` (row ids in epoch order), median and least; and
    MosaicML's entropy of the order (samples plus shards)."""
    full = len(order) // batch * batch
    rows = order[:full].reshape(-1, batch)
    scenes = [len(np.unique(scene[r])) for r in rows]
    chunks = [len(np.unique(r // chunk_rows)) for r in rows]
    return {"scenes median": statistics.median(scenes), "scenes min": min(scenes),
            "chunks median": statistics.median(chunks), "chunks min": min(chunks),
            "entropy": entropy(order) + entropy(order // chunk_rows)}


def zarrfeed_order(ds: Dataset, batch: int, options: dict) -> tuple[np.ndarray, int]:
    """The epoch's rows in order, and the window (chunks), from the loader's plan (nothing is loaded)."""
    with Loader(ds, "agents", batch_size=batch, num_workers=0, seed=0, **options) as loader:
        plan = loader.plan(0)
        return np.concatenate([plan.batch_row_ids(k) for k in range(len(loader))]), plan.config.window


def streaming_order(n: int, chunk_rows: int, algo: str, block: int) -> np.ndarray | None:
    """MosaicML Streaming's shuffle `algo` of `n` samples in shards of a chunk's rows, one canonical node, blocks
    of `block` samples; None if the package is not installed."""
    try:
        from streaming.base.shuffle import get_shuffle
    except ImportError:
        return None
    shards = [chunk_rows] * (n // chunk_rows) + ([n % chunk_rows] if n % chunk_rows else [])
    return np.asarray(get_shuffle(algo, np.array(shards), 1, 9176, 0, block_size=max(block, 1)))


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
    add_plot_option(p)
    add_json_option(p)
    args = p.parse_args()
    check_plot_option(args.plot)
    with synthetic_dataset(args.scenes) as path:
        ds = Dataset.open(path)
        n, c = ds.rows["agents"], ds["agents"].chunks[0]
        chunks = -(-n // c)
        table_bytes = chunks * c * ds["agents"].dtype.itemsize
        base = "order 1, window 8 (old default)"
        options = {f"default, table {k} the budget": {"shuffle_bytes": table_bytes // d} for k, d in BUDGETS.items()}
        options[base] = {"shuffle_window": 8, "order": 1}
        scene = scene_of_rows(ds)
        print(machine())
        print(f"agents: {n:,} rows in {ds.rows['scenes']} scenes, stored scene after scene, chunks of {c:,} "
              f"({chunks} chunks, {table_bytes / 2**20:.0f} MiB decoded)\n")
        uniform = np.random.default_rng(0).permutation(n)
        mixed: dict[int, dict[str, dict[str, float]]] = {}
        for batch in BATCHES:
            orders: dict[str, np.ndarray | None] = {}
            for name, opts in options.items():
                order, window = zarrfeed_order(ds, batch, opts)
                orders[f"zarrfeed {name} (window {window})"] = order
            for k, d in BUDGETS.items():
                for algo in ("py1e", "py1br"):
                    orders[f"Streaming {algo}, table {k} the budget"] = streaming_order(n, c, algo, n // d)
            orders["uniform permutation"] = uniform
            print(f"batch {batch}: distinct scenes (median, least) | distinct chunks (median, least) | entropy, bits")
            mixed[batch] = {}
            for name, order in orders.items():
                if order is None:
                    continue
                m = mixed[batch][name] = mixing(order, batch, scene, c)
                print(f"  {name:<48}{m['scenes median']:>6.0f} {m['scenes min']:>5} |{m['chunks median']:>6.0f} "
                      f"{m['chunks min']:>5} |{m['entropy']:>6.2f}")
            if all(orders[k] is None for k in orders if k.startswith("Streaming")):
                print("  (MosaicML Streaming is not installed: pip install mosaicml-streaming)")
        rate: dict[str, float] = {}
        if not args.mixing_only:
            runs: dict[str, list[tuple[float, int]]] = {}
            for rep in range(args.repeat):
                items = list(options.items())
                for name, opts in items if rep % 2 == 0 else items[::-1]:  # alternating which goes first
                    for batch in BATCHES:
                        runs.setdefault(f"{name}, batch {batch}", []).append(cached_rows_per_s(ds, batch, opts))
            rate = {k: statistics.median(r / s for s, r in v) for k, v in runs.items()}
            write_json(args.json, rate)
            print(f"\ncached epoch, 2 workers, median of {args.repeat}:")
            for k, v in rate.items():
                print(f"  {k:<56}{v / 1e6:>8.2f} M rows/s")
            print(f"\nratios to {base} (speed, higher is faster):")
            for batch in BATCHES:
                for name in options:
                    if name != base:
                        print(f"  {name}, batch {batch}: "
                              f"{rate[f'{name}, batch {batch}'] / rate[f'{base}, batch {batch}']:.3f}x")
        if args.plot:
            panels = [(f"distinct scenes per batch of {batch} (median; {ds.rows['scenes']} scenes)", "scenes",
                       {k: v["scenes median"] for k, v in mixed[batch].items()}) for batch in BATCHES]
            panels.append(("entropy, samples + chunks (MosaicML's measure)",
                           "bits", {k: v["entropy"] for k, v in mixed[4096].items()}))
            if rate:
                panels.append(("cached epoch, 2 workers, batch 4096", "M rows/s",
                               {k: v / 1e6 for k, v in rate.items() if k.endswith("4096")}))
            plot_panels(args.plot, f"Shuffle: how mixed a batch is, by memory ({n:,} agents, {chunks} chunks)",
                        panels, smoke=args.scenes < 100)


if __name__ == "__main__":
    sys.exit(main())
