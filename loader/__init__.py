"""zarrfeed's reading side: open, describe and check datasets; load shuffled batches; Arrow and Parquet out.

Names are imported on first use (see zarrfeed.core.lazy): a reader worker loads only what reading chunks needs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_names

__all__ = ["AgentSampleLoader", "Dataset", "EgoSampleLoader", "FormatError", "Loader", "LoaderError",
           "LoaderStalledError", "StoreUnreachable", "ValidationReport", "WindowLoader", "export_parquet",
           "from_arrow", "to_arrow"]
__getattr__, __dir__ = lazy_names(__name__, {
    "from_arrow": "..core.arrow_records", "FormatError": "..core.dataset_format",
    "StoreUnreachable": "..core.stores", "to_arrow": ".arrow_bridge",
    "Loader": ".batches", "LoaderError": ".batches", "LoaderStalledError": ".batches",
    "Dataset": ".dataset", "ValidationReport": ".dataset", "export_parquet": ".parquet_export",
    "AgentSampleLoader": ".sample_loaders", "EgoSampleLoader": ".sample_loaders", "WindowLoader": ".windows",
})

if TYPE_CHECKING:  # what the names are, for type checkers and editors and docs
    from ..core.arrow_records import from_arrow
    from ..core.dataset_format import FormatError
    from ..core.stores import StoreUnreachable
    from .arrow_bridge import to_arrow
    from .batches import Loader, LoaderError, LoaderStalledError
    from .dataset import Dataset, ValidationReport
    from .parquet_export import export_parquet
    from .sample_loaders import AgentSampleLoader, EgoSampleLoader
    from .windows import WindowLoader
