"""The loader's gather kernel: rows of interleaved records into per-field columns.

The C extension `loader._gather` is built at install; where it could not be (no C compiler), the numpy
version in `loader.engine.gather_numpy` does the same, slower, with a warning once per process. ZARRFEED_GATHER=numpy
chooses the numpy version on purpose (to compare them, or to rule the C kernel out when debugging).
"""
from __future__ import annotations

import os
import warnings

from ...core._proc.pool import in_the_fork_server
from . import gather_numpy

gather, gather_runs = gather_numpy.gather, gather_numpy.gather_runs
KERNEL = "numpy"
if os.environ.get("ZARRFEED_GATHER", "").lower() != "numpy":
    try:
        from .. import _gather  # type: ignore[attr-defined]  # the C extension, built at install

        gather, gather_runs, KERNEL = _gather.gather, _gather.gather_runs, "c"
    except ImportError:
        if not in_the_fork_server():  # (the parent of its workers, which imported this too, has said it)
            warnings.warn("zarrfeed: the C gather kernel was not built (was there a C compiler at install?); "
                          "batches are gathered with numpy, about 10 times slower per row (python "
                          "bench/bench_gather.py). Reinstall with a C compiler (gcc) for full speed.", stacklevel=2)

__all__ = ["KERNEL", "gather", "gather_runs"]
