"""LeRobot v3 windows: zarrfeed's LeRobotLoader against LeRobot 0.4.4's own reading and the decode bound, in one run.

    bash bench/lerobot_env.sh                       # once: bench/.venv-lerobot (LeRobot, torch, zarrfeed[video])
    bench/.venv-lerobot/bin/python bench/bench_lerobot.py [--episodes 200] [--repeat 3] [--json run.json]

Datasets: make_lerobot_data.py's three variants (tabular; one and two 96x96 AV1 cameras; LeRobot's own writer,
kept in --data and reused). Windows as Diffusion Policy samples them: `observation.state` and each camera at
-0.1 and 0 s, `action` at 0 to 15 steps ahead. Per variant, repeats alternating which goes first:
- LeRobot: `LeRobotDataset(root, delta_timestamps=DT, video_backend="pyav")` in a torch DataLoader (2 workers,
  shuffled, batch 64);
- zarrfeed: `LeRobotLoader(root, delta_timestamps=DT, ...)`, batches alike (2 workers, shuffled, batch 64);
  skipped, saying so, while zarrfeed has no LeRobotLoader;
- the decode bound (video variants): PyAV decoding every frame of the dataset's videos once into RGB, each file
  split at half its duration, the pieces over 2 processes (one decoder thread each, --decode-threads: the same
  2 cores), as frames/s and as dataset rows/s (frames/s over the cameras: each item needs one new frame per camera).
A loader's first batch is timed from its construction (opening the dataset included). LeRobot's items/s are
those of the batches after the first, up to --batches batches or --seconds seconds (its steady pace: each item
costs the same). zarrfeed's are a whole epoch's items over the whole epoch's time, from the loader's
construction to its last batch: zarrfeed decodes each window's chunks before that window's first batch, so a
pace measured after the first batch leaves the first window's decoding out (it is printed too, as LeRobot's pace
is measured, and compared with the bound without a target). Medians of --repeat
are printed, then the ratios, last; --json writes them as speeds (first batches as first batches/s) for
bench/figures.py.
"""
from __future__ import annotations

import argparse
import inspect
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never ask the Hub

from common import add_json_option, print_ratios, write_json  # noqa: E402
from make_lerobot_data import DEFAULT_OUT, FPS, VARIANTS, camera_keys, make  # noqa: E402

BATCH = 64
WORKERS = 2


def delta_timestamps(cameras: int) -> dict[str, list[float]]:
    """Diffusion Policy's sampling: 2 observation steps, 16 action steps."""
    dt = {"observation.state": [-0.1, 0.0], "action": [i / FPS for i in range(16)]}
    dt.update({key: [-0.1, 0.0] for key in camera_keys(cameras)})
    return dt


def timed(make_batches: Callable[[], Iterator[Any]], batches: int, seconds: float) -> tuple[float, float]:
    """(items/s after the first batch, seconds to the first batch from `make_batches()`) of one epoch's batches,
    up to `batches` batches or `seconds` seconds after the first."""
    t0 = time.perf_counter()
    it = make_batches()
    first = len(next(it)["index"])
    t1 = time.perf_counter()
    items, taken = 0, 0
    for batch in it:
        items += len(batch["index"])
        taken += 1
        if taken >= batches or time.perf_counter() - t1 >= seconds:
            break
    elapsed = time.perf_counter() - t1
    getattr(it, "close", lambda: None)()  # the loader's workers stopped now, not timed
    if items == 0:  # an epoch of one batch: the first is all there is
        return first / (t1 - t0), t1 - t0
    return items / elapsed, t1 - t0


def timed_epoch(make_batches: Callable[[], Iterator[Any]]) -> tuple[float, float, float]:
    """(items/s of one whole epoch, from `make_batches()` to its last batch; items/s after the first batch, as
    LeRobot's pace is measured; seconds to the first batch)."""
    t0 = time.perf_counter()
    it = make_batches()
    items = len(next(it)["index"])
    t1 = time.perf_counter()
    for batch in it:
        items += len(batch["index"])
    t2 = time.perf_counter()
    return items / (t2 - t0), (items - BATCH) / max(t2 - t1, 1e-9), t1 - t0


def lerobot_batches(root: Path, dt: dict, seed: int) -> Iterator[Any]:
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(f"zarrfeed-bench/{root.name}", root=root, delta_timestamps=dt, video_backend="pyav")
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         generator=torch.Generator().manual_seed(seed))
    yield from loader


def zarrfeed_loader_class() -> tuple[Any, str]:
    """zarrfeed's LeRobotLoader, or None and why it is not there."""
    try:
        from zarrfeed.loader.kinds.lerobot_windows import LeRobotLoader
    except ImportError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return LeRobotLoader, ""


def zarrfeed_batches(cls: Any, root: Path, dt: dict, seed: int) -> Iterator[Any]:
    params = inspect.signature(cls).parameters
    workers = {"workers" if "workers" in params else "num_workers": WORKERS}
    loader = cls(str(root), delta_timestamps=dt, batch_size=BATCH, shuffle=True, seed=seed, **workers)
    if hasattr(loader, "__enter__"):
        with loader:
            yield from loader
    else:
        yield from loader


def video_pieces(root: Path) -> list[tuple[str, float, float]]:
    """(file, from, to) seconds: every video file of the dataset split at half its duration."""
    import av

    pieces = []
    for path in sorted((root / "videos").rglob("*.mp4")):
        with av.open(str(path)) as container:
            if container.duration is None:
                raise SystemExit(f"decode bound: {path} states no duration")
            end = container.duration / 1e6  # in FFmpeg's microseconds
        pieces += [(str(path), 0.0, end / 2), (str(path), end / 2, float("inf"))]
    return pieces


def decode_piece(piece: tuple[str, float, float, int]) -> int:
    """Frames of `piece` decoded into RGB arrays with `threads` decoder threads (0: FFmpeg's choice), from the
    key frame before its start."""
    import av

    path, start, end, threads = piece
    n = 0
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = threads
        container.seek(int(start * 1e6), backward=True, any_frame=False)  # microseconds: no stream given
        for frame in container.decode(stream):
            t = frame.time
            if t is None or t < start - 1e-6:
                continue
            if t >= end - 1e-6:
                break
            frame.to_ndarray(format="rgb24")
            n += 1
    return n


def decode_bound(pieces: list[tuple[str, float, float]], expected: int, threads: int) -> float:
    """Frames/s of PyAV decoding every frame of `pieces` on WORKERS processes (their start not timed), with
    `threads` decoder threads each."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(WORKERS) as pool:
        pool.map(abs, range(WORKERS))  # started
        t = time.perf_counter()
        frames = sum(pool.map(decode_piece, [(*piece, threads) for piece in pieces], chunksize=1))
        elapsed = time.perf_counter() - t
    if frames != expected:
        raise SystemExit(f"decode bound: {frames} frames decoded, the dataset has {expected} (frames x cameras)")
    return frames / elapsed


def bench_variant(variant: str, root: Path, args: argparse.Namespace, runs: dict[str, list[float]],
                  zarrfeed: Any) -> None:
    import json

    cameras = VARIANTS[variant]
    dt = delta_timestamps(cameras)
    frames = json.loads((root / "meta" / "info.json").read_text())["total_frames"]
    pieces = video_pieces(root)

    def record(name: str, value: float, unit: str) -> None:
        runs.setdefault(f"{variant} {name}", []).append(value)
        print(f"  {variant + ' ' + name:<42} {value:12,.3f} {unit}" if unit == "s" else
              f"  {variant + ' ' + name:<42} {value:12,.0f} {unit}", flush=True)

    def lerobot(seed: int) -> None:
        rate, first = timed(lambda: lerobot_batches(root, dt, seed), args.batches, args.seconds)
        record("LeRobot (items/s)", rate, "items/s")
        record("LeRobot first batch (s)", first, "s")

    def ours(seed: int) -> None:
        rate, pace, first = timed_epoch(lambda: zarrfeed_batches(zarrfeed, root, dt, seed))
        record("zarrfeed (items/s)", rate, "items/s")
        record("zarrfeed after its first batch (items/s)", pace, "items/s")
        record("zarrfeed first batch (s)", first, "s")

    def bound(seed: int) -> None:
        rate = decode_bound(pieces, frames * cameras, args.decode_threads)
        record("decode bound (frames/s)", rate, "frames/s")
        record("decode bound (items/s)", rate / cameras, "rows/s")

    sides = [lerobot] + ([ours] if zarrfeed else []) + ([bound] if cameras else [])
    print(f"{variant}: {root} ({frames:,} frames, {cameras} camera(s), {len(pieces)} video pieces)")
    for r in range(args.repeat):
        print(f" repeat {r + 1}/{args.repeat}")
        for side in sides if r % 2 == 0 else sides[::-1]:
            side(r)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batches", type=int, default=50, help="batches after the first per measurement (default: 50)")
    p.add_argument("--seconds", type=float, default=30.0,
                   help="seconds after the first batch per measurement, at most (default: 30)")
    p.add_argument("--decode-threads", type=int, default=1,
                   help="decoder threads of each decode-bound process (default: 1; 0: FFmpeg's choice)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--data", type=Path, default=DEFAULT_OUT,
                   help=f"the datasets' cache folder (default: {DEFAULT_OUT})")
    add_json_option(p)
    args = p.parse_args()
    zarrfeed, why = zarrfeed_loader_class()
    if zarrfeed is None:
        print(f"zarrfeed side skipped: no LeRobotLoader in this zarrfeed ({why})")
    roots = {v: make(v, args.episodes, out=args.data) for v in args.variants}
    runs: dict[str, list[float]] = {}
    for variant, root in roots.items():
        bench_variant(variant, root, args, runs, zarrfeed)
    median = {name: statistics.median(values) for name, values in runs.items()}
    print("\nmedians:")
    for name, value in median.items():
        print(f"  {name:<42} {value:12,.3f}")
    # as speeds (per second, higher is faster), as every figure of --json is
    write_json(args.json, {(name.replace(" first batch (s)", " first batches/s") if name.endswith("(s)") else name):
                           (1 / value if name.endswith("(s)") else value) for name, value in median.items()})
    if zarrfeed is None:
        return
    for variant in args.variants:
        pairs: list[tuple[str, str, float | None]] = [
            (f"{variant} zarrfeed (items/s)", f"{variant} LeRobot (items/s)", 10.0 if VARIANTS[variant] else 100.0)]
        if VARIANTS[variant]:
            pairs.append((f"{variant} zarrfeed (items/s)", f"{variant} decode bound (items/s)", 0.8))
            pairs.append((f"{variant} zarrfeed after its first batch (items/s)", f"{variant} decode bound (items/s)",
                          None))
        print_ratios(median, pairs, title=f"{variant} ratios")
    print("\nfirst batch (seconds, target < 1 s for zarrfeed):")
    for variant in args.variants:
        ours, theirs = median[f"{variant} zarrfeed first batch (s)"], median[f"{variant} LeRobot first batch (s)"]
        print(f"  {variant}: zarrfeed {ours:.3f} s ({'met' if ours < 1 else 'NOT met'}), LeRobot {theirs:.3f} s")


if __name__ == "__main__":
    main()
