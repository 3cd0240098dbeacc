"""`zarrfeed info`: rows, chunks, bytes and compression per table."""
from __future__ import annotations

import argparse
import json


from .common import Command, format_info, open_dataset
from . import status


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("info", "rows, chunks, bytes and compression per table")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.path.startswith(("grpc://", "grpc+tls://")):
        return status.describe_server(args)
    with open_dataset(args) as ds:
        info = ds.info()
        formats = sorted({t.get("zarr_format", 2) for t in info.values()})
        said = f", zarr {'/'.join(f'v{n}' for n in formats)}" if formats != [2] else ""
        about = f"{ds.lerobot.describe()}\n\n" if getattr(ds, "lerobot", None) is not None else ""  # a LeRobot root
        print(json.dumps(info, indent=2) if args.json else f"{ds.location} ({ds.schema.name}{said})\n{about}"
              f"{format_info(info)}")
    return 0
