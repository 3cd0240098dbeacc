"""The documents of the zarr v3 format, read and written by zarrfeed itself: `zarr.json` for arrays and groups.

Written from the v3 core specification (https://zarr-specs.readthedocs.io/en/latest/v3/core/index.html): an
array's `zarr.json` holds its shape, `data_type` (`core.v3_data_types`), `chunk_grid` (`regular`), its
`chunk_key_encoding` (`default`, with "/" or "." between the indices, or `v2`), `fill_value`, `codecs`
(`core.v3_codecs`, sharding included: `core.v3_sharding`), `attributes` and optional `dimension_names`; a
group's holds its attributes (and, as zarr-python 3 writes it, `consolidated_metadata`, which zarrfeed reads
around: each node's own document is what it trusts).

`ArrayMetaV3` answers what `zarr_meta.ArrayMeta` answers for v2, so that arrays, readers and writers need not
know the version: `chunks` is the unit zarrfeed reads and decodes (a shard's inner chunk when the array is
sharded), `chunk_name(i)` names the object that holds chunk i (its shard), `codecs` decodes one such chunk.
As in v2, arrays are chunked (and sharded) along their first axis only. Refused in one line naming the
document and the field: other chunk grids and key encodings, storage transformers, an extension field marked
`must_understand`, and anything malformed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numcodecs
import numpy as np

from .errors import MetaError
from .v3_codecs import CodecChain
from .v3_data_types import dtype_from_json, dtype_to_json, fill_from_json, fill_to_json
from .v3_sharding import ShardingSpec
from .zarr_meta import MAX_CHUNK_BYTES, json_bytes

ZARR_JSON = "zarr.json"
_KNOWN = {"zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value",
          "codecs", "attributes", "dimension_names", "storage_transformers"}


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def node_type(doc: Any) -> str | None:
    """"array" or "group" for a v3 node's parsed `zarr.json`, None if it is not one."""
    if isinstance(doc, dict) and doc.get("zarr_format") == 3 and doc.get("node_type") in ("array", "group"):
        return str(doc["node_type"])
    return None


def _named(value: Any, where: str, name: str) -> tuple[str, dict[str, Any]]:
    """A `{"name": ..., "configuration": {...}}` field (or a bare name) as (name, configuration)."""
    if isinstance(value, str):
        return value, {}
    if isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("configuration", {}),
                                                                                      dict):
        return value["name"], dict(value.get("configuration", {}))
    raise MetaError(f"{where}: field '{name}' is {value!r}, not {{\"name\": ..., \"configuration\": {{...}}}}")


def _key_encoding(value: Any, where: str) -> tuple[str, str]:
    """(encoding, separator) of a `chunk_key_encoding`."""
    name, config = _named(value, where, "chunk_key_encoding")
    if name not in ("default", "v2"):
        raise MetaError(f"{where}: field 'chunk_key_encoding' is {name!r}; zarrfeed reads the 'default' and 'v2' "
                        "encodings")
    separator = config.get("separator", "/" if name == "default" else ".")
    if separator not in ("/", "."):
        raise MetaError(f"{where}: field 'chunk_key_encoding' has separator {separator!r}, not '/' or '.'")
    return name, separator


@dataclass(frozen=True)
class ArrayMetaV3:
    """An array's `zarr.json`, checked: what zarrfeed needs to find, decode and encode every chunk."""

    shape: tuple[int, ...]
    grid: tuple[int, ...]  # the chunk grid's chunk shape: a shard's shape when the array is sharded
    dtype: np.dtype
    codec_json: tuple[dict[str, Any], ...]
    fill_value: Any = 0  # as JSON (see `fill`)
    key_encoding: str = "default"
    separator: str = "/"
    attributes: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # dimension_names, other tools' fields: kept as they are
    zarr_format = 3

    @classmethod
    def parse(cls, doc: Any, where: str = ZARR_JSON) -> "ArrayMetaV3":
        """An array's `zarr.json` (parsed JSON) checked against the spec and what zarrfeed supports; `MetaError`
        naming `where` and the field otherwise."""
        if not isinstance(doc, dict):
            raise MetaError(f"{where}: a JSON {type(doc).__name__}, not an object")
        if doc.get("zarr_format") != 3 or doc.get("node_type") != "array":
            raise MetaError(f"{where}: not a zarr v3 array document (zarr_format {doc.get('zarr_format')!r}, "
                            f"node_type {doc.get('node_type')!r})")
        shape = doc.get("shape")
        if not (isinstance(shape, list) and all(_whole(n, 0) for n in shape)):
            raise MetaError(f"{where}: field 'shape' is {shape!r}, not a list of whole numbers >= 0")
        grid_name, grid = _named(doc.get("chunk_grid"), where, "chunk_grid")
        if grid_name != "regular":
            raise MetaError(f"{where}: field 'chunk_grid' is {grid_name!r}; zarrfeed reads the 'regular' grid")
        chunks = grid.get("chunk_shape")
        if not (isinstance(chunks, list) and len(chunks) == len(shape) and all(_whole(n, 1) for n in chunks)):
            raise MetaError(f"{where}: field 'chunk_grid' has chunk_shape {chunks!r}, not one whole number >= 1 per "
                            f"dimension of shape {shape}")
        if shape and chunks[1:] != shape[1:]:
            raise MetaError(f"{where}: field 'chunk_grid' has chunk_shape {chunks}, chunked along more than the first "
                            f"axis of shape {shape}; zarrfeed reads arrays chunked along the first axis only")
        if doc.get("storage_transformers"):
            raise MetaError(f"{where}: field 'storage_transformers' is {doc['storage_transformers']!r}; zarrfeed "
                            "reads arrays without storage transformers")
        for key, value in doc.items():
            if key not in _KNOWN and isinstance(value, dict) and value.get("must_understand", True) is not False:
                raise MetaError(f"{where}: field {key!r} is an extension zarrfeed does not know (and it is not "
                                "marked must_understand: false)")
        attributes = doc.get("attributes", {})
        if not isinstance(attributes, dict):
            raise MetaError(f"{where}: field 'attributes' is {attributes!r}, not an object")
        dtype = dtype_from_json(doc.get("data_type"), where)
        codecs = doc.get("codecs")
        if not isinstance(codecs, list):
            raise MetaError(f"{where}: field 'codecs' is {codecs!r}, not a list of codecs")
        encoding, separator = _key_encoding(doc.get("chunk_key_encoding", {"name": "default"}), where)
        meta = cls(tuple(shape), tuple(chunks), dtype, tuple(codecs), doc.get("fill_value"), encoding, separator,
                   attributes, {k: v for k, v in doc.items() if k not in _KNOWN or k == "dimension_names"})
        meta.chain_of(where)  # the codecs, checked now: a bad one is named when the array opens
        fill_from_json(meta.fill_value, dtype, where)
        chunk_bytes = math.prod(meta.chunks) * dtype.itemsize
        if chunk_bytes > MAX_CHUNK_BYTES:
            raise MetaError(f"{where}: one chunk holds {chunk_bytes:,} bytes decoded, more than the "
                            f"{MAX_CHUNK_BYTES >> 30} GiB zarrfeed decodes at once (rechunk it)")
        return meta

    @classmethod
    def new(cls, shape: tuple[int, ...], chunk_rows: int, dtype: np.dtype, codecs: CodecChain,
            shard_rows: int | None = None, fill_value: Any = None,
            attributes: dict[str, Any] | None = None) -> "ArrayMetaV3":
        """The document of a new array chunked along its first axis: `codecs` as built by
        `v3_codecs.CodecChain` (with sharding, `shard_rows` rows per shard)."""
        dtype = np.dtype(dtype)
        rows = int(shard_rows or chunk_rows)
        fill = fill_to_json(np.zeros((), dtype)[()] if fill_value is None else fill_value, dtype)
        return cls(tuple(int(n) for n in shape), (rows, *map(int, shape[1:])), dtype, tuple(codecs.to_json()), fill,
                   "default", "/", dict(attributes or {}))

    def chain_of(self, where: str = ZARR_JSON) -> CodecChain:
        return CodecChain.parse(list(self.codec_json), self.dtype, self.grid, where)

    @cached_property
    def chain(self) -> CodecChain:
        """The array's codecs, as its chunk grid's cells are encoded (a shard, when sharded)."""
        return self.chain_of()

    @property
    def sharding(self) -> ShardingSpec | None:
        return self.chain.sharding

    @property
    def codecs(self) -> CodecChain:
        """The codecs of one chunk zarrfeed reads (a shard's inner chunk, when sharded)."""
        spec = self.sharding
        return spec.codecs if spec is not None else self.chain

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "zarr_format": 3, "node_type": "array", "shape": list(self.shape), "data_type": dtype_to_json(self.dtype),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(self.grid)}},
            "chunk_key_encoding": {"name": self.key_encoding, "configuration": {"separator": self.separator}},
            "fill_value": self.fill_value, "codecs": list(self.codec_json), "attributes": self.attributes}
        doc.update(self.extra)
        return doc

    def to_bytes(self) -> bytes:
        return json_bytes(self.to_json())

    def resized(self, rows: int) -> "ArrayMetaV3":
        """The same array with `rows` along its first axis."""
        return replace(self, shape=(int(rows), *self.shape[1:]))

    def with_attributes(self, attributes: dict[str, Any]) -> "ArrayMetaV3":
        return replace(self, attributes=dict(attributes))

    @property
    def fill(self) -> Any:
        """The fill value as a numpy scalar of the dtype."""
        return fill_from_json(self.fill_value, self.dtype, ZARR_JSON)

    @property
    def chunks(self) -> tuple[int, ...]:
        """The shape of the chunk zarrfeed reads and decodes at once: a shard's inner chunk when sharded."""
        spec = self.sharding
        return tuple(spec.chunk_shape) if spec is not None else self.grid

    @property
    def chunk_rows(self) -> int:
        return self.chunks[0] if self.chunks else 1

    @property
    def shard_rows(self) -> int:
        """Rows of one object of the chunk grid (a shard, or a chunk when not sharded)."""
        return self.grid[0] if self.grid else 1

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape[1:])

    @property
    def nchunks(self) -> int:
        return -(-self.shape[0] // self.chunk_rows) if self.shape else 1

    @property
    def per_object(self) -> int:
        """Chunks (as `chunks` has them) per stored object: the inner chunks of a shard, else 1."""
        return self.shard_rows // self.chunk_rows if self.shape else 1

    def object_name(self, cell: int) -> str:
        """The key, below the array, of cell `cell` of the chunk grid (along the first axis)."""
        indices = [str(cell)] + ["0"] * (len(self.shape) - 1) if self.shape else ["0"] if self.key_encoding == "v2" \
            else []
        if self.key_encoding == "v2":
            return self.separator.join(indices)
        return self.separator.join(["c", *indices])

    def chunk_name(self, index: int) -> str:
        """The key, below the array, of the object holding chunk `index` (its shard, when sharded)."""
        return self.object_name(index // self.per_object)

    def object_index(self, name: str) -> int | None:
        """The grid cell stored under `name`, or None if `name` is not one of this array's objects."""
        parts = name.split(self.separator)
        if self.key_encoding == "default":
            if not parts or parts[0] != "c":
                return None
            parts = parts[1:]
        if len(parts) != max(len(self.shape), 1 if self.key_encoding == "v2" else 0):
            return None
        if not self.shape:
            return 0 if self.key_encoding == "default" or parts == ["0"] else None
        if not all(p.isascii() and p.isdigit() for p in parts) or any(p != "0" for p in parts[1:]):
            return None
        if parts[0] != "0" and parts[0].startswith("0"):
            return None
        cell = int(parts[0])
        return cell if cell < -(-self.shape[0] // self.shard_rows) else None

    def chunk_index(self, name: str) -> int | None:
        """The first chunk held by the object `name`, or None (see `object_index`)."""
        cell = self.object_index(name)
        return None if cell is None else cell * self.per_object

    def compressor(self) -> numcodecs.abc.Codec | None:
        """The numcodecs codec that compresses a chunk (a writer appending to the array uses the same)."""
        found = [c.codec for c in self.codecs.compressors if c.codec is not None]
        return found[0] if len(found) == 1 else None
