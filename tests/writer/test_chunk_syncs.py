"""A writer stores each whole chunk without waiting for the disk and fsyncs it in a thread of its own process
(`ChunkSyncs`): rows count as stored, and so can be committed, only once their chunks are synced, and a sync that
fails stops the writer with its rows uncommitted (resume writes them again)."""
import errno
import threading

import numpy as np
import pytest
from expected import expected_tables
from zarrfeed.core.errors import WriteRefused
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

EPISODES = dict(seed=7, frames=30, agents_per_frame=60)


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_are_committed_only_once_their_chunks_are_synced(tmp_path, monkeypatch, workers):
    gate, synced = threading.Event(), []
    real = DirectoryStore.sync_objects

    def gated(store, keys):
        assert gate.wait(60), "the test never let the syncs go"
        real(store, keys)
        synced.extend(keys)
    monkeypatch.setattr(DirectoryStore, "sync_objects", gated)
    episodes = list(synthetic.episodes(8, **EPISODES))
    w = DatasetWriter(tmp_path / "d.zarr", workers=workers, segment_bytes=1 << 16, commit_interval=0.0,
                      chunks={"agents": 500, "frames": 100})
    try:
        for i, ep in enumerate(episodes):
            w.submit(ep, key=i)
        syncing = threading.Thread(target=w.sync)
        syncing.start()
        syncing.join(1.0)
        assert syncing.is_alive(), "sync() returned before the chunk files were synced"
        assert not any(w.committed.values())
        gate.set()
        syncing.join(60)
        assert w.committed["scenes"] == 8
        assert any(k.startswith("agents/") for k in synced)
    finally:
        gate.set()
        w.close()
    ds = Dataset.open(tmp_path / "d.zarr")
    for table, want in expected_tables(episodes).items():
        np.testing.assert_array_equal(ds.read_rows(table, 0, ds.rows[table]), want, err_msg=table)


def test_a_sync_that_fails_stops_the_writer_and_resume_writes_its_rows(tmp_path, monkeypatch):
    real, failed = DirectoryStore.sync_objects, []

    def failing(store, keys):
        if not failed and any(k.startswith("agents/") for k in keys):
            failed.append(keys)
            raise OSError(errno.ENOSPC, "No space left on device", store.file(keys[0]))
        real(store, keys)
    monkeypatch.setattr(DirectoryStore, "sync_objects", failing)
    episodes = list(synthetic.episodes(8, **EPISODES))
    path = tmp_path / "d.zarr"
    with pytest.raises(WriteRefused, match="no space left") as stopped:
        with DatasetWriter(path, workers=2, segment_bytes=1 << 16, chunks={"agents": 500, "frames": 100}) as w:
            w.ingest(episodes)
    assert "\n" not in str(stopped.value) and "--resume" not in str(stopped.value)
    assert failed
    before = Dataset.open(path).rows["scenes"] if (path / ".zgroup").exists() else 0
    assert before < 8
    monkeypatch.setattr(DirectoryStore, "sync_objects", real)
    with DatasetWriter(path, mode="a", workers=2, segment_bytes=1 << 16) as w:
        w.ingest(episodes, resume=True)
    ds = Dataset.open(path)
    for table, want in expected_tables(episodes).items():
        np.testing.assert_array_equal(ds.read_rows(table, 0, ds.rows[table]), want, err_msg=table)


def test_rows_synced_before_a_failed_sync_are_still_taken():
    """One call finds rows synced and then a sync that failed: it raises, and the next call returns the rows synced
    before the failure (they are durable: the failure's last commit includes them)."""
    from zarrfeed.writer.chunk_syncs import ChunkSyncs, StoredRows

    class Store:
        def sync_objects(self, keys):
            if keys == ["bad"]:
                raise OSError(errno.EIO, "Input/output error", "agents/1")

    syncs = ChunkSyncs(Store(), "test")
    syncs.add(["good"], StoredRows("agents", 0, 100))
    syncs.add(["bad"], StoredRows("agents", 100, 200))
    syncs.add(["later"], StoredRows("agents", 200, 300))
    try:
        with pytest.raises(OSError, match="Input/output error"):
            syncs.synced(wait=True)
        assert syncs.synced(wait=True) == [StoredRows("agents", 0, 100), StoredRows("agents", 200, 300)]
        assert syncs.synced(wait=True) == []
    finally:
        syncs.close()
