"""Shards of zarr v3's `sharding_indexed` codec (`zarrfeed.core.v3_sharding`): shards zarr-python 3 writes (index
at the start or the end, inner chunks left out where they hold only the fill value) decode inner chunk by inner
chunk to what zarr-python reads; shards zarrfeed assembles, appending, read back in zarr-python; and assembling
never moves or changes a byte that an older index points to."""
import json
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BytesCodec, GzipCodec, ShardingCodec, ZstdCodec

from zarrfeed.core.errors import MetaError
from zarrfeed.core.schema import L5KIT_SCHEMA
from zarrfeed.core.v3_codecs import CodecChain
from zarrfeed.core.v3_sharding import MISSING, assemble, compact

WHERE = "t/zarr.json"
FILL = 7

# (name, dtype, shape, shard shape, inner chunk shape, index location, inner codecs)
CASES = [
    ("end-i4", "<i4", (40,), (16,), (4,), "end", None),
    ("start-i4", "<i4", (40,), (16,), (4,), "start", None),
    ("end-u1-2d", "u1", (10, 12), (4, 6), (2, 3), "end", None),
    ("start-f8-2d-gzip", "<f8", (9, 8), (6, 8), (2, 4), "start", [BytesCodec(endian="little"), GzipCodec(level=1)]),
    ("end-big-endian", "<i2", (30,), (10,), (5,), "end", [BytesCodec(endian="big"), ZstdCodec(level=3)]),
]


def _create(tmp_path, case):
    name, dtype, shape, shard, inner, location, codecs = case
    codecs = codecs or [BytesCodec(endian="little") if np.dtype(dtype).itemsize > 1 else BytesCodec(), ZstdCodec()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return zarr.create_array(store=tmp_path / name, shape=shape, chunks=shard, dtype=dtype, fill_value=FILL,
                                 serializer=ShardingCodec(chunk_shape=inner, codecs=codecs, index_location=location),
                                 compressors=None)


def _partly(case, seed=0):
    """Values of `case`'s array with its first shard and the next one's first inner chunks at the fill value
    (zarr-python leaves out that shard and those inner chunks)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 100, case[2]).astype(case[1])
    data[: case[3][0] + case[4][0]] = FILL
    return data


def _chain(tmp_path, case):
    doc = json.loads((tmp_path / case[0] / "zarr.json").read_text())
    chain = CodecChain.parse(doc["codecs"], np.dtype(case[1]), tuple(case[3]), WHERE)
    assert chain.sharding is not None and chain.to_json() == doc["codecs"]
    return chain


def _shards(tmp_path, name):
    root = tmp_path / name / "c"
    return {tuple(int(k) for k in p.relative_to(root).parts): p for p in root.rglob("*") if p.is_file()}


def _inner_region(data, shard_key, i, spec):
    """The values of inner chunk `i` of shard `shard_key`, padded with the fill value past the array's edge."""
    coords = np.unravel_index(i, spec.chunks_per_shard)
    at = [k * s + c * n for k, s, c, n in zip(shard_key, spec.shard_shape, coords, spec.chunk_shape, strict=True)]
    part = data[tuple(slice(a, a + n) for a, n in zip(at, spec.chunk_shape, strict=True))]
    out = np.full(spec.chunk_shape, FILL, data.dtype)
    out[tuple(slice(0, n) for n in part.shape)] = part
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_inner_chunk_zarr_python_writes_decodes_to_what_it_reads(tmp_path, case):
    arr = _create(tmp_path, case)
    data = _partly(case)
    arr[...] = data
    spec = _chain(tmp_path, case).sharding
    assert spec.index_location == case[5] and spec.index_nbytes == 16 * spec.inner_per_shard + 4
    shards = _shards(tmp_path, case[0])
    assert (0,) * arr.ndim not in shards, "a shard of only the fill value is not stored"
    missing = 0
    for key, path in shards.items():
        shard = path.read_bytes()
        start, stop = spec.index_range()
        suffix_or_prefix = shard[start:stop] if stop is not None else shard[start:]
        entries = spec.decode_index(suffix_or_prefix)  # what a reader fetches first: one range request
        np.testing.assert_array_equal(entries, spec.decode_index(spec.index_bytes(shard)))
        assert spec.index_range(len(shard)) == ((0, spec.index_nbytes) if case[5] == "start" else
                                                (len(shard) - spec.index_nbytes, len(shard)))
        stored = spec.chunks(shard)
        for i in range(spec.inner_per_shard):
            expect = _inner_region(data, key, i, spec)
            if i not in stored:
                assert (entries[i] == MISSING).all() and (expect == FILL).all()
                missing += 1
                continue
            out = np.empty(spec.codecs.nbytes, np.uint8)
            spec.codecs.decode_into(stored[i], out)
            np.testing.assert_array_equal(out.view(arr.dtype).reshape(spec.chunk_shape), expect)
    assert missing, "some inner chunks hold only the fill value and are left out"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_zarr_python_reads_shards_zarrfeed_assembles_appending(tmp_path, case):
    """Each shard assembled in three appends (the last replacing an inner chunk), then compacted: zarr-python
    reads the new values every time; in one dimension a shard built at once is zarr-python's, byte for byte."""
    arr = _create(tmp_path, case)
    data = _partly(case, seed=2)
    arr[...] = data
    spec = _chain(tmp_path, case).sharding
    theirs = {key: path.read_bytes() for key, path in _shards(tmp_path, case[0]).items()}
    for path in _shards(tmp_path, case[0]).values():
        path.unlink()
    grid = [-(-n // s) for n, s in zip(arr.shape, spec.shard_shape, strict=True)]
    written = {}
    for key in np.ndindex(*grid):
        encoded = {}
        for i in range(spec.inner_per_shard):
            values = _inner_region(data, key, i, spec)
            if not (values == FILL).all():
                encoded[i] = spec.codecs.encode(values)
        live = sorted(encoded)
        shard = assemble(spec, None, {i: encoded[i] for i in live[:1]}) if live else None
        shard = assemble(spec, shard, {i: encoded[i] for i in live[1:len(live) // 2]})
        wrong = spec.codecs.encode(np.zeros(spec.chunk_shape, arr.dtype))
        shard = assemble(spec, shard, {**{i: encoded[i] for i in live[len(live) // 2:-1]}, 0: wrong})
        shard = assemble(spec, shard, {0: encoded.get(0), **({live[-1]: encoded[live[-1]]} if live else {})})
        written[key] = shard
        at_once = assemble(spec, None, encoded)
        if len(spec.shard_shape) == 1 and live:
            assert at_once == theirs[key]  # (C order is Morton order in one dimension)
        assert compact(spec, shard) == at_once and len(at_once) < len(shard)
    for compacted in (False, True):
        for key, shard in written.items():
            if shard is None:
                continue
            path = tmp_path / case[0] / "c" / "/".join(map(str, key))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(compact(spec, shard) if compacted else shard)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.testing.assert_array_equal(zarr.open_array(tmp_path / case[0], mode="r")[...], data)


def test_records_zarr_python_cannot_shard_round_trip_through_zarrfeeds_shards():
    dt = L5KIT_SCHEMA.tables["agents"].dtype
    chain = CodecChain.sharded(dt, (12,), (4,), index_location="start", crc32c=True)
    spec = chain.sharding
    rng = np.random.default_rng(5)
    values = np.frombuffer(rng.integers(0, 256, 12 * dt.itemsize, dtype=np.uint8).tobytes(), dt)
    shard = assemble(spec, None, {i: spec.codecs.encode(values[4 * i:4 * i + 4].copy()) for i in (0, 2)})
    stored = spec.chunks(shard)
    assert sorted(stored) == [0, 2]
    for i in (0, 2):
        out = np.empty(spec.codecs.nbytes, np.uint8)
        spec.codecs.decode_into(stored[i], out)
        assert out.tobytes() == values[4 * i:4 * i + 4].tobytes()


def _spec(location, n=6):
    return CodecChain.sharded(np.dtype("<i4"), (4 * n,), (4,), index_location=location).sharding


@pytest.mark.parametrize("location", ["start", "end"])
def test_a_damaged_shard_is_refused(location):
    spec = _spec(location)
    shard = assemble(spec, None, {1: b"abc", 4: b"defgh"})
    lo, hi = spec.index_range(len(shard))
    damaged = bytearray(shard)
    damaged[lo] ^= 1
    with pytest.raises(ValueError, match="crc32c checksum mismatch"):
        spec.chunks(bytes(damaged))
    with pytest.raises(ValueError, match="crc32c checksum mismatch"):
        assemble(spec, bytes(damaged), {0: b"x"})
    with pytest.raises(ValueError, match="shorter than its index"):
        spec.chunks(shard[:10])
    entries = spec.decode_index(spec.index_bytes(shard)).copy()
    entries[4] = (len(shard), 5)
    bad = shard[:lo] + spec.encode_index(entries) + shard[hi:]
    with pytest.raises(ValueError, match="inner chunk 4 .* lies outside the shard's data"):
        spec.chunks(bad)
    entries[4] = (MISSING, 5)
    with pytest.raises(ValueError, match="entry 4 is half missing"):
        spec.decode_index(spec.encode_index(entries))
    with pytest.raises(IndexError, match="inner chunk 6 of a shard of 6"):
        assemble(spec, shard, {6: b"x"})


def test_an_inner_chunk_given_as_none_or_empty_becomes_missing():
    spec = _spec("end")
    shard = assemble(spec, None, {0: b"abc", 1: b"de", 2: b"f"})
    shard = assemble(spec, shard, {0: None, 2: b""})
    assert {i: bytes(b) for i, b in spec.chunks(shard).items()} == {1: b"de"}
    assert compact(spec, shard) == assemble(spec, None, {1: b"de"})


BAD = [
    ({"chunk_shape": [5], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}, "does not divide"),
    ({"chunk_shape": [4, 1], "codecs": []}, "field 'chunk_shape' is [4, 1]"),
    ({"chunk_shape": [4], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
      "index_location": "middle"}, "field 'index_location' is 'middle'"),
    ({"chunk_shape": [4], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
      "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}]}, "fixed size"),
    ({"chunk_shape": [4], "codecs": [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [2], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}]},
     "shard of shards"),
    ({"chunk_shape": [4], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}], "extra": 1},
     "keys ['extra'] it does not have"),
]


@pytest.mark.parametrize("config,why", BAD, ids=[str(i) for i in range(len(BAD))])
def test_refused_sharding_configurations_are_named_in_one_line(config, why):
    with pytest.raises(MetaError) as info:
        CodecChain.parse([{"name": "sharding_indexed", "configuration": config}], np.dtype("<i4"), (8,), WHERE)
    assert str(info.value).startswith(WHERE) and why in str(info.value) and "\n" not in str(info.value), info.value


UPDATES = st.lists(st.dictionaries(st.integers(0, 5), st.one_of(st.none(), st.binary(max_size=12)), max_size=4),
                   min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(location=st.sampled_from(["start", "end"]), updates=UPDATES)
def test_assembling_never_moves_or_changes_what_an_older_index_points_to(location, updates):
    """After any sequence of appends, a reader holding any earlier index finds every inner chunk it points to at
    the same offset with the same bytes, and the newest index finds the newest bytes of every inner chunk."""
    spec = _spec(location)
    shard, model, seen = None, {}, []
    for new in updates:
        after = assemble(spec, shard, new)
        model.update(new)
        if shard is not None:
            seen.append((shard, spec.decode_index(spec.index_bytes(shard))))
            lo, hi = spec.data_range(len(shard))
            assert after[lo:hi] == shard[lo:hi], "the old data keeps its place"
        for old, entries in seen:
            for offset, nbytes in entries[entries[:, 0] != MISSING].tolist():
                assert after[offset:offset + nbytes] == old[offset:offset + nbytes]
        assert {i: bytes(b) for i, b in spec.chunks(after).items()} == {i: b for i, b in model.items() if b}
        shard = after
