"""zarrfeed's reading side: open, describe and check datasets; load shuffled batches; Arrow and Parquet out."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import FormatError, LoaderError, LoaderStalledError, StoreUnreachable
from .loader import Loader
from .dataset import Dataset, ValidationReport
from .lerobot_dataset import LeRobotDataset  # (adds the LeRobot v3 reader to `Dataset.open`)
from .options import LoaderOptions
from .kinds.l5kit_samples import AgentSampleLoader, EgoSampleLoader
from .kinds.lerobot_windows import LeRobotLoader
from .kinds.sequences import SequenceLoader
from .kinds.windows import WindowLoader
from ..core._proc.pool import start_fork_server_early
from ..core.lazy import lazy_names

__all__ = ["AgentSampleLoader", "Dataset", "EgoSampleLoader", "FormatError", "LeRobotDataset", "LeRobotLoader",
           "Loader", "LoaderError", "LoaderOptions", "LoaderStalledError", "SequenceLoader", "StoreUnreachable",
           "ValidationReport", "WindowLoader", "export_parquet", "from_arrow", "to_arrow"]

# the Arrow and Parquet functions are imported on first use (see zarrfeed.core.lazy): pyarrow and tqdm take a tenth of
# a second to import, which neither a script that only loads batches nor the loaders' fork server (which imports
# this package) needs
__getattr__, _lazy = lazy_names(__name__, {"from_arrow": "..core.arrow_records", "to_arrow": ".arrow_bridge",
                                           "export_parquet": ".parquet_export"})


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_lazy()))


if TYPE_CHECKING:  # what the names are, for type checkers and editors and docs
    from ..core.arrow_records import from_arrow
    from .arrow_bridge import to_arrow
    from .parquet_export import export_parquet

start_fork_server_early()  # (see there: the first loader of a process does not wait for it)
