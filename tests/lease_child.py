"""Run by tests as a separate process: create a dataset, hold its lease, then (after a line on stdin) write one
episode and close. A test SIGSTOPs it in between, so that another writer takes its lease over.

    python lease_child.py URL LEASE_TIMEOUT [--append]
Prints "created", then after the line on stdin either "closed" or "failed: <exception type>: <message>".
"""
import sys

from writer import synthetic
from writer.dataset_writer import DatasetWriter

if __name__ == "__main__":
    url, timeout = sys.argv[1], float(sys.argv[2])
    w = DatasetWriter(url, workers=0, mode="a" if "--append" in sys.argv else "w", lease_timeout=timeout,
                      chunks={"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500})
    print("created", flush=True)
    sys.stdin.readline()
    try:
        with w:
            w.ingest(synthetic.episodes(1, seed=9, frames=20, agents_per_frame=30))
        print("closed", flush=True)
    except Exception as exc:
        print(f"failed: {type(exc).__name__}: {exc}", flush=True)
        sys.exit(1)
