"""Ingest synthetic scenes with two writer processes, interrupt, then resume.

Run: python examples/parallel_ingest.py [OUT_DIR]
"""
import sys
import tempfile
from pathlib import Path

from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, synthetic

if __name__ == "__main__":  # workers import this script again (see "Start methods" in docs/guides/loading.md)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()) / "scenes.zarr"
    episodes = list(synthetic.episodes(12, seed=0))

    # A first run that stops early: only the first 5 episodes are submitted before it is aborted.
    w = DatasetWriter(out, workers=2)
    for ep in episodes[:5]:
        w.submit(ep)
    w.sync()    # write and commit what was submitted
    w.abort()   # stop now, as a crash would (workers killed; what was committed stays)
    print("after the first run:", Dataset.open(out).rows)

    # Resume with the same input: committed episodes are passed over, the rest written.
    with DatasetWriter(out, workers=2, mode="a") as w:
        summary = w.ingest(episodes, resume=True)
    print("resumed:", summary["episodes"], "episodes written;", Dataset.open(out).rows)
    print("valid:", Dataset.open(out).validate().ok)
