"""Below the committed rows a missing chunk is a lost one, never zeros. Every reader (the Loader, WindowLoader,
the Arrow bridge, Parquet export, `to_dask`, `ingest --from`, the server) refuses it with one line naming the
table and the chunk, and writes nothing."""
import os
import subprocess
import sys

import numpy as np
import pytest
from zarrfeed.loader import Dataset, Loader, WindowLoader, export_parquet
from zarrfeed.loader.loader import LoaderError
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

from zarrfeed.core.chunks import ChunkError

SMALL = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}


@pytest.fixture
def holed(tmp_path):
    """A dataset of 6 scenes whose chunk agents/3 and frames/2 are deleted."""
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=SMALL) as w:
        w.ingest(synthetic.episodes(6, seed=0, frames=40, agents_per_frame=40))
    assert Dataset.open(out).rows["agents"] > 4 * 2000
    os.unlink(out / "agents" / "3")
    return out


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zarrfeed", *args], capture_output=True, text=True, timeout=120)


def one_line_naming_the_chunk(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "chunk 'agents/3'" in r.stderr and "missing" in r.stderr, r.stderr


def test_the_cli_refuses_a_missing_chunk_in_load_export_and_ingest_from(holed, tmp_path):
    one_line_naming_the_chunk(cli("load", str(holed), "-q"))
    one_line_naming_the_chunk(cli("export", str(holed), str(tmp_path / "pq"), "-q"))
    assert not (tmp_path / "pq").exists()
    one_line_naming_the_chunk(cli("ingest", str(tmp_path / "c.zarr"), "--from", str(holed), "-q"))
    assert not (tmp_path / "c.zarr").exists()
    r = cli("validate", str(holed), "-q")
    assert r.returncode == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_refuses_a_missing_chunk(holed, workers):
    with Loader(Dataset.open(holed), "agents", batch_size=1000, num_workers=workers, seed=0) as loader:
        with pytest.raises((ChunkError, LoaderError), match=r"chunk 'agents/3' \(rows 6,000-8,000\) is missing"):
            for _ in loader:
                pass


def test_windows_refuse_a_missing_chunk(holed):
    with WindowLoader(Dataset.open(holed), history=2, future=2, batch_size=8, num_workers=0, seed=0) as windows:
        with pytest.raises((ChunkError, LoaderError), match=r"chunk 'agents/3'.* is missing"):
            for _ in windows:
                pass


def test_arrow_parquet_and_dask_refuse_a_missing_chunk(holed, tmp_path):
    ds = Dataset.open(holed)
    with pytest.raises(ChunkError, match=r"chunk 'agents/3'.* is missing"):
        ds.to_arrow("agents")
    with pytest.raises(ChunkError, match=r"chunk 'agents/3'.* is missing"):
        ds.to_batches("frames", join={"agents": "agent_index_interval"}).read_all()
    with pytest.raises(Exception, match=r"chunk 'agents/3'.* is missing"):
        export_parquet(ds, tmp_path / "pq", workers=0)
    with pytest.raises(ChunkError, match=r"chunk 'agents/3'.* is missing"):
        ds.to_dask("agents").compute(scheduler="sync")
    assert np.array_equal(ds.to_arrow("frames").num_rows, ds.rows["frames"])  # other tables still read


def test_a_served_loader_refuses_a_missing_chunk(holed):
    from zarrfeed.flight import FeedServer, RemoteLoader

    with FeedServer(str(holed), port=0, workers=1) as server:
        with RemoteLoader(server.url, "agents", batch_size=1000, seed=0) as loader:
            with pytest.raises(Exception, match=r"chunk 'agents/3'.* is missing"):
                for _ in loader:
                    pass
