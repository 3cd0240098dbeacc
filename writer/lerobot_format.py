"""LeRobot v3.0's files, as LeRobot 0.4.4's own writer lays them out: paths, `meta/info.json`, the frames'
Parquet tables (schema, column types, the `huggingface` schema metadata Hugging Face `datasets` adds),
`meta/tasks.parquet` (the task string as the pandas index) and the rows of `meta/episodes/`.

A feature is a camera (uint8 frames (H, W, 3): dtype "video", stored as MP4) or a column: a number per frame
(LeRobot's shape [1], a plain Parquet column) or a vector (shape [D], a Parquet fixed_size_list). Every frame
also gets LeRobot's own columns `timestamp` (frame_index / fps, float32), `frame_index`, `episode_index`,
`index` (the frame's row in the dataset) and `task_index`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.lerobot_meta import (CODEBASE_VERSION, DATA_PATH, EPISODES_PATH, FRAME_COLUMNS, FRAME_FEATURES, INFO,
                                 NUMERIC, STATS, TASKS, VIDEO, VIDEO_PATH, video_columns)

__all__ = ["CODEBASE_VERSION", "DATA_PATH", "EPISODES_PATH", "FRAME_COLUMNS", "INFO", "STATS", "TASKS",
           "VIDEO_PATH", "Feature", "check_feature", "data_schema", "data_table", "tasks_table", "info_json",
           "next_file", "episode_row"]

CHUNKS_SIZE, DATA_FILE_MB, VIDEO_FILE_MB = 1000, 100, 200  # LeRobot's defaults (info.json says them)
_PANDAS_VERSION = "3.1.1"  # the pandas whose tasks.parquet layout this writes when pandas is not installed


@dataclass(frozen=True)
class Feature:
    """One of the source's keys as a LeRobot feature: `name`, numpy `dtype`, the step's `shape` as the
    source has it, and whether it is a camera."""
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def video(self) -> bool:
        return self.dtype == np.uint8 and len(self.shape) == 3 and self.shape[2] == 3

    @property
    def width(self) -> int:
        """Values per frame of a column (1: a plain column)."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def spec(self) -> dict[str, Any]:
        """Its entry in info.json's `features` (a camera's `info` is added from its first video file)."""
        if self.video:
            return {"dtype": VIDEO, "shape": list(self.shape), "names": ["height", "width", "channels"]}
        return {"dtype": self.dtype.name, "shape": [self.width], "names": None}


def check_feature(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Feature:
    """The key as a feature, or a ValueError of one line saying why LeRobot's format cannot hold it."""
    feature = Feature(name, np.dtype(dtype), tuple(shape))
    if "/" in name:
        raise ValueError(f"key {name!r}: LeRobot's feature names cannot hold '/'")
    if name in FRAME_COLUMNS:
        raise ValueError(f"key {name!r}: a column LeRobot writes itself; rename the key, or leave it out (keys=, "
                         "--keys)")
    if feature.video:
        return feature
    if feature.dtype.name not in NUMERIC or feature.dtype.byteorder == ">":
        raise ValueError(f"key {name!r}: {feature.dtype} steps; LeRobot's columns hold numbers and booleans")
    if len(shape) > 1 and not (len(shape) == 2 and 1 in shape):
        raise ValueError(f"key {name!r}: steps of shape {shape}; LeRobot's Parquet columns hold a number or a "
                         "vector per frame (and cameras uint8 (H, W, 3)): leave the key out (keys=, --keys) or "
                         "reshape it")
    return feature


def _hf_feature(feature: Feature) -> dict[str, Any]:
    value = {"dtype": feature.dtype.name, "_type": "Value"}
    if feature.width == 1 and len(feature.shape) <= 1:
        return value
    return {"feature": value, "length": feature.width, "_type": "List"}


def data_schema(columns: list[Feature], fingerprint: str) -> pa.Schema:
    """The frames' Parquet schema: each column, then LeRobot's own, with the `huggingface` metadata."""
    fields, hf = [], {}
    for f in columns:
        base = pa.from_numpy_dtype(f.dtype)
        scalar = f.width == 1 and len(f.shape) <= 1
        fields.append(pa.field(f.name, base if scalar else pa.list_(pa.field("element", base), f.width)))
        hf[f.name] = _hf_feature(f)
    for name, dtype in FRAME_FEATURES.items():
        fields.append(pa.field(name, pa.from_numpy_dtype(np.dtype(dtype))))
        hf[name] = {"dtype": dtype, "_type": "Value"}
    meta = {"huggingface": json.dumps({"info": {"features": hf}, "fingerprint": fingerprint})}
    return pa.schema(fields, metadata=meta)


def data_table(schema: pa.Schema, columns: dict[str, np.ndarray], frame_columns: dict[str, np.ndarray]) -> pa.Table:
    """One episode's frames as a table of `schema` (`columns`: key -> steps; `frame_columns`: LeRobot's)."""
    arrays = []
    for field in schema:
        values = columns[field.name] if field.name in columns else frame_columns[field.name]
        if pa.types.is_fixed_size_list(field.type):
            flat = pa.array(np.ascontiguousarray(values).reshape(-1), type=field.type.value_type)
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, type=field.type))
        else:
            flat = np.asarray(values).reshape(-1).astype(field.type.to_pandas_dtype(), copy=False)
            arrays.append(pa.array(flat, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def tasks_table(tasks: list[str]) -> pa.Table:
    """meta/tasks.parquet as pandas writes LeRobot's `DataFrame({"task_index": ...}, index=tasks)`."""
    try:
        from importlib.metadata import version
        pandas_version = version("pandas")
    except Exception:  # not installed: the layout is the same
        pandas_version = _PANDAS_VERSION
    pandas = {"index_columns": ["__index_level_0__"],
              "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "str",
                                  "metadata": {"encoding": "UTF-8"}}],
              "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                           "numpy_type": "int64", "metadata": None},
                          {"name": None, "field_name": "__index_level_0__", "pandas_type": "object",
                           "numpy_type": "str", "metadata": None}],
              "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__},
              "pandas_version": pandas_version}
    schema = pa.schema([("task_index", pa.int64()), ("__index_level_0__", pa.large_string())],
                       metadata={"pandas": json.dumps(pandas)})
    return pa.table([pa.array(range(len(tasks)), pa.int64()), pa.array(tasks, pa.large_string())], schema=schema)


def info_json(features: list[Feature], video_info: dict[str, dict], *, fps: int, episodes: int, frames: int,
              tasks: int, robot_type: str | None, sizes: tuple[int, int, int]) -> dict[str, Any]:
    """meta/info.json, its keys in LeRobot's order."""
    specs = {}
    for f in features:
        specs[f.name] = f.spec()
        if f.video:
            specs[f.name]["info"] = video_info[f.name]
    for name, dtype in FRAME_FEATURES.items():
        specs[name] = {"dtype": dtype, "shape": [1], "names": None}
    return {"codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": episodes,
            "total_frames": frames, "total_tasks": tasks, "chunks_size": sizes[0],
            "data_files_size_in_mb": sizes[1], "video_files_size_in_mb": sizes[2], "fps": fps,
            "splits": {"train": f"0:{episodes}"}, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if any(f.video for f in features) else None, "features": specs}


def next_file(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """LeRobot's `update_chunk_file_indices`: the file after (chunk, file)."""
    return (chunk + 1, 0) if file == chunks_size - 1 else (chunk, file + 1)


def episode_row(record: dict[str, Any], cameras: list[str], stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One row of meta/episodes, its columns in LeRobot's order (`record`: the export's journal entry;
    `stats`: the episode's statistics as nested lists, features' order)."""
    row: dict[str, Any] = {"episode_index": record["episode"], "tasks": [record["task"]], "length": record["length"],
                           "data/chunk_index": record["data"][0], "data/file_index": record["data"][1],
                           "dataset_from_index": record["from"], "dataset_to_index": record["from"] + record["length"]}
    for key in cameras:
        row.update(zip(video_columns(key), record["videos"][key], strict=True))
    for key, s in stats.items():
        for stat, value in s.items():
            row[f"stats/{key}/{stat}"] = value
    row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = 0, 0
    return row
