"""A loader's start-up, measured as a training script meets it: a fresh process per measurement.

    python bench/bench_startup.py [--scenes 100] [--repeat 3] [--json startup.json]

On a synthetic L5Kit dataset (100 scenes = 2.1 M agents), a `Loader` over agents, batch 4,096, shuffled,
2 workers, cache_bytes=0 (every epoch decodes), in a new process that imports zarrfeed at its top (the import
starts the fork server in the background) and then either makes the loader at once, or first works for a
second on one core (a script building its model), the last case with 32 MiB shuffle windows:
  first batch   from `iter(loader)` to the first batch, and from the loader's construction (opening the
                dataset included) to it
  first epoch   rows/s from the construction to the end of the first epoch (start-up included), against the
                second epoch in the same process (the steady uncached epoch)
Targets on 2 cores: first batch <= 50 ms after the loop starts; first epoch >= 0.5x the steady epoch.
One process per measurement, alternating the cases, medians of --repeat; the ratios are printed last. The
measured process imports only zarrfeed and the standard library, as a minimal training script would: each
worker runs the script again (the start method's rule), so a script's own heavy imports add to its workers'
start.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


# (seconds of the script's own work before it makes the loader, the loader's shuffle_bytes: None is the default
# window, the whole table up to 1 GiB, every chunk of which the first batch holds rows of)
CASES = {"at once": (0.0, None), "after 1 s of work": (1.0, None), "after 1 s, 32 MiB windows": (1.0, 32 << 20)}


def one(path: str, work: float, shuffle_bytes: int | None) -> dict:
    t_import = time.perf_counter()
    from zarrfeed.loader import Dataset, Loader  # at the top of a script: starts the fork server

    t_imported = time.perf_counter()
    end = time.perf_counter() + work
    while time.perf_counter() < end:  # the script's own work (its model), on one core
        sum(range(1000))
    t0 = time.perf_counter()
    ds = Dataset.open(path)
    window = {} if shuffle_bytes is None else {"shuffle_bytes": shuffle_bytes}
    with Loader(ds, "agents", batch_size=4096, num_workers=2, seed=0, cache_bytes=0, **window) as loader:
        t1 = time.perf_counter()
        it = iter(loader)
        first = next(it)
        t2 = time.perf_counter()
        rows = len(first["yaw"]) + sum(len(b["yaw"]) for b in it)
        t3 = time.perf_counter()
        rows2 = sum(len(b["yaw"]) for b in loader)
        t4 = time.perf_counter()
    return {"import": t_imported - t_import, "first_after_iter": t2 - t1, "first_after_make": t2 - t0,
            "epoch1": rows / (t3 - t0), "epoch2": rows2 / (t4 - t3)}


def main() -> None:
    # (imported here, not at the top: each loader worker runs this script again, as a fork server's workers do,
    # and a training script's own imports are its own; bench/common.py imports zarr)
    from common import add_json_option, parser, synthetic_dataset, write_json

    p = parser(__doc__)
    p.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    add_json_option(p)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], float(args.one[1]), None if args.one[2] == "-" else int(args.one[2]))))
        return
    runs: dict[str, list[dict]] = {c: [] for c in CASES}
    with synthetic_dataset(args.scenes) as path:
        for r in range(args.repeat):
            for case in (list(CASES) if r % 2 == 0 else list(CASES)[::-1]):
                work, window = CASES[case]
                out = subprocess.run([sys.executable, __file__, "--one", str(path), str(work),
                                      "-" if window is None else str(window)],
                                     check=True, capture_output=True, text=True, cwd=Path(__file__).parent).stdout
                runs[case].append(json.loads(out.splitlines()[-1]))
    med = {c: {k: statistics.median(r[k] for r in runs[c]) for k in runs[c][0]} for c in CASES}
    speeds = {}
    print(f"Loader over agents ({args.scenes} scenes), batch 4,096, 2 workers, cache_bytes=0, a fresh process each, "
          f"medians of {args.repeat}\n")
    for case, m in med.items():
        print(f"  {case}: import {m['import'] * 1e3:.0f} ms; first batch {m['first_after_iter'] * 1e3:.0f} ms after "
              f"iter(), {m['first_after_make'] * 1e3:.0f} ms after Dataset.open; first epoch {m['epoch1'] / 1e6:.1f} M "
              f"rows/s, steady uncached epoch {m['epoch2'] / 1e6:.1f} M rows/s")
        speeds[f"startup {case}: first batches/s after iter()"] = 1 / m["first_after_iter"]
        speeds[f"startup {case}: first epoch (rows/s)"] = m["epoch1"]
        speeds[f"startup {case}: steady uncached epoch (rows/s)"] = m["epoch2"]
    write_json(args.json, speeds)
    print("\nratios (first epoch, start-up included / steady uncached epoch; target >= 0.5x):")
    for case, m in med.items():
        print(f"  {case}: {m['epoch1'] / m['epoch2']:.2f}x")


if __name__ == "__main__":
    main()
