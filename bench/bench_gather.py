"""The gather kernel: the C extension against the numpy fallback (used where no C compiler was found at
install), on shuffled rows of L5Kit agents (116-byte records, 8 fields). Alternated repeats, medians; the
ratio is printed last.

    python bench/bench_gather.py [--rows 4096] [--repeat 7]
"""
import argparse
import statistics
import time

import numpy as np
from zarrfeed.loader import _gather
from zarrfeed.loader.engine import gather_numpy
from zarrfeed.loader.engine.layout import Layout

from zarrfeed.core.schema import AGENT_DTYPE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096, help="rows per call (a batch)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n_src = 200_000  # about 23 MB of records: larger than the caches, as a loader's chunk cache is
    src = np.frombuffer(rng.bytes(n_src * AGENT_DTYPE.itemsize), np.uint8).copy()
    layout = Layout.of_records(AGENT_DTYPE, None, args.rows)
    spec, out = layout.gather_spec(), np.zeros(layout.slot_bytes, np.uint8)
    calls = 50
    times: dict[str, list[float]] = {"c": [], "numpy": []}
    for _ in range(args.repeat):
        for name, kernel in (("c", _gather), ("numpy", gather_numpy)):
            rows = [rng.integers(0, n_src, args.rows).astype(np.int64) for _ in range(calls)]
            t0 = time.perf_counter()
            for r in rows:
                kernel.gather(src, AGENT_DTYPE.itemsize, r, out, spec, 0, AGENT_DTYPE.itemsize)
            times[name].append((time.perf_counter() - t0) / (calls * args.rows))
    c, py = statistics.median(times["c"]), statistics.median(times["numpy"])
    print(f"C kernel: {c * 1e9:.0f} ns per row; numpy: {py * 1e9:.0f} ns per row (medians of {args.repeat})")
    print(f"numpy / C time: {py / c:.1f}x")


if __name__ == "__main__":
    main()
