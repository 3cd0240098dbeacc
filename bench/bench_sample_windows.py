"""What mixing costs WindowLoader and SequenceLoader: cached epochs by window width, in one run.

    python bench/bench_sample_windows.py [--scenes 100] [--episodes 500] [--repeat 3] [--json FILE]

Their batches hold samples of every group of their window (a group: the samples starting in one chunk) in
proportion, so a wider window mixes more episodes into a batch, but each sample gathers many rows (WindowLoader:
the frames, agents and traffic-light faces of 61 frames, about 1,200 agent rows; SequenceLoader: 16 steps of
96x96x3 images), which come from the caches when the window is narrow and from memory when it is wide. Their
defaults (8 and 16 groups, `loader/options.py`) are the widest that cost under a tenth of their speed:
  WindowLoader     history 10, future 50, whole windows, batch 32, on --scenes synthetic L5Kit scenes:
                   windows of 4, 8 and 16 groups and the whole table (`shuffle_bytes` holding it)
  SequenceLoader   Diffusion Policy's PushT sampling (bench_episodes.py's buffer of --episodes episodes; needs
                   zarr-python 2, the bench extra): 8, 16 and 32 groups and the whole table
Each the second epoch (decoded chunks kept), 2 workers; widths alternate, medians of --repeat; ratios to the
narrowest last.
"""
from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from common import add_json_option, parser, print_ratios, synthetic_dataset, write_json
from zarrfeed.loader import Dataset, SequenceLoader, WindowLoader

WHOLE = 1 << 40  # shuffle_bytes that hold any table here: the whole table is one window


def width(option: int | None) -> dict:
    return {"shuffle_bytes": WHOLE} if option is None else {"shuffle_window": option}


def cached(make: Callable[[], WindowLoader], column: str) -> float:
    """Samples per second of the loader's second epoch."""
    with make() as loader:
        for _ in loader:
            pass
        t = time.perf_counter()
        n = sum(len(b[column]) for b in loader)
        return n / (time.perf_counter() - t)


def measure(runs: dict[str, list[float]], loaders: dict[str, Callable[[], float]], repeat: int) -> None:
    for rep in range(repeat):
        items = list(loaders.items())
        for name, run in items if rep % 2 == 0 else items[::-1]:  # alternating which goes first
            runs.setdefault(name, []).append(run())
            print(f"  {name}: {runs[name][-1]:,.0f} samples/s", flush=True)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=500, help="episodes of the SequenceLoader's replay buffer")
    add_json_option(p)
    args = p.parse_args()
    runs: dict[str, list[float]] = {}
    names = {"WindowLoader": [4, 8, 16, None], "SequenceLoader": [8, 16, 32, None]}

    def label(cls: str, w: int | None) -> str:
        return f"{cls} {'whole table' if w is None else f'{w} groups'}"

    with synthetic_dataset(args.scenes) as path:
        ds = Dataset.open(path)
        measure(runs, {label("WindowLoader", w): (lambda w=w: cached(
            lambda: WindowLoader(ds, 10, 50, whole_windows=True, batch_size=32, num_workers=2, seed=0, **width(w)),
            "frame_row")) for w in names["WindowLoader"]}, args.repeat)
    import bench_episodes as dp

    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-"))
    try:
        buffer = tmp / "buffer.zarr"
        dp.write_buffer(buffer, args.episodes, 96)
        measure(runs, {label("SequenceLoader", w): (lambda w=w: cached(
            lambda: SequenceLoader(buffer, dp.S, dp.BEFORE, dp.AFTER, batch_size=dp.BATCH, num_workers=2, seed=1,
                                   **width(w)), "sample")) for w in names["SequenceLoader"]}, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    speed = {k: statistics.median(v) for k, v in runs.items()}
    write_json(args.json, speed)
    print(f"\ncached epochs, 2 workers, median of {args.repeat} (samples/s):")
    for k, v in speed.items():
        print(f"  {k:<32}{v:>10,.0f}")
    pairs: list[tuple[str, str, float | None]] = []
    for cls, widths in names.items():
        pairs += [(label(cls, w), label(cls, widths[0]), None) for w in widths[1:]]
    print_ratios(speed, pairs, title="ratios to the narrowest window")


if __name__ == "__main__":
    sys.exit(main())
