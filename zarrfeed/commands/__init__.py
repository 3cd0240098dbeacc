"""The `zarrfeed` command's commands: demo, ingest, convert, load, mask, export, info, validate, plot, serve,
status (they compose `writer` and `loader`). `zarrfeed.cli.main` imports this package, and everything it
imports, only once it can take a Ctrl+C as the command's interrupt.

Exit codes: 0 success, 1 the dataset is invalid, 2 the input cannot be read (one line on stderr, no traceback),
3 `validate --deep` found nothing wrong but could not check every chunk against a recorded digest
(`validate.UNVERIFIED`), 130 interrupted.

Each command is a module of this package with its parser (`add`) and what it does (`run`) side by side;
`common` holds what they share.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from typing import Sequence

from .. import __version__
from ..core.errors import FormatError, LeaseLost, LoaderError, ShmSpaceError, WorkerError
from . import convert, demo, export, info, ingest, load, mask, plot, serve, status, validate
from .common import CommandParser, Help, TopParser, in_cli_words, plural

# in the order --help lists them, a dataset's life: make it, look at it, read it, serve it
COMMANDS = (demo, ingest, convert, info, validate, load, export, mask, plot, serve, status)


def _check_workers(args: argparse.Namespace) -> None:
    """More worker processes than cores only adds switching: say so (it still runs)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = getattr(args, "workers", 0) or 0
    if workers > cores:
        warnings.warn(f"--workers {workers} is more than the {plural(cores, 'core')} this process may use; "
                      f"{cores} would be as fast")


def build_parser() -> argparse.ArgumentParser:
    parser = TopParser(prog="zarrfeed", description="Training-data loader and writer for "
                                     "datasets of structured records in zarr (L5Kit format).")
    parser.add_argument("--version", action="version", version=f"zarrfeed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help[:1].upper() + help[1:] + ".",
                              formatter_class=Help)

    for module in COMMANDS:
        module.add(command)
    for name in ("load", "export", "serve", "mask", "plot"):
        sub.choices[name].add_argument(
            "--no-verify", action="store_true",
            help="read chunks without checking them against the digests their commits recorded (default: every "
            "chunk is checked; unchecked, a changed chunk or another dataset put in its place is read as data)")
    for name, p in sub.choices.items():
        if name in ("demo", "info"):
            p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        if name == "status":  # it asks a server, which opens the stores
            continue
        p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                       help="an option of the store's fsspec filesystem, e.g. endpoint_url=http://127.0.0.1:9000 "
                       "or anon=true (repeatable; VALUE is read as JSON if it is JSON); fsspec's FSSPEC_<PROTOCOL>_"
                       "<KEY> environment variables and the usual credentials (AWS_*) apply too")
    return parser


def _credential_errors() -> tuple[type[BaseException], ...]:
    """botocore's "no credentials" errors (none when botocore is not installed)."""
    try:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    except ImportError:
        return ()
    return NoCredentialsError, PartialCredentialsError


def _credentials_message(exc: BaseException) -> str:
    """One line for missing S3 credentials: botocore's own words (which are missing) and where it looks."""
    home = os.path.expanduser("~")
    files = [os.environ.get("AWS_SHARED_CREDENTIALS_FILE", f"{home}/.aws/credentials"),
             os.environ.get("AWS_CONFIG_FILE", f"{home}/.aws/config")]
    what = "none found" if type(exc).__name__ == "NoCredentialsError" else str(exc).rstrip(".")
    return (f"S3 credentials: {what}; they are read from --storage-option key=... secret=... "
            "(or profile=...), the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), "
            f"the files {files[0]} and {files[1]}, and a container or EC2 instance role; for a public bucket "
            "pass --storage-option anon=true")


def run(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the command line) and run its command; the exit code."""
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda msg, *a, **k: print(f"zarrfeed: warning: {msg}", file=sys.stderr)
            _check_workers(args)
            return args.func(args)
    except BrokenPipeError:  # the reader of our output left (`zarrfeed info X | head -2`): stop quietly, as
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Unix tools do; no flush error at exit
        return 128 + signal.SIGPIPE
    except (FormatError, ValueError, WorkerError, LoaderError, LeaseLost, ShmSpaceError, OSError) as exc:
        print(f"zarrfeed: error: {in_cli_words(exc)}", file=sys.stderr)
        return 2
    except TypeError as exc:
        if "unexpected keyword argument" not in str(exc):
            raise
        print(f"zarrfeed: error: a --storage-option is not an option of this store's filesystem ({exc})",
              file=sys.stderr)
        return 2
    except MemoryError as exc:  # a batch, a chunk or a table larger than this machine's memory
        smaller = [flag for flag, dest in (("--batch-size", "batch_size"), ("--workers", "workers"), ("--dpi", "dpi"))
                   if getattr(args, dest, None)]
        print(f"zarrfeed: error: not enough memory{f' ({exc})' if str(exc) else ''}: ask for less at once"
              f"{f' (a smaller {smaller[0]})' if len(smaller) == 1 else ''}"
              f"{f' ({smaller[0]} or {smaller[1]} smaller)' if len(smaller) > 1 else ''}", file=sys.stderr)
        return 2
    except _credential_errors() as exc:  # botocore's traceback says only "Unable to locate credentials"
        print(f"zarrfeed: error: {_credentials_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    # said once the exception is gone: a progress bar its frames held (one interrupted while it was being made
    # is closed only when it is collected) has written its last output first, so this line is the last
    print("zarrfeed: interrupted", file=sys.stderr)
    return 130
