"""The `zarrfeed` command: demo, ingest, load, mask, export, info, validate, plot, serve, status (it composes
`writer` and `loader`; the commands are in `zarrfeed.commands`).

Exit codes: 0 success, 1 the dataset is invalid, 2 the input cannot be read (one line on stderr, no traceback),
130 interrupted (Ctrl+C), at any moment: this module imports nothing but the standard library, so that a Ctrl+C
while the commands import numpy, zarr and pyarrow (a good part of a second) is an interrupt too, not a
traceback through the import machinery.
"""
from __future__ import annotations

import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in `argv` (default: the command line); its exit code."""
    try:
        from .commands import run

        return run(argv)
    except KeyboardInterrupt:
        print("zarrfeed: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
