"""zarrfeed's reading side: open, describe and check datasets; load shuffled batches; Arrow and Parquet out."""
from ..core.arrow_records import from_arrow
from ..core.errors import FormatError, LoaderError, LoaderStalledError, StoreUnreachable
from .arrow_bridge import to_arrow
from .loader import Loader
from .dataset import Dataset, ValidationReport
from .lerobot_dataset import LeRobotDataset  # (adds the LeRobot v3 reader to `Dataset.open`)
from .options import LoaderOptions
from .parquet_export import export_parquet
from .kinds.l5kit_samples import AgentSampleLoader, EgoSampleLoader
from .kinds.lerobot_windows import LeRobotLoader
from .kinds.sequences import SequenceLoader
from .kinds.windows import WindowLoader
from ..core._proc.pool import start_fork_server_early

__all__ = ["AgentSampleLoader", "Dataset", "EgoSampleLoader", "FormatError", "LeRobotDataset", "LeRobotLoader",
           "Loader", "LoaderError", "LoaderOptions", "LoaderStalledError", "SequenceLoader", "StoreUnreachable",
           "ValidationReport", "WindowLoader", "export_parquet", "from_arrow", "to_arrow"]

start_fork_server_early()  # (see there: the first loader of a process does not wait for it)
