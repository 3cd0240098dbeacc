"""`zarrfeed convert`: write a dataset in the other zarr format (or with other shards)."""
from __future__ import annotations

import argparse
import sys

from ..core.location import Location
from ..writer.conversion import convert
from .common import Command, add_format_args, count_arg, show_progress, store_options
from .ingest import print_summary


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("convert", "write a dataset in zarr v3 (sharded) or v2, episode by episode")
    p.add_argument("source", help="dataset to read: a directory, a .zip or an fsspec URL")
    p.add_argument("out", help="dataset to write: a directory or an fsspec URL")
    add_format_args(p, default=3)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--overwrite", action="store_true", help="replace a dataset at OUT")
    how.add_argument("--resume", action="store_true", help="finish an interrupted conversion of the same source")
    p.add_argument("--workers", type=count_arg, default=2, help="writer processes (0: write in this process)")
    p.add_argument("--no-fsync", dest="durable", action="store_false", help="do not fsync (scratch data)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = store_options(args)
    out = Location.of(args.out, options)
    try:
        summary = convert(Location.of(args.source, options), out, zarr_format=args.zarr_format,
                          shard_bytes=args.shard_bytes, resume=args.resume, overwrite=args.overwrite,
                          workers=args.workers, progress=show_progress(args), durable=args.durable)
    except KeyboardInterrupt:
        print("zarrfeed: interrupted; run again with --resume to finish.", file=sys.stderr)
        return 130
    from ..loader import Dataset

    print_summary(summary, Dataset.open(out).rows)
    return 0
