"""zarr v3 between zarrfeed and implementations other than zarr-python, where they are installed (the `interop`
extra; CI does not install it, and these tests are skipped there):

- tensorstore (Google's C++ library) reads the numeric arrays of a replay buffer zarrfeed writes in v3 (sharded,
  a crc32c on every inner chunk and on the index), and a record table of plain fields (zarr-extensions'
  `struct`) field by field; zarrfeed reads a sharded, blosc-compressed replay buffer tensorstore writes.
  (tensorstore refuses L5Kit's tables: subarray fields and fixed-size strings are "extension data types with
  configuration", which it does not read.)
- zarrs (the Rust implementation, as zarr-python 3's codec pipeline) reads zarrfeed's v3 arrays, and zarrfeed
  reads the sharded arrays zarr-python writes through it.
"""
import json

import numpy as np
import pytest
import zarr
from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, Schema, replay_buffer_schema

KEYS = {"img": (np.uint8, (6, 6, 3)), "state": (np.float32, (5,)), "action": (np.float64, (2,)),
        "contact": (np.bool_, (1,)), "count": (np.int16, ())}
ENDS = np.array([5, 20, 21, 53], np.int64)
STEP = np.dtype([("t", "<f8"), ("id", "<i4"), ("ok", "u1")])


def _episodes(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t = int(rng.integers(1, 30))
        values = {k: rng.normal(size=(t, *shape)) * 50 for k, (_, shape) in KEYS.items()}
        out.append({k: (v > 0 if KEYS[k][0] is np.bool_ else v.astype(KEYS[k][0])) for k, v in values.items()})
    return out


@pytest.fixture(scope="module")
def buffer(tmp_path_factory):
    """A replay buffer zarrfeed wrote in v3 (shards of 2 img chunks of 16 steps) and its episodes."""
    path = tmp_path_factory.mktemp("v3") / "buffer.zarr"
    eps = _episodes(10, seed=3)
    with DatasetWriter(path, replay_buffer_schema(KEYS, chunk_rows=16), zarr_format=3, shard_bytes=2 * 16 * 108,
                       workers=0) as w:
        w.ingest(eps)
    return path, eps


def _rows(eps, key) -> np.ndarray:
    return np.concatenate([e[key] for e in eps])


def _group_docs(path) -> None:
    for folder in (path, path / "data", path / "meta"):
        folder.mkdir(exist_ok=True)
        (folder / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))


def _sharded_blosc(values: np.ndarray, shard_rows: int, chunk_rows: int) -> dict:
    rest = list(values.shape[1:])
    return {"shape": list(values.shape), "data_type": str(values.dtype),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [shard_rows, *rest]}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [chunk_rows, *rest],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                           {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle",
                                                               "typesize": values.dtype.itemsize, "blocksize": 0}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end"}}]}


# ------------------------------------------------------------------ tensorstore
@pytest.fixture
def tensorstore():
    return pytest.importorskip("tensorstore")


def _ts_open(path, create: bool = False, **spec):
    """The array at `path` in tensorstore: read (and written, and made with `spec`'s metadata, if `create`)."""
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}, **spec}
    return ts.open(spec, read=True, write=create, create=create).result()


def test_tensorstore_reads_the_replay_buffer_zarrfeed_writes(tensorstore, buffer):
    path, eps = buffer
    assert (_ts_open(path / "meta" / "episode_ends").read().result()
            == np.cumsum([len(e["img"]) for e in eps])).all()
    for key, (dtype, _) in KEYS.items():
        got = _ts_open(path / "data" / key).read().result()
        want = _rows(eps, key)
        assert got.dtype == dtype and got.shape == want.shape and (got == want).all(), key


def test_tensorstore_reads_a_record_table_zarrfeed_writes_field_by_field(tensorstore, tmp_path):
    path = tmp_path / "records.zarr"
    rng = np.random.default_rng(5)
    episodes = []
    for n in (7, 30, 2):
        steps = np.zeros(n, STEP)
        steps["t"], steps["id"], steps["ok"] = rng.random(n), rng.integers(-9, 9, n), rng.integers(0, 2, n)
        episodes.append({"steps": steps})
    with DatasetWriter(path, Schema(tables={"steps": (STEP, 8)}), zarr_format=3, shard_bytes=16 * STEP.itemsize,
                       workers=0) as w:
        w.ingest(episodes)
    assert json.loads((path / "steps" / "zarr.json").read_text())["data_type"]["name"] == "struct"
    want = np.concatenate([e["steps"] for e in episodes])
    for name in STEP.names:
        got = _ts_open(path / "steps", field=name).read().result()
        assert got.dtype == STEP[name] and (got == want[name]).all(), name


def test_zarrfeed_reads_the_sharded_replay_buffer_tensorstore_writes(tensorstore, tmp_path):
    path = tmp_path / "ts.zarr"
    _group_docs(path)
    rng = np.random.default_rng(8)
    values = {"img": rng.integers(0, 256, (53, 4, 4, 3), dtype=np.uint8),
              "state": rng.standard_normal((53, 5)).astype(np.float32)}
    for key, v in values.items():
        _ts_open(path / "data" / key, metadata=_sharded_blosc(v, 24, 8), create=True).write(v).result()
    _ts_open(path / "meta" / "episode_ends", create=True, metadata={
        "shape": [len(ENDS)], "data_type": "int64",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [len(ENDS)]}}}).write(ENDS).result()
    ds = Dataset.open(path)
    assert ds.rows == {"episodes": len(ENDS), "img": 53, "state": 53} and ds.validate().ok
    for key, v in values.items():
        assert ds.read_rows(key, 0, 53)[key].tobytes() == v.tobytes(), key


# ------------------------------------------------------------------ zarrs
@pytest.fixture
def zarrs_pipeline():
    """zarr-python 3 with zarrs' codec pipeline (Rust) in place of its own."""
    pytest.importorskip("zarrs")
    with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
        yield


def test_zarrs_reads_the_replay_buffer_zarrfeed_writes(zarrs_pipeline, buffer):
    path, eps = buffer
    for key, (dtype, _) in KEYS.items():
        arr = zarr.open_array(str(path / "data" / key), mode="r")
        assert type(arr._async_array.codec_pipeline).__name__ == "ZarrsCodecPipeline"
        assert arr.dtype == dtype and (arr[:] == _rows(eps, key)).all(), key


def test_zarrfeed_reads_what_zarr_python_writes_through_zarrs(tmp_path, zarrs_pipeline):
    path = tmp_path / "zarrs.zarr"
    rng = np.random.default_rng(9)
    values = {"img": rng.integers(0, 256, (53, 4, 4, 3), dtype=np.uint8),
              "state": rng.standard_normal((53, 5)).astype(np.float32)}
    root = zarr.open_group(str(path), mode="w")
    for key, v in values.items():
        arr = root.create_array(f"data/{key}", shape=v.shape, dtype=v.dtype, chunks=(8, *v.shape[1:]),
                                shards=(24, *v.shape[1:]))
        assert type(arr._async_array.codec_pipeline).__name__ == "ZarrsCodecPipeline"
        arr[:] = v
    root.create_array("meta/episode_ends", shape=ENDS.shape, dtype=ENDS.dtype, chunks=ENDS.shape)[:] = ENDS
    ds = Dataset.open(path)
    assert ds.validate().ok
    for key, v in values.items():
        assert ds.read_rows(key, 0, 53)[key].tobytes() == v.tobytes(), key
