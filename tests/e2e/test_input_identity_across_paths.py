"""One identity of an input and of its episodes for every path: a local DatasetWriter, a Dask cluster and the
Flight server. What one path ingested, every other path refuses to ingest again without resume, and resumes
exactly: the dataset ends as one local ingest of the whole input, chunk for chunk."""
import logging
from itertools import chain

import pytest

pytest.importorskip("distributed")

import dask_sources as src  # noqa: E402
from zarrfeed.loader import Dataset  # noqa: E402
from zarrfeed.writer import dask as zdask  # noqa: E402
from zarrfeed.writer.dataset_writer import DatasetWriter  # noqa: E402

from zarrfeed.flight import FeedServer, RemoteWriter  # noqa: E402

SOURCES = list(range(6))
PATHS = ("local", "dask", "server")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False},
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        yield c


def episodes(sources):
    return chain.from_iterable(src.small(s) for s in sources)


def ingest(how: str, path, sources, client, resume: bool = False) -> int:
    """Ingest the episodes of `sources` into the existing dataset at `path` by path `how`; episodes written."""
    if how == "local":
        with DatasetWriter(path, mode="a", workers=1) as w:
            return w.ingest(episodes(sources), resume=resume)["episodes"]
    if how == "dask":
        return zdask.ingest(client, sources, src.small, path, mode="a", resume=resume).episodes
    # the server listens at once; leaving commits and releases the lease
    with FeedServer(path, port=0, workers=1, ingest=True) as server, RemoteWriter(server.url) as w:
        return w.ingest(episodes(sources), resume=resume)


def stored(path) -> dict[str, bytes]:
    ds = Dataset.open(path)
    store = ds.location.store("r")
    out = {k: bytes(store[k]) for k in store.keys()
           if not k.startswith("zarrfeed") and not k.rsplit("/", 1)[-1].startswith(".")}
    out.update({f"{t}/rows": str(ds.rows[t]).encode() for t in ds.tables})
    return out


@pytest.mark.parametrize("first,second", [(a, b) for a in PATHS for b in PATHS if a != b])
def test_an_input_ingested_by_one_path_is_refused_and_resumed_by_another(first, second, client, tmp_path):
    path, local = tmp_path / "d.zarr", tmp_path / "local.zarr"
    for p in (path, local):
        DatasetWriter(p, chunks=src.SMALL, workers=0).close()
    assert ingest(first, path, SOURCES[:3], client) == 7  # an ingest that stopped after 3 sources
    before = stored(path)
    with pytest.raises(ValueError, match="ingested before"):
        ingest(second, path, SOURCES, client)
    assert stored(path) == before  # refused before anything changed
    total = sum(1 for _ in episodes(SOURCES))
    assert ingest(second, path, SOURCES, client, resume=True) == total - 7
    assert ingest(first, path, SOURCES, client, resume=True) == 0  # and back: nothing left for either
    ingest("local", local, SOURCES, client)
    assert stored(path) == stored(local)
    ds = Dataset.open(path)
    assert ds.validate().ok and ds.rows["scenes"] == total
    assert ds.digests() == Dataset.open(local).digests()
