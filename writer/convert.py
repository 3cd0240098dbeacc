"""Converting a dataset from one zarr format to the other (or re-sharding it), through the writer.

A conversion is an ingest of the source's episodes (`dataset_episodes.DatasetSource`: every chunk read checked
against its commit's digest) into a new dataset of the other format: the same schema, chunk rows, compressor
and rows, committed as they are written, with the writer's guarantees (a lease, digests, ordered fsyncs). Its
episodes are keyed by their position in the source, with the source's fingerprint, so an interrupted
conversion finishes with `resume=True` and never writes an episode twice.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from ..core.location import Location
from .dataset_episodes import DatasetSource
from .dataset_writer import DatasetWriter


def convert(source: str | os.PathLike | Location, out: str | os.PathLike | Location, *, zarr_format: int = 3,
            shard_bytes: int | None = None, resume: bool = False, overwrite: bool = False, workers: int = 2,
            progress: bool = False, durable: bool = True,
            storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the dataset at `source` to `out` in `zarr_format` (3: sharded, `shard_bytes` decoded per shard at
    most; 2: what L5Kit's own code and zarr-python read) and return the ingest's summary. `resume=True`
    finishes an interrupted conversion of the same source; `overwrite=True` replaces a dataset at `out`.

    Example::

        convert("scenes.zarr", "scenes-v3.zarr", zarr_format=3)
    """
    src = Location.of(source, dict(storage_options or {}))
    dst = Location.of(out, dict(storage_options or {}))
    if src.same_place(dst):
        raise ValueError(f"{dst}: the output is also the input; convert to another path")
    episodes = DatasetSource(src)
    with DatasetWriter(dst, episodes.schema, workers=workers, mode="a" if resume else "w", overwrite=overwrite,
                       progress=progress, durable=durable, zarr_format=zarr_format, shard_bytes=shard_bytes) as w:
        return w.ingest(episodes, resume=resume)
