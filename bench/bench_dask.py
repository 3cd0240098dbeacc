"""Dask benchmark: ingestion on a 2-worker LocalCluster against a local DatasetWriter(workers=2).

    python bench/bench_dask.py [--scenes 200] [--sources 20] [--repeat 3] [--json FILE]

The episodes (200 synthetic scenes, about 530 MB) are made before the clock starts and saved as one pickle
file per source (10 episodes each): `to_episodes(file)` reads one back, as a reader of raw logs would. The
local writer runs the same function over the same files in its parent process; the cluster runs it on its
workers. Both write to a local directory; the cluster is started once, outside the clock (it outlives one
ingest). Repeats alternate; medians; ratios printed last. Target: cluster >= 0.7x local. Also printed: the
cost of one Dask task round trip, and rows written per worker-second (the rate that a bigger cluster
multiplies).
"""
from __future__ import annotations

import logging
import pickle
import shutil
import statistics
import tempfile
import time
from itertools import chain
from pathlib import Path

from common import add_json_option, parser, print_ratios, write_json
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter


def read_source(path: str):
    """One source: a file of pickled episodes."""
    with open(path, "rb") as f:
        yield from pickle.load(f)


def noop(x: int) -> int:
    return x


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(scenes=200)
    p.add_argument("--sources", type=int, default=20)
    add_json_option(p)
    args = p.parse_args()
    from distributed import Client, LocalCluster
    from zarrfeed.writer import dask as zdask

    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-dask-"))
    try:
        eps = list(synthetic.episodes(args.scenes))
        per = -(-args.scenes // args.sources)
        sources = []
        for i in range(args.sources):
            path = tmp / f"source-{i:03d}.pkl"
            path.write_bytes(pickle.dumps(eps[i * per:(i + 1) * per], protocol=5))
            sources.append(str(path))
        mb = sum(a.nbytes for ep in eps for a in ep.values()) / 1e6
        rows = sum(len(a) for ep in eps for a in ep.values())
        del eps
        print(f"{args.scenes} scenes in {args.sources} sources, {mb:,.0f} MB, {rows:,} rows")
        with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                          dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False},
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            client.gather(client.map(noop, range(10)))  # warm
            t = time.perf_counter()
            client.gather(client.map(noop, range(200), pure=False))
            per_task = (time.perf_counter() - t) / 200
            print(f"one Dask task round trip (200 no-op tasks, throughput): {per_task * 1e3:.2f} ms")
            times: dict[str, list[float]] = {"dask-2-workers": [], "local-2-workers": []}
            per_worker: list[float] = []
            for r in range(args.repeat):
                print(f"repeat {r + 1}/{args.repeat}")
                for variant in times:
                    out = tmp / f"{variant}.zarr"
                    shutil.rmtree(out, ignore_errors=True)
                    t = time.perf_counter()
                    if variant.startswith("dask"):
                        s = zdask.ingest(client, sources, read_source, out)
                        per_worker.append(rows / s.task_seconds)
                    else:
                        with DatasetWriter(out, workers=2) as w:
                            w.ingest(chain.from_iterable(read_source(s) for s in sources))
                    seconds = time.perf_counter() - t
                    times[variant].append(seconds)
                    print(f"  {variant:18s} {mb / seconds:8,.0f} MB/s  ({seconds:.2f} s)")
        speed = {v: mb / statistics.median(ts) for v, ts in times.items()}
        # MB/s of each variant, rows/s of one worker, and the task round trip as a speed (higher is faster), as
        # every figure of --json is
        write_json(args.json, {**speed, "rows written per worker-second (dask tasks)": statistics.median(per_worker),
                               "Dask task round trips/s": 1 / per_task})
        print("\nmedians:")
        for v, s in speed.items():
            print(f"  {v:18s} {s:8,.0f} MB/s")
        print(f"  rows written per worker-second (dask tasks): {statistics.median(per_worker):,.0f}")
        print(f"  Dask task round trip: {per_task * 1e3:.2f} ms")
        print_ratios(speed, [("dask-2-workers", "local-2-workers", 0.7)])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
