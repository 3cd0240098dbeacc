"""zarr v3 data types and fill values (`zarrfeed.core.v3_data_types`), checked against the `zarr.json` documents
zarr-python 3 writes and reads, zarr-extensions' examples, and round trips of every L5Kit record type."""
import json
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrfeed.core.errors import MetaError
from zarrfeed.core.schema import L5KIT_SCHEMA
from zarrfeed.core.v3_data_types import dtype_from_json, dtype_to_json, fill_from_json, fill_to_json

WHERE = "agents/zarr.json"
NAN_PAYLOAD = np.frombuffer(bytes.fromhex("7fc00001")[::-1], "<f4")[0]  # a NaN other than the spec's "NaN"

# (numpy dtype, fill value given to zarr-python 3)
CORE_CASES = [
    ("bool", True), ("bool", False), ("int8", -128), ("int16", 12345), ("int32", -7), ("int64", -(2**63)),
    ("uint8", 255), ("uint16", 7), ("uint32", 2**32 - 1), ("uint64", 2**64 - 1),
    ("float16", 1.5), ("float16", np.nan), ("float32", -np.inf), ("float32", 0.1), ("float64", -0.0),
    ("float64", np.inf), ("float64", 1e-310), ("float32", NAN_PAYLOAD),
    ("complex64", 1 + 2j), ("complex128", complex(np.nan, -np.inf)),
    ("V3", b"\x01\x02\xff"), ("S4", b"ab"), ("U3", "hé"),
    ("M8[s]", np.datetime64("NaT")), ("M8[10s]", np.datetime64(5, "10s")), ("m8[ms]", np.timedelta64(-3, "ms")),
    (np.dtype([("a", "<i4"), ("b", "<f4"), ("c", "u1")]), (1, 2.5, 3)),
    (np.dtype([("p", [("x", "<f4"), ("y", "<f4")]), ("v", "<f8")]), ((1.0, 2.0), 3.0)),
]


def _zarr_json(tmp_path, dtype, fill):
    """The `zarr.json` zarr-python 3 writes for an array of `dtype` with `fill`, and the array it opens."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its "not in the v3 spec yet" warnings for structured and string types
        arr = zarr.create_array(store=tmp_path / "a", shape=(4,), chunks=(2,), dtype=dtype, fill_value=fill)
    return json.loads((tmp_path / "a" / "zarr.json").read_text()), arr


def _same_bits(a, b, dtype):
    return np.asarray(a, dtype).tobytes() == np.asarray(b, dtype).tobytes()


@pytest.mark.parametrize("dtype,fill", CORE_CASES, ids=[f"{np.dtype(d)}-{i}" for i, (d, _) in enumerate(CORE_CASES)])
def test_what_zarr_python_writes_reads_as_its_dtype_and_fill(tmp_path, dtype, fill):
    doc, arr = _zarr_json(tmp_path, dtype, fill)
    got = dtype_from_json(doc["data_type"], WHERE)
    assert got == np.dtype(dtype) and got.descr == np.dtype(dtype).descr
    value = fill_from_json(doc["fill_value"], got, WHERE)
    assert isinstance(value, np.generic) and (value.dtype == got or got.kind in "SU")  # (numpy sizes text scalars)
    if np.dtype(dtype) == np.float32 and fill is NAN_PAYLOAD:  # zarr-python writes every NaN as "NaN"
        assert doc["fill_value"] == "NaN" and np.isnan(value)
    else:
        assert _same_bits(value, arr.fill_value, got)


@pytest.mark.parametrize("dtype,fill", CORE_CASES, ids=[f"{np.dtype(d)}-{i}" for i, (d, _) in enumerate(CORE_CASES)])
def test_zarr_python_reads_what_zarrfeed_writes(tmp_path, dtype, fill):
    """zarrfeed's `data_type` and `fill_value` (legacy forms for records and raw bits, which zarr-python 3.1
    reads only so) put into zarr-python's document: it opens the array with the same dtype and fill."""
    doc, arr = _zarr_json(tmp_path, dtype, fill)
    dt = np.dtype(dtype)
    legacy = dt.kind == "V"
    doc["data_type"] = dtype_to_json(dt, legacy=legacy)
    doc["fill_value"] = fill_to_json(arr.fill_value if fill is not NAN_PAYLOAD else fill, dt, legacy=legacy)
    (tmp_path / "a" / "zarr.json").write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = zarr.open_array(tmp_path / "a", mode="r")
    assert again.dtype == dt
    assert _same_bits(again.fill_value, fill if fill is NAN_PAYLOAD else arr.fill_value, dt)


@pytest.mark.parametrize("dtype,fill", CORE_CASES, ids=[f"{np.dtype(d)}-{i}" for i, (d, _) in enumerate(CORE_CASES)])
def test_zarrfeed_writes_what_zarr_python_writes_for_core_types(tmp_path, dtype, fill):
    """The same JSON, except where the spec and zarr-python differ: raw bits (the spec's `r<n>` and list of
    bytes; zarr-python's `raw_bytes` and base64, which legacy=True writes), records (zarr-extensions' `struct`;
    zarr-python's `structured`) and a NaN with a payload (zarr-python loses it, writing "NaN")."""
    doc, arr = _zarr_json(tmp_path, dtype, fill)
    dt = np.dtype(dtype)
    legacy = dt.kind == "V"
    assert dtype_to_json(dt, legacy=legacy) == doc["data_type"]
    if fill is NAN_PAYLOAD:
        assert fill_to_json(fill, dt) == "0x7fc00001"
    else:
        assert fill_to_json(arr.fill_value, dt, legacy=legacy) == doc["fill_value"]


def test_raw_bits_and_records_in_the_spec_forms():
    assert dtype_from_json("r24", WHERE) == np.dtype("V3") and dtype_to_json(np.dtype("V3")) == "r24"
    assert fill_to_json(np.void(b"\x01\x02\xff"), np.dtype("V3")) == [1, 2, 255]
    assert fill_from_json([1, 2, 255], np.dtype("V3"), WHERE).tobytes() == b"\x01\x02\xff"
    assert fill_from_json("AQL/", np.dtype("V3"), WHERE).tobytes() == b"\x01\x02\xff"  # zarr-python's base64
    assert dtype_from_json({"name": "raw_bytes", "configuration": {"length_bytes": 3}}, WHERE) == np.dtype("V3")
    # zarr-extensions' `struct` examples (data-types/struct/README.md)
    point = {"name": "struct", "configuration": {"fields": [
        {"name": "x", "data_type": "float32"}, {"name": "y", "data_type": "float32"}]}}
    nested = {"name": "struct", "configuration": {"fields": [
        {"name": "point", "data_type": point}, {"name": "value", "data_type": "float64"}]}}
    dt = dtype_from_json(nested, WHERE)
    assert dt == np.dtype([("point", [("x", "<f4"), ("y", "<f4")]), ("value", "<f8")]) and dt.itemsize == 16
    assert dtype_to_json(dt) == nested
    fill = fill_from_json({"point": {"x": 1.0, "y": 2.0}, "value": 3.14}, dt, WHERE)
    assert fill["point"]["y"] == 2.0 and fill["value"] == 3.14
    assert fill_to_json(fill, dt) == {"point": {"x": 1.0, "y": 2.0}, "value": 3.14}
    timed = {"name": "struct", "configuration": {"fields": [
        {"name": "timestamp", "data_type": {"name": "numpy.datetime64",
                                            "configuration": {"unit": "s", "scale_factor": 1}}},
        {"name": "value", "data_type": "float32"}]}}
    assert dtype_from_json(timed, WHERE) == np.dtype([("timestamp", "<M8[s]"), ("value", "<f4")])
    assert dtype_to_json(np.dtype([("timestamp", "<M8[s]"), ("value", "<f4")])) == timed
    # the legacy record: zarr-python 3's `structured` with its base64 fill, and tuple-form fields
    legacy = {"name": "structured", "configuration": {"fields": [["a", "int32"], ["b", point]]}}
    dt = dtype_from_json(legacy, WHERE)
    assert dt == np.dtype([("a", "<i4"), ("b", [("x", "<f4"), ("y", "<f4")])])
    assert fill_from_json("AQAAAAAAAAAAAIA/", dt, WHERE).tobytes() == np.array((1, (0, 1)), dt).tobytes()


@pytest.mark.parametrize("table", sorted(L5KIT_SCHEMA.tables))
def test_every_l5kit_dtype_and_a_fill_round_trip_through_json(table):
    dt = L5KIT_SCHEMA.tables[table].dtype
    doc = json.loads(json.dumps(dtype_to_json(dt)))
    back = dtype_from_json(doc, WHERE)
    assert back == dt and back.descr == dt.descr and back.itemsize == dt.itemsize
    rng = np.random.default_rng(7)
    value = np.zeros((), dt)
    for name in dt.names:
        field = dt.fields[name][0]
        base = field.base
        if base.kind == "U":
            value[name] = "face-é7"
        else:
            value[name] = rng.normal(size=field.shape).astype(base) if base.kind == "f" else \
                rng.integers(0, 2**62, size=field.shape).astype(base)
    fill = json.loads(json.dumps(fill_to_json(value[()], dt)))
    assert fill_from_json(fill, back, WHERE).tobytes() == value.tobytes()


def test_subarray_fields_are_zarrfeeds_extension_with_nested_list_fills():
    dt = L5KIT_SCHEMA.tables["agents"].dtype
    centroid = dtype_to_json(dt)["configuration"]["fields"][0]
    assert centroid == {"name": "centroid", "data_type": {"name": "zarrfeed.subarray", "configuration": {
        "data_type": "float64", "shape": [2]}}}
    frames = L5KIT_SCHEMA.tables["frames"].dtype
    value = np.zeros((), frames)
    value["ego_rotation"] = np.arange(9).reshape(3, 3)
    assert fill_to_json(value[()], frames)["ego_rotation"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]


def test_times_and_strings():
    assert fill_from_json("NaT", np.dtype("M8[s]"), WHERE) != fill_from_json(0, np.dtype("M8[s]"), WHERE)
    assert np.isnat(fill_from_json("NaT", np.dtype("M8[s]"), WHERE))
    assert fill_to_json(np.datetime64("NaT", "s"), np.dtype("M8[s]")) == -(2**63)  # as zarr-python writes it
    for name in ("datetime64", "numpy.datetime64"):  # zarr-extensions' name and zarr-python's
        got = dtype_from_json({"name": name, "configuration": {"unit": "μs", "scale_factor": 10}}, WHERE)
        assert got == np.dtype("M8[10us]")
    generic = {"name": "numpy.timedelta64", "configuration": {"unit": "generic", "scale_factor": 1}}
    assert dtype_from_json(generic, WHERE) == np.dtype("m8") and dtype_to_json(np.dtype("m8")) == generic
    assert fill_from_json("0x3c00", np.dtype("f2"), WHERE) == 1.0
    assert fill_from_json(3.0, np.dtype("i4"), WHERE) == 3  # zarr-python's reading of whole floats


REFUSED_TYPES = [
    ("string", "variable length"), ({"name": "variable_length_bytes", "configuration": {}}, "variable length"),
    ("bytes", "variable length"), ("r12", "not a whole number of bytes"), ("int128", "not a data type"),
    (7, "not a data type"), ({"name": "struct"}, "without a configuration"),
    ({"name": "struct", "configuration": {"fields": []}}, "non-empty list"),
    ({"name": "struct", "configuration": {"fields": [{"name": "a", "data_type": "int8"},
                                                     {"name": "a", "data_type": "int8"}]}}, "unique"),
    ({"name": "struct", "configuration": {"fields": [{"name": "", "data_type": "int8"}]}}, "non-empty"),
    ({"name": "struct", "configuration": {"fields": [["a", "int8"]]}}, "not {\"name\""),
    ({"name": "struct", "configuration": {"fields": [{"name": "a", "data_type": "string"}]}}, "field 'a'"),
    ({"name": "zarrfeed.subarray", "configuration": {"data_type": "int8", "shape": [2]}}, "give the array"),
    ({"name": "numpy.datetime64", "configuration": {"unit": "fortnight", "scale_factor": 1}}, "'unit'"),
    ({"name": "fixed_length_utf32", "configuration": {"length_bytes": 6}}, "multiple of 4"),
    ({"name": "int32", "configuration": {"x": 1}}, "takes no configuration"),
]


@pytest.mark.parametrize("value,why", REFUSED_TYPES, ids=[str(i) for i in range(len(REFUSED_TYPES))])
def test_refused_data_types_are_named_in_one_line(value, why):
    with pytest.raises(MetaError) as info:
        dtype_from_json(value, WHERE)
    message = str(info.value)
    assert message.startswith(f"{WHERE}: field 'data_type' is {value!r}: ") and why in message
    assert "\n" not in message


def test_refused_dtypes_and_fills():
    refused = [(np.dtype(object), "Python objects"), (np.dtype([("a", "u1"), ("b", "<i4")], align=True), "packed"),
               (np.dtype({"names": ["a"], "formats": ["u1"], "itemsize": 4}), "padding"),
               (np.dtype((("<f8", (2,)))), "subarray"), (np.dtype([(("title", "a"), "u1")]), "title")]
    if np.dtype(np.longdouble).itemsize > 8:
        refused.append((np.dtype(np.longdouble), "no name"))
    for dt, why in refused:
        with pytest.raises(MetaError, match=why):
            dtype_to_json(dt)
    f4 = np.dtype("f4")
    rec = np.dtype([("a", "<i4"), ("b", "<f4")])
    for value, dt, why in [(None, f4, "null"), ("nan", f4, "text other than"), ("0x7fc0", f4, "8 hex digits"),
                           (True, np.dtype("i4"), "whole number"), (2**31, np.dtype("i4"), "out of bounds"),
                           (0, np.dtype("bool"), "true or false"), ([1, 2], np.dtype("V3"), "3 byte values"),
                           ({"a": 1}, rec, "exactly the fields"), ({"a": 1, "b": "x"}, rec, "field 'b'"),
                           ("AAAA", rec, "not one record of 8"), ("abcde", np.dtype("U4"), "at most 4"),
                           ([1.0], np.dtype("c8"), "real, imaginary")]:
        with pytest.raises(MetaError) as info:
            fill_from_json(value, dt, WHERE)
        assert str(info.value).startswith(f"{WHERE}: field 'fill_value' is ") and why in str(info.value), info.value


LEAVES = st.sampled_from(["|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8", "<c8",
                          "<c16", "V3", "<M8[ms]", "<m8[10s]", "|S5"])


def _records(depth):
    leaf = st.tuples(LEAVES, st.sampled_from([(), (), (2,), (3, 1)])).map(
        lambda t: np.dtype(t[0]) if not t[1] else np.dtype((np.dtype(t[0]), t[1])))
    child = leaf if depth == 0 else st.one_of(leaf, _records(depth - 1))
    return st.lists(child, min_size=1, max_size=4).map(lambda ts: np.dtype([(f"f{i}", t) for i, t in enumerate(ts)]))


@settings(max_examples=150, deadline=None)
@given(dt=_records(2), seed=st.integers(0, 2**32 - 1))
def test_any_packed_record_and_any_fill_bits_round_trip(dt, seed):
    """Nested records with subarray fields of any bits (NaNs with payloads included) come back bit for bit."""
    doc = json.loads(json.dumps(dtype_to_json(dt)))
    assert dtype_from_json(doc, WHERE) == dt
    raw = np.random.default_rng(seed).integers(0, 256, dt.itemsize, dtype=np.uint8).tobytes()
    value = np.frombuffer(raw, dt)[0]
    fill = json.loads(json.dumps(fill_to_json(value, dt)))
    back = fill_from_json(fill, dt, WHERE)
    assert back.tobytes() == raw
    legacy = json.loads(json.dumps(fill_to_json(value, dt, legacy=True)))
    assert fill_from_json(legacy, dt, WHERE).tobytes() == raw

