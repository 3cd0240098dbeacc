"""`write_dataset`: the one-call way to write episodes to a new dataset."""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Unpack

import numpy as np

from ..core.keywords import spelled_out
from ..core.schema import L5KIT_SCHEMA, Schema
from .dataset_writer import DatasetWriter
from .options import WriteOptions, Writes


@spelled_out(WriteOptions, Writes)
def write_dataset(path: str | os.PathLike, episodes: Iterable[Mapping[str, np.ndarray]],
                  schema: Schema = L5KIT_SCHEMA, *, workers: int = 0, start_method: str | None = None,
                  **options: Unpack[WriteOptions]) -> dict[str, Any]:
    """Create a dataset at `path` holding `episodes` in order; return a summary (episodes, rows, bytes, seconds).

    `workers=0` writes in this process; the options are every writer's (`WriteOptions`); `DatasetWriter` takes
    a few more, for its workers and its lease.

    Args:
        path: Where the new dataset goes: a local directory or any fsspec URL (with `storage_options=`).
        episodes: The episodes, in order: each a mapping of table name to a structured array of that table's
            records, intervals relative to the episode (see `check_episode`).
        schema: The dataset's tables and links (default L5Kit's).
        workers: Writer processes (default 0: write in this process, unlike `DatasetWriter`'s 2).
        start_method: How worker processes start, as `DatasetWriter`'s (default: its own).
    """
    Writes.of(options, "write_dataset")  # an unknown or bad option named as this function's
    with DatasetWriter(path, schema, workers=workers, start_method=start_method, **options) as w:
        return w.ingest(episodes)
