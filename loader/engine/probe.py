"""The transform probe: the layout of a transform's outputs, found by running it once on one batch, before the
ring of batch slots is made (its slots hold the outputs).

The batch comes from the source's `probe_batch(plan, k)`: a picklable call with no arguments that returns the
batch as a dict of numpy arrays, made however the source likes (with plain zarr). The probe runs in a process
of its own (here only with num_workers=0), so that whatever the transform initialises (CUDA, a thread pool)
is never initialised in the loader's process before workers are started from it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...core._proc.pool import Failed, RemoteError, WorkerPool, describe_exit
from ...core.errors import LoaderError
from .layout import Layout, TransformOutputError, transform_name
from ..options import WorkerOptions
from ..ordering.plan import EpochPlan
from ..kinds.source import BatchSource

Columns = list[tuple[str, str, tuple[int, ...]]]  # (name, dtype, shape per row) of each output


def output_layout(source: BatchSource, plan: EpochPlan, k: int, workers: WorkerOptions) -> Layout:
    """The ring slots' layout for the transform's output, from one run of `workers.transform` on batch k of
    `plan`, in a process of its own unless `workers.num_workers` is 0."""
    make_batch, transform = source.probe_batch(plan, k), workers.transform
    assert transform is not None  # sizing is for a transform's output

    def failed(err: RemoteError) -> str:
        if isinstance(err.exc, TransformOutputError):  # zarrfeed's check of the output: its one line says it all
            return f"transform {transform_name(transform)!r}: {err.message} (epoch {plan.epoch}, table " \
                   f"'{source.table}')"
        return (f"transform failed on batch {k} of epoch {plan.epoch} (table '{source.table}'), run once to size "
                f"the batch slots: {err}\ntraceback:\n{err.traceback}")

    if workers.num_workers == 0:
        try:
            columns = probe(make_batch, transform, k, source.rows_column)
        except Exception as exc:
            err = RemoteError.capture(exc)
            raise LoaderError(failed(err), err) from exc
    else:
        columns = probe_in_process(make_batch, transform, k, workers.start_method, failed, source.rows_column)
    for name, dtype, _ in columns:  # a dtype of Python objects cannot live in shared memory (numpy would
        if np.dtype(dtype).hasobject:  # say only "cannot create an OBJECT array from memory buffer")
            raise LoaderError(f"transform output {name!r} of batch {k} of epoch {plan.epoch} (table "
                              f"'{source.table}') is an array of Python objects (dtype {np.dtype(dtype)}); "
                              "batches live in shared memory: return numbers, bools or fixed-width strings")
    return Layout([(name, dtype, shape, -1) for name, dtype, shape in columns], source.config.batch_size)


def probe(make_batch: Callable[[], dict[str, np.ndarray]], transform: Callable, k: int,
          rows_of: str | None = None) -> Columns:
    """Run `transform` on batch k; its output's columns (name, dtype, shape per row), checked as the workers
    check every later batch against them. `rows_of` names the batch column whose length is the batch's rows
    (default: the first)."""
    batch = make_batch()
    rows = len(batch[rows_of] if rows_of else next(iter(batch.values())))
    out = transform(batch)
    if not isinstance(out, dict) or not all(isinstance(a, np.ndarray) and a.ndim >= 1 for a in out.values()):
        got = type(out).__name__ if not isinstance(out, dict) else \
            f"a dict of {', '.join(sorted({type(a).__name__ for a in out.values()}))}"
        raise TransformOutputError("transform must return a dict of numpy arrays whose first axis is the batch's "
                                   f"rows, got {got}")
    Layout.of_arrays(out, rows).check(out, k, rows)
    return [(name, a.dtype.str, a.shape[1:]) for name, a in out.items()]


def _probe_setup(wid: int, make_batch: Callable, transform: Callable, k: int, rows_of: str | None) -> Callable:
    return lambda msg: probe(make_batch, transform, k, rows_of)


def probe_in_process(make_batch: Callable, transform: Callable, k: int, start_method: str | None,
                     describe: Callable[[RemoteError], str], rows_of: str | None = None) -> Columns:
    """`probe` in a worker process of its own, started as the loader's workers are; a failure of the
    transform raises LoaderError carrying the worker's exception, a dead process LoaderError at once."""
    pool = WorkerPool(1, _probe_setup, (make_batch, transform, k, rows_of), "transform probe", start_method)
    try:
        pool.send(0, "probe")
        while True:
            for reply in pool.poll(1.0):
                if isinstance(reply, Failed):
                    raise LoaderError(describe(reply.error), reply.error) from reply.error.exc
                return reply
            if pool.dead():
                raise LoaderError(describe_exit("transform probe", *pool.dead()[0]) + " (running the transform "
                                  "once to size the batch slots)")
    finally:
        pool.stop()
