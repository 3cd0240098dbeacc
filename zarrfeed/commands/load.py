"""`zarrfeed load`: iterate shuffled batches of a table with loader workers (a speed check)."""
from __future__ import annotations

import argparse
import time

from tqdm.auto import tqdm

from ..loader import Dataset, Loader
from ..core.sizes import decimal_size
from .common import Command, count_arg, positive_arg, open_dataset, plural, show_progress


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("load", "iterate shuffled batches of a table with loader workers (a speed check)")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--table", help="table to load (default: agents; of a replay buffer, its first data key)")
    p.add_argument("--batch-size", type=positive_arg, default=4096, help="rows per batch")
    p.add_argument("--workers", type=count_arg, default=2, help="loader processes (0: load in this process)")
    p.add_argument("--epochs", type=positive_arg, default=1, help="epochs to iterate")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def load_epochs(ds: Dataset, table: str, batch_size: int, workers: int, epochs: int, progress: bool) -> dict:
    """Iterate `epochs` epochs of shuffled batches with a progress bar; return rows, bytes, seconds."""
    with Loader(ds, table, batch_size=batch_size, num_workers=workers) as loader:
        itemsize = ds[table].dtype.itemsize
        total = loader.plan(0).per_rank * epochs  # every epoch reads as many rows (one rank, from its start)
        t0 = time.perf_counter()
        first, first_rows = None, 0
        with tqdm(total=total * itemsize, unit="B", unit_scale=True, desc=f"loading {table}",
                  disable=not progress, smoothing=0.1) as bar:
            rows = 0
            for _ in range(epochs):
                for batch in loader:
                    n = len(next(iter(batch.values())))
                    rows += n
                    if first is None:
                        first, first_rows = time.perf_counter() - t0, n
                    bar.update(n * itemsize)
        seconds = time.perf_counter() - t0
    return {"rows": rows, "bytes": rows * itemsize, "seconds": seconds, "first_batch": first or seconds,
            "first_rows": first_rows, "itemsize": itemsize, "batches": len(loader) * epochs}


def speeds(r: dict) -> str:
    """The start-up (to the first batch: workers, the first chunks decoded) and the speed after it, said apart:
    on a small dataset the start-up is most of the time, and one rate over both would say neither."""
    rest, after = r["rows"] - r["first_rows"], r["seconds"] - r["first_batch"]
    speed = (f"then {rest / after:,.0f} rows/s, {decimal_size(rest * r['itemsize'] / after, 'B/s')}"
             if rest and after > 0 else "the only one")
    return f"the first batch after {r['first_batch'] * 1000:.0f} ms (start-up), {speed}"


def run(args: argparse.Namespace) -> int:
    with open_dataset(args) as ds:
        if args.table is None:
            steps = ds.schema.step_tables()
            args.table = "agents" if "agents" in ds.tables or not steps else steps[0]
        if args.table not in ds.tables:
            raise ValueError(f"table {args.table!r} is not in {args.path} (tables: {', '.join(ds.tables)})")
        r = load_epochs(ds, args.table, args.batch_size, args.workers, args.epochs, show_progress(args))
    batches = plural(r['batches'], 'shuffled batch', 'shuffled batches')
    print(f"loaded {plural(r['rows'], 'row')} of {args.table} in {batches}"
          f" of {args.batch_size} over {plural(args.epochs, 'epoch')} in {r['seconds']:.2f} s: {speeds(r)}")
    return 0
