"""The zarr v2 format read and written by zarrfeed itself (`zarrfeed.core.zarr_meta`, `zarr_array`, `stores`),
checked against documents and chunks that other tools wrote (L5Kit's scene, written by zarr 2, and Diffusion
Policy's replay buffer) and against the v2 specification, without zarr-python."""
import base64
import json
import math
import subprocess
import sys
import zipfile

import numcodecs
import numpy as np
import pytest
from repo_paths import REAL_SCENE

from zarrfeed.core.stores import DirectoryStore, MemoryStore, ZipStore
from zarrfeed.core.zarr_array import Array, Group
from zarrfeed.core.zarr_meta import ArrayMeta, MetaError, consolidated, decode_fill, encode_fill, json_bytes

DP_BUFFER = REAL_SCENE.parent / "dp_replay_small.zarr"


def _documents(root):
    return sorted(p for p in root.rglob(".zarray"))


@pytest.mark.parametrize("root", [REAL_SCENE, DP_BUFFER], ids=["l5kit", "diffusion_policy"])
def test_documents_written_by_zarr_2_read_and_write_back_byte_for_byte(root):
    if not root.is_dir():
        pytest.skip(f"{root} is not there")
    found = _documents(root)
    assert found
    for path in found:
        raw = path.read_bytes()
        meta = ArrayMeta.parse(json.loads(raw), str(path))
        assert meta.to_bytes() == raw, path
        assert meta.chunks[1:] == meta.shape[1:]


def test_l5kit_tables_are_decoded_row_for_row(real_scene):
    """Every table of the real scene, read through the format layer, equals its chunks decoded by hand."""
    group = Group.open(DirectoryStore(real_scene))
    assert sorted(group.array_keys()) == ["agents", "frames", "scenes", "traffic_light_faces"]
    assert group.attrs["format_version"] == 2
    for name in group.array_keys():
        arr = group[name]
        c = arr.chunks[0]
        blosc = numcodecs.get_codec(json.loads((real_scene / name / ".zarray").read_text())["compressor"])
        by_hand = np.concatenate([np.frombuffer(blosc.decode((real_scene / name / str(i)).read_bytes()), arr.dtype)
                                  for i in range(arr.nchunks)])[:arr.shape[0]]
        np.testing.assert_array_equal(arr[:], by_hand)
        np.testing.assert_array_equal(arr[c - 3:c + 5], by_hand[c - 3:c + 5])  # across a chunk boundary
        np.testing.assert_array_equal(arr[::7], by_hand[::7])
        assert arr[-1] == by_hand[-1]
        assert arr.nchunks_initialized == arr.nchunks


def test_replay_buffer_arrays_are_n_dimensional_and_keyed_by_every_axis():
    if not DP_BUFFER.is_dir():
        pytest.skip(f"{DP_BUFFER} is not there")
    group = Group.open(DirectoryStore(DP_BUFFER))
    assert set(group.group_keys()) == {"data", "meta"}
    img = group["data"]["img"]
    assert img.shape[1:] == (12, 12, 3) and img.chunks == (250, 12, 12, 3)
    assert img.chunk_key(3) == "data/img/3.0.0.0"
    ends = group["meta"]["episode_ends"][:]
    assert ends[-1] == img.shape[0] == 5913 and len(ends) == 40
    raw = (DP_BUFFER / "data" / "img" / "1.0.0.0").read_bytes()
    by_hand = np.frombuffer(img.compressor.decode(raw), np.uint8).reshape(250, 12, 12, 3)
    np.testing.assert_array_equal(img[250:500], by_hand)
    np.testing.assert_array_equal(img[260:270, 3], by_hand[10:20, 3])


@pytest.mark.parametrize("separator", [".", "/"])
def test_either_dimension_separator_is_written_and_read(tmp_path, separator):
    store = DirectoryStore(tmp_path / "a.zarr")
    values = np.arange(7 * 4 * 2, dtype="<i4").reshape(7, 4, 2)
    arr = Group.create(store).create_array("x", ArrayMeta.new((7, 4, 2), 3, np.dtype("<i4"), numcodecs.Zstd(),
                                                              fill_value=-1, dimension_separator=separator))
    arr[:] = values
    names = sorted(p.relative_to(tmp_path / "a.zarr" / "x").as_posix() for p in (tmp_path / "a.zarr" / "x").rglob("*")
                   if p.is_file() and p.name != ".zarray")
    assert names == [f"{i}{separator}0{separator}0" for i in range(3)]
    np.testing.assert_array_equal(Array.open(DirectoryStore(tmp_path / "a.zarr"), "x")[:], values)


def test_a_chunk_never_stored_reads_as_the_fill_value():
    arr = Array.create(MemoryStore(), "x", ArrayMeta.new((10, 2), 4, np.dtype("<f8"), None, fill_value=math.nan))
    arr[4:8] = np.ones((4, 2))
    got = arr[:]
    assert np.isnan(got[:4]).all() and (got[4:8] == 1).all() and np.isnan(got[8:]).all()


@pytest.mark.parametrize("dtype,fill,doc", [
    ("<f4", math.nan, "NaN"), ("<f8", math.inf, "Infinity"), ("<f8", -math.inf, "-Infinity"), ("<f8", 1.5, 1.5),
    ("<i8", -3, -3), ("|u1", 7, 7), ("|b1", True, True), ("<c16", 1 + 2j, [1.0, 2.0]),
    ("|S3", b"ab", base64.b64encode(b"ab").decode()), ("<M8[s]", np.datetime64(5, "s"), 5),
    ("<f4", None, None)])
def test_fill_values_in_every_form_of_the_spec(dtype, fill, doc):
    dtype = np.dtype(dtype)
    assert encode_fill(fill, dtype) == doc
    back = decode_fill(doc, dtype, ".zarray")
    if fill is None:
        assert back is None
    elif dtype.kind == "f" and math.isnan(fill):
        assert math.isnan(back)
    else:
        assert back == np.array(fill, dtype)[()]


def test_a_structured_fill_value_is_base64_of_one_record():
    dtype = np.dtype([("a", "<i4"), ("b", "<f8", (2,))])
    record = np.array([(3, [1.0, 2.0])], dtype)[0]
    doc = encode_fill(record, dtype)
    assert base64.b64decode(doc) == record.tobytes()
    assert decode_fill(doc, dtype, ".zarray").tobytes() == record.tobytes()
    with pytest.raises(MetaError, match="not one record of 20"):
        decode_fill(base64.b64encode(b"\x00" * 8).decode(), dtype, "t/.zarray")


GOOD = {"zarr_format": 2, "shape": [10, 3], "chunks": [4, 3], "dtype": "<f4", "compressor": None,
        "fill_value": 0.0, "order": "C", "filters": None}


@pytest.mark.parametrize("change,message", [
    ({"order": "F"}, "field 'order' is 'F' (Fortran order); zarrfeed reads C order only"),
    ({"dtype": "|O", "filters": [{"id": "vlen-utf8"}]}, "Python objects, which zarrfeed does not read"),
    ({"chunks": [4, 1]}, "chunked along more than the first axis"),
    ({"dimension_separator": "-"}, "field 'dimension_separator' is '-', not '.' or '/'"),
    ({"zarr_format": 3}, "field 'zarr_format' is 3, not 2"),
    ({"shape": [-1, 3]}, "field 'shape' is [-1, 3]"),
    ({"chunks": [0, 3]}, "field 'chunks' is [0, 3]"),
    ({"compressor": {"id": "no-such-codec"}}, "field 'compressor' is {'id': 'no-such-codec'}, a codec that cannot"),
    ({"filters": {"id": "delta"}}, "field 'filters' is {'id': 'delta'}, not a list"),
    ({"dtype": "<q9"}, "field 'dtype' is '<q9', not a dtype"),
])
def test_what_is_not_supported_is_refused_in_one_line_naming_the_array(change, message):
    with pytest.raises(MetaError) as err:
        ArrayMeta.parse({**GOOD, **change}, "data/img/.zarray")
    assert str(err.value).startswith("data/img/.zarray: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_fields_of_other_tools_are_kept():
    doc = {**GOOD, "dimension_separator": "/", "zarr_extra": {"a": 1}}
    meta = ArrayMeta.parse(doc)
    assert meta.to_json() == doc
    assert meta.resized(12).to_json() == {**doc, "shape": [12, 3]}


def test_groups_attributes_and_consolidated_metadata(tmp_path):
    store = DirectoryStore(tmp_path / "g.zarr")
    root = Group.create(store, attrs={"b": 2, "a": [1]})
    root.require_group("data").create_array("x", ArrayMeta.new((5,), 2, np.dtype("<i8"), fill_value=0))
    root.require_group("meta")
    root.attrs["c"] = "x"
    assert dict(root.attrs.items()) == {"a": [1], "b": 2, "c": "x"}
    assert (tmp_path / "g.zarr" / ".zattrs").read_bytes() == json_bytes({"a": [1], "b": 2, "c": "x"})
    assert sorted(root.group_keys()) == ["data", "meta"] and root["data"].array_keys() == ["x"]
    docs = root.consolidated_docs()
    assert sorted(docs) == [".zattrs", ".zgroup", "data/.zgroup", "data/x/.zarray", "meta/.zgroup"]
    doc = json.loads(consolidated(docs))
    assert doc["zarr_consolidated_format"] == 1 and doc["metadata"]["data/x/.zarray"]["shape"] == [5]


def test_a_zip_store_reads_the_real_scene(real_zip, real_scene):
    group = Group.open(ZipStore(real_zip))
    np.testing.assert_array_equal(group["frames"][:], Group.open(DirectoryStore(real_scene))["frames"][:])
    with pytest.raises(PermissionError):
        ZipStore(real_zip).put("x", b"1")
    with zipfile.ZipFile(real_zip) as z:
        assert ZipStore(real_zip).sizes("agents")["0"] == z.getinfo("agents/0").compress_size


def test_a_directory_store_never_shows_half_a_key(tmp_path):
    store = DirectoryStore(tmp_path)
    store.put("a/b", b"1" * 10)
    assert store.put_new("a/b", b"2") is False and store["a/b"] == b"1" * 10
    assert store.put_new("a/c", b"3") is True
    assert sorted(store.keys()) == ["a/b", "a/c"] and store.listdir("a") == ["b", "c"]
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".partial")]
    store.delete(["a/b", "a/zz"])
    assert "a/b" not in store and store.get("a/b") is None


def test_fortran_order_in_one_dimension_is_the_same_layout_and_is_read():
    doc = {**GOOD, "shape": [10], "chunks": [4], "order": "F", "filters": []}
    meta = ArrayMeta.parse(doc)
    assert meta.to_json() == doc  # written back as it was


# ---------------------------------------------------------------- edges: indices, bounds, listings, odd documents
def _nd(store, separator=None, shape=(10, 3, 4)):
    arr = Array.create(store, "img", ArrayMeta.new(shape, 4, np.dtype("<i4"), numcodecs.Blosc(),
                                                   dimension_separator=separator))
    data = np.arange(math.prod(shape), dtype="<i4").reshape(shape)
    arr.write(0, data)
    return arr, data


def test_an_ellipsis_stands_for_the_axes_the_other_indices_leave():
    """`arr[..., 0]` read axis 1 instead of the last one (the shape is even right when they are as long)."""
    arr, data = _nd(MemoryStore(), shape=(10, 4, 4))
    for key in [(Ellipsis, 0), (Ellipsis, slice(1, 3)), (2, Ellipsis), (slice(2, 9, 3), Ellipsis, 1), Ellipsis,
                (Ellipsis, 1, 2), (1, Ellipsis, 2)]:
        np.testing.assert_array_equal(arr[key], data[key], err_msg=str(key))
    flat, values = _nd(MemoryStore(), shape=(10,))
    assert flat[..., 3] == values[3]
    with pytest.raises(IndexError, match="single ellipsis"):
        arr[..., 0, ...]


def test_a_write_at_a_negative_row_is_refused_not_lost():
    arr, data = _nd(MemoryStore())
    with pytest.raises(IndexError, match="negative"):
        arr.write(-2, data[:2])
    np.testing.assert_array_equal(arr[:], data)


@pytest.mark.parametrize("separator", [".", "/"])
def test_chunks_stored_are_counted_from_a_listing_with_either_separator(tmp_path, separator):
    """With '/', an N-d array's chunks lie in sub-folders (`3/0/0`): they counted as none stored. And the count
    looped over every chunk the shape could hold: a shape of 2**62 rows never returned."""
    arr, _ = _nd(DirectoryStore(tmp_path), separator)
    assert arr.nchunks_initialized == 3 and arr.nbytes_stored > len(arr.meta.to_bytes()) + 3 * 16
    doc = json.loads((tmp_path / "img" / ".zarray").read_text())
    doc["shape"][0] = 2**62
    (tmp_path / "img" / ".zarray").write_text(json.dumps(doc))
    assert Array.open(DirectoryStore(tmp_path), "img").nchunks_initialized == 3  # at once


def test_a_chunk_too_large_to_decode_is_refused_when_the_array_opens():
    doc = json.loads(ArrayMeta.new((10,), 4, np.dtype("<f8")).to_bytes())
    doc["chunks"] = [2**40]
    with pytest.raises(MetaError, match=r"one chunk holds 8,796,093,022,208 bytes decoded, more than the 2 GiB"):
        ArrayMeta.parse(doc, "x/.zarray")
    doc["chunks"], doc["dtype"] = [4], "|S0"
    with pytest.raises(MetaError, match="of 0 bytes"):
        ArrayMeta.parse(doc, "x/.zarray")


def test_json_nested_too_deep_is_one_error_naming_the_document():
    from zarrfeed.core.zarr_meta import load_json

    with pytest.raises(MetaError, match=r"^a/.zarray: JSON nested too deep to read$"):
        load_json(b"[" * 100_000 + b"]" * 100_000, "a/.zarray")


def test_numpy_numbers_are_stored_in_attributes_as_zarr_2_stored_them():
    arr, _ = _nd(MemoryStore())
    arr.attrs["n"], arr.attrs["x"], arr.attrs["v"] = np.int64(3), np.float32(0.5), np.arange(3)
    assert arr.attrs.asdict() == {"n": 3, "x": 0.5, "v": [0, 1, 2]}
    with pytest.raises(TypeError, match="not JSON serializable"):
        arr.attrs["o"] = object()


def test_a_chunk_too_short_for_its_header_says_so(tmp_path):
    from zarrfeed.core.chunks import ChunkError, read_rows

    arr, _ = _nd(DirectoryStore(tmp_path), shape=(8,))
    (tmp_path / "img" / "1").write_bytes(b"")
    with pytest.raises(ChunkError, match=r"chunk 'img/1' cannot be decoded \(ValueError: it is 0 bytes, shorter "
                                         r"than a Blosc header \(16\)\); the file is truncated or corrupt$"):
        read_rows(arr, 0, 8)


@pytest.mark.parametrize("zarr_format,filtered", [(2, False), (2, True), (3, False)])
def test_a_truncated_blosc_chunk_is_refused_before_blosc_reads_past_its_end(tmp_path, zarr_format, filtered):
    """c-blosc trusts the compressed size its header states and reads a chunk cut short past its end (a crash,
    not an error): the frame is checked first, on every Blosc path (into the caller's buffer, and through
    filters), in both formats, in a process of its own so a crash shows."""
    code = f"""
import numcodecs, numpy as np, pathlib
from zarrfeed.core.chunks import ChunkError, read_rows
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array
from zarrfeed.core.zarr_meta import ArrayMeta
from zarrfeed.core.v3_meta import ArrayMetaV3
from zarrfeed.core.v3_codecs import CodecChain
dtype, blosc = np.dtype("<i4"), numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)
filters = [numcodecs.Delta(dtype="<i4")] if {filtered} else None
meta = (ArrayMeta.new((4096,), 1024, dtype, blosc, filters=filters) if {zarr_format} == 2 else
        ArrayMetaV3.new((4096,), 1024, dtype, CodecChain.default(dtype, (1024,), blosc)))
arr = Array.create(DirectoryStore({str(tmp_path)!r}), "x", meta)
arr.write(0, np.random.default_rng(0).integers(0, 2**31, 4096).astype(dtype))
key = arr.chunk_key(1)
path = pathlib.Path({str(tmp_path)!r}) / key
path.write_bytes(path.read_bytes()[:100])
try:
    read_rows(arr, 0, 4096)
except ChunkError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out
    assert "its Blosc header says" in out.stdout and "it holds 100 (truncated)" in out.stdout, out
