"""zarrfeed: a training-data pipeline for datasets of numpy structured records in zarr (L5Kit's format).

Layers, each importing only those below it:
`zarrfeed.core` (the dataset format, schemas, links, keys, chunks, stores, worker pools, shared memory),
`zarrfeed.writer` (writing: `DatasetWriter`, episodes, leases, ingestion on Dask) and `zarrfeed.loader`
(reading: `Dataset`, `Loader`, `WindowLoader`, the Arrow bridge), which never import each other, then what
composes them: `zarrfeed.flight` (the Flight service and its clients) and the command line
(`zarrfeed.cli`). The main names of both sides are importable from here too (`from zarrfeed import
DatasetWriter, Loader`), and every exception zarrfeed raises of its own, `zarrfeed.Error` at their base; they are
imported on first use, so `zarrfeed --version` starts without numpy or zarr.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_NAMES = {
    "zarrfeed.writer": ["DatasetWriter", "L5KIT_SCHEMA", "Schema", "Table", "Link", "write_dataset", "ingest_parquet",
               "synthetic", "convert"],
    "zarrfeed.loader": ["Dataset", "Loader", "WindowLoader", "AgentSampleLoader",
               "SequenceLoader", "LeRobotLoader",
               "EgoSampleLoader", "ValidationReport", "export_parquet",
               "from_arrow", "to_arrow"],
    # every exception zarrfeed raises of its own, `Error` at their base (zarrfeed/core/errors.py imports nothing
    # heavy)
    "zarrfeed.core.errors": ["Error", "FormatError", "MetaError", "FieldError", "ChunkError", "ChunkChanged",
                             "StoreUnreachable", "StoreTimeout", "WriteRefused", "LeaseHeld", "LeaseLost",
                             "IngestError", "WorkerError", "RendezvousError", "ShmSpaceError", "LoaderError",
                             "LoaderStalledError", "TransformOutputError", "CacheInvariantError"],
}
_HOME = {name: package for package, names in _NAMES.items() for name in names}
__all__ = ["__version__", *_HOME]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'zarrfeed' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)  # what tab completion offers: the public API, not this module's own imports
