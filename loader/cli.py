"""The `zarrfeed` command: demo, info, validate.

Exit codes: 0 success, 1 the dataset is invalid, 2 the input cannot be read (one line on stderr, no traceback).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

import writer
from writer.format import FormatError

from .dataset import Dataset


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def format_info(info: dict) -> str:
    """A readable table of `Dataset.info()`, then each table's fields."""
    head = f"{'table':<22}{'rows':>14}{'chunk rows':>12}{'chunks':>8}{'bytes':>12}{'stored':>12}{'ratio':>7}"
    lines = [head, "-" * len(head)]
    for name, t in info.items():
        ratio = f"{t['ratio']:.2f}" if t["ratio"] is not None else "-"
        lines.append(f"{name:<22}{t['rows']:>14,}{t['chunk_rows']:>12,}{t['chunks_initialized']:>8,}"
                     f"{_size(t['bytes']):>12}{_size(t['bytes_stored']):>12}{ratio:>7}")
    lines.append("")
    for name, t in info.items():
        fields = ", ".join(f"{f[0]} {f[1]}{tuple(f[2]) if len(f) == 3 else ''}" for f in t["dtype"])
        lines.append(f"{name}: {fields}")
    return "\n".join(lines)


def _validate(ds: Dataset, progress: bool) -> int:
    total = sum(ds.rows.values())
    with tqdm(total=total, unit="row", unit_scale=True, desc="validating", disable=not progress,
              leave=False) as bar:
        report = ds.validate(progress=bar.update)
    if report.ok:
        print(f"{ds.location}: valid ({', '.join(f'{n:,} {t}' for t, n in ds.rows.items())})")
        return 0
    print(f"{ds.location}: INVALID\n{report}")
    return 1


def cmd_info(args: argparse.Namespace) -> int:
    with Dataset.open(args.path) as ds:
        info = ds.info()
        print(json.dumps(info, indent=2) if args.json else f"{ds.location} ({ds.schema.name})\n{format_info(info)}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    with Dataset.open(args.path) as ds:
        return _validate(ds, progress=not args.quiet)


def cmd_demo(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    print(f"writing {args.scenes} synthetic L5Kit scenes to {out}")
    summary = writer.write_dataset(out, writer.synthetic.episodes(args.scenes, seed=args.seed), progress=True)
    rate = summary["bytes"] / summary["seconds"] / 1e6
    print(f"wrote {summary['episodes']} episodes, {summary['rows']['agents']:,} agents, "
          f"{summary['bytes'] / 1e6:.0f} MB in {summary['seconds']:.2f} s ({rate:.0f} MB/s)\n")
    with Dataset.open(out) as ds:
        print(format_info(ds.info()) + "\n")
        return _validate(ds, progress=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zarrfeed", description="Training-data loader and writer for "
                                     "datasets of structured records in zarr (L5Kit format).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="write a synthetic L5Kit dataset, describe it and validate it")
    p.add_argument("--out", default="zarrfeed-demo.zarr", help="where to write (replaced if it exists)")
    p.add_argument("--scenes", type=int, default=50, help="synthetic scenes (about 21,000 agents each)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("info", help="rows, chunks, bytes and compression per table")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("validate", help="check every interval link and decode every chunk; exit 1 if invalid")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda msg, *a, **k: print(f"zarrfeed: warning: {msg}", file=sys.stderr)
            return args.func(args)
    except (FormatError, ValueError) as exc:
        print(f"zarrfeed: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zarrfeed: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
