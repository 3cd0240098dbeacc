"""Sources for the Dask tests: importable on the cluster's worker processes (they share the test's sys.path)."""
import os
import signal
import sys
import time
from pathlib import Path

from zarrfeed.writer import synthetic

SMALL = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}


def small(seed: int):
    """Two or three small episodes per source (so sources share chunks), the same each time."""
    return synthetic.episodes(2 + seed % 2, seed=seed, frames=20, agents_per_frame=30)


def slow(seed: int):
    """`small`, a quarter second slower: for killing the client mid-ingest."""
    time.sleep(0.25)
    return small(seed)


class KillOnce:
    """`small`, except that the first worker to read source `victim` is SIGKILLed (a marker file says so)."""

    def __init__(self, marker: str, victim: int) -> None:
        self.marker, self.victim = marker, victim

    def __call__(self, seed: int):
        if seed == self.victim and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return small(seed)


class Broken:
    """`small`, but while `broken`, source 3 raises after its first episode (if `raises`) and source 5 yields
    an episode with an interval past the agents."""

    def __init__(self, broken: bool = True, raises: bool = True) -> None:
        self.broken, self.raises = broken, raises

    def __call__(self, seed: int):
        for i, ep in enumerate(small(seed)):
            if self.broken and self.raises and seed == 3 and i == 1:
                raise OSError("cannot read log-3.bin: truncated")
            if self.broken and seed == 5 and i == 1:
                ep["frames"]["agent_index_interval"][4] = (10**6, 10**6 + 1)
            yield ep


class BadFirst:
    """`small`, but while `broken`, the input's first episode (source 0's episode 0) has an interval past its
    agents."""

    def __init__(self, broken: bool = True) -> None:
        self.broken = broken

    def __call__(self, seed: int):
        for i, ep in enumerate(small(seed)):
            if self.broken and seed == 0 and i == 0:
                ep["frames"]["agent_index_interval"][4] = (10**6, 10**6 + 1)
            yield ep


class Exits:
    """`small`, except that source 3 calls `sys.exit` after its first episode (a BaseException, not an Exception)."""

    def __call__(self, seed: int):
        for i, ep in enumerate(small(seed)):
            if seed == 3 and i == 1:
                sys.exit("no more logs")
            yield ep


def robot(seed: int):
    """Two or three episodes of a replay buffer per source (Diffusion Policy's `add_episode` dicts), the same
    each time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{"img": rng.integers(0, 256, (t, 8, 8, 3), dtype=np.uint8),
             "action": rng.normal(size=(t, 2)).astype(np.float32)}
            for t in rng.integers(1, 30, 2 + seed % 2).tolist()]
