"""Feeding over Arrow Flight: RemoteLoader from a `zarrfeed serve` process on loopback against a local Loader,
both batch 4096 of agents with 2 loader workers (the server's per stream), one epoch each, alternated;
medians of --repeat. Ratios printed last (target: remote >= 0.6x local).

    python bench/bench_serve.py [--scenes 100] [--repeat 3]

RemoteWriter (ingestion over Flight) is not built yet, so its half of the benchmark is not here.
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import parser, print_ratios, synthetic_dataset

from loader import Loader
from loader.remote import RemoteLoader

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
            url = server.stdout.readline().split()[3]
            itemsize = 116
            times = {"remote": [], "local": []}
            epoch(lambda: RemoteLoader(url, "agents", batch_size=4096))  # warm: the server's fork server
            for _ in range(args.repeat):
                for name, make in (("remote", lambda: RemoteLoader(url, "agents", batch_size=4096, seed=1)),
                                   ("local", lambda: Loader(path, "agents", batch_size=4096, seed=1,
                                                            num_workers=2))):
                    seconds, rows = epoch(make)
                    times[name].append(seconds)
            speed = {}
            for name, ts in times.items():
                s = statistics.median(ts)
                speed[name] = rows / s
                print(f"{name}: {rows:,} rows in {s:.2f} s, {rows / s / 1e6:.2f} M rows/s, "
                      f"{rows * itemsize / s / 1e6:.0f} MB/s (median of {args.repeat})")
            print_ratios(speed, [("remote", "local", 0.6)])
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
