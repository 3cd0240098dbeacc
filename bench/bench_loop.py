"""What a loader's loop costs per batch: cached epochs of small batches, where the loop's own work is most of it.

    python bench/bench_loop.py [--scenes 40] [--repeat 3] [--json FILE]

On --scenes synthetic L5Kit scenes, the second and later epochs (decoded chunks kept), 2 workers:
  Loader 256     batches of 256 agents: tens of microseconds each, so a microsecond more in the loop (the
                 scheduler's bookkeeping, the ring's views, the cursor) shows
  Loader 4096    batches of 4,096 agents: the gather's cost, the loop's a small part
  WindowLoader   batches of 32 L5Kit windows (history 10, future 50)
Each the best of two cached epochs, medians of --repeat. Written for `compare_revisions.py` (one revision
against another on the same machine and run): it uses the public API alone, so any revision runs it.
"""
from __future__ import annotations

import statistics
import time

from common import add_json_option, parser, synthetic_dataset, write_json
from zarrfeed.loader import Loader, WindowLoader


def rows_per_s(loader) -> float:
    """One epoch of `loader`: rows (or samples) a second."""
    n, t0 = 0, time.perf_counter()
    for batch in loader:
        n += len(next(iter(batch.values())))
    return n / (time.perf_counter() - t0)


def cached(make) -> float:
    """The best of two cached epochs (the first decodes)."""
    with make() as loader:
        rows_per_s(loader)
        return max(rows_per_s(loader), rows_per_s(loader))


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(scenes=40)
    add_json_option(p)
    args = p.parse_args()
    runs: dict[str, list[float]] = {}
    with synthetic_dataset(args.scenes) as path:
        for _ in range(args.repeat):
            runs.setdefault("Loader 256", []).append(cached(lambda: Loader(path, "agents", batch_size=256, seed=0)))
            runs.setdefault("Loader 4096", []).append(cached(lambda: Loader(path, "agents", batch_size=4096, seed=0)))
            runs.setdefault("WindowLoader", []).append(cached(lambda: WindowLoader(path, 10, 50, batch_size=32,
                                                                                     seed=0)))
    speeds = {name: statistics.median(values) for name, values in runs.items()}
    for name, value in speeds.items():
        print(f"{name:14s} {value:14,.0f} a second (median of {args.repeat})")
    write_json(args.json, speeds)


if __name__ == "__main__":
    main()
