"""The data types and fill values of zarr v3 (a `zarr.json`'s `data_type` and `fill_value`), as numpy dtypes and
scalars, read and written by zarrfeed itself.

Written from the v3 core specification's data types (https://zarr-specs.readthedocs.io/en/latest/v3/data-types/
index.html) and zarr-extensions' (https://github.com/zarr-developers/zarr-extensions/tree/main/data-types):

- core: `bool`, `int8`..`uint64`, `float16/32/64`, `complex64/128`, raw bits `r8`, `r16`, ... (numpy `V<n>`);
- records: `struct` (fields as `{"name", "data_type"}` objects, fill as an object of field -> fill) and the legacy
  `structured` that zarr-python 3 writes (fields as `[name, data_type]` pairs, fill as base64 of the packed
  record), nested records included, packed with no padding (numpy's default layout);
- `numpy.datetime64` / `numpy.timedelta64` (also read under zarr-extensions' names `datetime64`/`timedelta64`),
  `fixed_length_utf32` (numpy `U<n>`, L5Kit's names and ids), `null_terminated_bytes` (numpy `S<n>`) and
  `raw_bytes` (numpy `V<n>`, zarr-python 3's name for raw bits);
- `zarrfeed.subarray`: a record field with a shape of its own (numpy's `('<f8', (2,))`, L5Kit's `centroid`),
  `{"name": "zarrfeed.subarray", "configuration": {"data_type": <inner>, "shape": [2]}}`, its fill a nested
  list of that shape. zarr-extensions has no form for such a field, so this one is zarrfeed's own, namespaced
  as the v3 specification asks of extensions; other readers refuse it by name rather than misread it.

In memory every dtype is native little-endian: the byte order on disk is the `bytes` codec's (`v3_codecs`).
Refused in one line naming the document and the value: variable-length types (`string`, `bytes`), Python
objects, aligned (padded) records, and names zarrfeed does not know.
"""
from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any

import numpy as np

from .errors import FieldError, MetaError

CORE_TYPES = {"bool": "|b1", "int8": "|i1", "int16": "<i2", "int32": "<i4", "int64": "<i8", "uint8": "|u1",
              "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "float16": "<f2", "float32": "<f4",
              "float64": "<f8", "complex64": "<c8", "complex128": "<c16"}
_CORE_NAMES = {np.dtype(v): k for k, v in CORE_TYPES.items()}
SUBARRAY = "zarrfeed.subarray"
_TIME_NAMES = {"numpy.datetime64": "M", "datetime64": "M", "numpy.timedelta64": "m", "timedelta64": "m"}
_TIME_UNITS = ("Y", "M", "W", "D", "h", "m", "s", "ms", "us", "μs", "ns", "ps", "fs", "as", "generic")
_SIZED = {"fixed_length_utf32": "U", "null_terminated_bytes": "S", "raw_bytes": "V"}
_RAW_BITS = re.compile(r"r([1-9][0-9]*)")
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
VARIABLE_LENGTH = ("string", "variable_length_utf8", "bytes", "variable_length_bytes")  # values of no fixed size



# ---------------------------------------------------------------- data types
def dtype_from_json(value: Any, where: str) -> np.dtype:
    """The numpy dtype (native little-endian) a `zarr.json`'s `data_type` names; `MetaError` naming `where`, the
    value and why, for one that zarrfeed does not read."""
    try:
        return _dtype(value, top=True)
    except FieldError as exc:
        raise MetaError(f"{where}: field 'data_type' is {value!r}: {exc.why}") from None


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _dtype(value: Any, top: bool = False) -> np.dtype:
    """One data type, nested records and subarray fields included (`top`: the array's own, which has no shape)."""
    if isinstance(value, str):
        return _named(value)
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
        raise FieldError("data_type", "not a data type (a name, or an object with a 'name')")
    name, config = value["name"], value.get("configuration")
    extra = set(value) - {"name", "configuration", "must_understand"}
    if extra:
        raise FieldError("data_type", f"keys {sorted(extra)} that a data type does not have")
    if name in CORE_TYPES or _RAW_BITS.fullmatch(name):
        if config not in (None, {}):
            raise FieldError("data_type", f"'{name}' takes no configuration")
        return _named(name)
    if not isinstance(config, dict):
        raise FieldError("data_type", f"'{name}' without a configuration object" if name in _KNOWN else _unknown(name))
    if name == SUBARRAY and top:
        raise FieldError("data_type",
                         f"a '{SUBARRAY}' is a record field's type only; give the array that shape instead")
    return _configured(name, config)


def _unknown(name: str) -> str:
    if name in VARIABLE_LENGTH:
        return f"'{name}' holds values of variable length, which zarrfeed does not read (store fixed-size fields)"
    return f"'{name}' is not a data type zarrfeed reads"


def _named(name: str) -> np.dtype:
    if name in CORE_TYPES:
        return np.dtype(CORE_TYPES[name])
    bits = _RAW_BITS.fullmatch(name)
    if bits and int(bits[1]) % 8 == 0:
        return np.dtype(f"V{int(bits[1]) // 8}")
    if bits:
        raise FieldError("data_type", f"raw bits of {bits[1]}, not a whole number of bytes")
    raise FieldError("data_type", _unknown(name))


def _configured(name: str, config: dict[str, Any]) -> np.dtype:
    """A data type with a configuration: records, subarrays, times and fixed-size strings."""
    if name in ("struct", "structured"):
        return _record(name, config)
    if name == SUBARRAY:
        shape = config.get("shape")
        if set(config) != {"data_type", "shape"} or not (
                isinstance(shape, list) and shape and all(_whole(n, 1) for n in shape)):
            raise FieldError("data_type", f"'{SUBARRAY}' needs exactly 'data_type' and 'shape' (whole numbers >= 1)")
        return np.dtype((_dtype(config["data_type"]), tuple(shape)))
    if name in _TIME_NAMES:
        unit, scale = config.get("unit"), config.get("scale_factor", 0)
        if set(config) != {"unit", "scale_factor"} or unit not in _TIME_UNITS or not (
                _whole(scale, 1) and scale < 2**31):
            raise FieldError("data_type",
                             f"'{name}' needs a 'unit' of {list(_TIME_UNITS)} and a 'scale_factor' in [1, 2**31)")
        unit = "us" if unit == "μs" else unit
        return np.dtype(f"<{_TIME_NAMES[name]}8" + ("" if unit == "generic" else f"[{scale}{unit}]"))
    if name in _SIZED:
        n, kind = config.get("length_bytes", 0), _SIZED[name]
        if set(config) != {"length_bytes"} or not _whole(n, 1) or (kind == "U" and n % 4):
            raise FieldError("data_type",
                             f"'{name}' needs a 'length_bytes' >= 1" + (", a multiple of 4" if kind == "U" else ""))
        return np.dtype(f"<U{n // 4}" if kind == "U" else f"{kind}{n}")
    raise FieldError("data_type", _unknown(name))


_KNOWN = {"struct", "structured", SUBARRAY, *_TIME_NAMES, *_SIZED}


def _record(name: str, config: dict[str, Any]) -> np.dtype:
    """A `struct` (fields as objects) or legacy `structured` (fields as [name, type] pairs) record, packed."""
    fields = config.get("fields")
    if set(config) != {"fields"} or not (isinstance(fields, list) and fields):
        raise FieldError("data_type", f"'{name}' needs a configuration of exactly one non-empty list, 'fields'")
    pairs = []
    for f in fields:
        if name == "struct" and isinstance(f, dict) and set(f) == {"name", "data_type"}:
            pairs.append((f["name"], f["data_type"]))
        elif name == "structured" and isinstance(f, list) and len(f) == 2:
            pairs.append((f[0], f[1]))
        else:
            shape = '{"name": ..., "data_type": ...}' if name == "struct" else "[name, data_type]"
            raise FieldError("data_type", f"a field {f!r} of '{name}' is not {shape}")
    names = [n for n, _ in pairs]
    if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise FieldError("data_type", f"field names {names} are not unique non-empty strings")
    out = []
    for n, dt in pairs:
        try:
            out.append((n, _dtype(dt)))
        except FieldError as exc:
            raise FieldError("data_type", f"field '{n}': {exc.why}") from None
    return np.dtype(out)


def dtype_to_json(dtype: np.dtype, *, legacy: bool = False) -> Any:
    """The `data_type` of `dtype` (the inverse of `dtype_from_json`): records as `struct`, fields with a shape
    as `zarrfeed.subarray`, `V<n>` as raw bits `r<8n>`. `legacy`: as zarr-python 3.1 writes and reads them,
    records as `structured` and `V<n>` as `raw_bytes` (it reads neither `struct` nor `r<n>`). `MetaError` for
    Python objects, padded records, and types v3 has no name for."""
    try:
        return _to_json(np.dtype(dtype), legacy, top=True)
    except FieldError as exc:
        raise MetaError(f"dtype {dtype}: {exc.why}") from None


def _to_json(dtype: np.dtype, legacy: bool, top: bool = False) -> Any:
    if dtype.hasobject:
        raise FieldError("data_type", "Python objects, which zarr v3 cannot store as fixed-size values")
    if dtype.subdtype is not None:
        if top:
            raise FieldError("data_type", "a subarray type; give the array that shape instead")
        base, shape = dtype.subdtype
        return {"name": SUBARRAY, "configuration": {"data_type": _to_json(base, legacy), "shape": list(shape)}}
    if dtype.fields is not None:
        return _record_json(dtype, legacy)
    name = _CORE_NAMES.get(dtype.newbyteorder("<"))
    if name is not None:
        return name
    if dtype.kind == "V":
        return {"name": "raw_bytes", "configuration": {"length_bytes": dtype.itemsize}} if legacy \
            else f"r{8 * dtype.itemsize}"
    if dtype.kind in "US":
        kind = "fixed_length_utf32" if dtype.kind == "U" else "null_terminated_bytes"
        return {"name": kind, "configuration": {"length_bytes": dtype.itemsize}}
    if dtype.kind in "Mm":
        unit, scale = np.datetime_data(dtype)
        kind = "numpy.datetime64" if dtype.kind == "M" else "numpy.timedelta64"
        return {"name": kind, "configuration": {"unit": unit, "scale_factor": scale}}
    raise FieldError("data_type", "a type zarr v3 has no name for")


def _record_json(dtype: np.dtype, legacy: bool) -> Any:
    """A record as `struct` (or `structured`), refused if its fields are not packed in order with no padding."""
    names = dtype.names or ()
    offset = 0
    for n in names:
        field = dtype.fields[n]  # type: ignore[index]
        if len(field) > 2 or field[1] != offset:
            raise FieldError("data_type",
                             f"field '{n}' is not packed after the one before it (padding, an offset or a title); "
                             "zarr v3 records are packed (numpy's default, align=False)")
        offset += field[0].itemsize
    if offset != dtype.itemsize or not names:
        raise FieldError("data_type", f"records of {dtype.itemsize} bytes hold {offset} bytes of fields (padding)")
    types = [_to_json(dtype.fields[n][0], legacy) for n in names]  # type: ignore[index]
    if legacy:
        return {"name": "structured", "configuration": {"fields": [[n, t] for n, t in zip(names, types, strict=True)]}}
    return {"name": "struct", "configuration": {"fields": [{"name": n, "data_type": t}
                                                           for n, t in zip(names, types, strict=True)]}}


# ---------------------------------------------------------------- fill values
def fill_from_json(value: Any, dtype: np.dtype, where: str) -> Any:
    """A `fill_value` as a numpy scalar of `dtype`: numbers, "NaN"/"Infinity"/"-Infinity" and hex raw bits
    ("0x7fc00000") for floats, [re, im] for complex numbers, a list of byte values (or base64) for raw bits,
    an object of field -> fill for records (or base64 of the packed record, as zarr-python 3 writes it), nested
    lists for subarray fields, integers or "NaT" for times. `MetaError` naming `where`, for null too (v3 has
    no "no fill value")."""
    if value is None:
        raise MetaError(f"{where}: field 'fill_value' is null, which zarr v3 does not allow (give a value of "
                        f"{dtype})")
    try:
        return _fill(value, np.dtype(dtype))
    except (FieldError, TypeError, ValueError, OverflowError, binascii.Error) as exc:
        why = exc.why if isinstance(exc, FieldError) else exc
        raise MetaError(f"{where}: field 'fill_value' is {value!r}, not a value of {dtype} ({why})") from None


def _fill(value: Any, dtype: np.dtype) -> Any:
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        out = np.empty(shape, base)
        for at in np.ndindex(*shape):
            item = value
            for i, n in zip(at, shape, strict=True):
                if not (isinstance(item, list) and len(item) == n):
                    raise FieldError("fill_value", f"a field of shape {list(shape)} takes a nested list of that shape")
                item = item[i]
            out[at] = _fill(item, base)
        return out
    if dtype.fields is not None:
        return _record_fill(value, dtype)
    kind = dtype.kind
    if kind == "b":
        if not isinstance(value, bool):
            raise FieldError("fill_value", "not true or false")
        return np.bool_(value)
    if kind in "iu":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise FieldError("fill_value", "not a whole number")
        return np.array(int(value), dtype)[()]
    if kind == "f":
        return _float(value, dtype)
    if kind == "c":
        if not (isinstance(value, list) and len(value) == 2):
            raise FieldError("fill_value", "not [real, imaginary]")
        half = np.dtype(f"<f{dtype.itemsize // 2}")
        parts = np.array([_float(value[0], half), _float(value[1], half)], half)  # (bits kept: no Python complex)
        return parts.view(dtype)[0]
    if kind in "Mm":
        if value == "NaT":
            return np.array(np.iinfo(np.int64).min, "<i8").view(dtype)[()]
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError("fill_value", "not a whole number or 'NaT'")
        return np.array(value, "<i8").view(dtype)[()]
    if kind == "U":
        if not isinstance(value, str) or len(value) > dtype.itemsize // 4:
            raise FieldError("fill_value", f"not text of at most {dtype.itemsize // 4} characters")
        return np.array(value, dtype)[()]
    return _bytes_fill(value, dtype)


def _float(value: Any, dtype: np.dtype) -> Any:
    """A float fill: a JSON number, one of the special names, or "0x" and the raw bits (as many hex digits as the
    type has nibbles, the v3 spec's form and the only one that keeps a NaN's payload)."""
    if isinstance(value, str):
        if value in _SPECIAL_FLOATS:
            return np.array(_SPECIAL_FLOATS[value], dtype)[()]
        if re.fullmatch(r"0x[0-9a-fA-F]+", value) and len(value) == 2 + 2 * dtype.itemsize:
            return np.array(int(value, 16), f"<u{dtype.itemsize}").view(dtype)[()]
        raise FieldError("fill_value",
                         f"text other than 'NaN', 'Infinity', '-Infinity' or 0x and {2 * dtype.itemsize} hex digits")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError("fill_value", "not a number")
    return np.array(value, dtype)[()]


def _bytes_fill(value: Any, dtype: np.dtype) -> Any:
    """Raw bits (`V`): the spec's list of byte values, or base64 (zarr-python's `raw_bytes`); `S`: base64."""
    if dtype.kind == "V" and isinstance(value, list):
        if len(value) != dtype.itemsize or not all(_whole(b, 0) and b < 256 for b in value):
            raise FieldError("fill_value", f"not a list of {dtype.itemsize} byte values (0-255)")
        return np.frombuffer(bytes(value), dtype)[0]
    if not isinstance(value, str):
        raise FieldError("fill_value", "not base64 text" + (" or a list of byte values" if dtype.kind == "V" else ""))
    raw = base64.b64decode(value.encode("ascii"), validate=True)
    if dtype.kind == "S":
        if len(raw) > dtype.itemsize:
            raise FieldError("fill_value", f"it holds {len(raw)} bytes, more than {dtype.itemsize}")
        return np.array(raw, dtype)[()]
    if len(raw) != dtype.itemsize:
        raise FieldError("fill_value", f"it holds {len(raw)} bytes, not {dtype.itemsize}")
    return np.frombuffer(raw, dtype)[0]


def _record_fill(value: Any, dtype: np.dtype) -> Any:
    """A record's fill: an object with every field's fill and no other key, or base64 of the packed record."""
    if isinstance(value, str):
        raw = base64.b64decode(value.encode("ascii"), validate=True)
        if len(raw) != dtype.itemsize:
            raise FieldError("fill_value", f"it holds {len(raw)} bytes, not one record of {dtype.itemsize}")
        return np.frombuffer(raw, dtype)[0]
    names = list(dtype.names or ())
    if not isinstance(value, dict) or set(value) != set(names):
        raise FieldError("fill_value", f"not an object with exactly the fields {names} (or base64 of a record)")
    out = np.zeros((), dtype)
    for n in names:
        try:
            out[n] = _fill(value[n], dtype.fields[n][0])  # type: ignore[index]
        except (FieldError, TypeError, ValueError, OverflowError) as exc:
            raise FieldError("fill_value", f"field '{n}': {exc}") from None
    return out[()]


def fill_to_json(value: Any, dtype: np.dtype, *, legacy: bool = False) -> Any:
    """The `fill_value` of `value` for `dtype` (the inverse of `fill_from_json`): "NaN" for the spec's NaN and
    "0x..." for any other, objects of field -> fill for records, lists of byte values for raw bits. `legacy`:
    records and raw bits as base64, as zarr-python 3.1 writes and reads them (with `dtype_to_json(legacy=True)`).
    """
    dtype = np.dtype(dtype)
    if legacy and dtype.kind == "V":
        return base64.standard_b64encode(np.asarray(value, dtype).tobytes()).decode("ascii")
    return _fill_json(np.asarray(value, dtype)[()], dtype)


def _fill_json(value: Any, dtype: np.dtype) -> Any:
    if dtype.subdtype is not None:
        base, _ = dtype.subdtype
        return _nested(np.asarray(value, base), base)
    if dtype.fields is not None:
        return {n: _fill_json(value[n], dtype.fields[n][0]) for n in dtype.names or ()}  # type: ignore[index]
    kind = dtype.kind
    if kind == "f":
        return _float_json(value, dtype)
    if kind == "c":
        re, im = np.asarray(value, dtype.newbyteorder("<")).reshape(1).view(f"<f{dtype.itemsize // 2}")
        return [_float_json(re, re.dtype), _float_json(im, im.dtype)]
    if kind == "b":
        return bool(value)
    if kind in "iu":
        return int(value)
    if kind in "Mm":
        return int(np.asarray(value, dtype).view("<i8"))
    if kind == "U":
        return str(value)
    if kind == "S":
        return base64.standard_b64encode(bytes(value)).decode("ascii")
    return list(np.asarray(value, dtype).tobytes())  # raw bits


def _nested(values: np.ndarray, base: np.dtype) -> Any:
    """A subarray field's fill as nested lists of its items' fills."""
    if values.ndim == 0:
        return _fill_json(values[()], base)
    return [_nested(values[i:i + 1].reshape(values.shape[1:]), base) for i in range(len(values))]


def _float_json(value: Any, dtype: np.dtype) -> Any:
    v = np.asarray(value, dtype.newbyteorder("<"))
    if not np.isnan(v):
        f = float(v)
        return "Infinity" if f == math.inf else "-Infinity" if f == -math.inf else f
    bits = int(v.view(f"<u{dtype.itemsize}"))
    if bits == int(np.array(np.nan, v.dtype).view(f"<u{dtype.itemsize}")):
        return "NaN"
    return f"0x{bits:0{2 * dtype.itemsize}x}"
