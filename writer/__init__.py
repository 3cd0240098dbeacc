"""zarrfeed's writing side: the dataset format, schemas, episodes and writers.

Names are imported on first use (see zarrfeed.core.lazy): a writer worker loads only what writing chunks needs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_names

__all__ = ["AGENT_DTYPE", "Coordinator", "DatasetWriter", "FRAME_DTYPE", "FormatError", "L5KIT_SCHEMA", "Link",
           "LocalCoordinator", "PERCEPTION_LABELS", "SCENE_DTYPE", "Schema", "StoreUnreachable", "TL_FACE_DTYPE",
           "Table", "Violation", "WorkerError", "WriteOptions", "WriteRefused", "check_episode", "convert",
           "ingest_parquet", "relocate", "replay_buffer_schema", "synthetic", "write_dataset"]
__getattr__, __dir__ = lazy_names(__name__, {
    **dict.fromkeys(["FormatError", "StoreUnreachable", "WorkerError", "WriteRefused"], "..core.errors"),
    "Violation": "..core.links",
    "replay_buffer_schema": "..core.replay_buffer",
    **dict.fromkeys(["AGENT_DTYPE", "FRAME_DTYPE", "L5KIT_SCHEMA", "PERCEPTION_LABELS", "SCENE_DTYPE",
                     "TL_FACE_DTYPE", "Link", "Schema", "Table"], "..core.schema"),
    "Coordinator": ".coordinator", "LocalCoordinator": ".coordinator", "DatasetWriter": ".dataset_writer",
    "check_episode": ".episode", "relocate": ".episode", "ingest_parquet": ".parquet_ingest", "convert": ".conversion",
    "write_dataset": ".write", "WriteOptions": ".options",
}, modules=("synthetic",))

if TYPE_CHECKING:  # what the names are, for type checkers and editors and docs
    from ..core.errors import FormatError, StoreUnreachable, WorkerError, WriteRefused
    from ..core.links import Violation
    from ..core.replay_buffer import replay_buffer_schema
    from ..core.schema import (AGENT_DTYPE, FRAME_DTYPE, L5KIT_SCHEMA, PERCEPTION_LABELS, SCENE_DTYPE, TL_FACE_DTYPE,
        Link, Schema, Table)
    from . import synthetic
    from .conversion import convert
    from .coordinator import Coordinator, LocalCoordinator
    from .dataset_writer import DatasetWriter
    from .episode import check_episode, relocate
    from .options import WriteOptions
    from .parquet_ingest import ingest_parquet
    from .write import write_dataset
