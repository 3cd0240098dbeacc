"""The service over loopback, against the same work done locally, alternated; medians of --repeat:
- feeding: RemoteLoader from a `zarrfeed serve` process (2 loader workers per stream) against a local
  Loader(num_workers=2), batch 4096 of agents, one epoch each (target: remote >= 0.6x local);
- ingestion: RemoteWriter from 2 producer processes against a local DatasetWriter(workers=2) ingesting the
  same episodes (target: remote >= 0.6x local).
Ratios printed last.

    python bench/bench_serve.py [--scenes 100] [--repeat 3]
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import parser, print_ratios, synthetic_dataset
from zarrfeed.loader import Loader

from zarrfeed.flight import RemoteLoader, RemoteWriter

ROOT = Path(__file__).resolve().parents[1]


def epoch(make) -> tuple[float, int]:
    with make() as loader:
        t0 = time.perf_counter()
        rows = 0
        for batch in loader:
            rows += len(batch["centroid"])
        return time.perf_counter() - t0, rows


def main() -> None:
    args = parser(__doc__).parse_args()
    with synthetic_dataset(args.scenes) as path:
        server = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "serve", str(path), "--port", "0",
                                   "--workers", "2"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            url = server.stdout.readline().split()[2]
            itemsize = 116
            times = {"remote": [], "local": []}
            epoch(lambda: RemoteLoader(url, "agents", batch_size=4096))  # warm: the server's fork server
            for r in range(args.repeat):  # a new seed each repeat: the server keeps a finished epoch's loader
                # for the same ticket's next epoch, which a new local Loader cannot do
                for name, make in (("remote", lambda: RemoteLoader(url, "agents", batch_size=4096, seed=1 + r)),
                                   ("local", lambda: Loader(path, "agents", batch_size=4096, seed=1 + r,
                                                            num_workers=2))):
                    seconds, rows = epoch(make)
                    times[name].append(seconds)
            speed = {}
            for name, ts in times.items():
                s = statistics.median(ts)
                speed[name] = rows / s
                print(f"{name}: {rows:,} rows in {s:.2f} s, {rows / s / 1e6:.2f} M rows/s, "
                      f"{rows * itemsize / s / 1e6:.0f} MB/s (median of {args.repeat})")
            ingest = bench_ingest(args.repeat, min(args.scenes, 80))
            print_ratios({**speed, **ingest}, [("remote", "local", 0.6), ("remote ingest", "local ingest", 0.6)])
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


def bench_ingest(repeat: int, scenes: int) -> dict[str, float]:
    """MB/s of 2 RemoteWriter producers (half the scenes each) and of a local DatasetWriter(workers=2)."""
    import shutil
    import tempfile

    from zarrfeed.writer import DatasetWriter, synthetic
    eps = list(synthetic.episodes(scenes, seed=0))
    nbytes = sum(a.nbytes for ep in eps for a in ep.values())
    times: dict[str, list[float]] = {"remote ingest": [], "local ingest": []}
    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-"))
    script = tmp / "producer.py"
    script.write_text(PRODUCER)
    try:
        for r in range(repeat):
            local = tmp / f"local{r}.zarr"
            with DatasetWriter(local, workers=2) as w:
                t0 = time.perf_counter()
                w.ingest(eps)
                w.sync()
                times["local ingest"].append(time.perf_counter() - t0)
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
                t0 = time.perf_counter()
                for p in producers:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                for p in producers:
                    p.wait(600)  # each closes its RemoteWriter: its episodes are committed
                times["remote ingest"].append(time.perf_counter() - t0)
            finally:
                server.terminate()
                server.wait(10)
            shutil.rmtree(local)
            shutil.rmtree(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {}
    for name, ts in times.items():
        s = statistics.median(ts)
        out[name] = nbytes / s
        print(f"{name}: {scenes} scenes, {nbytes / 1e6:.0f} MB in {s:.2f} s, {nbytes / s / 1e6:.0f} MB/s "
              f"(median of {repeat})")
    return out


if __name__ == "__main__":
    main()
