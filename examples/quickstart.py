"""Write synthetic L5Kit scenes, open them, describe and validate them; then a custom schema.

Run: python examples/quickstart.py [OUT_DIR]
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
from zarrfeed.loader import Dataset
from zarrfeed.writer import Schema, synthetic, write_dataset

if __name__ == "__main__":  # workers import this script again (see "Start methods" in docs/guides/loading.md)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())

    summary = write_dataset(out / "scenes.zarr", synthetic.episodes(5, seed=0))
    print("wrote", summary["rows"])

    ds = Dataset.open(out / "scenes.zarr")
    print(ds)
    frame = ds["frames"][100]
    start, end = frame["agent_index_interval"]
    print(f"frame 100 has {end - start} agents; first track ids:", ds["agents"][start:start + 5]["track_id"])
    print("agents compress", ds.info()["agents"]["ratio"], "x; valid:", ds.validate().ok)

    # Any other set of linked tables: runs own [start, end) intervals of steps.
    run = np.dtype([("step_index_interval", "<i8", (2,)), ("name", "S8")])
    step = np.dtype([("t", "<f4"), ("action", "<f4", (6,))])
    schema = Schema({"runs": (run, 1000), "steps": (step, 50_000)}, links={"runs.step_index_interval": "steps"})
    episodes = ({"runs": np.array([([0, n], b"run%d" % n)], run), "steps": np.zeros(n, step)} for n in (10, 20, 5))
    write_dataset(out / "runs.zarr", episodes, schema)
    runs = Dataset.open(out / "runs.zarr")
    print(runs.rows, runs["runs"][:]["step_index_interval"].tolist())
