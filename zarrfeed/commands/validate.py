"""`zarrfeed validate`: check every interval link and decode every chunk; exit 1 if invalid. With `--deep`, also
every chunk's stored bytes against the digest its commit recorded, and exit `UNVERIFIED` unless every chunk was
checked so (`--allow-unverified` accepts chunks with no recorded digest): `validate --deep && publish` never
publishes a dataset whose chunks were not checked."""
from __future__ import annotations

import argparse

from tqdm.auto import tqdm

from ..loader import Dataset
from .common import Command, open_dataset, rows_text, show_progress

UNVERIFIED = 3  # --deep: nothing found wrong, but not every chunk could be checked against a recorded digest


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("validate", "check every interval link and decode every chunk; exit 1 if invalid",
                description="Check every interval link and decode every chunk. Exit 0 valid, 1 invalid, 2 unreadable "
                            f"(or not a dataset), {UNVERIFIED} with --deep when nothing is wrong but some chunks "
                            "have no recorded digest to be checked against (a dataset another tool wrote).")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--deep", action="store_true",
                   help="also check every chunk's stored bytes against the size and digest its commit recorded; "
                   f"exit {UNVERIFIED} if some chunks have none (written by another tool or an older zarrfeed)")
    p.add_argument("--allow-unverified", action="store_true",
                   help=f"with --deep: exit 0, not {UNVERIFIED}, when the only chunks not checked are those with no "
                   "recorded digest")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def check(ds: Dataset, progress: bool, deep: bool = False, allow_unverified: bool = False) -> int:
    total = sum(ds.rows.values())
    with tqdm(total=total, unit="row", unit_scale=True, desc="validating", disable=not progress,
              leave=False) as bar:
        report = ds.validate(progress=bar.update)
    verified = None
    if deep:
        chunks = sum(-(-ds.rows[t] // a.chunks[0]) for t, a in ds.tables.items())
        with tqdm(total=chunks, unit="chunk", desc="verifying", disable=not progress, leave=False) as bar:
            verified = ds.verify(progress=bar.update)
    if not report.ok or (verified is not None and not verified.ok):
        print(f"{ds.location}: INVALID" + (f"\n{report}" if not report.ok else "") +
              (f"\n{verified}" if verified is not None else ""))
        return 1
    notes = "".join(f"\n{line}" for line in str(report).splitlines()[1:])  # arrays not checked, if any
    if verified is None or verified.all_verified:
        print(f"{ds.location}: valid ({rows_text(ds.rows)}){notes}" + (f"\n{verified}" if verified else ""))
        return 0
    said = f"chunks {verified}" if not verified.recorded else f"not every chunk verified:\n{verified}"
    verdict = ("accepted with those chunks unchecked (--allow-unverified)" if allow_unverified else
               f"exit {UNVERIFIED}: its chunks could not all be verified (--allow-unverified accepts that)")
    print(f"{ds.location}: links valid ({rows_text(ds.rows)}); {said}{notes}\n{verdict}")
    return 0 if allow_unverified else UNVERIFIED


def run(args: argparse.Namespace) -> int:
    if args.allow_unverified and not args.deep:
        raise ValueError("--allow-unverified goes with --deep (without it, no chunk is compared with its digest "
                         "by validate's exit status)")
    with open_dataset(args) as ds:
        return check(ds, progress=show_progress(args), deep=args.deep, allow_unverified=args.allow_unverified)
