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
    """
    with DatasetWriter(path, schema, workers=workers, **options) as w:
        return w.ingest(episodes)
