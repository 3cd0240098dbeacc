"""zarr v3 codec chains (`zarrfeed.core.v3_codecs`): chunks zarr-python 3 writes decode to its values, chunks
zarrfeed encodes read back in zarr-python 3 (byte for byte the same where the codecs are deterministic), and
malformed chains are refused in one line naming the document, the codec and the field."""
import json
import warnings
import zlib

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

from zarrfeed.core import v3_codecs
from zarrfeed.core.errors import MetaError
from zarrfeed.core.v3_codecs import CodecChain, compressor_json

WHERE = "t/zarr.json"
RECORD = np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "u1")])

# (name, dtype, shape, chunks, filters, serializer, compressors) as zarr-python 3's create_array takes them
CASES = [
    ("default-i4", "<i4", (10, 3), (4, 3), None, "auto", "auto"),
    ("default-u1", "u1", (10,), (4,), None, "auto", "auto"),
    ("zstd-checksum", "<f8", (9,), (4,), None, "auto", [ZstdCodec(level=5, checksum=True)]),
    ("blosc-shuffle", "<f4", (20, 2), (8, 2), None, "auto", [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]),
    ("blosc-bitshuffle", "<u2", (20,), (8,), None, "auto",
     [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")]),
    ("blosc-noshuffle", "<i8", (20,), (8,), None, "auto", [BloscCodec(cname="zlib", clevel=1, shuffle="noshuffle")]),
    ("gzip", "<i2", (11,), (5,), None, "auto", [GzipCodec(level=6)]),
    ("crc32c-only", "<f4", (10,), (4,), None, "auto", [Crc32cCodec()]),
    ("zstd-crc32c", "<u4", (10,), (4,), None, "auto", [ZstdCodec(level=1), Crc32cCodec()]),
    ("no-compressor", "<c8", (6,), (4,), None, "auto", None),
    ("big-endian", "<i4", (10,), (4,), None, BytesCodec(endian="big"), [ZstdCodec()]),
    ("big-endian-raw", "<f8", (10,), (4,), None, BytesCodec(endian="big"), None),
    ("transpose", "<f4", (6, 4, 5), (3, 4, 5), [TransposeCodec(order=[2, 0, 1])], "auto", [ZstdCodec()]),
    ("transpose-big-blosc-crc", "<i2", (6, 4), (3, 4), [TransposeCodec(order=[1, 0])], BytesCodec(endian="big"),
     [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"), Crc32cCodec()]),
    ("record", RECORD, (10,), (4,), None, "auto", "auto"),
    ("record-blosc", RECORD, (10,), (4,), None, "auto", [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]),
    ("datetime", "<M8[s]", (10,), (4,), None, "auto", "auto"),
    ("text", "<U3", (10,), (4,), None, BytesCodec(endian="big"), "auto"),
]


def _values(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 4, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)  # compressible
    values = np.frombuffer(raw.tobytes(), dtype).reshape(shape).copy()
    if dtype.fields is None and dtype.kind == "f":
        values[...] = rng.normal(size=shape).round(1)
    if dtype.kind == "U":
        values[...] = "ab"
    return values


def _make(tmp_path, case):
    """zarr-python 3's array for `case`, all written (one chunk short: a partial edge chunk), its document."""
    name, dtype, shape, chunks, filters, serializer, compressors = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arr = zarr.create_array(store=tmp_path / name, shape=shape, chunks=chunks, dtype=dtype, filters=filters,
                                serializer=serializer, compressors=compressors, fill_value=np.zeros((), dtype)[()])
        data = _values(dtype, shape)
        arr[...] = data
    return arr, data, json.loads((tmp_path / name / "zarr.json").read_text())


def _chunk_files(tmp_path, name):
    return sorted(p for p in (tmp_path / name / "c").rglob("*") if p.is_file())


def _region(data, key, chunks):
    """The values of chunk `key` (its grid position), padded with zeros past the array's edge."""
    at = tuple(k * c for k, c in zip(key, chunks, strict=True))
    part = data[tuple(slice(a, a + c) for a, c in zip(at, chunks, strict=True))]
    out = np.zeros(chunks, data.dtype)
    out[tuple(slice(0, n) for n in part.shape)] = part
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_chunks_zarr_python_writes_decode_to_its_values(tmp_path, case):
    arr, data, doc = _make(tmp_path, case)
    chunks = tuple(case[3])
    chain = CodecChain.parse(doc["codecs"], np.dtype(case[1]), chunks, WHERE)
    assert chain.to_json() == doc["codecs"]
    files = _chunk_files(tmp_path, case[0])
    assert files
    for path in files:
        key = tuple(int(k) for k in path.relative_to(tmp_path / case[0] / "c").parts)
        out = np.empty(chain.nbytes, np.uint8)
        chain.decode_into(path.read_bytes(), out)
        np.testing.assert_array_equal(out.view(chain.dtype).reshape(chunks), _region(data, key, chunks))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_chunks_zarrfeed_encodes_read_back_in_zarr_python(tmp_path, case):
    arr, data, doc = _make(tmp_path, case)
    chunks = tuple(case[3])
    chain = CodecChain.parse(doc["codecs"], np.dtype(case[1]), chunks, WHERE)
    new = _values(case[1], arr.shape, seed=1)
    for path in _chunk_files(tmp_path, case[0]):
        key = tuple(int(k) for k in path.relative_to(tmp_path / case[0] / "c").parts)
        ours = chain.encode(_region(data, key, chunks))
        assert ours == path.read_bytes(), "the same codecs, the same bytes"
        path.write_bytes(chain.encode(_region(new, key, chunks)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(zarr.open_array(tmp_path / case[0], mode="r")[...], new)


def test_crc32c_is_appended_little_endian_and_checked():
    chain = CodecChain.parse([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                             np.dtype("<u4"), (3,), WHERE)
    encoded = chain.encode(np.array([1, 2, 3], "<u4"))
    body = np.array([1, 2, 3], "<u4").tobytes()
    assert encoded[:-4] == body and encoded[-4:] == v3_codecs.crc32c(body).to_bytes(4, "little")
    assert v3_codecs.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    out = np.empty(12, np.uint8)
    with pytest.raises(ValueError, match="crc32c checksum mismatch"):
        chain.decode_into(b"\x07" + encoded[1:], out)
    with pytest.raises(ValueError, match="shorter than a crc32c"):
        chain.decode_into(b"\x01", out)


def test_the_plain_python_crc32c_is_the_same_function():
    python = v3_codecs._python_crc32c()
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 100, 4099):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert python(data) == v3_codecs.crc32c(data)
    assert python(b"123456789") == 0xE3069283


def test_zstd_and_blosc_decode_straight_into_out_and_refuse_another_size():
    values = np.arange(1000, dtype="<i8")
    for compressor in (None, numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1)):
        chain = CodecChain.default(values.dtype, (1000,), compressor)
        raw = chain.encode(values)
        out = np.zeros(8000, np.uint8)
        chain.decode_into(memoryview(raw), out)
        np.testing.assert_array_equal(out.view("<i8"), values)
        smaller = CodecChain.default(values.dtype, (999,), compressor)
        with pytest.raises(ValueError, match="decodes to 8000 bytes, a chunk holds 7992"):
            smaller.decode_into(raw, np.empty(7992, np.uint8))
        with pytest.raises(ValueError, match="cannot decode|shorter than|decodes to|truncated"):
            chain.decode_into(raw[:20] + bytes(20), out)
    gz = CodecChain.default(values.dtype, (999,), numcodecs.GZip(level=1))
    with pytest.raises(ValueError, match="decodes to 8000 bytes, a chunk holds 7992"):
        gz.decode_into(CodecChain.default(values.dtype, (1000,), numcodecs.GZip(level=1)).encode(values),
                       np.empty(7992, np.uint8))
    with pytest.raises(ValueError, match="cannot decode"):
        gz.decode_into(zlib.compress(b"x") + b"junk", np.empty(7992, np.uint8))
    with pytest.raises(ValueError, match="not contiguous uint8 of 8000"):
        chain.decode_into(raw, np.empty(1000, "<i8"))


def _zstd_frame_of_unknown_size(data: bytes) -> bytes:
    """A zstd frame with no content size (as a streaming writer leaves it): one raw block, by hand (RFC 8878)."""
    header = (1 | len(data) << 3).to_bytes(3, "little")  # last block, raw, its size
    return b"\x28\xb5\x2f\xfd" + b"\x00" + b"\x00" + header + data  # no size, 1 KiB window, no checksum


def test_zstd_frames_of_unknown_size_decode_to_exactly_the_chunk():
    values = np.arange(100, dtype="<i4")
    frame = _zstd_frame_of_unknown_size(values.tobytes())
    assert v3_codecs._zstd_size(memoryview(frame)) is None
    chain = CodecChain.default(values.dtype, (100,))
    out = np.empty(400, np.uint8)
    chain.decode_into(frame, out)
    np.testing.assert_array_equal(out.view("<i4"), values)
    with pytest.raises(ValueError, match="cannot decode"):
        CodecChain.default(values.dtype, (101,)).decode_into(frame, np.empty(404, np.uint8))
    assert v3_codecs._zstd_size(memoryview(chain.encode(values))) == 400


def test_default_chains_are_what_zarr_python_writes(tmp_path):
    for dtype in ("<i4", "u1", RECORD, "<U4", "V3"):
        dt = np.dtype(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.create_array(store=tmp_path / dt.str, shape=(8,), chunks=(4,), dtype=dt)
        doc = json.loads((tmp_path / dt.str / "zarr.json").read_text())
        ours = CodecChain.default(dt, (4,)).to_json()
        if dt.fields is not None:  # zarr-python writes no endian for records; zarr-extensions' struct asks for one
            assert doc["codecs"][0] == {"name": "bytes"} and ours[0] == {"name": "bytes", "configuration": {
                "endian": "little"}}
            assert ours[1:] == doc["codecs"][1:]
        else:
            assert ours == doc["codecs"]
    blosc = numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE)
    assert compressor_json(blosc, np.dtype("<f4")) == BloscCodec(
        cname="zstd", clevel=3, shuffle="bitshuffle", typesize=4).to_dict()
    auto = compressor_json(numcodecs.Blosc(shuffle=numcodecs.Blosc.AUTOSHUFFLE), np.dtype("u1"))
    assert auto["configuration"]["shuffle"] == "bitshuffle" and auto["configuration"]["typesize"] == 1
    chain = CodecChain.default(np.dtype("<f8"), (4,), numcodecs.Zstd(level=3), crc32c=True)
    assert [c["name"] for c in chain.to_json()] == ["bytes", "zstd", "crc32c"]
    with pytest.raises(MetaError, match="no codec for it"):
        CodecChain.default(np.dtype("<f8"), (4,), numcodecs.LZMA())


def test_blosc_encodes_with_the_records_type_size_as_v2_does():
    """Blosc shuffles by the record's size, as zarrfeed's v2 tables always were: the same bytes as v2's."""
    values = _values(RECORD, (50,))
    blosc = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1)
    ours = CodecChain.default(RECORD, (50,), blosc).encode(values)
    assert ours[3] == RECORD.itemsize and ours == blosc.encode(values)


BAD = [
    ("x", "field 'codecs' is 'x', not a non-empty list"),
    ([], "not a non-empty list"),
    ([{"name": "zstd"}], "codec 0 ('zstd') in 'codecs': field 'name' is 'zstd' (bytes->bytes) before"),
    ([{"name": "bytes"}], "codec 0 ('bytes') in 'codecs': field 'endian' is missing"),
    ([{"name": "bytes", "configuration": {"endian": "middle"}}], "field 'endian' is 'middle'"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "bytes"}], "a second array->bytes"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "lz5"}], "codec 1 ('lz5')"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "transpose", "configuration": {
        "order": [0]}}], "'transpose' after the array->bytes codec"),
    ([{"name": "transpose", "configuration": {"order": [0, 0]}}, {"name": "bytes", "configuration": {
        "endian": "little"}}], "field 'order' is [0, 0]"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "blosc", "configuration": {
        "cname": "lz4", "clevel": 5, "shuffle": "byteshuffle", "typesize": 4}}], "field 'shuffle' is 'byteshuffle'"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "blosc", "configuration": {
        "cname": "lz4", "clevel": 5, "shuffle": "shuffle"}}], "field 'typesize' is missing"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "blosc", "configuration": {
        "cname": "lz4", "clevel": 10, "shuffle": "noshuffle"}}], "field 'clevel' is 10"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {}}],
     "keys ['level'] missing"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {
        "level": 1, "checksum": "yes"}}], "field 'checksum' is 'yes'"),
    ([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c", "configuration": {"x": 1}}],
     "keys ['x'] it does not have"),
    ([{"name": "transpose", "configuration": {"order": [0, 1]}}], "no array->bytes codec"),
    ([{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 3], "codecs": [
        {"name": "bytes", "configuration": {"endian": "little"}}]}}, {"name": "zstd"}], "after 'sharding_indexed'"),
]


@pytest.mark.parametrize("codecs,why", BAD, ids=[str(i) for i in range(len(BAD))])
def test_refused_chains_are_named_in_one_line(codecs, why):
    with pytest.raises(MetaError) as info:
        CodecChain.parse(codecs, np.dtype("<i4"), (4, 3), WHERE)
    message = str(info.value)
    assert message.startswith(f"{WHERE}: ") and why in message and "\n" not in message, message


def test_endian_may_be_left_out_for_one_byte_values_and_records():
    for dtype in ("u1", "bool", "V5", "S3", [("a", "u1"), ("b", "i1")], RECORD):
        chain = CodecChain.parse([{"name": "bytes"}], np.dtype(dtype), (4,), WHERE)
        assert chain.endian is None
    big = CodecChain.parse([{"name": "bytes", "configuration": {"endian": "big"}}], np.dtype("u1"), (4,), WHERE)
    assert big.encode(np.arange(4, dtype="u1")) == bytes(range(4))  # one-byte values have no byte order


def test_sharded_chains_neither_decode_nor_encode_whole_shards():
    chain = CodecChain.sharded(np.dtype("<i4"), (8,), (4,))
    assert chain.sharding is not None and chain.encoded_size() is None
    with pytest.raises(TypeError, match="v3_sharding"):
        chain.decode_into(b"", np.empty(32, np.uint8))
    with pytest.raises(TypeError, match="v3_sharding"):
        chain.encode(np.zeros(8, "<i4"))
