"""zarrfeed's reading side: open, describe and check datasets; load shuffled batches; Arrow and Parquet out."""
from ..core.arrow_records import from_arrow
from ..core.errors import FormatError, LoaderError, LoaderStalledError, StoreUnreachable
from .arrow_bridge import to_arrow
from .batches import Loader
from .dataset import Dataset, ValidationReport
from .options import LoaderOptions
from .parquet_export import export_parquet
from .sample_loaders import AgentSampleLoader, EgoSampleLoader
from .sequences import SequenceLoader
from .windows import WindowLoader

__all__ = ["AgentSampleLoader", "Dataset", "EgoSampleLoader", "FormatError", "Loader", "LoaderError",
           "LoaderOptions", "LoaderStalledError", "SequenceLoader", "StoreUnreachable", "ValidationReport",
           "WindowLoader", "export_parquet", "from_arrow", "to_arrow"]
