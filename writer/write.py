"""Writing episodes to a dataset in one process, committing the row counts at the end."""
from __future__ import annotations

import os
import time
from typing import Any, Iterable, Mapping

import numcodecs
import numpy as np
import zarr
from tqdm.auto import tqdm

from . import format
from .chunked import ChunkedAppender
from .episode import check_episode, relocate
from .schema import L5KIT_SCHEMA, Schema


def write_dataset(path: str | os.PathLike, episodes: Iterable[Mapping[str, np.ndarray]],
                  schema: Schema = L5KIT_SCHEMA, *, chunks: dict[str, int] | None = None,
                  compressor: numcodecs.abc.Codec | None = None, overwrite: bool = False,
                  progress: bool = False) -> dict[str, Any]:
    """Create a dataset at `path` holding `episodes` in order; return a summary (episodes, rows, bytes, seconds).

    Each episode is checked before any of it is written (`ValueError` naming table, field and row).
    """
    t0 = time.perf_counter()
    schema = format.create(path, schema, chunks=chunks, compressor=compressor, overwrite=overwrite)
    group = zarr.open_group(zarr.storage.DirectoryStore(os.fspath(path)), mode="r+")
    appenders = {name: ChunkedAppender(group[name]) for name in schema.tables}
    n = 0
    bar = tqdm(episodes, desc="writing", unit="episode", disable=not progress)
    for n, episode in enumerate(bar, 1):
        try:
            tables = check_episode(episode, schema)
        except ValueError as exc:
            raise ValueError(f"episode {n - 1}: {exc}") from None
        tables = relocate(tables, schema, {name: a.pos for name, a in appenders.items()})
        for name, rows in tables.items():
            appenders[name].append(rows)
    committed = {}
    for name, appender in appenders.items():
        appender.flush()
        appender.array.resize(appender.pos)
        committed[name] = appender.pos
    format.write_manifest(path, format.manifest(schema, committed))
    nbytes = sum(committed[name] * t.dtype.itemsize for name, t in schema.tables.items())
    return {"episodes": n, "rows": committed, "bytes": nbytes, "seconds": time.perf_counter() - t0}
