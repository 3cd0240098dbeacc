"""zarrfeed's writing side: the dataset format, schemas, episodes and writers."""
from ..core._proc.pool import WorkerError
from ..core.dataset_format import FormatError
from ..core.links import Violation
from ..core.schema import (
           AGENT_DTYPE,
           FRAME_DTYPE,
           L5KIT_SCHEMA,
           PERCEPTION_LABELS,
           SCENE_DTYPE,
           TL_FACE_DTYPE,
           Link,
           Schema,
           Table,
)
from ..core.stores import StoreUnreachable
from . import synthetic
from .coordinator import Coordinator, LocalCoordinator
from .dataset_writer import DatasetWriter
from .episode import check_episode, relocate
from .parquet_ingest import ingest_parquet
from .write import write_dataset

__all__ = ["AGENT_DTYPE", "FRAME_DTYPE", "L5KIT_SCHEMA", "PERCEPTION_LABELS", "SCENE_DTYPE", "TL_FACE_DTYPE",
           "Coordinator", "DatasetWriter", "FormatError", "Link", "LocalCoordinator", "Schema", "StoreUnreachable",
           "Table", "Violation", "WorkerError", "check_episode", "ingest_parquet", "relocate", "synthetic",
           "write_dataset"]
