"""`zarrfeed mask`: compute L5Kit's agents mask and store it at agents_mask/<threshold> in the dataset."""
from __future__ import annotations

import argparse
import time

from tqdm.auto import tqdm

from .common import Command, count_arg, fraction_arg, open_dataset, plural, show_progress


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("mask", "compute L5Kit's agents mask and store it at agents_mask/<threshold> in the dataset")
    p.add_argument("path", help="dataset: directory or fsspec URL (not a .zip: read-only)")
    p.add_argument("--threshold", type=fraction_arg, default=0.5, help="label probability threshold (L5Kit's "
                   "filter_agents_threshold); yaw 30 degrees, extent ratio 1.1, 50 m to the AV, as L5Kit")
    p.add_argument("--workers", type=count_arg, default=2, help="processes (0: in this process)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..loader.kinds import agents_mask

    with open_dataset(args) as ds:
        if not {"scenes", "frames", "agents"} <= set(ds.tables):
            raise ValueError(f"{args.path}: not an L5Kit dataset (it needs tables scenes, frames and agents)")
        agents_mask.check_writable(ds)  # before the work, not after it
        t0 = time.perf_counter()
        with tqdm(total=ds.rows["scenes"], unit="scene", desc="agents mask", disable=not show_progress(args),
                  leave=False) as bar:
            mask = agents_mask.compute(ds, args.threshold, workers=args.workers, progress=bar.update)
        where = agents_mask.save(ds, mask, args.threshold)
        selected = len(agents_mask.selected_rows(mask))
    commit = f"commit {ds.commit}" if ds.commit is not None else "no commits"
    print(f"{where}: {plural(len(mask), 'agent')}, {selected:,} with >= 10 valid past and >= 1 future frames "
          f"(AgentDataset's samples); {commit}; {time.perf_counter() - t0:.2f} s")
    return 0
