"""A LeRobot v3 root's tables, shaped as a Diffusion Policy replay buffer's (`core.replay_buffer`): the table
`episodes` (per episode its `end` = `dataset_to_index`, its `episode_index` and `length`) and one step table per
feature, records of one field named as the feature (`observation.state` float32 (6,); LeRobot's shape [1] a
scalar), each linked to `episodes` by an "ends" link. Tabular features are columns of the data files
(`ParquetTable`), cameras are video frames (`VideoTable`). Nothing is copied: every table reads the files where
they lie.
"""
from __future__ import annotations

import re

import numpy as np

from ._proc.pool import preload_in_workers
from .errors import ChunkError, FormatError
from .external_table import ExternalTable, MemoryTable
from .lerobot_meta import INFO, LeRobotMeta
from .location import Location
from .parquet_files import ParquetFiles
from .parquet_table import ParquetTable
from .replay_buffer import END, EPISODE_CHUNK, EPISODES, RESERVED
from .schema import ENDS, Link, Schema, Table
from .video_table import VideoTable

SCHEMA = "lerobot"
_FEATURE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # LeRobot's feature names ("observation.images.cam")


class LeRobotSchema(Schema):
    """A schema whose tables are a LeRobot dataset's features: no table is a folder of a store, so a name may hold
    dots, as LeRobot's feature names do (never a "/" nor "..")."""

    def _check_name(self, t: Table) -> None:
        if not _FEATURE.fullmatch(t.name) or ".." in t.name:
            raise ValueError(f"feature {t.name!r}: not a name zarrfeed reads (letters, digits, _, - and ., no ..)")


def open_lerobot(location: Location) -> tuple[LeRobotMeta, Schema, dict[str, ExternalTable]]:
    """The LeRobot root at `location`: its metadata, schema and tables (`FormatError` in one line naming the file
    below the location and the key or episode)."""
    try:
        meta = LeRobotMeta.read(location)
        schema, tables = lerobot_tables(meta)
    except FormatError as exc:
        raise FormatError(f"{str(location).rstrip('/')}/{exc}") from None
    return meta, schema, tables


def lerobot_tables(meta: LeRobotMeta, chunk_rows: int | None = None,
                   video_chunk_rows: int | None = None) -> tuple[Schema, dict[str, ExternalTable]]:
    """The schema and tables of the LeRobot root `meta` describes (see the module's docstring); `chunk_rows` and
    `video_chunk_rows` the rows per chunk of the Parquet and video tables (default 1024 and 32)."""
    for name in [*meta.features, *meta.cameras]:
        if name in RESERVED:
            raise FormatError(f"{INFO}: feature '{name}' has a name zarrfeed gives the episodes or the steps")
    ep = meta.episodes
    records = np.zeros(len(ep), [(END, np.int64), ("episode_index", np.int64), ("length", np.int64)])
    records[END], records["episode_index"], records["length"] = ep.end, ep.index, ep.length
    tables: dict[str, ExternalTable] = {EPISODES: MemoryTable(EPISODES, records, EPISODE_CHUNK, "meta/episodes")}
    # the libraries the tables read with, imported once by the loaders' fork server if it has not started yet
    preload_in_workers("pyarrow.parquet", "zarrfeed.core.parquet_files",
                       *(("av", "zarrfeed.core.video_frames") if meta.cameras else ()))
    parquet = {"chunk_rows": chunk_rows} if chunk_rows else {}
    # one reader for every column's table: each reads the rows the others read (see `parquet_files`)
    reader = ParquetFiles(meta.location, list(meta.features), meta.file_tags)
    for name, feature in meta.features.items():
        dtype = np.dtype([(name, feature.dtype, feature.shape)] if feature.shape else [(name, feature.dtype)])
        tables[name] = ParquetTable(meta.location, name, name, dtype, meta.data_files, meta.data_start,
                                    meta.data_stop, tags=meta.file_tags, reader=reader, **parquet)
    if meta.cameras:
        episode, times, unreadable = _frame_times(meta, tables.get("timestamp"))
        video = {"chunk_rows": video_chunk_rows} if video_chunk_rows else {}
        for cam, feature in meta.cameras.items():
            at = np.maximum(episode, 0)
            shifted = ep.from_timestamp[cam][at] + times if len(ep) else times
            tables[cam] = VideoTable(meta.location, cam, cam, feature.shape, meta.video_files[cam],
                                     ep.video_file[cam], episode, shifted, unreadable=unreadable,
                                     tags=meta.file_tags, **video)
    schema_tables = {name: Table(name, t.dtype, t.chunks[0]) for name, t in tables.items()}  # (no folder: no path)
    links = tuple(Link(EPISODES, END, name, ENDS) for name in tables if name != EPISODES)
    try:
        return LeRobotSchema(schema_tables, links, name=SCHEMA), tables
    except ValueError as exc:
        raise FormatError(f"{INFO}: {exc}") from None


def _frame_times(meta: LeRobotMeta, timestamps: ExternalTable | None) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Each dataset row's episode (-1: in none) and its `timestamp` within it, read from the data files; why
    they could not be read, if so (a missing or damaged data file: the video tables then say so when read, and
    `validate` names the file)."""
    rows = int(meta.data_stop.max()) if len(meta.data_stop) else 0
    ep = meta.episodes
    episode = np.full(rows, -1, np.int64)
    for e, (a, b) in enumerate(zip(ep.start.tolist(), ep.end.tolist(), strict=True)):
        episode[a:b] = e
    if not isinstance(timestamps, ParquetTable):
        return episode, np.zeros(rows), f"{INFO}: no feature 'timestamp'"
    try:
        times = timestamps.read_records(0, rows)["timestamp"]  # each data file read once, its one column
    except ChunkError as exc:
        return episode, np.zeros(rows), str(exc)
    return episode, times.astype(np.float64), None
