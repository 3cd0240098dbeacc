"""Sharded zarr v3 datasets on an S3-compatible object store: a real moto server on 127.0.0.1, started here with
its request recorder on, so that the tests see the requests the readers send.

A v3 dataset is written by `DatasetWriter`, read by `Dataset.open`, `read_rows`, a `Loader` with two worker
processes and `validate`. Inner chunks are read by range requests: a shard's index by a suffix range
(`bytes=-N`, no request for the object's size), then only the chunks asked for. The fetcher's retries and its
disk cache (`cache_dir`) work for inner chunks. Requests per epoch are compared with v2's only as a sanity bound
(no more GETs), never timed.
"""
import signal
import threading

import numpy as np
import pytest
from expected import expected_tables
from s3server import S3Server

from zarrfeed.core.errors import ChunkError
from zarrfeed.loader import Dataset, Loader
from zarrfeed.loader.engine.fetch import ChunkFetcher, ChunkRef, FetchOptions
from zarrfeed.writer import DatasetWriter, synthetic

SMALL = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}
SHARD = 1 << 20  # 4 agent chunks (2000 rows of 116 bytes) a shard
EPISODES = list(synthetic.episodes(12, seed=1, frames=40, agents_per_frame=50))  # 24,048 agents: 13 chunks


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A moto server of this module's own, recording requests to a file outside the repository."""
    s = S3Server(recording=str(tmp_path_factory.mktemp("moto") / "requests.jsonl"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def datasets(server):
    """The same episodes in v2 and in sharded v3 on the server: {2: url, 3: url}."""
    bucket = server.bucket()
    urls = {}
    for fmt in (2, 3):
        urls[fmt] = f"{bucket}/d{fmt}.zarr"
        with DatasetWriter(urls[fmt], workers=2, chunks=SMALL, zarr_format=fmt, shard_bytes=SHARD if fmt == 3 else None,
                           storage_options=server.options) as w:
            w.ingest(EPISODES)
    return urls


def test_a_v3_dataset_is_written_read_loaded_and_validated_on_s3(server, datasets):
    url = datasets[3]
    objects = server.fs().ls(f"{url}/agents/c", detail=False)
    assert len(objects) == 4  # 13 inner chunks in 4 shards
    ds = Dataset.open(url, storage_options=server.options)
    assert ds["agents"].sharding is not None and ds["agents"].chunks == (2000,)
    want = expected_tables(EPISODES)
    for name, rows in want.items():
        np.testing.assert_array_equal(ds.read_rows(name, 0, ds.rows[name]), rows, err_msg=name)
    np.testing.assert_array_equal(ds.read_rows("agents", 3990, 6010), want["agents"][3990:6010])  # across 2 shards
    with Loader(url, "agents", batch_size=1000, shuffle=False, num_workers=2, storage_options=server.options,
                copy=True) as loader:
        got = np.concatenate([b["track_id"] for b in loader])
    np.testing.assert_array_equal(got, want["agents"]["track_id"])
    assert ds.validate().ok
    verified = ds.verify()
    assert verified.ok and verified.all_verified and verified.verified == sum(
        -(-len(rows) // SMALL[name]) for name, rows in want.items())


def test_inner_chunks_are_read_by_range_requests_the_index_by_a_suffix(server, datasets):
    ds = Dataset.open(datasets[3], storage_options=server.options)
    spec = ds["agents"].sharding
    prefix = datasets[3].removeprefix("s3:/") + "/agents/c/"
    with server.requests() as seen:
        rows = ds.read_rows("agents", 2000, 4500)  # inner chunks 1 and 2 of shard 0
    np.testing.assert_array_equal(rows, expected_tables(EPISODES)["agents"][2000:4500])
    shard = [(method, rng) for method, path, rng in seen if path.startswith(prefix)]
    assert ("GET", f"bytes=-{spec.index_nbytes}") in shard  # the index: a suffix range, no HEAD for its size
    assert all(method == "GET" and rng for method, rng in shard), shard  # never a whole shard, never a HEAD
    assert len(shard) == 2, shard  # the index, then both chunks by one range (they lie side by side)


def _gets(seen, prefix: str) -> int:
    return sum(1 for method, path, _ in seen if method == "GET" and path.startswith(prefix))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_of_v3_sends_no_more_gets_than_v2(server, datasets, workers):
    """A sanity bound, not a measure: the same rows, the same chunks; v3 reads each shard's index before its
    chunks, and reads the chunks of one shard together."""
    counts = {}
    for fmt, url in datasets.items():
        with server.requests() as seen:
            with Loader(url, "agents", batch_size=512, num_workers=workers, storage_options=server.options,
                        cache_bytes=0) as loader:
                assert sum(len(b["track_id"]) for b in loader) == len(expected_tables(EPISODES)["agents"])
        counts[fmt] = (_gets(seen, url.removeprefix("s3:/") + "/agents/"), _gets(seen, "/"))
        if fmt == 3:  # the workers too read inner chunks by ranges only
            shards = [(method, rng) for method, path, rng in seen if "/agents/c/" in path]
            assert shards and all(method == "GET" and rng for method, rng in shards), shards
    assert counts[3][0] <= counts[2][0] and counts[3][1] <= counts[2][1], counts


def test_the_disk_cache_holds_inner_chunks(server, datasets, tmp_path):
    """Epoch 2 reads the sealed inner chunks from `cache_dir`: with their shards gone from the store, and no
    request for them."""
    bucket = datasets[3].rsplit("/", 1)[0]
    url = f"{bucket}/cached.zarr"
    with DatasetWriter(url, workers=0, chunks=SMALL, zarr_format=3, shard_bytes=SHARD,
                       storage_options=server.options) as w:
        w.ingest(EPISODES)
    cache = tmp_path / "cache"
    with Loader(url, "agents", batch_size=1000, num_workers=2, storage_options=server.options, cache_dir=cache,
                cache_bytes=0, copy=True) as loader:  # (no decoded chunks kept in memory: epoch 2 fetches again)
        first = [b["centroid"] for b in loader]
        complete = loader.dataset.rows["agents"] // SMALL["agents"]
        assert len(list(cache.glob("*.chunk"))) == complete == 12  # not the last, partly filled one
        for shard in range(3):  # shards 0-2 hold inner chunks 0-11, all cached
            server.fs().rm(f"{url}/agents/c/{shard}")
        loader.set_epoch(0)
        with server.requests() as seen:
            again = [b["centroid"] for b in loader]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    shards = [path for _, path, _ in seen if "/agents/c/" in path]
    assert shards and set(shards) == {url.removeprefix("s3:/") + "/agents/c/3"}, shards  # the last chunk's only


def test_the_fetcher_retries_inner_chunks_and_names_them(server, datasets):
    """Each request tried once (botocore and s3fs both), so that what brings a fetch through a paused server is
    the fetcher's own tries, with their backoff; when it stays down, the inner chunk is named."""
    quick = {**server.options, "config_kwargs": {"connect_timeout": 0.5, "read_timeout": 0.5,
                                                  "retries": {"max_attempts": 1}}, "skip_instance_cache": True}
    ds = Dataset.open(datasets[3], storage_options=quick)
    agents = ds["agents"]
    agents.store.fs.retries = 1
    fetcher = ChunkFetcher(ds.location, ds.group.store, FetchOptions())
    tries: list[int] = []
    attempt = fetcher._attempt
    fetcher._attempt = lambda refs: (tries.append(len(refs)), attempt(refs))[1]  # type: ignore[method-assign]
    record = ds.digests()["agents"][5]
    want = agents.read_chunks([5])[0]
    assert len(want) == record[0]
    server.proc.send_signal(signal.SIGSTOP)
    resume = threading.Timer(3.0, server.proc.send_signal, (signal.SIGCONT,))  # a try times out after ~1.3 s
    resume.start()
    try:
        assert fetcher.fetch([ChunkRef(agents, 5)], [record]) == [want]  # failed at first, then fetched
    finally:
        resume.join()
        server.proc.send_signal(signal.SIGCONT)
    assert len(tries) >= 2, tries
    server.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(ChunkError, match=r"^table 'agents': chunk 'agents/c/1#1' could not be fetched from "
                                             r"s3://.* after 4 tries"):
            fetcher.fetch([ChunkRef(agents, 5)], [record])
    finally:
        server.proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("how", ["killed", "paused"])
def test_a_store_that_goes_away_mid_read_is_reported_as_soon_as_in_v2(how):
    """As `test_s3.test_a_store_that_goes_away_mid_read_is_reported_within_its_timeout`, for inner chunks: a
    paused server was reported after 100 s and more (s3fs tried each range request 25 times: 5 tries of a call
    that tries 5 times, at 1.5 s each, where a whole object's read gives up after 5)."""
    import re
    import time

    from zarrfeed.loader import LoaderError

    server = S3Server()  # its own: this test stops it
    try:
        url = f"{server.bucket()}/d.zarr"
        with DatasetWriter(url, workers=0, chunks=SMALL, zarr_format=3, shard_bytes=SHARD,
                           storage_options=server.options) as w:
            w.ingest(EPISODES[:4])
        with Loader(url, "agents", batch_size=256, num_workers=2, storage_options=server.options,
                    cache_bytes=0) as loader:
            assert sum(len(b["centroid"]) for b in loader) == loader.dataset.rows["agents"]  # workers reading
            server.proc.send_signal(signal.SIGSTOP if how == "paused" else signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(LoaderError) as err:
                list(loader)  # epoch 1: every chunk is fetched again (no cache)
            took = time.monotonic() - t0
    finally:
        server.stop()
    assert "\n" not in str(err.value)
    assert re.match(r"table 'agents': chunk 'agents/c/\d+#\d+' could not be fetched from s3://.*"
                    r"(ReadTimeoutError|ConnectTimeoutError|EndpointConnectionError)", str(err.value)), str(err.value)
    assert took < (45 if how == "paused" else 10), took


def test_zarrfeed_convert_between_formats_on_s3(server, datasets, capsys):
    """The command, on the store: v2 -> v3 -> v2 there gives the same rows."""
    from zarrfeed.cli import main

    bucket = datasets[2].rsplit("/", 1)[0]
    options = [f"--storage-option={key}={value}" for key, value in server.options.items()]
    assert main(["convert", datasets[2], f"{bucket}/c3.zarr", "--shard-bytes", "1M", "-q", *options]) == 0
    assert main(["convert", f"{bucket}/c3.zarr", f"{bucket}/c2.zarr", "--zarr-format", "2", "-q", *options]) == 0
    assert "wrote 12 episodes" in capsys.readouterr().out
    assert len(server.fs().ls(f"{bucket}/c3.zarr/agents/c")) == 4
    source = Dataset.open(datasets[2], storage_options=server.options)
    for url in (f"{bucket}/c3.zarr", f"{bucket}/c2.zarr"):
        ds = Dataset.open(url, storage_options=server.options)
        assert ds.schema == source.schema
        for name, n in source.rows.items():
            assert ds.read_rows(name, 0, ds.rows[name]).tobytes() == source.read_rows(name, 0, n).tobytes(), name
