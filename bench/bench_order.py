"""Window orders: zarrfeed's own permutation (loader/ordering/order.py) against numpy's Generator.shuffle and
Generator.permutation (order 0's generator), for a window of 160,000 rows (8 chunks of 20,000),
alternated, medians of --repeat; ns per row, ratios last (target: zarrfeed <= 10 ns per row).

    python bench/bench_order.py [--repeat 5]
"""
import statistics
import time

import numpy as np
from common import parser, print_ratios

from zarrfeed.loader.ordering.order import permutation

N = 160_000


def zarrfeed(epoch: int) -> None:
    permutation(N, 1, epoch, 3)


def numpy_shuffle(epoch: int) -> None:
    np.random.default_rng([1, epoch, 3]).shuffle(np.arange(N))


def numpy_permutation(epoch: int) -> None:
    np.random.default_rng([1, epoch, 3]).permutation(N)


def main() -> None:
    args = parser(__doc__).parse_args()
    runs = {"zarrfeed": zarrfeed, "numpy shuffle": numpy_shuffle, "numpy permutation": numpy_permutation}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.repeat):
        for name, fn in runs.items():
            t = time.perf_counter()
            for epoch in range(20):
                fn(r * 20 + epoch)
            times[name].append((time.perf_counter() - t) / 20 / N * 1e9)
    ns = {name: statistics.median(ts) for name, ts in times.items()}
    for name, v in ns.items():
        print(f"{name:<20}{v:6.1f} ns per row (median of {args.repeat})")
    target = "met" if ns["zarrfeed"] <= 10 else "NOT met"
    print(f"zarrfeed: {ns['zarrfeed']:.1f} ns per row (target <= 10: {target})")
    print_ratios({k: 1 / v for k, v in ns.items()}, [("zarrfeed", "numpy shuffle", None),
                                                     ("zarrfeed", "numpy permutation", None)])


if __name__ == "__main__":
    main()
