"""`zarrfeed convert`: write a dataset in the other zarr format (or with other shards), a dataset of episodes as
a LeRobot v3.0 dataset (`--to lerobot`), or a LeRobot dataset as a Diffusion Policy replay buffer
(`--to replay-buffer`)."""
from __future__ import annotations

import argparse
import os
import sys

from ..core.location import Location
from ..writer.conversion import convert
from ..writer.lerobot_video import CODECS
from .common import Command, add_format_args, count_arg, show_progress, store_options
from .ingest import print_summary


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("convert", "write a dataset in zarr v3 (sharded) or v2, or to and from LeRobot v3.0, episode by "
                "episode")
    p.add_argument("source", help="dataset to read: a directory, a .zip or an fsspec URL (a LeRobot dataset's "
                   "directory with --to replay-buffer)")
    p.add_argument("out", help="dataset to write: a directory or an fsspec URL (a new local directory with --to "
                   "lerobot)")
    p.add_argument("--to", choices=("zarr", "lerobot", "replay-buffer"), default="zarr",
                   help="what to write: a zarrfeed dataset (default), a LeRobot v3.0 dataset (from a replay buffer "
                   "or a zarrfeed dataset of episodes), or a Diffusion Policy replay buffer (from a LeRobot dataset)")
    add_format_args(p, default=3)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--overwrite", action="store_true", help="replace a dataset at OUT")
    how.add_argument("--resume", action="store_true", help="finish an interrupted conversion of the same source")
    p.add_argument("--workers", type=count_arg, default=2, help="writer processes (0: write in this process)")
    p.add_argument("--fps", type=count_arg, help="with --to lerobot: frames per second of the episodes")
    p.add_argument("--task", default="default", help="with --to lerobot: the task of every episode")
    p.add_argument("--video-codec", choices=tuple(CODECS), default="libsvtav1",
                   help="with --to lerobot: libsvtav1 (LeRobot's default, AV1, lossy), h264 (lossy) or lossless "
                   "(H.264 in RGB, qp 0)")
    p.add_argument("--keys", type=lambda text: [k for k in text.split(",") if k], metavar="K1,K2",
                   help="with --to lerobot or replay-buffer: the keys (features) to write (default: all)")
    p.add_argument("--no-fsync", dest="durable", action="store_false", help="do not fsync (scratch data)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.to != "zarr":
        return _lerobot(args)
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


def _lerobot(args: argparse.Namespace) -> int:
    """--to lerobot and --to replay-buffer."""
    if args.overwrite:
        raise ValueError(f"--overwrite: not with --to {args.to} (remove {args.out} first)")
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's own banner and notes to stderr: errors only
    try:
        if args.to == "lerobot":
            if args.fps is None:
                raise ValueError("--to lerobot needs --fps (a replay buffer records no frame rate)")
            from ..loader import Dataset
            from ..writer.lerobot_export import to_lerobot

            source = Dataset.open(Location.of(args.source, store_options(args)))
            summary = to_lerobot(source, args.out, fps=args.fps, task=args.task, video_codec=args.video_codec,
                                 keys=args.keys, resume=args.resume, progress=show_progress(args), durable=args.durable)
            print(f"wrote {summary['path']}: {summary['episodes']} episodes, {summary['frames']} frames in "
                  f"{summary['seconds']:.2f} s")
            return 0
        from ..writer.lerobot_import import lerobot_to_replay_buffer

        summary = lerobot_to_replay_buffer(Location.of(args.source, store_options(args)), args.out, keys=args.keys,
                                           resume=args.resume, progress=show_progress(args), durable=args.durable)
        from ..loader import Dataset

        print_summary(summary, Dataset.open(args.out).rows)
        return 0
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    except KeyboardInterrupt:
        print("zarrfeed: interrupted; run again with --resume to finish.", file=sys.stderr)
        return 130
