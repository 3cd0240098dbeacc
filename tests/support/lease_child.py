"""Run by tests as a separate process: create a dataset, hold its lease, then (after a line on stdin) write and
close. A test SIGSTOPs it in between, so that another writer takes its lease over.

    python lease_child.py URL LEASE_TIMEOUT [--append] [--first] [--workers N]
Prints "created", then after the line on stdin either "closed" or "failed: <exception type>: <message>".
With --first it commits one episode (seed 8) before "created", and after the line submits three more (seed 9,
continuing that input, so no commit comes before their rows are written); otherwise it ingests one (seed 9).
"""
import sys

from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter


def episodes(n: int, seed: int):
    return synthetic.episodes(n, seed=seed, frames=20, agents_per_frame=30)


if __name__ == "__main__":
    url, timeout = sys.argv[1], float(sys.argv[2])
    workers = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 0
    first = "--first" in sys.argv
    w = DatasetWriter(url, workers=workers, mode="a" if "--append" in sys.argv else "w", lease_timeout=timeout,
                      chunks={"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500})
    if first:
        w.ingest(episodes(1, seed=8))
    print("created", flush=True)
    sys.stdin.readline()
    try:
        with w:
            if first:
                for ep in episodes(3, seed=9):
                    w.submit(ep)
            else:
                w.ingest(episodes(1, seed=9))
        print("closed", flush=True)
    except Exception as exc:
        print(f"failed: {type(exc).__name__}: {exc}", flush=True)
        sys.exit(1)
