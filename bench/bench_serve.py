"""The service over loopback, against the same work done locally, alternated; medians of --repeat:
- feeding: RemoteLoader from a `zarrfeed serve` process (2 loader workers per stream) against a local
  Loader(num_workers=2), batch 4096 of agents, one epoch each (target: remote >= 0.7x local). Both are on
  this host, so the server's streams and the local Loader share the host cache: after the warm-up epoch
  neither decodes, and the ratio is the wire's cost alone (docs/figures.json: serve.feed_vs_local);
- ingestion: RemoteWriter from 2 producer processes against a local DatasetWriter(workers=2) ingesting the
  same episodes (target: remote >= 0.6x local);
- cost: the server's CPU-seconds (its process and workers) per GB fed and per GB ingested, against the
  local Loader's and DatasetWriter's (this process and its workers) for the same work: what decides how many
  trainers and producers one server host carries.
Ratios printed last.

    python bench/bench_serve.py [--scenes 100] [--repeat 3] [--plot serve.png] [--json FILE]
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import (add_json_option, add_plot_option, check_plot_option, parser, plot_panels, print_ratios,
                    smaller_than_documented, synthetic_dataset, tree_cpu_seconds, write_json)
from zarrfeed.loader import Loader

from zarrfeed.flight import RemoteLoader, RemoteWriter

ROOT = Path(__file__).resolve().parents[1]


def epoch(make, cpu_of: int | None = None) -> tuple[float, int, float]:
    """Seconds and rows of one epoch, and the CPU seconds process `cpu_of`'s tree spent meanwhile."""
    import os
    pid = cpu_of or os.getpid()
    with make() as loader:
        c0, t0 = tree_cpu_seconds(pid), time.perf_counter()
        rows = 0
        for batch in loader:
            rows += len(batch["centroid"])
        return time.perf_counter() - t0, rows, tree_cpu_seconds(pid) - c0


def main() -> None:
    p = parser(__doc__)
    add_plot_option(p)
    add_json_option(p)
    args = p.parse_args()
    check_plot_option(args.plot)
    with synthetic_dataset(args.scenes) as path:
        server = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "serve", str(path), "--port", "0",
                                   "--workers", "2"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            url = server.stdout.readline().split()[2]
            itemsize = 116
            times: dict[str, list[float]] = {"remote": [], "local": []}
            cpu: dict[str, list[float]] = {"remote": [], "local": []}
            epoch(lambda: RemoteLoader(url, "agents", batch_size=4096))  # warm: the server's fork server
            for r in range(args.repeat):  # a new seed each repeat: the server keeps a finished epoch's loader
                # for the same ticket's next epoch, which a new local Loader cannot do
                for name, make in (("remote", lambda: RemoteLoader(url, "agents", batch_size=4096, seed=1 + r)),
                                   ("local", lambda: Loader(path, "agents", batch_size=4096, seed=1 + r,
                                                            num_workers=2))):
                    seconds, rows, cpu_s = epoch(make, server.pid if name == "remote" else None)
                    times[name].append(seconds)
                    cpu[name].append(cpu_s)
            speed, cost = {}, {}
            for name, ts in times.items():
                s = statistics.median(ts)
                speed[name] = rows / s
                gb = rows * itemsize / 1e9
                cost[name] = statistics.median(cpu[name]) / gb
                who = "the server's" if name == "remote" else "this process's"
                print(f"{name}: {rows:,} rows in {s:.2f} s, {rows / s / 1e6:.2f} M rows/s, "
                      f"{rows * itemsize / s / 1e6:.0f} MB/s; {who} CPU {cost[name]:.2f} s per GB "
                      f"(median of {args.repeat})")
            ingest, ingest_cost = bench_ingest(args.repeat, min(args.scenes, 80))
            # rows/s fed, bytes/s ingested, and CPU per GB as GB per CPU-second (higher is cheaper), as every
            # figure of --json is higher-is-faster
            write_json(args.json, {**speed, **ingest, **{f"{k}, GB per CPU-second": 1 / v for k, v in (
                ("server feeding", cost["remote"]), ("local Loader", cost["local"]),
                ("server ingesting", ingest_cost["remote ingest"]),
                ("local DatasetWriter", ingest_cost["local ingest"]))}})
            print_ratios({**speed, **ingest}, [("remote", "local", 0.7), ("remote ingest", "local ingest", 0.6)])
            # cheaper is better: local / remote is the share of the local cost the server's work costs
            print_ratios({"server feeding": 1 / cost["remote"], "local Loader": 1 / cost["local"],
                          "server ingesting": 1 / ingest_cost["remote ingest"],
                          "local DatasetWriter": 1 / ingest_cost["local ingest"]},
                         [("server feeding", "local Loader", None),
                          ("server ingesting", "local DatasetWriter", None)],
                         title="CPU per GB", meaning="local's CPU per GB / the server's: higher is cheaper")
            if args.plot:
                plot_panels(args.plot, f"Serving over loopback: {args.scenes} scenes, median of {args.repeat}", [
                    ("feeding: batches of 4096 agents, one epoch", "MB/s", {
                        "zarrfeed RemoteLoader from zarrfeed serve": speed["remote"] * itemsize / 1e6,
                        "zarrfeed Loader in this process (no wire)": speed["local"] * itemsize / 1e6}),
                    ("ingesting: 2 producers", "MB/s", {
                        "zarrfeed RemoteWriter x2 through the server": ingest["remote ingest"] / 1e6,
                        "zarrfeed DatasetWriter(workers=2), local": ingest["local ingest"] / 1e6}),
                    ("CPU per GB (lower is cheaper)", "CPU-seconds per GB", {
                        "zarrfeed serve, feeding": cost["remote"], "zarrfeed Loader, local": cost["local"],
                        "zarrfeed serve, ingesting": ingest_cost["remote ingest"],
                        "zarrfeed DatasetWriter, local": ingest_cost["local ingest"]})],
                        smoke=smaller_than_documented(p, args))
        finally:
            server.terminate()
            server.wait(10)


PRODUCER = """
import sys
from zarrfeed.writer import synthetic
from zarrfeed.flight import RemoteWriter
if __name__ == "__main__":
    url, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    eps = list(synthetic.episodes(first + n, seed=0))[first:]
    print("ready", flush=True)
    sys.stdin.readline()
    with RemoteWriter(url) as w:
        w.ingest(eps, keys=range(first, first + n))
"""


def bench_ingest(repeat: int, scenes: int) -> tuple[dict[str, float], dict[str, float]]:
    """MB/s of 2 RemoteWriter producers (half the scenes each) and of a local DatasetWriter(workers=2); and
    CPU seconds per GB: the server's (remote), this process's and its workers' (local)."""
    import os

    import shutil
    import tempfile

    from zarrfeed.writer import DatasetWriter, synthetic
    eps = list(synthetic.episodes(scenes, seed=0))
    nbytes = sum(a.nbytes for ep in eps for a in ep.values())
    times: dict[str, list[float]] = {"remote ingest": [], "local ingest": []}
    cpu: dict[str, list[float]] = {"remote ingest": [], "local ingest": []}
    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-"))
    script = tmp / "producer.py"
    script.write_text(PRODUCER)
    try:
        for r in range(repeat):
            local = tmp / f"local{r}.zarr"
            with DatasetWriter(local, workers=2) as w:
                c0, t0 = tree_cpu_seconds(os.getpid()), time.perf_counter()
                w.ingest(eps)
                w.sync()
                times["local ingest"].append(time.perf_counter() - t0)
                cpu["local ingest"].append(tree_cpu_seconds(os.getpid()) - c0)
            target = tmp / f"remote{r}.zarr"
            with DatasetWriter(target, workers=0):
                pass  # an empty dataset to serve
            server = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "serve", str(target), "--port", "0",
                                       "--workers", "2", "--ingest"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
            try:
                url = server.stdout.readline().split()[2]
                half = scenes // 2
                producers = [subprocess.Popen([sys.executable, str(script), url, str(a), str(b)], cwd=ROOT,
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                             for a, b in ((0, half), (half, scenes - half))]
                for p in producers:  # episodes made before the clock starts, as the local writer's are
                    p.stdout.readline()
                with RemoteWriter(url) as warm:  # the server's writer (lease, workers) opens before the clock,
                    warm.submit(eps[0], key="warm-up")  # as the local writer's is ready before ingest()
                c0, t0 = tree_cpu_seconds(server.pid), time.perf_counter()
                for p in producers:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                for p in producers:
                    p.wait(600)  # each closes its RemoteWriter: its episodes are committed
                times["remote ingest"].append(time.perf_counter() - t0)
                cpu["remote ingest"].append(tree_cpu_seconds(server.pid) - c0)
            finally:
                server.terminate()
                server.wait(10)
            shutil.rmtree(local)
            shutil.rmtree(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out, cost = {}, {}
    for name, ts in times.items():
        s = statistics.median(ts)
        out[name] = nbytes / s
        cost[name] = statistics.median(cpu[name]) / (nbytes / 1e9)
        who = "the server's" if name.startswith("remote") else "this process's"
        print(f"{name}: {scenes} scenes, {nbytes / 1e6:.0f} MB in {s:.2f} s, {nbytes / s / 1e6:.0f} MB/s; "
              f"{who} CPU {cost[name]:.2f} s per GB (median of {repeat})")
    return out, cost


if __name__ == "__main__":
    main()
