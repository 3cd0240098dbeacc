"""Table schemas: which tables a dataset has, their record dtypes, and the interval links between them.

L5Kit's format (version 2) is the built-in schema; `Schema` declares any other set of tables the same way.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numcodecs
import numpy as np

SCENE_DTYPE = np.dtype([
    ("frame_index_interval", np.int64, (2,)),
    ("host", "<U16"),
    ("start_time", np.int64),
    ("end_time", np.int64),
])
FRAME_DTYPE = np.dtype([
    ("timestamp", np.int64),
    ("agent_index_interval", np.int64, (2,)),
    ("traffic_light_faces_index_interval", np.int64, (2,)),
    ("ego_translation", np.float64, (3,)),
    ("ego_rotation", np.float64, (3, 3)),
])
AGENT_DTYPE = np.dtype([
    ("centroid", np.float64, (2,)),
    ("extent", np.float32, (3,)),
    ("yaw", np.float32),
    ("velocity", np.float32, (2,)),
    ("track_id", np.uint64),
    ("label_probabilities", np.float32, (17,)),
])
TL_FACE_DTYPE = np.dtype([
    ("face_id", "<U16"),
    ("traffic_light_id", "<U16"),
    ("traffic_light_face_status", np.float32, (3,)),
])

PERCEPTION_LABELS = [
    "PERCEPTION_LABEL_NOT_SET",
    "PERCEPTION_LABEL_UNKNOWN",
    "PERCEPTION_LABEL_DONTCARE",
    "PERCEPTION_LABEL_CAR",
    "PERCEPTION_LABEL_VAN",
    "PERCEPTION_LABEL_TRAM",
    "PERCEPTION_LABEL_BUS",
    "PERCEPTION_LABEL_TRUCK",
    "PERCEPTION_LABEL_EMERGENCY_VEHICLE",
    "PERCEPTION_LABEL_OTHER_VEHICLE",
    "PERCEPTION_LABEL_BICYCLE",
    "PERCEPTION_LABEL_MOTORCYCLE",
    "PERCEPTION_LABEL_CYCLIST",
    "PERCEPTION_LABEL_MOTORCYCLIST",
    "PERCEPTION_LABEL_PEDESTRIAN",
    "PERCEPTION_LABEL_ANIMAL",
    "AVRESEARCH_LABEL_DONTCARE",
]


def default_compressor() -> numcodecs.abc.Codec:
    """L5Kit's compressor: Blosc lz4, level 5, byte shuffle."""
    return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)


SCHEMA_CODEC = "schema"  # a table compressed with its schema's compressor


@dataclass(frozen=True)
class Table:
    """One 1-D array of structured records, stored in chunks of `chunk_rows` rows, in the folder `path` of the
    dataset's group (default: its name). A table at a path of its own may be an N-dimensional array read as
    records of one field (a replay buffer's `data/img`; see `core.record_view`).

    Args:
        name: The table's name (a plain folder name).
        dtype: Its records' numpy dtype (structured, or one field).
        chunk_rows: Rows per chunk.
        path: Its array's folder in the group, when not its name.
        compressor: Its compressor's config where it is not the schema's (None: uncompressed).
        missing_is_fill: A chunk not stored reads as the fill value (an array another tool wrote).
    """

    name: str
    dtype: np.dtype
    chunk_rows: int
    path: str = ""
    # its compressor's config (None: none), where it is not the schema's (a replay buffer Diffusion Policy wrote
    # stores `episode_ends` uncompressed)
    compressor: Any = field(default=SCHEMA_CODEC, hash=False)
    # a chunk not stored reads as the fill value, as zarr reads it: an array another tool wrote (zarr 3 stores no
    # chunk that is all fill), recorded in the manifest once zarrfeed appends to it (its own chunks are all stored)
    missing_is_fill: bool = field(default=False, compare=False)

    @property
    def array_path(self) -> str:
        """Where the table's array is in the group."""
        return self.path or self.name


def _parent_field(key: str) -> tuple[str, str]:
    """"frames.agent_index_interval" -> ("frames", "agent_index_interval")."""
    parent, _, field = key.partition(".")
    return parent, field


# a table's name is its array's folder (and, in links, what comes before the first "."): one plain folder name,
# never a path ("../x", "a/b") nor an fsspec pattern ("[", "*", "?")
_TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


INTERVALS, ENDS = "intervals", "ends"


@dataclass(frozen=True)
class Link:
    """`parent.field` holds, for each parent row, its rows of table `child`: as `[start, end)` intervals
    (`kind` "intervals", L5Kit's), or as the end alone, cumulative, each row starting where the one before
    ends (`kind` "ends", Diffusion Policy's `episode_ends`).

    Args:
        parent: The table whose rows point into `child`.
        field: The field of `parent` holding the intervals (or ends).
        child: The table pointed into.
        kind: "intervals" (default) or "ends".
    """

    parent: str
    field: str
    child: str
    kind: str = INTERVALS

    def __str__(self) -> str:
        return f"{self.parent}.{self.field} -> {self.child}"

    def to_json(self) -> list[str]:
        return [self.parent, self.field, self.child] + ([self.kind] if self.kind != INTERVALS else [])


class Schema:
    """A set of tables (parents listed before their children) and the links between them.

    Example::

        Schema(tables={"runs": (RUN_DTYPE, 1000), "steps": (STEP_DTYPE, 50_000)},
               links={"runs.step_index_interval": "steps"})

    Args:
        tables: Each table's name -> a `Table`, or (dtype, chunk rows).
        links: "parent.field" -> child table, or `Link`s.
        attrs: JSON attributes stored with the dataset.
        compressor: The numcodecs codec of every table's chunks (default: Blosc zstd, bit shuffle).
        name: The schema's name, as `info` shows it (default "custom").
    """

    def __init__(self, tables: Mapping[str, Table | tuple[Any, int]],
                 links: Mapping[str, str] | tuple[Link, ...] = (),
                 attrs: Mapping[str, Any] | None = None,
                 compressor: numcodecs.abc.Codec | None = None,
                 name: str = "custom") -> None:
        self.tables: dict[str, Table] = {
            tname: spec if isinstance(spec, Table) else Table(tname, np.dtype(spec[0]), int(spec[1]))
            for tname, spec in tables.items()
        }
        if isinstance(links, Mapping):
            links = tuple(Link(*_parent_field(key), child) for key, child in links.items())
        self.links: tuple[Link, ...] = tuple(links)
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.compressor = compressor or default_compressor()
        self.name = name
        self._check()

    def described(self) -> str:
        """What a dataset of this schema is, for messages: "an L5Kit dataset", "a replay buffer", ..."""
        known = {"l5kit": "an L5Kit dataset", "replay_buffer": "a replay buffer (Diffusion Policy's)",
                 "lerobot": "a LeRobot dataset"}
        return known.get(self.name, f"a dataset of tables {', '.join(self.tables)}")

    def __repr__(self) -> str:
        return f"Schema({self.name!r}, tables={list(self.tables)}, links={[str(x) for x in self.links]})"

    def _check(self) -> None:
        order = list(self.tables)
        parents: dict[str, Link] = {}
        for t in self.tables.values():
            self._check_name(t)
            if t.path and not all(_TABLE_NAME.fullmatch(p) for p in t.path.split("/")):
                raise ValueError(f"table {t.name!r}: path {t.path!r} is not a path of plain folder names")
            if t.dtype.names is None:
                raise ValueError(f"table '{t.name}': dtype {t.dtype} is not a structured dtype")
            if t.chunk_rows < 1:
                raise ValueError(f"table '{t.name}': chunk_rows must be >= 1, got {t.chunk_rows}")
        for link in self.links:
            for name in (link.parent, link.child):
                if name not in self.tables:
                    raise ValueError(f"link {link}: no table '{name}' in the schema")
            dtype = self.tables[link.parent].dtype
            if link.field not in (dtype.names or ()):
                raise ValueError(f"link {link}: table '{link.parent}' has no field '{link.field}'")
            sub = dtype[link.field]
            if link.kind not in (INTERVALS, ENDS):
                raise ValueError(f"link {link}: kind {link.kind!r} is not {INTERVALS!r} or {ENDS!r}")
            if link.kind == INTERVALS and (sub.shape != (2,) or sub.base.kind not in "iu"):
                raise ValueError(f"link {link}: field must be an integer (2,) interval, got {sub.base}{sub.shape}")
            if link.kind == ENDS and (sub.shape != () or sub.base.kind not in "iu"):
                raise ValueError(f"link {link}: field must be an integer end per row, got {sub.base}{sub.shape}")
            if link.child in parents:
                raise ValueError(f"link {link}: table '{link.child}' already has parent link {parents[link.child]}")
            if order.index(link.parent) >= order.index(link.child):
                raise ValueError(f"link {link}: list parent table '{link.parent}' before '{link.child}'")
            parents[link.child] = link

    def _check_name(self, t: Table) -> None:
        """`ValueError` unless the table's name is a plain folder name (it is its array's folder)."""
        if not _TABLE_NAME.fullmatch(t.name):
            raise ValueError(f"table {t.name!r}: a table's name is its folder in the store: letters, digits, _ "
                             "and - only, not starting with - (no /, . or ..)")

    def links_from(self, table: str) -> list[Link]:
        """Links whose parent is `table`."""
        return [link for link in self.links if link.parent == table]

    def codec_of(self, table: str) -> numcodecs.abc.Codec | None:
        """The compressor of `table`: the schema's, unless the table records its own (None: uncompressed)."""
        config = self.tables[table].compressor
        if config == SCHEMA_CODEC:
            return self.compressor
        return numcodecs.get_codec(dict(config)) if config else None

    def step_tables(self) -> list[str]:
        """The tables whose rows are an episode's steps by an "ends" link (a replay buffer's `data/<key>`
        arrays), in schema order: they share their row count and are read together as the `steps`."""
        return [t for t in self.tables if any(x.child == t and x.kind == ENDS for x in self.links)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description, stored in each dataset's manifest."""
        return {
            "name": self.name,
            "tables": {t.name: {"dtype": t.dtype.descr, "chunk_rows": t.chunk_rows,
                                **({"path": t.path} if t.path else {}),
                                **({"compressor": t.compressor} if t.compressor != SCHEMA_CODEC else {}),
                                **({"missing_is_fill": True} if t.missing_is_fill else {})}
                       for t in self.tables.values()},
            "links": [link.to_json() for link in self.links],
            "attrs": dict(self.attrs),
            "compressor": self.compressor.get_config(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Schema":
        """The schema `to_json` described (as a dataset's manifest or a Parquet export's metadata holds it)."""
        return cls(
            tables={name: Table(name, dtype_from_descr(t["dtype"]), int(t["chunk_rows"]), t.get("path", ""),
                                t.get("compressor", SCHEMA_CODEC), bool(t.get("missing_is_fill", False)))
                    for name, t in doc["tables"].items()},
            links=tuple(Link(*link) for link in doc["links"]),
            attrs=doc.get("attrs", {}),
            compressor=numcodecs.get_codec(doc["compressor"]),
            name=doc.get("name", "custom"),
        )


def dtype_from_descr(descr: Any) -> np.dtype:
    """Inverse of `np.dtype.descr` after a JSON round trip (lists back to tuples)."""
    if isinstance(descr, str):
        return np.dtype(descr)
    fields = []
    for item in descr:
        name, sub, *shape = item
        sub = dtype_from_descr(sub) if isinstance(sub, list) else sub
        fields.append((name, sub, tuple(shape[0])) if shape else (name, sub))
    return np.dtype(fields)


L5KIT_SCHEMA = Schema(
    tables={
        "scenes": (SCENE_DTYPE, 10_000),
        "frames": (FRAME_DTYPE, 10_000),
        "agents": (AGENT_DTYPE, 20_000),
        "traffic_light_faces": (TL_FACE_DTYPE, 10_000),
    },
    links={
        "scenes.frame_index_interval": "frames",
        "frames.agent_index_interval": "agents",
        "frames.traffic_light_faces_index_interval": "traffic_light_faces",
    },
    attrs={"format_version": 2, "labels": PERCEPTION_LABELS},
    name="l5kit",
)


def dtype_difference(actual: np.dtype, expected: np.dtype) -> str | None:
    """None if the dtypes are equal, else one phrase naming the first differing field."""
    if actual == expected:
        return None
    if actual.names is None:
        return f"is {actual}, not a structured dtype"
    for name in expected.names or ():
        if name not in actual.names:
            return f"has no field '{name}'"
    for name in actual.names:
        if name not in (expected.names or ()):
            return f"has an unexpected field '{name}'"
    if actual.names != expected.names:
        return f"has fields in order {list(actual.names or ())}, expected {list(expected.names or ())}"
    for name in expected.names:
        a, e = actual[name], expected[name]
        if a.shape != e.shape:
            return f"field '{name}' has shape {a.shape}, expected {e.shape}"
        if a.base != e.base:
            return f"field '{name}' is {a.base.str}, expected {e.base.str}"
    return f"is {actual}, expected {expected}"


def field_names(dtype: np.dtype, fields: Any, param: str = "fields") -> list[str]:
    """The fields of records of `dtype` that `fields` names, in its order: all for None, a single name as a
    list of one (`fields="centroid"` is `["centroid"]`, not its letters). ValueError naming `param` for anything
    that is not names, an unknown field or a field named twice (each would be a column of its own)."""
    known = list(dtype.names or ())
    if fields is None:
        return known
    names = [fields] if isinstance(fields, str) else fields
    try:
        names = list(names)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{param}: expected a field name or a list of field names, got {fields!r}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{param}: no field {unknown[0]!r} (fields: {', '.join(known)})")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{param}: {twice[0]!r} is named more than once")
    return names
