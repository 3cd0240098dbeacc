"""Writes into zarr v3 shards keep every guarantee of v2's chunks. Inner chunks are small against their shards
here (formats.layout: three of the largest table's a shard, more of the others'), so that one shard is written in
parts by segments, episodes, writer workers, writers one after another, Dask tasks and a server's writer:

- what is written is exact, whatever writes a shard (rows equal to the episodes, inner chunks equal to those
  one process writes, every chunk recorded and verified);
- no write of a shard is lost to another: each holds the shard's lock, whole inner chunks too;
- a shard that holds committed inner chunks is never rewritten in place: a write replaces it whole, keeping
  the bytes of each chunk it held at their offsets (append-only), so a reader of the old index and a crash
  at any point find every committed chunk;
- a replay buffer written in v3 opens, validates and takes appends as v2's does.
"""
import os
import threading
import time

import numpy as np
import pytest
from expected import expected_tables
from formats import array, layout
from zarrfeed.core.stores import MemoryStore
from zarrfeed.core.storage_layout import StorageLayout
from zarrfeed.core.zarr_array import Array
from zarrfeed.loader import Dataset
from zarrfeed.writer import replay_buffer_schema, synthetic
from zarrfeed.writer.chunk_write import object_key, write_rows
from zarrfeed.writer.dataset_writer import DatasetWriter

# agents: 3 inner chunks of 20 rows a shard; frames 4 rows a chunk, ~15 a shard: every episode shares shards
CHUNKS = {"agents": 20, "frames": 4, "scenes": 2, "traffic_light_faces": 10}
V3 = layout(3, CHUNKS)


def episodes(n: int, seed: int) -> list[dict]:
    return [synthetic.episode(i, seed=seed, frames=1 + i % 5, agents_per_frame=3 + i % 7) for i in range(n)]


def inner_chunks(path) -> dict[str, bytes]:
    """Every inner chunk below the committed rows, by key, as stored (encoded: deterministic for its rows)."""
    ds = Dataset.open(path)
    out = {}
    for t, arr in ds.tables.items():
        indices = list(range(-(-ds.rows[t] // arr.chunks[0])))
        out.update(zip([arr.chunk_key(i) for i in indices], arr.read_chunks(indices), strict=True))
    return out


def shards(path) -> dict[str, bytes]:
    """Every shard file of the dataset, by key."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("c/*")) if p.is_file()}


def assert_holds(path, eps) -> None:
    """The dataset holds exactly `eps`, in order, each once; valid; every chunk recorded and as recorded."""
    ds = Dataset.open(path)
    for t, rows in expected_tables(eps).items():
        assert ds.rows[t] == len(rows), t
        assert ds.read_rows(t, 0, ds.rows[t]).tobytes() == rows.tobytes(), t
    assert ds.validate().ok
    report = ds.verify()
    assert report.ok and report.unverifiable == 0, str(report)


def test_writer_workers_whose_segments_share_shards_write_what_one_process_writes(tmp_path):
    """commit_interval=0 sends each episode's rows as a segment of its own: segments far smaller than a shard,
    two workers storing neighbours of one shard at once."""
    eps = episodes(30, seed=2)
    got = {}
    for workers in (0, 2):
        out = tmp_path / f"w{workers}.zarr"
        with DatasetWriter(out, workers=workers, chunks=CHUNKS, commit_interval=0, segment_bytes=1 << 12,
                           **V3) as w:
            for ep in eps:
                w.submit(ep)
        assert w.shared_chunks > 20
        assert_holds(out, eps)
        got[workers] = inner_chunks(out)
    assert got[2] == got[0]
    assert any("#2" in k for k in got[0]) and array(tmp_path / "w2.zarr", "agents").sharding.inner_per_shard == 3


class _Locks:
    """A synchronizer of thread locks, recording the names asked for (`None` locks: each lock does nothing)."""

    def __init__(self, real: bool = True) -> None:
        self.real, self.names, self._locks = real, [], {}
        self._guard = threading.Lock()

    def __getitem__(self, name: str):
        with self._guard:
            self.names.append(name)
            if not self.real:
                return _NoLock()
            return self._locks.setdefault(name, threading.Lock())


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _SlowStore(MemoryStore):
    """A store whose writes take 0.2 s to land: a read of a shard and its write back are far apart."""

    def put_many(self, values):
        time.sleep(0.2)
        super().put_many(values)


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "control-unlocked"])
def test_two_writes_into_one_shard_at_once_lose_nothing_under_its_lock(locked):
    """Two writers store rows of one shard at once (a whole inner chunk each, and one merged into a chunk the
    other began): each reads the shard, adds its chunks and writes it back. Under the shard's lock both are
    kept; without it (the control) the later write back drops the earlier one's chunk."""
    arr = Array.create(_SlowStore(), "t", StorageLayout(3, 4 * 80).array_meta((40,), 10, np.dtype("<i8"), None))
    assert arr.sharding.inner_per_shard == 4
    sync = _Locks(real=locked)
    rows = np.arange(40, dtype="<i8")
    writes = [(0, rows[0:10]), (10, rows[10:25]), (25, rows[25:30])]  # chunk 0; chunk 1 and half of 2; rest of 2
    threads = [threading.Thread(target=write_rows, args=(arr, start, part, sync)) for start, part in writes]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(10)
    assert set(sync.names) == {"t/c/0"} == {object_key(arr, i) for i in range(4)}  # the shard's name, every time
    got = arr.read(0, 30)
    if locked:
        assert got.tolist() == list(range(30))
    else:
        assert got.tolist() != list(range(30))  # an update was lost: the lock is what keeps it


def test_writers_appending_one_after_another_never_rewrite_a_committed_shard_in_place(tmp_path):
    """The second writer's rows go into the first's last, partly filled shards: each is replaced whole (a new file
    renamed over it: a file opened before still reads the old bytes), the bytes of every chunk it held kept at
    their offsets, and a reader opened before reads the same rows after."""
    out = tmp_path / "d.zarr"
    first, second = episodes(7, seed=3), episodes(9, seed=4)
    with DatasetWriter(out, workers=0, chunks=CHUNKS, **V3) as w:
        w.ingest(first)
    before = shards(out)
    reader = Dataset.open(out)
    committed = {t: reader.read_rows(t, 0, reader.rows[t]) for t in reader.tables}
    opened = {k: open(out / k, "rb") for k in before}
    inodes = {k: os.stat(out / k).st_ino for k in before}
    try:
        with DatasetWriter(out, workers=2, mode="a", commit_interval=0) as w:
            w.ingest(second)
        after = shards(out)
        rewritten = [k for k in before if after[k] != before[k]]
        assert {k.split("/")[0] for k in rewritten} == set(reader.tables)  # every table's last shard took rows
        for k in rewritten:
            assert os.stat(out / k).st_ino != inodes[k], f"{k} written in place"
            assert opened[k].read() == before[k], f"{k} changed under a reader that had it open"
            index = array(out, k.split("/")[0]).sharding.index_nbytes  # at the shard's end
            data = before[k][:-index]  # the chunks it held, where its old index points
            assert after[k][:len(data)] == data, f"{k}: bytes of committed chunks moved"
    finally:
        for f in opened.values():
            f.close()
    for t, rows in committed.items():
        assert reader.read_rows(t, 0, len(rows)).tobytes() == rows.tobytes(), t
    assert_holds(out, first + second)


def _robot(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    t = int(rng.integers(1, 30))
    return {"img": rng.integers(0, 256, (t, 6, 6, 3), dtype=np.uint8),
            "action": rng.normal(size=(t, 2)).astype(np.float32)}


def test_a_replay_buffer_in_v3_opens_validates_and_takes_appends(tmp_path):
    """Its tables are arrays at paths of their own (`data/img`, `meta/episode_ends`), whose documents are
    `zarr.json`: opening one compared it as a v2 `.zarray` ("field 'compressor' is None")."""
    schema = replay_buffer_schema({"img": (np.uint8, (6, 6, 3)), "action": (np.float32, (2,))}, chunk_rows=8)
    eps = [_robot(i) for i in range(9)]
    out, v2 = tmp_path / "v3.zarr", tmp_path / "v2.zarr"
    with DatasetWriter(out, schema, workers=0, zarr_format=3, shard_bytes=4 * 8 * 108) as w:
        w.ingest(eps[:5])
    with DatasetWriter(out, workers=2, mode="a", commit_interval=0) as w:
        w.ingest(eps[5:])
    with DatasetWriter(v2, schema, workers=0) as w:
        w.ingest(eps)
    ds, want = Dataset.open(out), Dataset.open(v2)
    assert (out / "data" / "img" / "zarr.json").exists() and ds.tables["img"].sharding.inner_per_shard == 4
    assert ds.rows == want.rows and ds.validate().ok and ds.verify().ok
    for t in want.tables:
        assert ds.read_rows(t, 0, ds.rows[t]).tobytes() == want.read_rows(t, 0, want.rows[t]).tobytes(), t


def test_served_ingestion_from_two_producers_at_once_into_v3_is_exact(tmp_path):
    """A server (loopback, a free port) appends what two producers send at once, through its writer's two
    worker processes, into the last shards of a v3 dataset: every episode once, every chunk as recorded."""
    from serve_process import content_key, episodes_in
    from zarrfeed.flight import FeedServer, RemoteWriter
    from zarrfeed.writer import write_dataset

    target = tmp_path / "t.zarr"
    first = episodes(3, seed=5)
    write_dataset(target, first, chunks=CHUNKS, **V3)
    sent = {"a": episodes(8, seed=6), "b": episodes(8, seed=7)}
    failures: list[BaseException] = []

    def produce(url: str, name: str) -> None:
        try:
            with RemoteWriter(url, timeout=60) as w:
                for i, ep in enumerate(sent[name]):
                    w.submit(ep, key=f"{name}-{i}")
                    if i % 3 == 2:
                        w.sync()
        except BaseException as exc:  # handed to the test's thread
            failures.append(exc)

    with FeedServer(str(target), host="127.0.0.1", port=0, workers=2, ingest=True) as server:
        producers = [threading.Thread(target=produce, args=(server.url, n)) for n in sent]
        for t in producers:
            t.start()
        for t in producers:
            t.join(120)
        assert not any(t.is_alive() for t in producers) and not failures, failures
    everything = first + sent["a"] + sent["b"]
    assert episodes_in(target) == sorted(content_key(ep) for ep in everything)
    ds = Dataset.open(target)
    assert ds.tables["agents"].sharding.inner_per_shard == 3
    assert ds.rows == {t: len(rows) for t, rows in expected_tables(everything).items()}
    report = ds.verify()
    assert ds.validate().ok and report.ok and report.unverifiable == 0, str(report)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_writer_killed_while_it_writes_a_shard_holding_committed_rows_loses_none_of_them(where, request,
                                                                                           tmp_path):
    """SIGKILL a writer process as it writes a shard that holds committed rows (its PUT in flight on a moto S3
    server on loopback; its temporary file being renamed on a local disk): every committed inner chunk still
    reads, equal to what was written, the dataset validates, and `--resume` completes it with every row once."""
    import signal
    import subprocess
    import sys

    from repo_paths import SUPPORT

    if where == "s3":
        bucket, server = request.getfixturevalue("s3")
        url, options, env = f"{bucket}/d.zarr", server.options, {**os.environ, **server.env}
    else:
        url, options, env = str(tmp_path / "d.zarr"), None, None

    def child(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SUPPORT / "writer_child.py"), url, "8", "0", "0", "--v3", *args],
                              capture_output=True, text=True, timeout=300, env=env)

    killed = child("--kill-in-shard-write")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    shard = killed.stdout.split("killed writing ", 1)[1].split()[0]
    ds = Dataset.open(url, storage_options=options)
    eps = list(synthetic.episodes(8, seed=5, frames=40, agents_per_frame=300))
    want = expected_tables(eps)
    table = shard.split("/")[0]
    assert 0 < ds.rows[table] < len(want[table]) and ds.tables[table].sharding.inner_per_shard > 1
    for t, rows in want.items():
        assert ds.read_rows(t, 0, ds.rows[t]).tobytes() == rows[:ds.rows[t]].tobytes(), t
    report = ds.verify()
    assert ds.validate().ok and report.ok, str(report)
    resumed = child("--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ds = Dataset.open(url, storage_options=options)
    for t, rows in want.items():
        assert ds.read_rows(t, 0, ds.rows[t]).tobytes() == rows.tobytes(), t
    report = ds.verify()
    assert ds.validate().ok and report.ok and report.unverifiable == 0, str(report)


def test_overwrite_replaces_a_v3_dataset_another_tool_wrote(tmp_path, capsys):
    """A zarr v3 group (its `zarr.json`, as zarr-python 3 writes it) is a zarr dataset: `--overwrite` replaces it,
    as it replaces a v2 one (it was refused as "not a zarr dataset (it holds air, zarr.json)")."""
    import zarr
    from zarrfeed.cli import main

    out = tmp_path / "d.zarr"
    zarr.open_group(str(out), mode="w").create_array("air", shape=(4,), dtype="f4")
    assert main(["ingest", str(out), "--synthetic", "1", "--zarr-format", "3", "--overwrite", "-q"]) == 0, \
        capsys.readouterr().err
    assert not (out / "air").exists() and Dataset.open(out).validate().ok
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not zarr")
    assert main(["ingest", str(tmp_path / "other"), "--synthetic", "1", "--overwrite", "-q"]) == 2
    assert "not a zarr dataset" in capsys.readouterr().err
