"""Run with LeRobot's own Python (its environment, not zarrfeed's): open the LeRobot dataset at argv[1] with
`LeRobotDataset(..., video_backend="pyav")` and a window on every key, and save what it returns for every
frame (the current step of each key; frames as uint8 channels-last) to the .npz at argv[2]."""
import sys

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root, out = sys.argv[1], sys.argv[2]
ds = LeRobotDataset("local/zarrfeed", root=root, video_backend="pyav",
                    delta_timestamps={"state": [-0.1, 0.0], "image": [-0.1, 0.0]})
items = [ds[i] for i in range(len(ds))]
np.savez(out, state=np.stack([it["state"][-1].numpy() for it in items]),
         action=np.stack([it["action"].numpy() for it in items]),
         image=np.stack([(it["image"][-1].numpy() * 255).round().astype(np.uint8).transpose(1, 2, 0) for it in items]),
         tasks=np.array(ds.meta.tasks.index.tolist()))
