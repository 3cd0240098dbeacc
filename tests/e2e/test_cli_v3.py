"""The commands on zarr v3 datasets, run as real processes: `ingest --zarr-format 3` writes one and `--append`
keeps it v3; `info` says the format and, per table, the rows of a shard and the shards beside the (inner)
chunks, counted from the shards' indexes; `validate` and `validate --deep` find it valid, and name a damaged
inner chunk (`agents/c/1#1`) or shard index. `info` on a v2 dataset is as it was."""
import json

import numpy as np
import pytest
from cli_process import zarrfeed
from expected import expected_tables

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.v3_shard_reads import read_indexes
from zarrfeed.core.zarr_array import Array
from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, synthetic

CHUNKS = {"agents": 700, "frames": 50, "scenes": 3, "traffic_light_faces": 90}
SHARD = 300_000  # 3 agent chunks (700 rows of 116 bytes) a shard


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    """A sharded v3 dataset of 8 agent chunks (the last partly filled) in 3 shards (the last holding 2)."""
    path = tmp_path_factory.mktemp("v3") / "d.zarr"
    with DatasetWriter(path, workers=0, chunks=CHUNKS, zarr_format=3, shard_bytes=SHARD) as w:
        w.ingest(synthetic.episodes(5, seed=2, frames=40, agents_per_frame=26))
    return path


def test_ingest_writes_v3_and_an_append_keeps_it(tmp_path):
    out = tmp_path / "d.zarr"
    first = zarrfeed("ingest", out, "--synthetic", "3", "--zarr-format", "3", "--shard-bytes", "4M", "-q")
    assert first.returncode == 0 and first.stdout.startswith("wrote 3 episodes"), first.stderr
    more = zarrfeed("ingest", out, "--synthetic", "2", "--seed", "1", "--append", "-q")
    assert more.returncode == 0 and "committed: 5 scenes" in more.stdout, more.stderr
    assert (out / "zarr.json").is_file() and not [p for p in out.rglob(".z*") if p.name != ".zarrfeed.lock"]
    for table in ("scenes", "frames", "agents", "traffic_light_faces"):
        array = Array.open(DirectoryStore(out), table)
        assert array.zarr_format == 3 and array.sharding is not None, table
    ds = Dataset.open(out)
    for name, want in expected_tables(list(synthetic.episodes(3)) + list(synthetic.episodes(2, seed=1))).items():
        np.testing.assert_array_equal(ds.read_rows(name, 0, ds.rows[name]), want, err_msg=name)
    assert zarrfeed("validate", out, "-q").returncode == 0


def test_info_says_the_format_and_counts_inner_chunks_and_shards(v3):
    ds = Dataset.open(v3)
    inner = -(-ds.rows["agents"] // 700)
    assert inner == 8  # 3 shards of 3, 3 and 2 chunks: zarr-python 3 would count 3 x 3 = 9
    doc = json.loads(zarrfeed("info", v3, "--json").stdout)
    agents = doc["agents"]
    assert agents["chunks_initialized"] == 8 and agents["shards_initialized"] == 3 and agents["shard_rows"] == 2100
    assert agents["zarr_format"] == 3 and agents["chunk_rows"] == 700
    # bytes stored: what the store holds for the table, its document and its shards
    assert agents["bytes_stored"] == sum(p.stat().st_size for p in (v3 / "agents").rglob("*") if p.is_file())
    assert doc["scenes"]["chunks_initialized"] == 2 and doc["scenes"]["shards_initialized"] == 1
    text = zarrfeed("info", v3)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"{v3} (l5kit, zarr v3)"
    assert lines[1].split() == ["table", "rows", "chunk", "rows", "chunks", "shard", "rows", "shards", "bytes",
                                "stored", "ratio"]
    row = next(line for line in lines if line.startswith("agents "))
    assert row.split()[1:6] == [f"{ds.rows['agents']:,}", "700", "8", "2,100", "3"]


def test_info_on_v2_is_as_it_was(real_scene):
    out = zarrfeed("info", real_scene)
    lines = out.stdout.splitlines()
    assert lines[0] == f"{real_scene} (l5kit)"
    assert lines[1] == f"{'table':<22}{'rows':>14}{'chunk rows':>12}{'chunks':>8}{'bytes':>12}{'stored':>12}" \
                       f"{'ratio':>7}"
    assert lines[5].split()[:4] == ["agents", "20,802", "20,000", "2"]
    doc = json.loads(zarrfeed("info", real_scene, "--json").stdout)
    assert all(set(t) == {"rows", "dtype", "chunk_rows", "chunks_initialized", "bytes", "bytes_stored", "ratio"}
               for t in doc.values())


def test_validate_and_validate_deep_find_v3_valid(v3):
    ok = zarrfeed("validate", v3, "-q")
    assert ok.returncode == 0 and ok.stdout.startswith(f"{v3}: valid ("), ok.stdout
    deep = zarrfeed("validate", v3, "--deep", "-q")
    chunks = sum(-(-n // CHUNKS[t]) for t, n in Dataset.open(v3).rows.items())
    assert deep.returncode == 0 and f"{chunks} chunks match their recorded digests" in deep.stdout, deep.stdout


def _damaged(v3, tmp_path, where: str):
    """A copy of `v3` with one byte flipped: in agents' inner chunk 4 (shard 1, position 1), or in shard 1's
    index."""
    import shutil

    copy = tmp_path / "d.zarr"
    shutil.copytree(v3, copy)
    shard = copy / "agents" / "c" / "1"
    array = Array.open(DirectoryStore(copy), "agents")
    offset, nbytes = (int(v) for v in read_indexes(array.store, array.sharding, ["agents/c/1"])["agents/c/1"][1])
    data = bytearray(shard.read_bytes())
    data[offset + nbytes // 2 if where == "chunk" else -12] ^= 0xFF
    shard.write_bytes(bytes(data))
    return copy


def test_a_damaged_inner_chunk_is_named(v3, tmp_path):
    copy = _damaged(v3, tmp_path, "chunk")
    for args in (["validate", copy, "-q"], ["validate", copy, "--deep", "-q"]):
        r = zarrfeed(*args)
        assert r.returncode == 1 and "INVALID" in r.stdout, (args, r.stdout, r.stderr)
        assert "table 'agents': chunk 'agents/c/1#1' cannot be decoded" in r.stdout and "crc32c" in r.stdout, r.stdout
    deep = zarrfeed("validate", copy, "--deep", "-q").stdout
    assert "1 chunk differs from what was committed" in deep


def test_a_damaged_shard_index_is_invalid_not_unreadable(v3, tmp_path):
    """`validate --deep` stopped at the first shard whose index did not read (exit 2, "unreadable"), and `info`
    failed on it: the one reports it among the chunks that differ (exit 1), the other shows what it can."""
    copy = _damaged(v3, tmp_path, "index")
    said = "shard 'agents/c/1': its index cannot be read (shard index: crc32c checksum mismatch"
    for args in (["validate", copy, "-q"], ["validate", copy, "--deep", "-q"]):
        r = zarrfeed(*args)
        assert r.returncode == 1 and said in r.stdout, (args, r.stdout, r.stderr)
    info = zarrfeed("info", copy, "--json")
    assert info.returncode == 0, info.stderr
    doc = json.loads(info.stdout)
    assert doc["agents"]["chunks_initialized"] is None and doc["agents"]["shards_initialized"] == 3
    row = next(line for line in zarrfeed("info", copy).stdout.splitlines() if line.startswith("agents "))
    assert row.split()[3] == "?"
