"""The documents of the zarr v2 format, read and written by zarrfeed itself (no zarr-python at run time).

Written from the v2 specification (https://zarr-specs.readthedocs.io/en/latest/v2/v2.0.html): an array's
`.zarray` (shape, chunks, dtype, compressor, fill value, order, filters, dimension separator), a group's
`.zgroup`, anyone's `.zattrs`, and the consolidated `.zmetadata` that holds them all. Documents are written
as zarr-python 2 writes them (sorted keys, 4-space indent, ASCII), so a dataset zarrfeed writes is byte for
byte what zarr 2 would have written.

Supported: C order, arrays of any number of dimensions chunked along the first axis only (L5Kit's 1-D record
tables, and robotics replay buffers' (T, ...) arrays), numeric, boolean, byte-string, datetime and structured
dtypes (subarray fields included: what zarr-python 3 cannot read), fill values in every form the spec gives
(NaN/Infinity, base64 for byte strings and structured records). Refused in one line naming the array: F order
(in more than one dimension; in one it is the same layout),
object dtypes, chunk grids along other axes, and anything malformed. Why zarrfeed owns this: zarr-python 2 is
no longer maintained and pins an old numcodecs, and zarr-python 3 refuses subarray fields (docs/format.md).
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numcodecs
import numpy as np

from .blosc_frame import blosc_decoded_size
from .errors import MetaError

ZARRAY, ZGROUP, ZATTRS, ZMETADATA = ".zarray", ".zgroup", ".zattrs", ".zmetadata"
# zarrfeed decodes a chunk whole, into memory: a chunk larger than this decoded is refused when its array is
# opened (Blosc, zarr's default compressor, cannot hold more than 2 GiB in one buffer either)
MAX_CHUNK_BYTES = 2 << 30
META_NAMES = (ZARRAY, ZGROUP, ZATTRS)


def _numpy_number(value: Any) -> Any:
    """numpy numbers and arrays as JSON numbers and lists, as zarr 2 stored them in attributes."""
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_bytes(doc: Any) -> bytes:
    """A document as zarr-python 2 writes it: sorted keys, indented by 4, ASCII only."""
    return json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": "),
                      default=_numpy_number).encode("ascii")


def load_json(raw: bytes | str, where: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise MetaError(f"{where}: not JSON ({exc})") from None
    except RecursionError:
        raise MetaError(f"{where}: JSON nested too deep to read") from None


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


# ---------------------------------------------------------------- dtypes
def encode_dtype(dtype: np.dtype) -> Any:
    """A dtype as the spec writes it: its type string, or for records the list of fields (numpy's `descr`)."""
    return dtype.descr if dtype.fields is not None else dtype.str


def _tuples(descr: Any) -> Any:
    """JSON's lists back into numpy's tuples, field by field, nested records included."""
    if isinstance(descr, list):
        return [(f[0], _tuples(f[1]), *f[2:]) if isinstance(f, list) and len(f) >= 2 else f for f in descr]
    return descr


def decode_dtype(value: Any, where: str) -> np.dtype:
    """The numpy dtype a `.zarray`'s `dtype` field names; `MetaError` for one that is not a dtype, or holds
    Python objects (the spec's "O" needs an object codec zarrfeed does not have)."""
    if not isinstance(value, (str, list)):
        raise MetaError(f"{where}: field 'dtype' is {value!r}, not a type string or a list of fields")
    try:
        dtype = np.dtype(_tuples(value))
    except (TypeError, ValueError) as exc:
        raise MetaError(f"{where}: field 'dtype' is {value!r}, not a dtype ({exc})") from None
    if dtype.hasobject:
        raise MetaError(f"{where}: field 'dtype' is {value!r}: Python objects, which zarrfeed does not read "
                        "(store them as fixed-size fields)")
    if dtype.subdtype is not None:  # only a field can have a shape of its own; numpy folds a bare one away
        raise MetaError(f"{where}: field 'dtype' is {value!r}, a subarray type; give the array that shape")
    return dtype


# ---------------------------------------------------------------- fill values
def decode_fill(value: Any, dtype: np.dtype, where: str) -> Any:
    """A `fill_value` as a numpy scalar of `dtype` (None: no fill value, chunks not stored read as zero
    bytes). Base64 for byte strings and records, "NaN"/"Infinity"/"-Infinity" for floats, [re, im] for
    complex numbers, integers for datetimes, as the spec and zarr 2 write them."""
    if value is None:
        return None
    try:
        if dtype.kind in "VS":
            if not isinstance(value, str):
                if dtype.kind == "S":
                    return np.array(value, dtype)[()]  # zarr 2 wrote a number here before it used base64
                raise TypeError(f"{value!r} is not base64 text")
            raw = base64.b64decode(value.encode("ascii"), validate=True)
            if dtype.kind == "S":
                return np.array(raw, dtype)[()]
            if len(raw) != dtype.itemsize:
                raise ValueError(f"it holds {len(raw)} bytes, not one record of {dtype.itemsize}")
            return np.frombuffer(raw, dtype)[0]
        if dtype.kind == "f":
            special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
            return np.array(special.get(value, value) if isinstance(value, str) else value, dtype)[()]
        if dtype.kind == "c":
            re, im = (decode_fill(v, np.dtype(f"f{dtype.itemsize // 2}"), where) for v in value)
            return np.array(complex(re, im), dtype)[()]
        if dtype.kind in "mM":
            return np.array(int(value), "i8").view(dtype)[()]
        if dtype.kind in "iub" and isinstance(value, str):
            raise TypeError(f"{value!r} is text")
        return np.array(value, dtype)[()]
    except (TypeError, ValueError, OverflowError, binascii.Error, UnicodeEncodeError) as exc:
        raise MetaError(f"{where}: field 'fill_value' is {value!r}, not a value of {dtype} ({exc})") from None


def encode_fill(value: Any, dtype: np.dtype) -> Any:
    """The JSON form of a fill value of `dtype` (the inverse of `decode_fill`)."""
    if value is None:
        return None
    if dtype.kind in "VS":
        raw = np.asarray(value, dtype).tobytes() if dtype.kind == "V" else bytes(np.asarray(value, dtype)[()])
        return base64.standard_b64encode(raw).decode("ascii")
    if dtype.kind == "f":
        v = float(value)
        return "NaN" if math.isnan(v) else "Infinity" if v == math.inf else "-Infinity" if v == -math.inf else v
    if dtype.kind == "c":
        half = np.dtype(f"f{dtype.itemsize // 2}")
        return [encode_fill(np.real(value), half), encode_fill(np.imag(value), half)]
    if dtype.kind in "mM":
        return int(np.asarray(value, dtype).view("i8"))
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iu":
        return int(value)
    return value


# ---------------------------------------------------------------- codecs
def codec(config: Any, where: str, name: str) -> numcodecs.abc.Codec | None:
    """A codec from numcodecs' registry for a `compressor` or `filters` entry; None for null."""
    if config is None:
        return None
    if not (isinstance(config, dict) and isinstance(config.get("id"), str)):
        raise MetaError(f"{where}: field '{name}' is {config!r}, not a codec ({{\"id\": ...}}) or null")
    try:
        return numcodecs.get_codec(dict(config))
    except Exception as exc:  # an id numcodecs does not know, or arguments its codec refuses
        raise MetaError(f"{where}: field '{name}' is {config!r}, a codec that cannot be used "
                        f"({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------- arrays
@dataclass(frozen=True)
class ArrayMeta:
    """An array's `.zarray`, checked: what zarrfeed needs to find, decode and encode every chunk."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    compressor: dict[str, Any] | None = None
    filters: list[dict[str, Any]] | None = None
    fill_value: Any = None  # as JSON (see `fill`)
    dimension_separator: str | None = "."  # None: not written (the spec's default, ".")
    order: str = "C"  # "F" only in one dimension, where it is the same layout
    extra: dict[str, Any] = field(default_factory=dict)  # fields of other tools, kept as they are
    zarr_format = 2

    @classmethod
    def parse(cls, doc: Any, where: str = ZARRAY) -> "ArrayMeta":
        """A `.zarray` document (parsed JSON) checked against the spec and what zarrfeed supports; `MetaError`
        naming `where` and the field otherwise."""
        if not isinstance(doc, dict):
            raise MetaError(f"{where}: a JSON {type(doc).__name__}, not an object")
        if doc.get("zarr_format") != 2:
            raise MetaError(f"{where}: field 'zarr_format' is {doc.get('zarr_format')!r}, not 2")
        shape, chunks = doc.get("shape"), doc.get("chunks")
        if not (isinstance(shape, list) and all(_whole(n, 0) for n in shape)):
            raise MetaError(f"{where}: field 'shape' is {shape!r}, not a list of whole numbers >= 0")
        if not (isinstance(chunks, list) and len(chunks) == len(shape) and all(_whole(n, 1) for n in chunks)):
            raise MetaError(f"{where}: field 'chunks' is {chunks!r}, not one whole number >= 1 per dimension of "
                            f"shape {shape}")
        if shape and chunks[1:] != shape[1:]:
            raise MetaError(f"{where}: field 'chunks' is {chunks}, chunked along more than the first axis of shape "
                            f"{shape}; zarrfeed reads arrays chunked along the first axis only (rechunk it so "
                            f"that chunks = [n, {', '.join(map(str, shape[1:]))}])")
        if doc.get("order") == "F" and len(shape) > 1:  # (in one dimension both orders are the same bytes)
            raise MetaError(f"{where}: field 'order' is 'F' (Fortran order); zarrfeed reads C order only "
                            "(rewrite the array with order='C')")
        if doc.get("order") not in ("C", "F"):
            raise MetaError(f"{where}: field 'order' is {doc.get('order')!r}, not 'C' or 'F'")
        separator = doc.get("dimension_separator")
        if separator not in (None, ".", "/"):
            raise MetaError(f"{where}: field 'dimension_separator' is {separator!r}, not '.' or '/'")
        dtype = decode_dtype(doc.get("dtype"), where)
        if dtype.itemsize == 0:
            raise MetaError(f"{where}: field 'dtype' is {doc.get('dtype')!r}, of items of 0 bytes")
        chunk_bytes = math.prod(chunks) * dtype.itemsize
        if chunk_bytes > MAX_CHUNK_BYTES:
            raise MetaError(f"{where}: field 'chunks' is {chunks}: one chunk holds {chunk_bytes:,} bytes decoded, "
                            f"more than the {MAX_CHUNK_BYTES >> 30} GiB zarrfeed decodes at once (rechunk it)")
        codec(doc.get("compressor"), where, "compressor")
        filters = doc.get("filters")
        if filters is not None and not isinstance(filters, list):
            raise MetaError(f"{where}: field 'filters' is {filters!r}, not a list of codecs or null")
        for f in filters or []:
            codec(f, where, "filters")
        # the fill value is decoded when it is used (`fill`): a table's is checked with its dtype, so that a
        # changed dtype is named as such rather than as a fill value of the wrong size
        known = {"zarr_format", "shape", "chunks", "order", "dimension_separator", "dtype", "compressor", "filters",
                 "fill_value"}
        return cls(tuple(shape), tuple(chunks), dtype, doc.get("compressor"), filters,
                   doc.get("fill_value"), separator, doc["order"], {k: v for k, v in doc.items() if k not in known})

    @classmethod
    def new(cls, shape: tuple[int, ...], chunk_rows: int, dtype: np.dtype,
            compressor: numcodecs.abc.Codec | None = None, filters: list[numcodecs.abc.Codec] | None = None,
            fill_value: Any = None, dimension_separator: str | None = None) -> "ArrayMeta":
        """The document of a new array chunked along its first axis (`chunk_rows` per chunk); its separator
        is left unwritten by default, as zarrfeed's tables always were (the spec's default, ".")."""
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise MetaError(f"dtype {dtype}: Python objects, which zarrfeed does not write")
        return cls(tuple(int(n) for n in shape), (int(chunk_rows), *map(int, shape[1:])), dtype,
                   dict(compressor.get_config()) if compressor is not None else None,
                   [dict(f.get_config()) for f in filters] if filters else None, encode_fill(fill_value, dtype),
                   dimension_separator)

    def to_json(self) -> dict[str, Any]:
        doc = {**self.extra, "zarr_format": 2, "shape": list(self.shape), "chunks": list(self.chunks),
               "dtype": encode_dtype(self.dtype), "compressor": self.compressor, "fill_value": self.fill_value,
               "order": self.order, "filters": self.filters}
        if self.dimension_separator is not None:
            doc["dimension_separator"] = self.dimension_separator
        return doc

    def to_bytes(self) -> bytes:
        return json_bytes(self.to_json())

    def resized(self, rows: int) -> "ArrayMeta":
        """The same array with `rows` along its first axis."""
        return replace(self, shape=(int(rows), *self.shape[1:]))

    @property
    def fill(self) -> Any:
        """The fill value as a numpy scalar of the dtype (None: none); `MetaError` if it is not one."""
        return decode_fill(self.fill_value, self.dtype, ZARRAY)

    @property
    def chunk_rows(self) -> int:
        return self.chunks[0] if self.chunks else 1

    @property
    def row_bytes(self) -> int:
        """Bytes of one step along the first axis (one record of a table, one image of a (T, H, W, C) array)."""
        return self.dtype.itemsize * math.prod(self.shape[1:])

    @property
    def nchunks(self) -> int:
        return -(-self.shape[0] // self.chunks[0]) if self.shape else 1

    def chunk_index(self, name: str) -> int | None:
        """The index along the first axis of the chunk stored under `name` (as `chunk_name` spells it), or None if
        `name` is not one of this array's chunks."""
        parts = name.split(self.dimension_separator or ".")
        if len(parts) != max(len(self.shape), 1) or not all(p.isascii() and p.isdigit() for p in parts):
            return None
        if any(p != "0" for p in parts[1:]) or (parts[0] != "0" and parts[0].startswith("0")):
            return None
        index = int(parts[0])
        return index if index < self.nchunks else None

    def chunk_name(self, index: int) -> str:
        """The key of chunk `index` (along the first axis) within the array: `i.0.0` or `i/0/0`; `0` for a
        0-D array."""
        if not self.shape:
            return "0"
        return (self.dimension_separator or ".").join([str(index)] + ["0"] * (len(self.shape) - 1))


# ---------------------------------------------------------------- groups and consolidated metadata
GROUP_DOC = {"zarr_format": 2}


def group_problem(doc: Any) -> str | None:
    """What is wrong with a `.zgroup` document, or None."""
    if not isinstance(doc, dict) or doc.get("zarr_format") != 2:
        return f"{doc!r} is not a zarr v2 group document ({{\"zarr_format\": 2}})"
    return None


def consolidated(docs: Mapping[str, Any]) -> bytes:
    """The `.zmetadata` document holding `docs` (key -> parsed `.zarray`/`.zgroup`/`.zattrs`), as zarr 2's
    `consolidate_metadata` writes it."""
    return json_bytes({"zarr_consolidated_format": 1, "metadata": {k: docs[k] for k in sorted(docs)}})


# ---------------------------------------------------------------- a v2 chunk's codecs
class V2Codecs:
    """A v2 array's filters and compressor: how one chunk's stored bytes decode, and how a chunk encodes, as
    zarr 2 does (the same two methods as a v3 array's `v3_codecs.CodecChain`)."""

    def __init__(self, compressor: numcodecs.abc.Codec | None, filters: list[numcodecs.abc.Codec] | None) -> None:
        self.compressor, self.filters = compressor, filters

    def decode_into(self, raw: bytes | memoryview, out: np.ndarray) -> None:
        """Decode one chunk's stored bytes into `out` (the uint8 bytes of one full chunk): the compressor, then
        the filters in reverse. With a Blosc compressor and no filters Blosc writes straight into `out`, with
        no intermediate copy (the loader's workers decode into shared memory this way). `ValueError` if the
        bytes do not decode to exactly one chunk."""
        comp = self.compressor
        if isinstance(comp, numcodecs.Blosc) and not self.filters:
            size = blosc_decoded_size(raw)  # (Blosc accepts a larger `out` silently)
            if size != out.nbytes:
                raise ValueError(f"it decodes to {size} bytes, a chunk holds {out.nbytes}")
            comp.decode(raw, out=out)
            return
        if isinstance(comp, numcodecs.Blosc):
            blosc_decoded_size(raw)
        data: Any = comp.decode(raw) if comp else raw
        for f in reversed(self.filters or []):
            data = f.decode(data)
        flat = np.frombuffer(memoryview(data).cast("B"), np.uint8) if not isinstance(data, np.ndarray) else data
        if flat.nbytes != out.nbytes:
            raise ValueError(f"it decodes to {flat.nbytes} bytes, a chunk holds {out.nbytes}")
        out[:] = flat.reshape(-1).view(np.uint8)

    def encode(self, data: Any) -> bytes:
        """A chunk's values (C-contiguous, of the array's own dtype and chunk shape): the filters in order, then
        the compressor."""
        for f in self.filters or []:
            data = f.encode(data)
        return bytes(self.compressor.encode(data)) if self.compressor else bytes(np.asarray(data).tobytes())
