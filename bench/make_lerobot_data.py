"""LeRobot v3 datasets for bench_lerobot.py, written by LeRobot's own writer (runs in bench/.venv-lerobot).

    bench/.venv-lerobot/bin/python bench/make_lerobot_data.py [--episodes 200] [--seed 0] [--out DIR]

Three variants of the same episodes, each written with `LeRobotDataset.create` + `add_frame` + `save_episode` +
`finalize` at LeRobot's defaults (AV1 with libsvtav1 through PyAV, a key frame every 2 frames, data and video files
of up to 100 and 200 MB holding many episodes), as the golden in shared/data was made:
  tabular   `observation.state` and `action`, float32 (6,)
  cam1      the same and `observation.images.cam0`, 96x96 RGB video
  cam2      the same and `observation.images.cam1`, a second view
Episodes of 50-150 frames at 10 fps (seeded), tasks "pick", "place", "push". The frames are smooth gradients
that drift with moving shapes and a little sensor noise: compressible, not trivial, so the AV1 files are of a
realistic size. Each dataset goes to `<out>/<variant>-e<episodes>-s<seed>` (default out:
/tmp/zarrfeed-lerobot-bench, outside the repository), written under `.partial` and renamed when finalized, and is
reused when it is there already.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never ask the Hub
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 (the encoder): errors only, not its configuration per episode

VARIANTS = {"tabular": 0, "cam1": 1, "cam2": 2}  # variant -> number of cameras
FPS = 10
SIZE = 96
DIM = 6
TASKS = ("pick", "place", "push")
DEFAULT_OUT = Path("/tmp/zarrfeed-lerobot-bench")


def camera_keys(cameras: int) -> list[str]:
    return [f"observation.images.cam{c}" for c in range(cameras)]


def features(cameras: int) -> dict:
    """LeRobot's feature description of a variant with `cameras` cameras."""
    out: dict = {
        "observation.state": {"dtype": "float32", "shape": (DIM,), "names": None},
        "action": {"dtype": "float32", "shape": (DIM,), "names": None},
    }
    for key in camera_keys(cameras):
        out[key] = {"dtype": "video", "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]}
    return out


def lengths(episodes: int, seed: int) -> np.ndarray:
    """Each episode's number of frames: 50 to 150, seeded."""
    return np.random.default_rng(seed).integers(50, 151, size=episodes)


def episode(e: int, n: int, cameras: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], str]:
    """Episode `e` of `n` frames: state (n, 6), action (n, 6), per camera frames (n, 96, 96, 3) uint8, its task.
    The same for every variant (the cameras' frames aside)."""
    rng = np.random.default_rng([seed, e])
    t = np.arange(n, dtype=np.float64) / FPS
    freq, phase = rng.uniform(0.2, 1.5, DIM), rng.uniform(0, 2 * np.pi, DIM)
    state = np.sin(freq * t[:, None] + phase).astype(np.float32)
    action = np.vstack([state[1:], state[-1:]]) + rng.normal(0, 0.01, (n, DIM)).astype(np.float32)
    views = [frames(rng, n, c) for c in range(cameras)]
    return state, action.astype(np.float32), views, TASKS[e % len(TASKS)]


def frames(rng: np.random.Generator, n: int, camera: int) -> np.ndarray:
    """A camera's view: a drifting two-color gradient, a disc and a square moving on smooth paths, light noise."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    c0, c1 = rng.uniform(30, 220, 3), rng.uniform(30, 220, 3)
    disc_color, square_color = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    path = rng.uniform(0.3, 1.2, 4)
    out = np.empty((n, SIZE, SIZE, 3), np.uint8)
    for i in range(n):
        s = i / FPS
        mix = 0.5 + 0.5 * np.sin(2 * np.pi * (xx * (1 + camera) + yy * 0.5 + 0.1 * s))
        img = c0 * mix[..., None] + c1 * (1 - mix[..., None])
        cx, cy = 0.5 + 0.3 * np.sin(path[0] * s), 0.5 + 0.3 * np.cos(path[1] * s)
        img[(xx - cx) ** 2 + (yy - cy) ** 2 < 0.015] = disc_color
        sx, sy = 0.5 + 0.35 * np.sin(path[2] * s + 1), 0.5 + 0.35 * np.sin(path[3] * s + 2)
        img[(abs(xx - sx) < 0.08) & (abs(yy - sy) < 0.08)] = square_color
        img += rng.normal(0, 3, img.shape)
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def dataset_path(out: Path, variant: str, episodes: int, seed: int) -> Path:
    return out / f"{variant}-e{episodes}-s{seed}"


def make(variant: str, episodes: int, seed: int = 0, out: Path = DEFAULT_OUT) -> Path:
    """The dataset of `variant` with `episodes` episodes: written by LeRobot's writer, or the one already there."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = dataset_path(out, variant, episodes, seed)
    if (root / "meta" / "info.json").is_file():
        return root
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    cameras = VARIANTS[variant]
    t0 = time.perf_counter()
    ds = LeRobotDataset.create(f"zarrfeed-bench/{variant}", fps=FPS, features=features(cameras), root=partial,
                               use_videos=cameras > 0)
    for e, n in enumerate(lengths(episodes, seed)):
        state, action, views, task = episode(e, int(n), cameras, seed)
        for i in range(n):
            frame = {"observation.state": state[i], "action": action[i], "task": task}
            frame.update({key: view[i] for key, view in zip(camera_keys(cameras), views, strict=True)})
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    os.rename(partial, root)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"wrote {root} ({episodes} episodes, {size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s", flush=True)
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the cache folder (default: {DEFAULT_OUT})")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = p.parse_args()
    for variant in args.variants:
        print(make(variant, args.episodes, args.seed, args.out))


if __name__ == "__main__":
    main()
