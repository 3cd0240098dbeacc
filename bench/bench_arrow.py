"""Arrow bridge benchmark: Parquet export of the agents table, and `to_arrow` of loader batches.

    python bench/bench_arrow.py [--scenes 100] [--repeat 3]     (needs pandas: pip install -e '.[bench]')

On a synthetic L5Kit dataset (100 scenes = 2.1 M agents), in one run:
  zarrfeed-1/2   export_parquet of the agents table from zarr with 1 and 2 worker processes (zstd)
  (a) pyarrow    pq.write_table of the same table already in memory as Arrow (zstd): the bound
  (b) pandas     structured array -> DataFrame with list columns -> to_parquet (zstd), the route users write
  to_arrow       of a Loader batch (256 and 4096 rows), against copying the same columns
Targets on 2 cores: 2-worker export >= 1.2x (a) and >= 3x (b); to_arrow under 50 us at any batch size.
"""
from __future__ import annotations

import shutil
import statistics
import time

import pyarrow as pa
import pyarrow.parquet as pq
from common import parser, print_ratios, synthetic_dataset
from zarrfeed.loader import Dataset, Loader, export_parquet, to_arrow

from zarrfeed.core.arrow_records import records_to_arrow


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    args = parser(__doc__).parse_args()
    import pandas as pd

    with synthetic_dataset(args.scenes) as path:
        tmp = path.parent
        ds = Dataset.open(path)
        agents = ds["agents"][:]
        nbytes = agents.nbytes
        table = pa.Table.from_batches([records_to_arrow(agents)])
        times: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for w in (1, 2):
                out = tmp / f"z{w}"
                times.setdefault(f"zarrfeed-{w}", []).append(
                    timed(lambda: export_parquet(ds, out, ["agents"], workers=w)))
                shutil.rmtree(out)
            times.setdefault("(a) pyarrow", []).append(
                timed(lambda: pq.write_table(table, tmp / "a.parquet", row_group_size=100_000, compression="zstd")))

            def pandas_route():
                df = pd.DataFrame({n: list(agents[n]) if agents.dtype.fields[n][0].shape else agents[n]
                                   for n in agents.dtype.names})
                df.to_parquet(tmp / "b.parquet", compression="zstd")
            times.setdefault("(b) pandas", []).append(timed(pandas_route))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"agents: {len(agents):,} rows, {nbytes / 1e6:.0f} MB; median of {args.repeat} runs\n")
        for k, v in med.items():
            print(f"{k:<14}{v:>8.3f} s{nbytes / v / 1e6:>8.0f} MB/s")

        print("\nto_arrow of a Loader batch (median of 200), against copying its columns:")
        with Loader(ds, batch_size=4096, num_workers=1) as big, Loader(ds, batch_size=256, num_workers=1) as small:
            for loader in (small, big):
                batch = next(iter(loader))
                t_arrow = statistics.median(timed(lambda: to_arrow(batch)) for _ in range(200))
                t_copy = statistics.median(timed(lambda: {k: v.copy() for k, v in batch.items()}) for _ in range(200))
                print(f"  batch {loader.batch_size:>5}: to_arrow {t_arrow * 1e6:6.1f} us, copy {t_copy * 1e6:7.1f} us"
                      f"  (target < 50 us: {'met' if t_arrow < 50e-6 else 'NOT met'})")
                loader.close()

        print_ratios({k: 1 / v for k, v in med.items()}, [("zarrfeed-2", "(a) pyarrow", 1.2),
                                                           ("zarrfeed-2", "(b) pandas", 3),
                                                           ("zarrfeed-2", "zarrfeed-1", None)])


if __name__ == "__main__":
    main()
