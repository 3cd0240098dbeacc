"""What zarrfeed writes in zarr v3, read by zarr-python 3 and by zarrfeed itself.

- zarr-python 3 reads the numeric arrays of a replay buffer `DatasetWriter(..., zarr_format=3)` writes and
  appends to (shards written in parts, partly filled last shards), with values equal to what was written, and
  the agents mask `zarrfeed mask` stores in a v3 dataset, from the dataset's root;
- the record tables of the real L5Kit scene converted to v3 (zarr-extensions' `struct`, sharded) read back byte
  for byte as the v2 source, and converted back to v2 too (zarr-python 3 itself does not read records in v3).
"""
import json
import shutil

import numpy as np
import pytest
import zarr
import zarrfeed
from zarrfeed import SequenceLoader
from zarrfeed.loader import Dataset
from zarrfeed.loader.kinds import agents_mask
from zarrfeed.writer import DatasetWriter, replay_buffer_schema, synthetic

KEYS = {"img": (np.uint8, (6, 6, 3)), "state": (np.float32, (5,)), "action": (np.float64, (2,)),
        "contact": (np.bool_, (1,)), "count": (np.int16, ())}


def episodes(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t = int(rng.integers(1, 30))
        values = {k: rng.normal(size=(t, *shape)) * 50 for k, (_, shape) in KEYS.items()}
        out.append({k: (v > 0 if KEYS[k][0] is np.bool_ else v.astype(KEYS[k][0])) for k, v in values.items()})
    return out


# zarr-python 3 names zarrfeed's own files (manifest, commit log, lock) as not part of the hierarchy
pytestmark = pytest.mark.filterwarnings("ignore:Object at .* is not recognized as a component of a Zarr hierarchy")


def _zarr_python(path) -> zarr.Group:
    return zarr.open_group(str(path), mode="r")


@pytest.mark.parametrize("workers", [0, 2])
def test_zarr_python_reads_the_replay_buffer_zarrfeed_writes_in_v3(tmp_path, workers):
    path = tmp_path / "buffer.zarr"
    eps = episodes(14, seed=1)
    # img: shards of 2 chunks of 16 steps (108 bytes a step), appended in parts; the other keys: more chunks
    with DatasetWriter(path, replay_buffer_schema(KEYS, chunk_rows=16), zarr_format=3, shard_bytes=2 * 16 * 108,
                       workers=workers) as w:
        w.ingest(eps[:9])
    with DatasetWriter(path, mode="a", workers=workers) as w:
        w.ingest(eps[9:])
    doc = json.loads((path / "data" / "img" / "zarr.json").read_text())
    assert doc["zarr_format"] == 3 and doc["codecs"][0]["name"] == "sharding_indexed"
    assert doc["chunk_grid"]["configuration"]["chunk_shape"][0] == 32
    root = _zarr_python(path)
    assert sorted(root.group_keys()) == ["data", "meta"] and sorted(root["data"].array_keys()) == sorted(KEYS)
    ends = zarr.open_array(str(path / "meta" / "episode_ends"), mode="r")
    assert ends.metadata.zarr_format == 3
    assert (ends[:] == np.cumsum([len(e["img"]) for e in eps])).all()
    ds = Dataset.open(path)
    assert ds.validate().ok and ds.verify().ok
    for key, (dtype, shape) in KEYS.items():
        arr = zarr.open_array(str(path / "data" / key), mode="r")
        want = np.concatenate([e[key] for e in eps])
        assert arr.metadata.zarr_format == 3 and arr.dtype == dtype and arr.shape == want.shape, key
        assert (arr[:] == want).all(), key  # written values, copied bytes: equal exactly
        assert (ds.read_rows(key, 0, len(want))[key] == want).all(), key
    with SequenceLoader(path, 4, 1, 2, keys=["state"], shuffle=False, batch_size=4096, num_workers=0) as loader:
        batch = next(iter(loader))
        lo, hi, s0, _ = loader.indices()[0]
    first = eps[0]["state"]
    assert (batch["state"][0] == np.concatenate([np.repeat(first[:1], s0, axis=0), first[lo:hi]])).all()


def test_zarr_python_reads_the_agents_mask_of_a_v3_dataset_from_its_root(tmp_path):
    path = tmp_path / "d.zarr"
    with DatasetWriter(path, workers=0, zarr_format=3, chunks={"agents": 700, "frames": 50}) as w:
        w.ingest(synthetic.episodes(3, seed=2, frames=70))
    ds = Dataset.open(path)
    agents_mask.save(ds, agents_mask.compute(ds, 0.5, workers=0))
    mask, why = agents_mask.load(Dataset.open(path), 0.5)
    assert mask is not None and mask.shape == (ds.rows["agents"], 2) and mask.any(), why
    got = _zarr_python(path)["agents_mask/0.5"]
    assert got.metadata.zarr_format == 3 and got.dtype == np.uint32 and (got[:] == mask).all()


def test_the_real_scene_through_v3_and_back_is_byte_identical(real_scene, tmp_path):
    source = tmp_path / "scene.zarr"
    shutil.copytree(real_scene, source)
    v3, v2 = tmp_path / "scene-v3.zarr", tmp_path / "scene-v2.zarr"
    # shards of one agents chunk (20,000 rows): two shards, the second partly filled
    zarrfeed.convert(source, v3, zarr_format=3, shard_bytes=3 << 20, workers=0)
    zarrfeed.convert(v3, v2, zarr_format=2, workers=0)
    assert (v3 / "zarr.json").exists() and (v2 / ".zgroup").exists()
    agents = json.loads((v3 / "agents" / "zarr.json").read_text())
    assert agents["data_type"]["name"] == "struct" and agents["codecs"][0]["name"] == "sharding_indexed"
    assert sorted(p.name for p in (v3 / "agents" / "c").iterdir()) == ["0", "1"]
    src, there, back = Dataset.open(source), Dataset.open(v3), Dataset.open(v2)
    assert src.rows == there.rows == back.rows == {"scenes": 1, "frames": 248, "agents": 20802,
                                                   "traffic_light_faces": 3216}
    for table in src.tables:
        want = src.read_rows(table, 0, src.rows[table])
        assert there.record_dtype(table) == back.record_dtype(table) == want.dtype, table
        assert there.read_rows(table, 0, there.rows[table]).tobytes() == want.tobytes(), table
        assert there[table][...].tobytes() == want.tobytes(), table
        assert back.read_rows(table, 0, back.rows[table]).tobytes() == want.tobytes(), table
    assert there.validate().ok and there.verify().ok and back.validate().ok


def test_a_step_array_whose_compressor_was_changed_is_refused_naming_its_document(tmp_path):
    path = tmp_path / "buffer.zarr"
    with DatasetWriter(path, replay_buffer_schema(KEYS, chunk_rows=16), zarr_format=3, workers=0) as w:
        w.ingest(episodes(3, seed=4))
    doc_path = path / "data" / "state" / "zarr.json"
    doc = json.loads(doc_path.read_text())
    inner = doc["codecs"][0]["configuration"]["codecs"]
    assert inner[1]["name"] == "blosc"
    inner[1] = {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(zarrfeed.FormatError, match=r"^table 'state': data/state/zarr\.json: it is compressed with "
                                                   r"\{'id': 'zstd'.*, not \{'id': 'blosc'"):
        Dataset.open(path)
