"""`write_dataset`: the one-call way to write episodes to a new dataset."""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import numpy as np

from ..core.schema import L5KIT_SCHEMA, Schema
from .dataset_writer import DatasetWriter


def write_dataset(path: str | os.PathLike, episodes: Iterable[Mapping[str, np.ndarray]],
                  schema: Schema = L5KIT_SCHEMA, *, workers: int = 0, **options: Any) -> dict[str, Any]:
    """Create a dataset at `path` holding `episodes` in order; return a summary (episodes, rows, bytes, seconds).

    `workers=0` writes in this process; options are those of `DatasetWriter`.

    Args:
        path: Where the new dataset goes: a local directory or any fsspec URL (with `storage_options=`).
        episodes: The episodes, in order: each a mapping of table name to a structured array of that table's
            records, intervals relative to the episode (see `check_episode`).
        schema: The dataset's tables and links (default L5Kit's).
        workers: Writer processes (default 0: write in this process, unlike `DatasetWriter`'s 2).
        **options: Any other option of `DatasetWriter` (`chunks`, `compressor`, `overwrite`, `progress`, ...).
    """
    with DatasetWriter(path, schema, workers=workers, **options) as w:
        return w.ingest(episodes)
