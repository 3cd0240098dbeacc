"""`zarrfeed demo`: the whole job on synthetic L5Kit data: write, describe, validate, load, export, query."""
from __future__ import annotations

import argparse
from pathlib import Path


from .. import writer
from ..loader import Dataset
from ..writer.dataset_writer import DatasetWriter
from ..core.sizes import decimal_size
from .common import Command, Sized, count_arg, format_info, plural, positive_arg, show_progress
from . import ingest, load, validate


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("demo", "the whole job on synthetic L5Kit data: write, describe, validate, load, export, query",
                "The whole job on synthetic L5Kit scenes: ingest them with writer processes "
                "into OUT (a dataset there is replaced), print `info`, validate every interval link and chunk, "
                "load one epoch of shuffled batches of 4,096 agents with loader workers, export every table to "
                "Parquet beside it (OUT.parquet/<table>/) and, with DuckDB installed (zarrfeed[demo]), count the "
                "agents per label with one SQL query on the Parquet files.")
    p.add_argument("--out", default="zarrfeed-demo.zarr", help="where to write (a dataset there is replaced; "
                   "anything else is refused)")
    p.add_argument("--scenes", type=positive_arg, default=50, help="synthetic scenes (about 21,000 agents each)")
    p.add_argument("--seed", type=count_arg, default=0, help="seed of the synthetic scenes")
    p.add_argument("--workers", type=count_arg, default=2, help="writer, loader and export processes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    # (overwrite replaces a dataset only: anything else there is refused)
    with DatasetWriter(out, workers=args.workers, progress=show_progress(args), overwrite=True) as w:
        writers = plural(args.workers, "writer process", "writer processes") if args.workers else "no writer processes"
        print(f"ingesting {plural(args.scenes, 'synthetic L5Kit scene')} into {out} with {writers}")
        summary = w.ingest(Sized(writer.synthetic.episodes(args.scenes, seed=args.seed), args.scenes))
    ingest.print_summary(summary, w.committed)
    print()
    with Dataset.open(out) as ds:
        print(format_info(ds.info()) + "\n")
        status = validate.check(ds, progress=show_progress(args))
        if status:
            return status
        print()
        r = load.load_epochs(ds, "agents", 4096, args.workers, 1, progress=show_progress(args))
        print(f"loaded {r['rows']:,} agents in shuffled batches of 4096 with {args.workers} loader workers: "
              f"{load.speeds(r)}")
        from ..loader.parquet_export import export_parquet

        parquet = out.with_name(out.name + ".parquet")
        r = export_parquet(ds, parquet, workers=args.workers, progress=show_progress(args))
        print(f"\nexported to Parquet in {parquet}/<table>/ ({decimal_size(r['bytes'] / r['seconds'], 'B/s')})")
    duckdb_query(parquet)
    return 0


def duckdb_query(parquet: Path) -> None:
    """The demo's last step: one SQL query on the Parquet export."""
    try:
        import duckdb
    except ImportError:
        print("(pip install duckdb, or install zarrfeed[demo], to run a DuckDB query on it)")
        return
    sql = (f"SELECT list_position(label_probabilities::FLOAT[], list_max(label_probabilities::FLOAT[])) - 1 "
           f"AS label, count(*) AS agents, round(avg(sqrt(velocity[1]^2 + velocity[2]^2)), 2) AS mean_speed "
           f"FROM read_parquet('{parquet}/agents/*.parquet') GROUP BY label ORDER BY agents DESC")
    print(f"DuckDB: agents per label, with their mean speed (m/s):\n{duckdb.sql(sql)}")
