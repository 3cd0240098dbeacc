"""`zarrfeed validate`: check every interval link and decode every chunk; exit 1 if invalid."""
from __future__ import annotations

import argparse

from tqdm.auto import tqdm

from ..loader import Dataset
from .common import (Command, open_dataset,
                     rows_text, show_progress)


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("validate", "check every interval link and decode every chunk; exit 1 if invalid")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--deep", action="store_true",
                   help="also check every chunk's stored bytes against the size and digest its commit recorded")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def check(ds: Dataset, progress: bool, deep: bool = False) -> int:
    total = sum(ds.rows.values())
    with tqdm(total=total, unit="row", unit_scale=True, desc="validating", disable=not progress,
              leave=False) as bar:
        report = ds.validate(progress=bar.update)
    verified = None
    if deep:
        chunks = sum(-(-ds.rows[t] // a.chunks[0]) for t, a in ds.tables.items())
        with tqdm(total=chunks, unit="chunk", desc="verifying", disable=not progress, leave=False) as bar:
            verified = ds.verify(progress=bar.update)
    if report.ok and (verified is None or verified.ok):
        notes = "".join(f"\n{line}" for line in str(report).splitlines()[1:])  # arrays not checked, if any
        if verified is not None and not verified.recorded:
            print(f"{ds.location}: links valid, chunks {verified} ({rows_text(ds.rows)}){notes}")
        else:
            print(f"{ds.location}: valid ({rows_text(ds.rows)}){notes}" + (f"\n{verified}" if verified else ""))
        return 0
    print(f"{ds.location}: INVALID" + (f"\n{report}" if not report.ok else "") +
          (f"\n{verified}" if verified is not None else ""))
    return 1


def run(args: argparse.Namespace) -> int:
    with open_dataset(args) as ds:
        return check(ds, progress=show_progress(args), deep=args.deep)
