"""`zarrfeed export`: write tables as Parquet (one folder per table) or an Arrow IPC stream."""
from __future__ import annotations

import argparse
import sys


from ..core.sizes import decimal_size
from .common import Command, count_arg, open_dataset, rows_text, show_progress, store_options


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("export", "write tables as Parquet (one folder per table) or an Arrow IPC stream")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("out", help="output folder (parquet), or file or - for stdout (arrow)")
    p.add_argument("--format", choices=["parquet", "arrow"], default="parquet", help="output format")
    p.add_argument("--tables", metavar="T1,T2", help="tables to export (default: all; of a replay buffer, "
                   "episodes and steps; arrow: agents, or steps)")
    p.add_argument("--workers", type=count_arg, default=2, help="writer processes for Parquet (0: this one)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..loader.arrow_bridge import write_ipc_stream
    from ..loader.parquet_export import export_parquet

    tables = [t.strip() for t in args.tables.split(",")] if args.tables else None
    if args.out == "-" and args.format != "arrow":
        raise ValueError("export to - (standard output) writes an Arrow IPC stream: add --format arrow")
    if args.out == "-" and sys.stdout.isatty():
        raise ValueError("export to - writes a binary Arrow IPC stream, and standard output is a terminal: "
                         "redirect it to a file (> agents.arrows) or pipe it to a reader")
    with open_dataset(args) as ds:
        for t in tables or []:
            if t not in ds.readable_tables():
                raise ValueError(f"--tables: no table {t!r} in {args.path} (tables: "
                                 f"{', '.join(ds.readable_tables())})")
        if args.format == "parquet":
            r = export_parquet(ds, args.out, tables, workers=args.workers, progress=show_progress(args),
                               storage_options=store_options(args))
            rows = rows_text(r["rows"])
            print(f"exported {rows} to {args.out}/<table>/*.parquet: {decimal_size(r['bytes'])} of records in "
                  f"{r['seconds']:.2f} s ({decimal_size(r['bytes'] / r['seconds'], 'B/s')})")
            return 0
        if tables and len(tables) != 1:
            raise ValueError("--format arrow writes one table as one stream; name one with --tables")
        table = tables[0] if tables else ("steps" if ds.schema.step_tables() else "agents")
        stream = ds.to_batches(table)
        n = write_ipc_stream(stream, sys.stdout.buffer if args.out == "-" else args.out)
        # (the summary on standard output, as every command's, unless the stream itself is there)
        print(f"wrote {n:,} rows of {table} as an Arrow IPC stream to {args.out}",
              file=sys.stderr if args.out == "-" else sys.stdout)
    return 0
