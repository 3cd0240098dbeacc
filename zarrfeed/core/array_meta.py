"""What zarrfeed relies on in a table's `.zarray`, checked as strictly as the manifest.

Readers and writers take a table's row count bound, rows per chunk, record dtype, codecs and fill value from
this document. zarr-python checks little of it: a negative chunk size read as a table of no chunks (0 rows,
exit 0), a chunk size of 0 or a string raised bare `ValueError`/`TypeError`, and a wrong order or separator
showed up only as a chunk "truncated or corrupt". Each check here names the field, in a few words.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any

import numcodecs
import numpy as np


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def not_records(meta: Any) -> bool:
    """Whether a `.zarray` describes an array that is plainly not a table: not 1-D, or not of records."""
    return isinstance(meta, dict) and ((isinstance(meta.get("shape"), list) and len(meta["shape"]) != 1)
                                       or isinstance(meta.get("dtype"), str))


def layout_problem(meta: Any) -> str | None:
    """What is wrong with the fields of a 1-D table's `.zarray` that do not need its dtype, or None."""
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    if meta.get("zarr_format") != 2:
        return f"field 'zarr_format' is {meta.get('zarr_format')!r}, not 2"
    shape, chunks = meta.get("shape"), meta.get("chunks")
    if not (isinstance(shape, list) and len(shape) == 1 and _whole(shape[0], 0)):
        return f"field 'shape' is {shape!r}, not [rows] (one whole number >= 0)"
    if not (isinstance(chunks, list) and len(chunks) == 1 and _whole(chunks[0], 1)):
        return f"field 'chunks' is {chunks!r}, not [rows per chunk] (one whole number >= 1)"
    if meta.get("order") not in ("C", "F"):
        return f"field 'order' is {meta.get('order')!r}, not 'C' or 'F'"
    if meta.get("dimension_separator") not in (None, ".", "/"):
        return f"field 'dimension_separator' is {meta['dimension_separator']!r}, not '.' or '/'"
    if not isinstance(meta.get("dtype"), list):
        return f"field 'dtype' is {meta.get('dtype')!r}, not a description of records (a list of fields)"
    if meta.get("fill_value") is not None and _fill_bytes(meta["fill_value"]) is None:
        return f"field 'fill_value' is {meta['fill_value']!r}, not base64 of one record, or null"
    compressor, filters = meta.get("compressor"), meta.get("filters")
    if compressor is not None and not (isinstance(compressor, dict) and isinstance(compressor.get("id"), str)):
        return f"field 'compressor' is {compressor!r}, not a codec ({{\"id\": ...}}) or null"
    if filters is not None and not (isinstance(filters, list) and all(
            isinstance(f, dict) and isinstance(f.get("id"), str) for f in filters)):
        return f"field 'filters' is {filters!r}, not a list of codecs ({{\"id\": ...}}) or null"
    return None


def codec_problem(meta: dict[str, Any], dtype: np.dtype) -> str | None:
    """Whether the filters and the compressor turn two records into bytes and back (an unknown codec, or a
    setting it refuses, such as a Blosc `cname` it does not have, fails here rather than at the first write)."""
    configs = [("filters", f) for f in meta.get("filters") or []]
    if meta.get("compressor") is not None:
        configs.append(("compressor", meta["compressor"]))
    data: Any = np.zeros(2, dtype)
    codecs = []
    for field, config in configs:
        try:
            codec = numcodecs.get_codec(dict(config))
            data = codec.encode(data)
            codecs.append(codec)
        except Exception as exc:  # unknown id, wrong arguments, a setting the codec refuses
            return f"field '{field}' is {config!r}, a codec that cannot be used ({type(exc).__name__}: {exc})"
    try:
        for codec in reversed(codecs):
            data = codec.decode(data)
        back = np.frombuffer(memoryview(data).cast("B"), np.uint8) if not isinstance(data, np.ndarray) else data
    except Exception as exc:
        return f"its codecs cannot decode what they encode ({type(exc).__name__}: {exc})"
    if back.nbytes != 2 * dtype.itemsize:
        return f"its codecs decode {2 * dtype.itemsize} bytes of records as {back.nbytes}"
    return None


def written_problem(meta: dict[str, Any], compressor: dict[str, Any] | None) -> str | None:
    """Whether the codecs of a table's `.zarray` are those zarrfeed wrote it with: no filters, and the compressor
    its manifest's schema records (`compressor`, a codec config). The chunk digests cover the stored bytes only,
    so a filter added later decodes every unchanged chunk into other rows."""
    if meta.get("filters"):
        return f"field 'filters' is {meta['filters']!r}, but zarrfeed wrote the table with none (its manifest's schema)"
    if normal_codec(meta.get("compressor")) != normal_codec(compressor):
        return (f"field 'compressor' is {meta.get('compressor')!r}, not {compressor!r}, the compressor its manifest's "
                "schema records")
    return None


def normal_codec(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """A codec config with its defaults filled in, so that two spellings of one codec compare equal."""
    if config is None:
        return None
    try:
        return dict(numcodecs.get_codec(dict(config)).get_config())
    except Exception:  # not a codec (codec_problem names it first)
        return dict(config)


def _fill_bytes(fill: Any) -> bytes | None:
    try:
        return base64.b64decode(fill.encode("ascii"), validate=True) if isinstance(fill, str) else None
    except (binascii.Error, UnicodeEncodeError):
        return None


def fill_problem(meta: dict[str, Any], dtype: np.dtype) -> str | None:
    """A structured table's fill value is null or base64 of exactly one record (zarr accepts a shorter one)."""
    raw = _fill_bytes(meta.get("fill_value"))
    if raw is not None and len(raw) != dtype.itemsize:
        return f"field 'fill_value' holds {len(raw)} bytes, not one record of {dtype.itemsize}"
    return None
