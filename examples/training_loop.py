"""Shuffled batches of agents for a training loop: resumable, sharded, with a transform in the workers.

Run: python examples/training_loop.py [DATASET]   (default: a small synthetic dataset in a temporary folder)
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
from zarrfeed.loader import Dataset, Loader
from zarrfeed.writer import synthetic, write_dataset


def features(batch):  # runs in the loader's worker processes; closures and lambdas are fine
    speed = np.linalg.norm(batch["velocity"], axis=1)
    return {"xy": batch["centroid"].astype(np.float32), "speed": speed.astype(np.float32)}


if __name__ == "__main__":  # workers import this script again (see "Start methods" in docs/guides/loading.md)
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        path = Path(tempfile.mkdtemp()) / "scenes.zarr"
        write_dataset(path, synthetic.episodes(4, seed=0), workers=2)

    cars = Dataset.open(path)["agents"][:]["label_probabilities"][:, 3] == 1  # like L5Kit's agents mask

    with Loader(path, "agents", batch_size=1024, rows=cars, transform=features, num_workers=2, seed=0) as loader:
        for step, batch in enumerate(loader):
            # batch["xy"] is a (1024, 2) float32 view into shared memory, valid until the next batch:
            # torch.from_numpy(batch["xy"]) or jax.dlpack.from_dlpack(batch["xy"]) take it without a copy.
            if step == 2:
                state = loader.state_dict()  # save it with your checkpoint
                break
        print("3 batches, then a checkpoint:", state)

    with Loader(path, "agents", batch_size=1024, rows=cars, transform=features, num_workers=2, seed=0) as resumed:
        resumed.load_state_dict(state)
        rest = sum(len(b["xy"]) for b in resumed)
        print(f"resumed: {rest} more car rows; epoch done, {int(cars.sum())} cars in all")

    # Two ranks of a distributed job: disjoint halves of every epoch, with equal batch counts.
    ranks = [Loader(path, "agents", batch_size=1024, rank=r, world_size=2, num_workers=0) for r in range(2)]
    print("batches per rank:", [len(x) for x in ranks])
