"""`zarrfeed plot`: draw a scene from above (--scene N) or the dataset at a glance (--summary) as a PNG; needs
zarrfeed[plot]."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..core.refusals import refused_writes
from ..core.stores import PARTIAL
from .common import Command, count_arg, open_dataset, positive_arg


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("plot", "draw a scene from above (--scene N) or the dataset at a glance (--summary) as a PNG; "
                "needs zarrfeed[plot]")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--scene", type=count_arg, metavar="N", help="draw scene N: tracks by label, the ego path, "
                   "traffic-light faces, frame --frame with its window")
    p.add_argument("--summary", action="store_true", help="draw rows per scene, agents per frame, label shares")
    p.add_argument("--frame", type=count_arg, metavar="T", help="the frame to mark: a row of the frames table "
                   "(global, as WindowLoader's frame_row, not the index within the scene; default: the scene's "
                   "middle)")
    p.add_argument("--history", type=count_arg, default=10, help="frames before --frame in its window")
    p.add_argument("--future", type=count_arg, default=50, help="frames after --frame in its window")
    p.add_argument("--out", metavar="FILE.png", help="where to save (default: scene-N.png or summary.png)")
    p.add_argument("--dpi", type=positive_arg, default=100, help="resolution of the PNG")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import plot

    try:
        plot.require_matplotlib()
    except ImportError as exc:  # an optional package: one line saying which extra installs it
        print(f"zarrfeed: error: {exc}", file=sys.stderr)
        return 2
    if args.summary == (args.scene is not None):
        raise ValueError(f"plot: give {'one of ' if args.summary else ''}--scene N (a scene from above) or --summary "
                         "(the dataset at a glance)")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise ValueError(f"--out {args.out}: no such folder {os.path.dirname(os.path.abspath(args.out))}")
    out = args.out or ("summary.png" if args.summary else f"scene-{args.scene}.png")
    with open_dataset(args) as ds:
        if args.summary:
            fig = plot.summary_figure(ds)
        else:
            fig = plot.scene_figure(ds, args.scene, args.frame, args.history, args.future)
        save(fig, out, args.dpi)
    print(f"wrote {out}")
    return 0


def save(fig: Any, out: str, dpi: int) -> None:
    """Save `fig` as `out`, written aside and renamed into place: a save that fails (a full disk) leaves no part
    of a file, and a write the system refuses is one line naming `out` (`refusals`)."""
    import matplotlib

    folder, name = os.path.split(os.path.abspath(out))
    kind = os.path.splitext(name)[1][1:].lower() or matplotlib.rcParams["savefig.format"]
    tmp = os.path.join(folder, f".{name}.{os.getpid()}{PARTIAL}")
    with refused_writes(out, "the plot cannot be written there"):
        try:
            fig.savefig(tmp, dpi=dpi, format=kind)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
