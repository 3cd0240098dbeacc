"""Named transforms for the serve tests (`zarrfeed serve --transforms tests/support/serve_transforms.py`)."""
import numpy as np


def speed(batch, scale=1.0):
    """Each agent's speed (times `scale`) and its track id."""
    return {"speed": (np.linalg.norm(batch["velocity"], axis=1) * scale).astype(np.float32),
            "track_id": batch["track_id"].copy()}


def window_summary(batch):
    """Per sample: the agents in each frame and the ego's xy path."""
    off = batch["agents_offsets"]
    return {"agents_per_frame": np.diff(off, axis=1).astype(np.int32),
            "ego_xy": batch["frames/ego_translation"][:, :, :2].astype(np.float32)}


def fails(batch):
    """Always raises (a transform with a bug)."""
    raise ValueError("boom from the server's transform")


def slow(batch, seconds=0.2):
    """The batch's track ids (agents) or frame indices (windows), after `seconds`: a stream that stays open
    while a test looks at it."""
    import time
    time.sleep(seconds)
    key = "frame_row" if "frame_row" in batch else "track_id"  # windows, or agents
    return {key: batch[key].copy()}


def _helper():  # private: not a transform
    return None
