"""Every read checks each chunk against the size and digest its commit recorded.

With the chunk files `agents/3` and `agents/4` swapped (or one byte of `agents/3` flipped so that it still
decodes), a Loader (cache off, process, host), `to_arrow`, `zarrfeed load`, `zarrfeed export`, the window and
sample loaders, the agents mask and a served stream each refuse the chunk instead of giving rows that are not
the rows they claim to be.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import numcodecs
import numpy as np
import pytest
from expected import expected_tables
from zarrfeed.loader import AgentSampleLoader, Dataset, EgoSampleLoader, Loader, LoaderError, WindowLoader
from zarrfeed.loader.kinds import agents_mask
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

from zarrfeed.core.chunks import ChunkError

SMALL = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}
NAMED = r"chunk '(agents|frames)/\d+' .*(is not the chunk that was committed|another dataset was put in its place)"


def episodes(n: int, seed: int) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=40, agents_per_frame=40))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zarrfeed", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def written(tmp_path):
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=SMALL) as w:
        w.ingest(episodes(6, seed=0))
    return out


def decoded(raw: bytes) -> bytes:
    return numcodecs.Blosc().decode(raw)


def damage(path, how: str, table: str = "agents", a: int = 3, b: int = 4) -> None:
    """Swap two chunk files of `table`, or flip one byte of chunk `a` where it still decodes, to other rows."""
    first, second = path / table / str(a), path / table / str(b)
    if how == "swap":
        x, y = first.read_bytes(), second.read_bytes()
        first.write_bytes(y)
        second.write_bytes(x)
        return
    raw = first.read_bytes()
    for at in range(len(raw) // 2, len(raw)):  # a byte whose change decodes to other values (no decode error)
        flipped = bytearray(raw)
        flipped[at] ^= 0x01
        try:
            if decoded(bytes(flipped)) != decoded(raw):
                first.write_bytes(bytes(flipped))
                return
        except Exception:
            continue
    raise AssertionError("no byte of the chunk changes its rows and still decodes")


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r
    lines = [line for line in r.stderr.strip().splitlines() if line.startswith("zarrfeed: error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("how", ["swap", "flip"])
@pytest.mark.parametrize("cache, workers", [("off", 1), ("process", 1), ("host", 1), ("off", 0)])
def test_a_loader_raises_naming_the_chunk_on_every_cache(written, how, cache, workers):
    damage(written, how)
    t0 = time.monotonic()
    with pytest.raises(LoaderError, match=NAMED) as err:
        with Loader(written, "agents", batch_size=500, num_workers=workers, cache=cache, copy=True) as loader:
            for _ in loader:
                pass
    assert "agents/3" in str(err.value) or "agents/4" in str(err.value)
    assert str(written) in str(err.value) and len(str(err.value).splitlines()) == 1
    assert isinstance(err.value.__cause__, ChunkError)
    assert time.monotonic() - t0 < 120  # it reached the loop (no hang); a generous bound for a busy machine


@pytest.mark.parametrize("how", ["swap", "flip"])
def test_to_arrow_and_read_rows_raise(written, how):
    damage(written, how)
    ds = Dataset.open(written)
    with pytest.raises(ChunkError, match=NAMED):
        ds.to_arrow("agents")
    with pytest.raises(ChunkError, match="chunk 'agents/3'"):
        ds.read_rows("agents", 3 * 2000 + 5, 3 * 2000 + 10)
    with pytest.raises(ChunkError, match="chunk 'agents/3'"):
        ds.read_coordinates("agents", np.array([3 * 2000 + 7]))


@pytest.mark.parametrize("args", [["load", "--workers", "1"], ["export", "OUT"], ["export", "OUT.arrow", "--format",
                                  "arrow", "--tables", "agents"], ["mask", "--workers", "0"]])
def test_the_cli_refuses_in_one_line(written, tmp_path, args):
    damage(written, "swap")
    args = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    r = cli(args[0], str(written), *args[1:], *(["-q"] if args[0] != "mask" else []))
    assert "agents/3" in one_line_error(r) or "agents/4" in one_line_error(r), r.stderr
    if args[0] == "export" and "arrow" not in args:
        assert not list((tmp_path / "out").rglob("*.parquet"))  # nothing half-written


def test_no_verify_reads_as_before(written, tmp_path):
    """The opt-out: the swapped rows are read as data, with no error (what it gives up)."""
    damage(written, "swap")
    r = cli("load", str(written), "--workers", "1", "--no-verify", "-q")
    assert r.returncode == 0, r.stderr
    ds = Dataset.open(written, verify_chunks=False)
    got = ds.to_arrow("agents").column("track_id").to_numpy()
    want = expected_tables(episodes(6, seed=0))["agents"]["track_id"]
    assert len(got) == len(want) and not np.array_equal(got, want)
    with Loader(written, "agents", batch_size=500, num_workers=1, verify_chunks=False, copy=True) as loader:
        assert sum(len(b["track_id"]) for b in loader) == len(want)
    with Loader(Dataset.open(written), "agents", batch_size=500, num_workers=1, verify_chunks=False) as loader:
        assert sum(len(b["track_id"]) for b in loader) == len(want)


def test_window_and_sample_loaders_raise(written):
    damage(written, "swap")  # agents: read by the workers
    for make in (lambda: WindowLoader(written, 2, 3, batch_size=64, num_workers=1, cache="off"),
                 lambda: AgentSampleLoader(written, 2, 3, rows=np.arange(9000), batch_size=64, num_workers=1)):
        with pytest.raises(LoaderError, match=NAMED):
            with make() as loader:
                for _ in loader:
                    pass
    with pytest.raises(ChunkError, match=NAMED):  # the mask is computed from the agents
        agents_mask.compute(Dataset.open(written), workers=2)
    damage(written, "swap", "frames", 0, 1)  # frames: read when the samples are made, then by the workers
    with pytest.raises(ChunkError, match=r"chunk 'frames/[01]'"):
        EgoSampleLoader(written, 2, 3, batch_size=64, num_workers=1)


def test_export_with_worker_processes_and_dask_raise(written, tmp_path):
    from zarrfeed.loader.parquet_export import export_parquet

    damage(written, "flip")
    ds = Dataset.open(written)
    with pytest.raises(ChunkError, match="chunk 'agents/3'"):
        export_parquet(ds, tmp_path / "out", ["agents"], workers=2, file_rows=2000)
    assert not list((tmp_path / "out").rglob("*.parquet"))
    with pytest.raises(ChunkError, match="chunk 'agents/3'"):
        ds.to_dask("agents", chunks_per_partition=1).compute(scheduler="processes", num_workers=2)


def test_a_zip_and_an_object_store_are_checked(written, tmp_path, s3):
    import zipfile

    damage(written, "swap")
    zipped = tmp_path / "d.zip"
    with zipfile.ZipFile(zipped, "w", compression=zipfile.ZIP_STORED) as z:
        for p in written.rglob("*"):
            if p.is_file():
                z.write(p, p.relative_to(written).as_posix())
    with pytest.raises(ChunkError, match=NAMED):
        Dataset.open(zipped).to_arrow("agents")
    bucket, server = s3
    url = f"{bucket}/d.zarr"
    server.fs().put(str(written), url, recursive=True)
    with pytest.raises(LoaderError, match=NAMED):
        with Loader(url, "agents", batch_size=500, num_workers=1, storage_options=server.options) as loader:
            for _ in loader:
                pass
    with pytest.raises(LoaderError, match=NAMED):  # with a disk cache: what is fetched is checked as it is kept
        with Loader(url, "agents", batch_size=500, num_workers=1, storage_options=server.options,
                    cache_dir=tmp_path / "cache") as loader:
            for _ in loader:
                pass


def test_a_served_stream_ends_with_the_one_line(written):
    from zarrfeed.flight import FeedServer, RemoteLoader

    damage(written, "swap")
    with FeedServer(written, port=0, workers=1) as server:
        with RemoteLoader(server.url, "agents", batch_size=500, reconnect_timeout=0) as remote:
            with pytest.raises(LoaderError, match=NAMED):
                for _ in remote:
                    pass


# ------------------------------------------------------------------ the last chunk, which writers rewrite


def last_chunk(path, table: str = "agents") -> int:
    return max(int(p.name) for p in (path / table).iterdir() if p.name.isdigit())


def test_a_reader_goes_on_while_a_writer_rewrites_the_last_chunk(written):
    """No false alarm: the last chunk, recorded when the reader opened, is rewritten by an append; the reader's
    rows in it are unchanged and read (checked against the latest record once the writer seals it, and
    unchecked while the writer is in it)."""
    ds = Dataset.open(written)
    want = expected_tables(episodes(6, seed=0))["agents"]
    assert ds.check is not None and ds.check.tail("agents", last_chunk(written))
    with DatasetWriter(written, workers=0, mode="a") as w:
        w.ingest(episodes(2, seed=1))
        w.sync()  # the last chunk rewritten, its record withdrawn while the writer is open
        np.testing.assert_array_equal(ds.read_rows("agents", 0, ds.rows["agents"]), want)
    np.testing.assert_array_equal(ds.read_rows("agents", 0, ds.rows["agents"]), want)  # sealed again, other bytes
    with Loader(ds, "agents", batch_size=500, num_workers=1, cache="off", shuffle=False, copy=True) as loader:
        np.testing.assert_array_equal(np.concatenate([b["track_id"] for b in loader]), want["track_id"])
    opened = Dataset.open(written, commit=ds.commit)  # an older commit, opened now: its last chunk is full now
    np.testing.assert_array_equal(opened.read_rows("agents", 0, ds.rows["agents"]), want)


def test_a_changed_last_chunk_is_refused(written):
    """A committed row of the last, partly filled chunk changed (it still decodes): refused. The rows past the
    committed ones are no commit's (a later append's, in a copy taken while it ran): a change there is read."""
    ds = Dataset.open(written)
    tail = last_chunk(written)
    path, n = written / "agents" / str(tail), ds.rows["agents"] - tail * 2000
    rows = np.frombuffer(decoded(path.read_bytes()), ds["agents"].dtype).copy()
    rows["track_id"][n:] += 1  # past the committed rows
    path.write_bytes(numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE).encode(rows))
    np.testing.assert_array_equal(ds.read_rows("agents", tail * 2000, ds.rows["agents"]),
                                  expected_tables(episodes(6, seed=0))["agents"][tail * 2000:])
    rows["track_id"][n - 1] += 1  # a committed row
    path.write_bytes(numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE).encode(rows))
    with pytest.raises(ChunkError, match=f"chunk 'agents/{tail}' .* is not the chunk that was committed"):
        ds.read_rows("agents", tail * 2000, ds.rows["agents"])


def test_a_last_chunk_with_no_record_is_read_only_from_the_dataset_opened(tmp_path):
    """While a writer is in it, the last chunk has no record; another dataset moved into place is told apart
    by its manifest (before, its rows were read as the opened dataset's)."""
    path, other = tmp_path / "d.zarr", tmp_path / "other.zarr"
    with DatasetWriter(other, workers=0, chunks=SMALL) as w:
        w.ingest(episodes(7, seed=3))
    with DatasetWriter(path, workers=0, chunks=SMALL) as w:
        w.ingest(episodes(6, seed=0))
        w.sync()
        ds = Dataset.open(path)
        tail = last_chunk(path)
        assert tail not in ds.check.records["agents"]  # unsealed
        np.testing.assert_array_equal(ds.read_rows("agents", tail * 2000, ds.rows["agents"]),
                                      expected_tables(episodes(6, seed=0))["agents"][tail * 2000:])
        os.rename(path, tmp_path / "old.zarr")
        os.rename(other, path)
        with pytest.raises(ChunkError, match=f"chunk 'agents/{tail}' .* another dataset was put in its place"):
            ds.read_rows("agents", tail * 2000, ds.rows["agents"])
        os.rename(path, other)
        os.rename(tmp_path / "old.zarr", path)


def test_a_dataset_replaced_after_it_was_opened_is_refused(written, tmp_path):
    """The manifest the reader opened is replaced: new chunks are never read against the old records."""
    other = tmp_path / "other.zarr"
    with DatasetWriter(other, workers=0, chunks=SMALL) as w:
        w.ingest(episodes(6, seed=5))
    ds = Dataset.open(written)
    shutil.rmtree(written)
    os.rename(other, written)
    with pytest.raises(ChunkError, match=NAMED):
        ds.to_arrow("agents")
    with pytest.raises(LoaderError, match=NAMED):
        with Loader(ds, "agents", batch_size=500, num_workers=1, cache="off") as loader:
            for _ in loader:
                pass


# ------------------------------------------------------------------ item 5: a dataset replaced under an open loader

CHUNKS = "agents=5000,frames=250,scenes=4,traffic_light_faces=2000"


@pytest.fixture(scope="module")
def twelve(tmp_path_factory):
    """12 synthetic scenes written by `zarrfeed ingest` (seed 0), another 12 (seed 1), and the rows of the first."""
    root = tmp_path_factory.mktemp("twelve")
    for seed in (0, 1):
        r = cli("ingest", str(root / f"seed{seed}.zarr"), "--synthetic", "12", "--seed", str(seed),
                "--chunks", CHUNKS, "--workers", "0", "-q")
        assert r.returncode == 0, r.stderr
    return root, expected_tables(list(synthetic.episodes(12, seed=0)))["agents"]


@pytest.mark.parametrize("cache", ["host", "off"])
@pytest.mark.parametrize("how", ["ingest --overwrite", "mv another", "mv a copy"])
def test_a_dataset_replaced_under_an_open_loader(twelve, tmp_path, how, cache):
    """Item 5: after the loader's first batch another process replaces the dataset. Before, 39-49 later
    batches held the replacement's rows under the old `_row` ids, exit 0. Now the loader raises, naming the
    chunk; a replacement whose chunks are bytewise the same (a copy) is read as it is: the same rows."""
    root, want = twelve
    path = tmp_path / "d.zarr"
    shutil.copytree(root / "seed0.zarr", path)
    if how == "mv another":
        shutil.copytree(root / "seed1.zarr", tmp_path / "other.zarr")
    elif how == "mv a copy":
        shutil.copytree(path, tmp_path / "other.zarr")
    read = 0
    with Loader(path, "agents", batch_size=512, shuffle_window=2, seed=3, num_workers=1, cache=cache,
                row_ids=True) as loader:
        batches = iter(loader)
        try:
            for k, batch in enumerate(batches):
                rows = batch["_row"]
                np.testing.assert_array_equal(batch["track_id"], want["track_id"][rows])
                np.testing.assert_array_equal(batch["centroid"], want["centroid"][rows])
                read += len(rows)
                if k == 0:
                    if how == "ingest --overwrite":
                        r = cli("ingest", str(path), "--synthetic", "12", "--seed", "1", "--overwrite",
                                "--chunks", CHUNKS, "--workers", "0", "-q")
                        assert r.returncode == 0, r.stderr
                    else:  # the workers held still: no read falls between the two moves (none finds nothing)
                        for pid in loader.worker_pids:
                            os.kill(pid, signal.SIGSTOP)
                        try:
                            for a, b in ((path, tmp_path / "old.zarr"), (tmp_path / "other.zarr", path)):
                                subprocess.run(["mv", str(a), str(b)], check=True)
                        finally:
                            for pid in loader.worker_pids:
                                os.kill(pid, signal.SIGCONT)
        except LoaderError as exc:
            assert how != "mv a copy", exc
            assert len(str(exc).splitlines()) == 1 and str(path) in str(exc), exc
            assert "another dataset was put in its place" in str(exc) or \
                "is not the chunk that was committed" in str(exc), exc
            return
    assert how == "mv a copy" and read == len(want)  # every row, each the one its id names


def test_a_server_serves_the_dataset_put_in_its_place_to_new_trainers(tmp_path):
    """The server's next trainers read the dataset put in its place. Before, what it kept of the one before
    for the same commit number was used again: the loader parked for a next epoch served the old rows (9,623
    rows, the old ones, to a trainer told the new dataset's id), or the kept Dataset failed every stream."""
    from zarrfeed.flight import FeedServer, RemoteLoader

    path, other = tmp_path / "d.zarr", tmp_path / "other.zarr"
    for where, seed in ((path, 0), (other, 5)):
        with DatasetWriter(where, workers=0, chunks=SMALL) as w:
            w.ingest(episodes(6, seed=seed))
    assert Dataset.open(path).commit == Dataset.open(other).commit
    with FeedServer(path, port=0, workers=1) as server:
        with RemoteLoader(server.url, "agents", batch_size=500, shuffle=False, reconnect_timeout=0) as remote:
            next(iter(remote))
        shutil.rmtree(path)
        os.rename(other, path)
        with RemoteLoader(server.url, "agents", batch_size=500, shuffle=False, reconnect_timeout=0) as remote:
            got = np.concatenate([b["track_id"] for b in remote])
    np.testing.assert_array_equal(got, expected_tables(episodes(6, seed=5))["agents"]["track_id"])
