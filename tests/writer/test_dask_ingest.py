"""Ingestion on a real Dask cluster: 2 worker processes on 127.0.0.1, data on a local directory and on S3."""
import logging
import os
import signal
import subprocess
import sys
from itertools import chain

import numpy as np
import pytest

pytest.importorskip("distributed")

import dask_sources as src  # noqa: E402
from expected import expected_tables, wait_for_scenes  # noqa: E402
from formats import layout, storage_layout  # noqa: E402
from zarrfeed.loader import Dataset  # noqa: E402
from zarrfeed.writer import dask as zdask  # noqa: E402
from zarrfeed.writer.dataset_writer import DatasetWriter  # noqa: E402

from repo_paths import SUPPORT
SOURCES = list(range(8))


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False},
                      silence_logs=logging.ERROR) as c:
        yield c


@pytest.fixture
def client(cluster):
    from distributed import Client

    with Client(cluster) as c:
        yield c


def local_ingest(path, sources, fn=src.small):
    with DatasetWriter(path, workers=2, chunks=src.SMALL) as w:
        w.ingest(chain.from_iterable(fn(s) for s in sources))


def stored(path, storage_options=None) -> dict[str, bytes]:
    """Every chunk of the dataset, as stored, and each table's length (zarr may add the default
    dimension_separator to a .zarray it rewrites: metadata documents are compared by what they say)."""
    ds = Dataset.open(path, storage_options=storage_options)
    store = ds.location.store("r")
    out = {k: bytes(store[k]) for k in store.keys()
           if not k.startswith("zarrfeed") and not k.rsplit("/", 1)[-1].startswith(".")}
    out.update({f"{t}/shape": str(ds.tables[t].shape).encode() for t in ds.tables})
    out.update({f"{t}/rows": str(ds.rows[t]).encode() for t in ds.tables})
    return out


def assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    different = [k for k in a if a[k] != b[k]]
    assert not different, different[:5]


def assert_recorded_as_local(path, local, storage_options=None) -> None:
    """Every chunk's digest is recorded, checks out, and equals the local ingest's record (the committer found
    the last write of each shared chunk, whatever order the tasks reported in, reruns included)."""
    ds = Dataset.open(path, storage_options=storage_options)
    report = ds.verify()
    assert report.ok and report.unverifiable == 0, str(report)
    assert ds.digests() == Dataset.open(local).digests()


def test_cluster_ingest_is_chunk_for_chunk_a_local_ingest(client, tmp_path):
    summary = zdask.ingest(client, SOURCES, src.small, tmp_path / "d.zarr", chunks=src.SMALL)
    local_ingest(tmp_path / "local.zarr", SOURCES)
    assert_same(stored(tmp_path / "d.zarr"), stored(tmp_path / "local.zarr"))
    ds = Dataset.open(tmp_path / "d.zarr")
    assert ds.validate().ok and ds.rows["scenes"] == summary.episodes == 20
    assert summary.written == 8 and summary.rows["agents"] == ds.rows["agents"] and summary.task_seconds > 0
    assert_recorded_as_local(tmp_path / "d.zarr", tmp_path / "local.zarr")
    # the same sources again: refused without resume; with resume nothing is left to do
    with pytest.raises(ValueError, match="ingested before"):
        zdask.ingest(client, SOURCES, src.small, tmp_path / "d.zarr", mode="a")
    again = zdask.ingest(client, SOURCES, src.small, tmp_path / "d.zarr", resume=True)
    assert again.passed_over == 20 and again.written == 0 and again.episodes == 0
    assert_same(stored(tmp_path / "d.zarr"), stored(tmp_path / "local.zarr"))


def test_cluster_ingest_to_s3_equals_a_local_ingest(client, s3, tmp_path):
    bucket, server = s3
    url = f"{bucket}/d.zarr"
    zdask.ingest(client, SOURCES, src.small, url, chunks=src.SMALL, storage_options=server.options)
    local_ingest(tmp_path / "local.zarr", SOURCES)
    assert_same(stored(url, server.options), stored(tmp_path / "local.zarr"))
    assert Dataset.open(url, storage_options=server.options).validate().ok
    assert_recorded_as_local(url, tmp_path / "local.zarr", server.options)


def inner_chunks(path) -> dict[str, bytes]:
    """Every inner chunk (v3) or chunk (v2) below the committed rows, by key, as stored."""
    ds = Dataset.open(path)
    out = {}
    for t, arr in ds.tables.items():
        indices = list(range(-(-ds.rows[t] // arr.chunks[0])))
        out.update(zip([arr.chunk_key(i) for i in indices], arr.read_chunks(indices), strict=True))
    return out


def test_cluster_ingest_into_v3_shards_is_inner_chunk_for_inner_chunk_a_local_ingest(client, tmp_path):
    """Shards of several inner chunks, which neighbouring sources share (every source's frames go into one
    shard): each task writes a shard under a lock of the whole cluster named by the shard's key, as a local
    writer's lock is, so no task's rows are lost to another's write back of the shard. The shards' bytes depend
    on the order of the writes (each appends to its shard); their inner chunks, and the digests recorded, do not."""
    chunks = {"agents": 200, "frames": 8, "scenes": 2, "traffic_light_faces": 50}
    v3 = layout(3, chunks)
    summary = zdask.ingest(client, SOURCES, src.small, tmp_path / "d.zarr", chunks=chunks, **v3)
    with DatasetWriter(tmp_path / "local.zarr", workers=2, chunks=chunks, **v3) as w:
        w.ingest(chain.from_iterable(src.small(s) for s in SOURCES))
    ds = Dataset.open(tmp_path / "d.zarr")
    assert ds.tables["frames"].sharding.inner_per_shard > 50 and summary.episodes == 20
    want = expected_tables(list(chain.from_iterable(src.small(s) for s in SOURCES)))
    for t, rows in want.items():
        assert ds.read_rows(t, 0, ds.rows[t]).tobytes() == rows.tobytes(), t
    assert inner_chunks(tmp_path / "d.zarr") == inner_chunks(tmp_path / "local.zarr")
    assert ds.validate().ok
    assert_recorded_as_local(tmp_path / "d.zarr", tmp_path / "local.zarr")
    assert zdask._ChunkLocks("zarrfeed/id")["frames/c/0"].name == "zarrfeed/id/frames/c/0"


def test_a_worker_killed_mid_task_changes_nothing(client, tmp_path):
    """Dask reruns the lost tasks on a new worker; no row is lost or written twice."""
    marker = tmp_path / "killed"
    zdask.ingest(client, SOURCES, src.KillOnce(str(marker), victim=2), tmp_path / "d.zarr", chunks=src.SMALL)
    assert marker.exists()  # a worker really died
    local_ingest(tmp_path / "local.zarr", SOURCES)
    assert_same(stored(tmp_path / "d.zarr"), stored(tmp_path / "local.zarr"))
    assert_recorded_as_local(tmp_path / "d.zarr", tmp_path / "local.zarr")
    client.wait_for_workers(2, timeout=60)


def test_a_failing_source_ends_the_ingest_there_and_resume_finishes_it_as_a_local_ingest(client, tmp_path):
    """Source 3 raises at its episode 1: everything before it is committed (its episode 0 too); resumed after
    the fix, the dataset is a local ingest of all the sources, chunk for chunk."""
    with pytest.raises(zdask.IngestError) as err:
        zdask.ingest(client, SOURCES, src.Broken(), tmp_path / "d.zarr", chunks=src.SMALL)
    msg = str(err.value)
    before = sum(len(list(src.small(s))) for s in range(3)) + 1
    assert "\n" not in msg and msg.startswith("source 3 (3), episode 1: OSError: cannot read log-3.bin")
    assert f"the {before} episodes before it are committed" in msg
    assert [(f.index, f.episode) for f in err.value.failures] == [(3, 1)]
    ds = Dataset.open(tmp_path / "d.zarr")
    assert ds.validate().ok and ds.rows["scenes"] == before
    # a bad episode (source 5, episode 1) ends a resumed ingest the same way, naming table, field and row
    with pytest.raises(zdask.IngestError) as err:
        zdask.ingest(client, SOURCES, src.Broken(raises=False), tmp_path / "d.zarr", resume=True)
    assert [(f.index, f.episode) for f in err.value.failures] == [(5, 1)]
    assert "agent_index_interval" in str(err.value) and "row 4" in str(err.value)
    summary = zdask.ingest(client, SOURCES, src.Broken(broken=False), tmp_path / "d.zarr", resume=True)
    total = sum(len(list(src.small(s))) for s in SOURCES)
    assert summary.passed_over + summary.episodes == total and summary.passed_over > before
    local_ingest(tmp_path / "local.zarr", SOURCES)
    assert_same(stored(tmp_path / "d.zarr"), stored(tmp_path / "local.zarr"))
    assert_recorded_as_local(tmp_path / "d.zarr", tmp_path / "local.zarr")


def test_a_refused_first_episode_begins_no_input_so_the_fixed_input_resumes(client, tmp_path):
    """As a local ingest: the input's identity is its first episode's fingerprint, so a refused first episode
    must not begin (record) an input, else the fixed one's resume is refused as another input."""
    sources = SOURCES[:3]
    with pytest.raises(zdask.IngestError) as err:
        zdask.ingest(client, sources, src.BadFirst(), tmp_path / "d.zarr", chunks=src.SMALL)
    assert str(err.value).startswith("source 0 (0), episode 0: frames.agent_index_interval row 4")
    assert Dataset.open(tmp_path / "d.zarr").rows["scenes"] == 0
    summary = zdask.ingest(client, sources, src.BadFirst(broken=False), tmp_path / "d.zarr", resume=True)
    assert summary.passed_over == 0 and summary.episodes == sum(len(list(src.small(s))) for s in sources)
    local_ingest(tmp_path / "local.zarr", sources)
    assert_same(stored(tmp_path / "d.zarr"), stored(tmp_path / "local.zarr"))


def test_skip_mode_leaves_out_bad_episodes_and_lists_them(client, tmp_path):
    broken = src.Broken(raises=False)
    summary = zdask.ingest(client, SOURCES, broken, tmp_path / "d.zarr", chunks=src.SMALL, on_error="skip")
    assert [(f.index, f.episode) for f in summary.skipped] == [(5, 1)]
    kept = [ep for s in SOURCES for i, ep in enumerate(src.small(s)) if (s, i) != (5, 1)]
    ds = Dataset.open(tmp_path / "d.zarr")
    assert ds.validate().ok
    for name, arr in expected_tables(kept).items():
        np.testing.assert_array_equal(ds[name][: ds.rows[name]], arr)
    again = zdask.ingest(client, SOURCES, broken, tmp_path / "d.zarr", resume=True, on_error="skip")
    assert again.episodes == 0 and again.passed_over == len(kept)  # the skipped one counts as done
    # skipped locally too: a local resume of the same episodes writes nothing either
    with DatasetWriter(tmp_path / "d.zarr", mode="a", on_error="skip") as w:
        assert w.ingest(chain.from_iterable(broken(s) for s in SOURCES), resume=True)["episodes"] == 0


def test_a_source_that_raises_ends_a_skip_mode_ingest_too(client, tmp_path):
    """Its episodes after the failure have no known positions, so nothing after it can be placed."""
    with pytest.raises(zdask.IngestError, match="source 3 .*episode 1: OSError"):
        zdask.ingest(client, SOURCES, src.Broken(), tmp_path / "d.zarr", chunks=src.SMALL, on_error="skip")


def test_a_source_that_exits_ends_the_ingest_there_instead_of_hanging(client, tmp_path):
    """A `to_episodes` that raises a BaseException (here `sys.exit`) escaped the task, and the client waited for
    it for ever; it is reported as any failing source is."""
    with pytest.raises(zdask.IngestError, match=r"source 3 \(3\), episode 1: SystemExit: no more logs"):
        zdask.ingest(client, SOURCES, src.Exits(), tmp_path / "d.zarr", chunks=src.SMALL)
    assert Dataset.open(tmp_path / "d.zarr").rows["scenes"] == sum(len(list(src.small(s))) for s in range(3)) + 1


def test_an_interrupted_ingest_leaves_no_task_holding_episodes_on_the_cluster(client, tmp_path):
    """Ctrl-C in the client (KeyboardInterrupt) while sources load: every task the ingest submitted is cancelled,
    so no worker keeps the sources' episodes in memory while the interrupt is held (as a notebook holds it
    before the user resumes with the same client)."""
    import _thread
    import threading
    import time

    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as held:
            zdask.ingest(client, list(range(40)), src.slow, tmp_path / "d.zarr", chunks=src.SMALL)
    finally:
        timer.cancel()
    deadline = time.monotonic() + 20
    while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held.value is not None
    assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0


def test_client_killed_mid_ingest_then_resume_finishes(cluster, client, tmp_path):
    path = tmp_path / "d.zarr"
    sources = list(range(16))
    script = ("import sys; from distributed import Client; import dask_sources as src\n"
              "from zarrfeed.writer import dask\n"
              f"with Client({cluster.scheduler_address!r}) as c:\n"
              f"    dask.ingest(c, {sources!r}, src.slow, {str(path)!r}, chunks=src.SMALL, commit_interval=0.1)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(SUPPORT)},
                            stderr=subprocess.DEVNULL)
    try:
        wait_for_scenes(path, 4, alive=lambda: proc.poll() is None)
        assert proc.poll() is None, "the client finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    committed = Dataset.open(path).rows["scenes"]
    assert 4 <= committed < 40
    summary = zdask.ingest(client, sources, src.slow, path, resume=True)
    assert summary.passed_over >= 4 and summary.passed_over + summary.episodes == \
        sum(len(list(src.small(s))) for s in sources)
    local_ingest(tmp_path / "local.zarr", sources)
    assert_same(stored(path), stored(tmp_path / "local.zarr"))


def test_cli_ingest_on_a_scheduler_equals_a_local_ingest(cluster, tmp_path, capsys):
    from zarrfeed.cli import main

    assert main(["ingest", str(tmp_path / "local.zarr"), "--synthetic", "23", "--seed", "4", "-q"]) == 0
    assert main(["ingest", str(tmp_path / "d.zarr"), "--synthetic", "23", "--seed", "4", "-q",
                 "--scheduler", cluster.scheduler_address]) == 0
    assert_same(stored(tmp_path / "d.zarr"), stored(tmp_path / "local.zarr"))
    assert main(["ingest", str(tmp_path / "copy.zarr"), "--from", str(tmp_path / "local.zarr"), "-q",
                 "--scheduler", cluster.scheduler_address]) == 0
    assert_same(stored(tmp_path / "copy.zarr"), stored(tmp_path / "local.zarr"))
    assert "wrote 23 episodes" in capsys.readouterr().out
    # the same input again without --resume: one line, exit 2, nothing changed
    assert main(["ingest", str(tmp_path / "d.zarr"), "--synthetic", "23", "--seed", "4", "-q", "--append",
                 "--scheduler", cluster.scheduler_address]) == 2
    err = capsys.readouterr().err
    assert "ingested before" in err and len(err.strip().splitlines()) == 1
    # a cluster of its own, on this machine: the same again
    assert main(["ingest", str(tmp_path / "own.zarr"), "--synthetic", "23", "--seed", "4", "-q",
                 "--dask-workers", "1"]) == 0
    assert_same(stored(tmp_path / "own.zarr"), stored(tmp_path / "local.zarr"))


@pytest.mark.parametrize("scenes", [1, 11])
def test_cli_ingest_on_a_scheduler_keeps_the_scene_past_a_whole_source(cluster, tmp_path, capsys, scenes):
    """The CLI cuts the scenes into sources of 10; a range that
    stopped one short (`range(0, n - 1, 10)`) dropped the last scene when it began a source of its own, and
    23 scenes (the test above) never did. 1 and 11 scenes: every one written, as a local ingest writes them."""
    from zarrfeed.cli import main

    assert main(["ingest", str(tmp_path / "local.zarr"), "--synthetic", str(scenes), "--seed", "5", "-q"]) == 0
    assert main(["ingest", str(tmp_path / "d.zarr"), "--synthetic", str(scenes), "--seed", "5", "-q",
                 "--scheduler", cluster.scheduler_address]) == 0
    assert Dataset.open(tmp_path / "d.zarr").rows["scenes"] == scenes
    assert_same(stored(tmp_path / "d.zarr"), stored(tmp_path / "local.zarr"))


def test_a_table_as_a_dask_dataframe_and_parquet_export_on_the_cluster(client, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from zarrfeed.loader import export_parquet

    local_ingest(tmp_path / "d.zarr", SOURCES)
    ds = Dataset.open(tmp_path / "d.zarr")
    df = ds.to_dask("frames", chunks_per_partition=1)
    assert df.npartitions == -(-ds.rows["frames"] // src.SMALL["frames"])
    got = df.compute()
    assert list(got.index) == list(range(ds.rows["frames"]))
    expected = ds.to_arrow("frames")  # pandas keeps no "not null": compare the values, in Arrow's types
    assert pa.Table.from_pandas(got, preserve_index=False).cast(expected.schema).equals(expected)
    assert df["timestamp"].max().compute() == ds["frames"][: ds.rows["frames"]]["timestamp"].max()

    summary = export_parquet(ds, tmp_path / "pq", tables=["agents"], client=client, file_rows=5000)
    assert summary["rows"]["agents"] == ds.rows["agents"]
    back = pq.read_table(tmp_path / "pq" / "agents")
    assert back.num_rows == ds.rows["agents"]
    assert back.sort_by("_row").drop_columns(["_row"]).equals(ds.to_arrow("agents"))


def test_a_write_task_of_a_client_that_lost_the_lease_writes_nothing(client, tmp_path, zarr_format):
    """A write task reads the lease document before it stores rows: with a token the document does not name
    (the client that placed the rows lost the lease, and another writer may be writing there), `_write`
    raises LeaseLost and no chunk of the rows is stored; with the holder's token the same call stores them.
    In this process, with the cluster's locks (the client fixture), as a worker runs it."""
    from zarrfeed.core.keys import Position
    from zarrfeed.core.location import Location
    from zarrfeed.writer.committer import Committer
    from zarrfeed.writer.lease import LeaseLost

    path = tmp_path / "d.zarr"
    committer = Committer(Location.of(path), chunks=src.SMALL, layout=storage_layout(zarr_format, src.SMALL))
    try:
        schema_doc = committer.schema.to_json()
        loaded = zdask._load(src.small, 3, schema_doc, "raise")  # 3 episodes: whole chunks and shared ones
        counted = loaded[1]
        committer.begin_input(counted.fingerprints[0], False, "its first episode has fingerprint", "episodes")
        which = list(range(len(counted.fingerprints)))
        starts = None
        for j in which:
            first = committer.reserve(Position(counted.fingerprints[0], j), counted.rows[j],
                                      counted.fingerprints[j])
            starts = starts or first
        store = committer.location.store("r")

        def chunks() -> list[str]:
            return [k for k in store.keys() if k.split("/")[0] in committer.schema.tables
                    and not k.rsplit("/", 1)[-1].startswith(".") and not k.endswith("/zarr.json")]

        assert committer.lease_token != "0" * 32
        with pytest.raises(LeaseLost, match="no longer holds the write lease"):
            zdask._write(loaded, which, counted.checked, committer.location, committer.dataset_id, "0" * 32,
                         schema_doc, starts)
        assert chunks() == []
        result = zdask._write(loaded, which, counted.checked, committer.location, committer.dataset_id,
                              committer.lease_token, schema_doc, starts)
        written = {committer.arrays[w.table].chunk_key(w.index).partition("#")[0] for w in result["writes"]}
        assert result["writes"] and sorted(chunks()) == sorted(written)  # (v3: the shards of the chunks)
    finally:
        committer.fail(None)


def test_cluster_ingest_of_a_replay_buffer_is_chunk_for_chunk_a_local_ingest(client, tmp_path):
    """Episodes of a replay buffer (Diffusion Policy's dicts) ingested on the cluster land as a local
    writer puts them, in Diffusion Policy's layout."""
    import zarr
    from zarrfeed.writer import replay_buffer_schema

    schema = replay_buffer_schema({"img": (np.uint8, (8, 8, 3)), "action": (np.float32, (2,))}, chunk_rows=20)
    local, remote = tmp_path / "local.zarr", tmp_path / "remote.zarr"
    with DatasetWriter(local, schema, workers=2) as w:
        w.ingest(chain.from_iterable(src.robot(s) for s in SOURCES))
    summary = zdask.ingest(client, SOURCES, src.robot, remote, schema=schema)
    assert summary.rows["episodes"] == sum(len(src.robot(s)) for s in SOURCES)
    assert_same(stored(remote), stored(local))
    assert_recorded_as_local(remote, local)
    root = zarr.open_group(str(remote), mode="r")
    assert root["data/img"].shape[0] == root["meta/episode_ends"][-1]  # what Diffusion Policy's reader checks
