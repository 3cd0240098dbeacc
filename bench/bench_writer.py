"""Writer benchmark: zarrfeed with 1 and 2 workers against zarr's bulk write and `Array.append` per episode.

    python bench/bench_writer.py [--scenes 100] [--repeat 3] [--out DIR] [--plot writer.png]

Each variant runs in its own process (so peak RSS is its own) on the same synthetic episodes, generated in
memory before the clock starts (100 scenes = 2.1 M agents, 290 MB; the writer_360 figures are of 360 scenes, 1 GB):
  zarrfeed-N    DatasetWriter(workers=N).ingest(episodes): every commit durable (fsynced) on the local disk
  zarrfeed-2-scratch  the same with durable=False (commits survive a killed process, not a power loss)
  zarr-bulk     zarr's write, in one process, of the rows already relocated and concatenated before the clock
  concat+bulk   what a user does instead: relocate and concatenate with numpy, then the same bulk write
  zarr-append   `Array.append` per table and episode
Targets on 2 cores: 2 workers >= 1.3x 1 worker, >= 0.9x without durability and >= 1.0x zarr-bulk; >= 3x
concat+bulk; >= 10x append.
Variants alternate within each repeat; medians of --repeat runs; ratios printed last.
"""
from __future__ import annotations

import argparse
import inspect
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import (add_json_option, add_plot_option, check_plot_option, plot_panels, print_ratios,
                    smaller_than_documented, write_json)
from zarrfeed.writer import L5KIT_SCHEMA, relocate, synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

VARIANTS = ["zarrfeed-1", "zarrfeed-2", "zarrfeed-2-scratch", "zarr-bulk", "concat+bulk", "zarr-append"]


def relocated(episodes: list[dict]):
    """Each episode with global intervals (what the writer computes), in order."""
    offsets = {t: 0 for t in L5KIT_SCHEMA.tables}
    for ep in episodes:
        yield relocate(ep, L5KIT_SCHEMA, offsets)
        offsets = {t: offsets[t] + len(ep[t]) for t in offsets}


def relocated_tables(episodes: list[dict]) -> dict[str, np.ndarray]:
    parts = list(relocated(episodes))
    return {t: np.concatenate([p[t] for p in parts]) for t in L5KIT_SCHEMA.tables}


def create_arrays(path: Path, rows: dict[str, int]) -> Any:
    import zarr  # not at the top: zarrfeed's workers import this script again (forkserver); a user's has no zarr

    group = zarr.open_group(str(path), mode="w")
    for t in L5KIT_SCHEMA.tables.values():
        group.create_dataset(t.name, shape=(rows.get(t.name, 0),), chunks=(t.chunk_rows,), dtype=t.dtype,
                             compressor=L5KIT_SCHEMA.compressor, fill_value=np.zeros(1, t.dtype)[0])
    return group


def peak_rss_kb(pid: int) -> int:
    """A live process's peak RSS (writer workers are children of the fork server, not of this process, so
    RUSAGE_CHILDREN does not see them)."""
    with open(f"/proc/{pid}/status") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)


def run_variant(variant: str, scenes: int, out: Path) -> dict:
    episodes = list(synthetic.episodes(scenes))
    tables = relocated_tables(episodes) if variant == "zarr-bulk" else None  # before the clock: the best case
    nbytes = sum(a.nbytes for ep in episodes for a in ep.values())
    rows = sum(len(a) for ep in episodes for a in ep.values())
    if not variant.startswith("zarrfeed"):
        import zarr  # noqa: F401 (imported before the clock, as by the script of a user of zarr)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    steady, worker_kb = None, 0
    if variant.startswith("zarrfeed"):
        workers, durable = int(variant.split("-")[1]), not variant.endswith("-scratch")
        # a revision without `durable` (compare_revisions.py) never fsyncs, as durable=False
        scratch = {"durable": False} if "durable" in inspect.signature(DatasetWriter).parameters else {}
        with DatasetWriter(out, workers=workers, **({} if durable else scratch)) as w:
            steady = w.ingest(episodes)["seconds"]  # first submit to last commit: no start-up or close
            worker_kb = max((peak_rss_kb(pid) for pid in getattr(w, "worker_pids", [])), default=0)
    elif variant in ("zarr-bulk", "concat+bulk"):
        if tables is None:  # what a user does: relocate and concatenate every episode, then one write
            tables = relocated_tables(episodes)
        group = create_arrays(out, {t: len(a) for t, a in tables.items()})
        for t, arr in tables.items():
            group[t][:] = arr
    else:
        group = create_arrays(out, {})
        for ep in relocated(episodes):  # the simple ingestion loop: one append per table and episode
            for t, arr in ep.items():
                group[t].append(arr)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child = max(worker_kb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return {"variant": variant, "seconds": seconds, "steady_seconds": steady or seconds, "rows": rows, "bytes": nbytes,
            "rss_data_mb": rss0 / 1024, "rss_peak_mb": peak / 1024, "worker_rss_peak_mb": child / 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated variants to run (default: all of {','.join(VARIANTS)})")
    add_plot_option(p)
    add_json_option(p)
    args = p.parse_args()
    check_plot_option(args.plot)
    out = args.out or Path(tempfile.mkdtemp(prefix="zarrfeed-bench-"))
    if args.variant:  # one measurement, in this process
        target = out / f"{args.variant}.zarr"
        shutil.rmtree(target, ignore_errors=True)
        print(json.dumps(run_variant(args.variant, args.scenes, target)))
        shutil.rmtree(target, ignore_errors=True)
        return
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    if unknown := set(args.variants.split(",")) - set(VARIANTS):
        p.error(f"--variants: no variant {', '.join(sorted(unknown))} (there are {', '.join(VARIANTS)})")
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.repeat):
        for v in variants:  # interleaved, so machine noise spreads over all variants
            cmd = [sys.executable, __file__, "--variant", v, "--scenes", str(args.scenes), "--out", str(out)]
            results[v].append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    med = {v: statistics.median(x["seconds"] for x in rs) for v, rs in results.items()}
    steady = {v: statistics.median(x["steady_seconds"] for x in rs) for v, rs in results.items()}
    write_json(args.json, {**{f"{k} open to close": 1 / v for k, v in med.items()},
                           **{f"{k} steady": 1 / v for k, v in steady.items()}})
    first = results[variants[0]][0]
    print(f"{args.scenes} scenes: {first['rows']:,} rows, {first['bytes'] / 1e6:.0f} MB in memory; "
          f"median of {args.repeat} runs, each variant in its own process\n")
    print("seconds: from opening the writer to closing it; steady: zarrfeed's ingest() alone (no process start-up "
          "or close)\nRSS: the variant's process at its peak, +data: of which the episodes in memory before writing; "
          "worker RSS: the largest worker (shared memory counted)\n")
    print(f"{'variant':<14}{'seconds':>9}{'steady':>8}{'M rows/s':>10}{'MB/s':>8}{'RSS MB':>9}{'+data':>7}"
          f"{'worker RSS':>12}")
    for v, rs in results.items():
        x = rs[0]
        print(f"{v:<14}{med[v]:>9.3f}{steady[v]:>8.3f}{x['rows'] / med[v] / 1e6:>10.2f}"
              f"{x['bytes'] / med[v] / 1e6:>8.0f}"
              f"{max(r['rss_peak_mb'] for r in rs):>9.0f}{x['rss_data_mb']:>7.0f}"
              f"{max(r['worker_rss_peak_mb'] for r in rs):>12.0f}")
    pairs = [(a, b, t) for a, b, t in [("zarrfeed-2", "zarrfeed-1", 1.3), ("zarrfeed-2", "zarrfeed-2-scratch", 0.9),
                                       ("zarrfeed-2", "zarr-bulk", 1.0),
                                       ("zarrfeed-2", "concat+bulk", 3), ("zarrfeed-2", "zarr-append", 10)]
             if a in med and b in med]
    print_ratios({k: 1 / v for k, v in med.items()}, pairs, "ratios, writer open to close")
    print_ratios({k: 1 / v for k, v in steady.items()}, pairs, "ratios, steady state (ingest() alone)")
    if args.plot:
        mb = first["bytes"] / 1e6
        names = {"zarrfeed-1": "zarrfeed, 1 writer process", "zarrfeed-2": "zarrfeed, 2 writer processes",
                 "zarrfeed-2-scratch": "zarrfeed, 2 writer processes, durable=False",
                 "zarr-bulk": "zarr bulk write, 1 process, rows relocated beforehand",
                 "concat+bulk": "numpy relocate + concatenate, then bulk write",
                 "zarr-append": "zarr Array.append per table and episode"}
        plot_panels(args.plot, f"Writer: {args.scenes} synthetic L5Kit scenes, {mb:,.0f} MB, median of {args.repeat}",
                    [("writer open to close", "MB/s", {names[v]: mb / med[v] for v in variants}),
                     ("steady state: ingest() alone for zarrfeed", "MB/s",
                      {names[v]: mb / steady[v] for v in variants})],
                        smoke=smaller_than_documented(p, args))
    shutil.rmtree(out, ignore_errors=True) if args.out is None else None


if __name__ == "__main__":
    main()
