"""zarrfeed: a training-data pipeline for datasets of numpy structured records in zarr (L5Kit's format).

Three packages: `writer` writes datasets (schemas, episodes, `DatasetWriter`, ingestion on Dask), `loader`
reads them (`Dataset`, `Loader`, `WindowLoader`, the Arrow bridge), and this one holds what composes both:
the command line (`zarrfeed.cli`). The main names of both sides are importable from here too
(`from zarrfeed import DatasetWriter, Loader`); they are imported on first use, so `zarrfeed --version`
starts without numpy or zarr.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_NAMES = {
    "writer": ["DatasetWriter", "L5KIT_SCHEMA", "Schema", "Table", "Link", "write_dataset", "ingest_parquet",
               "FormatError", "WorkerError", "synthetic"],
    "loader": ["Dataset", "Loader", "LoaderError", "WindowLoader", "ValidationReport", "export_parquet",
               "from_arrow", "to_arrow"],
}
_HOME = {name: package for package, names in _NAMES.items() for name in names}
__all__ = ["__version__", *_HOME]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'zarrfeed' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
