"""Run by tests as a separate process: ingest synthetic scenes slowly, so that it can be killed mid-way.

    python writer_child.py OUT N_SCENES WORKERS [SECONDS_PER_EPISODE] [--resume] [--start-method M]
"""
import sys
import time

from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter


def slowly(n: int, pause: float):
    for ep in synthetic.episodes(n, seed=5, frames=40, agents_per_frame=300):
        time.sleep(pause)
        yield ep


if __name__ == "__main__":
    out, n, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    resume = "--resume" in sys.argv
    method = sys.argv[sys.argv.index("--start-method") + 1] if "--start-method" in sys.argv else None
    with DatasetWriter(out, workers=workers, mode="a" if resume else "w", commit_interval=0.05, start_method=method,
                       chunks={"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}) as w:
        print("workers", *w.worker_pids, flush=True)
        w.ingest(slowly(n, pause), resume=resume)
    print("done", flush=True)
