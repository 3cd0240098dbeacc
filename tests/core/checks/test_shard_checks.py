"""Checks on read of a zarr v3 dataset that zarrfeed wrote, as of v2's: an inner chunk of a shard is checked as a
v2 chunk is (its recorded size and XXH3 digest, and its crc32c), on every read (`read_rows`, the loader's
workers, `validate`, `verify`); what is wrong is said in one line naming table and chunk, or for a shard that
cannot be read at all (truncated, its index corrupt), the shard, once."""
import shutil
import subprocess
import sys

import pytest
from formats import array, chunk_bytes, layout, object_file, put_chunk
from zarrfeed.core.errors import ChunkChanged, ChunkError
from zarrfeed.loader import Dataset, Loader, LoaderError
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

# agents: 20 rows (2,320 bytes) an inner chunk, 3 a shard; the other tables more inner chunks a shard
CHUNKS = {"agents": 20, "frames": 4, "scenes": 2, "traffic_light_faces": 10}
EPISODES = [synthetic.episode(i, seed=3, frames=7, agents_per_frame=13) for i in range(6)]
AGENT_CHUNK = 4  # the inner chunk that tests damage: position 1 of shard agents/c/1 (rows 80-100)


def write(path, zarr_format: int) -> None:
    with DatasetWriter(path, workers=0, chunks=CHUNKS, commit_interval=0, **layout(zarr_format, CHUNKS)) as w:
        for i, ep in enumerate(EPISODES):
            w.submit(ep, key=f"e{i}")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    out = {}
    for fmt in (2, 3):
        out[fmt] = tmp_path_factory.mktemp(f"v{fmt}") / "d.zarr"
        write(out[fmt], fmt)
    assert array(out[3], "agents").sharding.inner_per_shard == 3
    return out


@pytest.fixture
def written(sources, tmp_path):
    """A copy of the v3 dataset, for a test to damage."""
    return shutil.copytree(sources[3], tmp_path / "d.zarr")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zarrfeed", *args], capture_output=True, text=True, timeout=300)


def flip(path, table: str = "agents", index: int = AGENT_CHUNK) -> str:
    """Flip one byte inside the stored bytes of inner chunk `index` (its shard's index left as it is): the
    shard is whole, the chunk is not. Returns the chunk's key."""
    raw = chunk_bytes(path, table, index)
    shard = object_file(path, table, index)
    whole = bytearray(shard.read_bytes())
    at = bytes(whole).index(raw) + len(raw) // 2
    whole[at] ^= 0x40
    shard.write_bytes(bytes(whole))
    return array(path, table).chunk_key(index)


def read_all(path, **options) -> None:
    ds = Dataset.open(path, **options)
    ds.read_rows("agents", 0, ds.rows["agents"])


def load_all(path, workers: int, **options) -> None:
    with Loader(path, "agents", batch_size=64, num_workers=workers, seed=0, cache="off", **options) as loader:
        for _ in loader:
            pass


def test_a_flipped_byte_in_an_inner_chunk_is_caught_by_its_digest_and_by_its_crc32c(written):
    key = flip(written)
    assert key == "agents/c/1#1"
    named = rf"table 'agents': chunk '{key}'"
    with pytest.raises(ChunkChanged, match=named + ".* is not the chunk that was committed"):
        read_all(written)
    with pytest.raises(ChunkError, match=named + r" cannot be decoded \(ValueError: crc32c checksum mismatch"):
        read_all(written, verify_chunks=False)  # no digest checked: the crc32c still is
    for workers in (0, 1):
        with pytest.raises((LoaderError, ChunkError), match=named + ".* is not the chunk that was committed"):
            load_all(written, workers)
        with pytest.raises((LoaderError, ChunkError), match=named + ".* crc32c checksum mismatch"):
            load_all(written, workers, verify_chunks=False)
    ds = Dataset.open(written)
    report = ds.validate()
    assert not report.ok and any(named in v.message for v in report.violations), report
    verified = ds.verify()
    assert verified.problems == [f"table 'agents': chunk '{key}' is not the chunk that was committed "
                                 f"{verified.problems[0].split('committed ', 1)[1]}"], verified.problems


@pytest.mark.parametrize("how", ["truncated", "index"])
def test_a_shard_that_cannot_be_read_is_one_line_naming_the_shard(written, how):
    """Truncated, or a byte of its index flipped: the index's crc32c fails. Every chunk of the shard fails alike,
    and `validate` and `verify` say it once (verify reports it, rather than raising)."""
    shard = object_file(written, "agents", AGENT_CHUNK)
    raw = shard.read_bytes()
    if how == "truncated":
        shard.write_bytes(raw[: len(raw) // 2])
    else:
        shard.write_bytes(raw[:-10] + bytes([raw[-10] ^ 0x01]) + raw[-9:])
    said = "table 'agents': shard 'agents/c/1': its index cannot be read"
    with pytest.raises(ChunkError, match=said + ".*the file is truncated or corrupt"):
        read_all(written)
    ds = Dataset.open(written)
    report = ds.validate()
    assert [v.message.split(" (")[0] for v in report.violations] == [said], report
    verified = ds.verify()
    assert len(verified.problems) == 1 and verified.problems[0].startswith(said), verified.problems
    r = cli("load", str(written), "-q")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and said in lines[0], r.stderr


def test_a_chunk_removed_reads_as_missing_naming_its_table(sources, tmp_path, zarr_format):
    """A v2 chunk file deleted, or an inner chunk left out of its shard (the shard's other chunks kept): missing,
    below the committed rows, in one line naming the table and the chunk."""
    path = shutil.copytree(sources[zarr_format], tmp_path / "d.zarr")
    put_chunk(path, "agents", AGENT_CHUNK, None)
    key = array(path, "agents").chunk_key(AGENT_CHUNK)
    with pytest.raises(ChunkError, match=rf"^table 'agents': chunk '{key}' \(rows 80-100\) is missing, below the "):
        read_all(path)
    ds = Dataset.open(path)
    assert [v.message for v in ds.validate().violations] == [
        f"chunk '{key}' (rows 80-100) is missing: it would read as fill values"]
    assert ds.verify().problems == [f"table 'agents': chunk '{key}' is missing"]
    assert chunk_bytes(path, "agents", AGENT_CHUNK + 1) == chunk_bytes(sources[zarr_format], "agents",
                                                                       AGENT_CHUNK + 1)
