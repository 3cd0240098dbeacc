"""Diffusion Policy's replay buffer copied to zarr v3 by zarr-python 3 (unsharded; sharded; sharded with its images
compressed by blosc) is the same dataset as the v2 buffer it came from: `Dataset.open`, `validate`,
`export_parquet` and `SequenceLoader` give exactly what they give on the v2 buffer (the same batches for the same
seed), and the samples Diffusion Policy's own `SequenceSampler` gave on it."""
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr
from zarr.codecs import BloscCodec
from zarrfeed import SequenceLoader
from zarrfeed.loader import Dataset, export_parquet

KEYS = ["action", "img", "keypoint", "n_contacts", "state"]
# name -> (rows of a shard (None: unsharded), the images' compressor (None: zarr 3's default, zstd))
COPIES = {"unsharded": (None, None), "sharded": (1000, None),
          "sharded-blosc-images": (1000, BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"))}


def copy_to_v3(source, out, shard_rows: int | None, img_codec) -> None:
    """The v2 buffer at `source` written again by zarr-python 3 in its default format, v3: same chunks."""
    src = zarr.open_group(str(source), mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root = zarr.open_group(str(out), mode="w")
        for key, arr in src["data"].arrays():
            options = {"shards": (shard_rows, *arr.shape[1:])} if shard_rows else {}
            if key == "img" and img_codec is not None:
                options["compressors"] = img_codec
            root.create_array(f"data/{key}", shape=arr.shape, dtype=arr.dtype, chunks=arr.chunks, **options)[:] = \
                arr[:]
        ends = src["meta/episode_ends"]
        root.create_array("meta/episode_ends", shape=ends.shape, dtype=ends.dtype, chunks=ends.chunks)[:] = ends[:]


@pytest.fixture(scope="module")
def v3_copies(dp_buffer, tmp_path_factory):
    """name -> the v3 copy of Diffusion Policy's buffer (read them, do not change them)."""
    out = {}
    for name, (shard_rows, img_codec) in COPIES.items():
        out[name] = tmp_path_factory.mktemp("v3") / f"{name}.zarr"
        copy_to_v3(dp_buffer, out[name], shard_rows, img_codec)
    doc = zarr.open_array(str(out["sharded-blosc-images"] / "data" / "img"), mode="r").metadata.to_dict()
    inner = doc["codecs"][0]["configuration"]["codecs"]
    assert doc["zarr_format"] == 3 and doc["codecs"][0]["name"] == "sharding_indexed" and inner[1]["name"] == "blosc"
    return out


@pytest.mark.parametrize("name", COPIES)
def test_it_opens_validates_and_exports_as_the_v2_buffer(dp_buffer, v3_copies, tmp_path, name):
    v2, v3 = Dataset.open(dp_buffer), Dataset.open(v3_copies[name])
    assert list(v3.tables) == list(v2.tables) and v3.rows == v2.rows
    assert v3.schema.step_tables() == v2.schema.step_tables() == KEYS
    for table in v2.tables:
        assert v3.record_dtype(table) == v2.record_dtype(table), table
        want = v2.read_rows(table, 0, v2.rows[table])
        assert v3.read_rows(table, 0, v3.rows[table]).tobytes() == want.tobytes(), table
        assert v3[table][...].tobytes() == want.tobytes(), table
    steps = v3.read_rows("steps", 240, 1260)  # every key at once, across chunks and shards
    assert steps.tobytes() == v2.read_rows("steps", 240, 1260).tobytes()
    assert str(v3.validate()) == str(v2.validate()) == "valid"
    for label, ds in (("v2", v2), ("v3", v3)):
        export_parquet(ds, tmp_path / label, workers=0, file_rows=2000)
    for table in ("episodes", "steps"):
        got, want = (pq.read_table(tmp_path / label / table) for label in ("v3", "v2"))
        assert got.equals(want), table  # the rows; the files' metadata name each buffer's own compressor


def _epoch(loader) -> list[dict[str, np.ndarray]]:
    return [{k: np.array(v) for k, v in batch.items()} for batch in loader]


def test_sequence_loader_gives_the_v2_buffers_batches_for_the_same_seed(dp_buffer, v3_copies):
    options = dict(keys=["img", "action"], batch_size=512, seed=9, num_workers=1, shuffle_window=3)
    with SequenceLoader(dp_buffer, 16, 1, 7, **options) as loader:
        want = _epoch(loader)
    for name in ("unsharded", "sharded-blosc-images"):
        with SequenceLoader(v3_copies[name], 16, 1, 7, **options) as loader:
            got = _epoch(loader)
        assert len(got) == len(want) == 12, name
        for a, b in zip(got, want, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), (name, k)


@pytest.mark.parametrize("name,workers", [("sharded", 0), ("sharded-blosc-images", 2)])
def test_samples_equal_diffusion_policys(v3_copies, dp_samples, name, workers):
    episodes = ~dp_samples["val_mask"]
    with SequenceLoader(v3_copies[name], 16, 1, 7, episodes=episodes, shuffle=False, batch_size=1000,
                        num_workers=workers) as loader:
        indices = dp_samples["train/indices"]
        assert (loader.indices() == indices).all()
        got = {k: np.concatenate([b[k] for b in _epoch(loader)]) for k in ["sample", *KEYS]}
    assert (got["sample"] == np.arange(len(indices))).all()
    for key in KEYS:
        want = dp_samples[f"train/{key}"]
        assert got[key].dtype == want.dtype and got[key].shape == want.shape and (got[key] == want).all(), key
