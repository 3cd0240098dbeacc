"""Fixtures of the `zarrfeed serve` tests: a small dataset, a server process serving it, a dataset to ingest into."""
import pytest
from serve_process import TRANSFORMS, Server
from zarrfeed.writer import synthetic, write_dataset


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(3, 9, chunks={"agents": 900}, frames=60, agents_per_frame=40)


@pytest.fixture(scope="module")
def server(data):
    s = Server(data, "--transforms", str(TRANSFORMS))
    yield s
    s.stop()


@pytest.fixture
def target(tmp_path):
    """A dataset holding one episode, to ingest into."""
    path = tmp_path / "t.zarr"
    write_dataset(path, synthetic.episodes(1, seed=100, frames=30, agents_per_frame=20), workers=0)
    return path
