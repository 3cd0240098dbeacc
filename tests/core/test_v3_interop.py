"""Replay buffers that zarr-python 3 writes in zarr v3 open in zarrfeed as they are, through its public API: with
zarr 3's defaults, sharded (the index at the start or the end), with each codec zarrfeed reads (blosc with each
shuffle, zstd, gzip, crc32c, transpose, big-endian bytes), either chunk key encoding with either separator,
NaN and infinite fill values, chunks and whole shards left out; every value as zarr-python reads it, and
validate, the Parquet export and a loader give what they give on the same buffer in v2. What zarrfeed does not
read is refused in one line naming the array's document and the feature."""
import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr
from cli_process import zarrfeed
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarrfeed import SequenceLoader
from zarrfeed.core.errors import FormatError
from zarrfeed.loader import Dataset, export_parquet

T = 53  # steps: chunks of 8, shards of 24 (the last one partly filled)
CHUNK, SHARD = 8, 24
HOLE = slice(8, 48)  # steps left at the fill value: inner chunks 1-5, the whole second shard
ENDS = np.array([5, 20, 21, 40, 53], np.int64)


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {"img": rng.integers(0, 256, (T, 4, 4, 3), dtype=np.uint8),
            "state": rng.standard_normal((T, 5)).astype(np.float32),
            "action": rng.standard_normal((T, 2)),
            "n": rng.integers(-300, 300, T).astype(np.int16)}


VALUES = _values()


def _reversed_axes(ndim: int) -> list:
    return [TransposeCodec(order=tuple(reversed(range(ndim))))]


# name -> create_array keywords (a function: of the array's dimensions); "shards": (rows, index location); "fill":
# the float arrays' fill value; "hole": leave HOLE out (at the fill value)
CASES = {
    "defaults": {},
    "sharded-index-at-end": {"shards": (SHARD, "end")},
    "sharded-index-at-start": {"shards": (SHARD, "start")},
    "blosc-noshuffle": {"compressors": BloscCodec(cname="lz4", shuffle="noshuffle")},
    "blosc-shuffle": {"compressors": BloscCodec(cname="lz4", shuffle="shuffle")},
    "blosc-bitshuffle": {"compressors": BloscCodec(cname="zstd", shuffle="bitshuffle")},
    "zstd-checksum": {"compressors": ZstdCodec(level=3, checksum=True)},
    "gzip": {"compressors": GzipCodec(level=5)},
    "zstd-crc32c": {"compressors": [ZstdCodec(), Crc32cCodec()]},
    "crc32c-uncompressed": {"compressors": [Crc32cCodec()]},
    "transpose": {"filters": _reversed_axes},
    "big-endian": {"serializer": BytesCodec(endian="big")},
    "keys-default-dot": {"chunk_key_encoding": {"name": "default", "separator": "."}},
    "keys-v2-dot": {"chunk_key_encoding": {"name": "v2", "separator": "."}},
    "keys-v2-slash": {"chunk_key_encoding": {"name": "v2", "separator": "/"}},
    "fill-nan-left-out": {"fill": np.nan, "hole": True},
    "fill-infinity-left-out": {"fill": np.inf, "hole": True},
    "sharded-fill-minus-infinity-left-out": {"fill": -np.inf, "hole": True, "shards": (SHARD, "start")},
    "sharded-blosc-left-out": {"hole": True, "shards": (SHARD, "end"),
                               "compressors": BloscCodec(cname="lz4", shuffle="bitshuffle")},
    "dimension-names-and-attributes": {"dimension_names": lambda n: ["t", *(f"d{i}" for i in range(1, n))],
                                       "attributes": {"units": "m"}},
    "sharded-transpose-big-endian-crc32c": {"shards": (SHARD, "end"), "filters": _reversed_axes,
                                            "serializer": BytesCodec(endian="big"), "compressors": [Crc32cCodec()]},
}


def write_buffer(path: Path, zarr_format: int = 3, **case) -> Path:
    """A replay buffer (data/<key>, meta/episode_ends) written by zarr-python 3 with `case`'s options."""
    case = dict(case)
    shards, fill, hole = case.pop("shards", None), case.pop("fill", None), case.pop("hole", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr 3 warns that some of these are not yet in the v3 specification
        root = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
        for key, values in VALUES.items():
            options = {k: (v(values.ndim) if callable(v) else v) for k, v in case.items()}
            if shards:
                options["shards"] = {"shape": (shards[0], *values.shape[1:]), "index_location": shards[1]}
            if fill is not None and values.dtype.kind == "f":
                options["fill_value"] = fill
            arr = root.create_array(f"data/{key}", shape=values.shape, dtype=values.dtype,
                                    chunks=(CHUNK, *values.shape[1:]), **options)
            if hole:
                arr[:HOLE.start] = values[:HOLE.start]
                arr[HOLE.stop:] = values[HOLE.stop:]
            else:
                arr[:] = values
        root.create_array("meta/episode_ends", shape=ENDS.shape, dtype=ENDS.dtype, chunks=ENDS.shape)[:] = ENDS
    return path


@pytest.mark.parametrize("case", CASES)
def test_every_value_reads_as_zarr_python_reads_it(tmp_path, case):
    path = write_buffer(tmp_path / "b.zarr", **CASES[case])
    if CASES[case].get("hole"):  # the chunks (and shard) of the hole are indeed not stored
        stored = [p for p in (path / "data" / "state").rglob("*") if p.is_file() and p.name != "zarr.json"]
        assert len(stored) == 2, stored  # chunks 0 and 6, or shards 0 and 2
    z = zarr.open_group(str(path), mode="r")
    ds = Dataset.open(path)
    assert ds.schema.name == "replay_buffer" and ds.rows == {"episodes": len(ENDS), **{k: T for k in VALUES}}
    assert (ds.read_rows("episodes", 0, len(ENDS))["end"] == ENDS).all()
    some = np.array([0, 7, 8, 23, 24, 47, 48, T - 1])  # each side of chunk and shard boundaries
    for key in VALUES:
        want = z[f"data/{key}"][:]
        got = ds.read_rows(key, 0, T)[key]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), key
        assert ds[key][...][key].tobytes() == want.tobytes(), key
        assert ds.read_coordinates(key, some)[key].tobytes() == want[some].tobytes(), key
        fill, their_fill = ds[key].fill_value, z[f"data/{key}"].fill_value
        assert np.asarray(fill).tobytes() == np.asarray(their_fill, want.dtype).tobytes(), key
    if "fill" in CASES[case]:  # the steps left out read as the fill value, bit for bit
        hole = ds.read_rows("state", HOLE.start, HOLE.stop)["state"]
        assert (hole.view(np.uint32) == np.float32(CASES[case]["fill"]).view(np.uint32)).all()
    report = ds.validate()
    assert report.ok, str(report)


def _epoch(loader) -> list[dict[str, np.ndarray]]:
    return [{k: np.array(v) for k, v in batch.items()} for batch in loader]


@pytest.mark.parametrize("case", ["defaults", "sharded-blosc-left-out"])
def test_validate_export_and_a_loader_give_what_the_same_buffer_in_v2_gives(tmp_path, case):
    v3 = write_buffer(tmp_path / "v3.zarr", **CASES[case])
    same = {k: v for k, v in CASES[case].items() if k in ("fill", "hole")}  # the same values, v2's codecs
    v2 = write_buffer(tmp_path / "v2.zarr", zarr_format=2, **same)
    assert (v2 / ".zgroup").exists() and (v3 / "zarr.json").exists()
    assert str(Dataset.open(v3).validate()) == str(Dataset.open(v2).validate()) == "valid"
    for path in (v2, v3):
        assert export_parquet(path, tmp_path / f"pq-{path.stem}", workers=0)["rows"] == {"episodes": 5, "steps": T}
    for table in ("episodes", "steps"):
        got, want = (pq.read_table(tmp_path / f"pq-{p.stem}" / table) for p in (v3, v2))
        assert got.equals(want), table
    z = zarr.open_group(str(v3), mode="r")
    steps = pq.read_table(tmp_path / "pq-v3" / "steps")
    assert (np.stack(steps["state"].to_numpy(zero_copy_only=False)) == z["data/state"][:]).all()
    options = dict(batch_size=16, seed=4, num_workers=1)  # shuffled, in a worker process (its own fetches)
    with SequenceLoader(v3, 4, 1, 2, **options) as a, SequenceLoader(v2, 4, 1, 2, **options) as b:
        got, want = _epoch(a), _epoch(b)
        assert (a.indices() == b.indices()).all()
    assert len(got) == len(want) > 1
    for x, y in zip(got, want, strict=True):
        assert x.keys() == y.keys() == {"sample", "episode", "is_pad", *VALUES}
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].tobytes() == y[k].tobytes(), k


def test_fill_values_in_raw_bits_read_as_zarr_python_reads_them(tmp_path):
    path = write_buffer(tmp_path / "b.zarr", fill=np.nan, hole=True)
    for key, bits in (("state", "0x7fc00001"), ("action", "0x7ff8000000000001")):  # NaNs of other payloads
        doc_path = path / "data" / key / "zarr.json"
        doc_path.write_text(json.dumps({**json.loads(doc_path.read_text()), "fill_value": bits}))
    z, ds = zarr.open_group(str(path), mode="r"), Dataset.open(path)
    for key in ("state", "action"):
        want = z[f"data/{key}"][:]
        got = ds.read_rows(key, 0, T)[key]
        assert got.tobytes() == want.tobytes(), key
        assert got[HOLE].view(f"u{got.itemsize}")[0, 0] == int(json.loads(
            (path / "data" / key / "zarr.json").read_text())["fill_value"], 16), key


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part")
def test_consolidated_metadata_is_read_around(tmp_path):
    path = write_buffer(tmp_path / "b.zarr", shards=(SHARD, "end"))
    zarr.consolidate_metadata(str(path))
    assert "consolidated_metadata" in json.loads((path / "zarr.json").read_text())
    ds = Dataset.open(path)
    assert ds.rows["img"] == T and ds.read_rows("img", 0, T)["img"].tobytes() == VALUES["img"].tobytes()


def test_shards_left_out_and_partly_filled_read_the_same_from_an_object_store(s3, tmp_path):
    """On S3 a shard's index and its inner chunks are read by range requests: the same values and batches."""
    bucket, server = s3
    local = write_buffer(tmp_path / "b.zarr", hole=True, fill=np.nan, shards=(SHARD, "start"))
    server.fs().put(str(local), f"{bucket}/b.zarr", recursive=True)
    remote = Dataset.open(f"{bucket}/b.zarr", storage_options=server.options)
    here = Dataset.open(local)
    for table in here.tables:
        assert remote.read_rows(table, 0, T).tobytes() == here.read_rows(table, 0, T).tobytes(), table
    assert remote.validate().ok
    options = dict(batch_size=16, seed=2, num_workers=0)
    with SequenceLoader(f"{bucket}/b.zarr", 4, 1, 2, storage_options=server.options, **options) as a, \
            SequenceLoader(local, 4, 1, 2, **options) as b:
        for x, y in zip(_epoch(a), _epoch(b), strict=True):
            assert all(x[k].tobytes() == y[k].tobytes() for k in y)


# ------------------------------------------------------------------ refusals
def _rectilinear(doc):
    doc["chunk_grid"] = {"name": "rectilinear", "configuration": {"kind": "inline", "chunk_shapes": [[24, 29], [5]]}}


def _second_axis(doc):
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [8, 2]


def _transformer(doc):
    doc["storage_transformers"] = [{"name": "chunk-manifest-json", "configuration": {}}]


def _unknown_codec(doc):
    doc["codecs"].append({"name": "lzma"})


def _compressed_shards(doc):
    doc["codecs"] = [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [8, 5], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}},
        {"name": "zstd", "configuration": {"level": 0, "checksum": False}}]


def _unknown_type(doc):
    doc["data_type"] = "bfloat16"


REFUSED = [
    (_rectilinear, "field 'chunk_grid' is 'rectilinear'; zarrfeed reads the 'regular' grid"),
    (_second_axis, "field 'chunk_grid' has chunk_shape [8, 2], chunked along more than the first axis"),
    (_transformer, "field 'storage_transformers' is [{'name': 'chunk-manifest-json'"),
    (_unknown_codec, "codec 2 ('lzma') in 'codecs': field 'name' is 'lzma', a codec zarrfeed does not know"),
    (_compressed_shards, "field 'codecs' has ['zstd'] after 'sharding_indexed'"),
    (_unknown_type, "field 'data_type' is 'bfloat16': 'bfloat16' is not a data type zarrfeed reads"),
]


@pytest.mark.parametrize("edit,says", REFUSED, ids=[e.__name__.strip("_") for e, _ in REFUSED])
def test_what_zarrfeed_does_not_read_is_refused_in_one_line(tmp_path, edit, says):
    path = write_buffer(tmp_path / "b.zarr")
    doc_path = path / "data" / "state" / "zarr.json"
    doc = json.loads(doc_path.read_text())
    edit(doc)
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as caught:
        Dataset.open(path)
    assert "data/state/zarr.json: " in str(caught.value) and says in str(caught.value), str(caught.value)
    out = zarrfeed("info", path)
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr, out
    assert out.stderr.strip().splitlines() == [f"zarrfeed: error: {caught.value}"]


def test_a_key_of_strings_is_left_beside_the_steps_as_v2s_python_objects_are(tmp_path):
    """zarr's variable-length strings are no steps in either format: the buffer opens without that key, and
    says so in one line naming it."""
    said = {}
    for zarr_format, kind in ((3, "'string'"), (2, "Python objects")):
        path = write_buffer(tmp_path / f"v{zarr_format}.zarr", zarr_format=zarr_format)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.open_group(str(path), mode="r+").create_array(
                "data/label", shape=(T,), dtype=str, chunks=(CHUNK,))[:] = np.array([f"s{i}" for i in range(T)])
        with pytest.warns(UserWarning, match=f"not reading 'data/label' \\(an array of {kind}, not steps\\)"):
            ds = Dataset.open(path)
        assert list(ds.tables) == ["episodes", *sorted(VALUES)]
        out = zarrfeed("info", path)
        assert out.returncode == 0 and len(out.stderr.strip().splitlines()) == 1, out
        said[zarr_format] = out.stderr.replace(str(path), "PATH").replace(kind, "KIND")
    assert said[3] == said[2]
