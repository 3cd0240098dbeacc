"""The write lease between writers in processes of their own: a writer that lost its lease deletes and commits
nothing, and the lease document, not the lock file, says who holds a local dataset."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from expected import assert_holds, ticked
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter
from zarrfeed.writer.lease import LOCK_FILE, LeaseHeld

from repo_paths import SUPPORT
SMALL = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}


def small_episodes(n: int, seed: int) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=20, agents_per_frame=30))


def lease_child(url: str, timeout: float, env: dict | None = None, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "lease_child.py"), url, str(timeout), *extra],
                            env={**os.environ, **(env or {})}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "created", proc.stderr.read()
    return proc


def test_a_writer_that_lost_its_lease_on_s3_deletes_nothing_of_its_successor(s3):
    """Item 1: A creates the dataset and stalls before any commit with rows; B takes the lease over, appends and
    closes; A wakes, loses its lease and used to delete everything B wrote ("a writer that created its dataset
    and fails before any commit removes it")."""
    bucket, server = s3
    url = f"{bucket}/x.zarr"
    a = lease_child(url, 1.5, server.env)
    a.send_signal(signal.SIGSTOP)  # its heartbeat stops with it
    try:
        time.sleep(2.0)
        eps = small_episodes(3, seed=1)
        with DatasetWriter(url, workers=0, mode="a", lease_timeout=1.5, storage_options=server.options) as b:
            b.ingest(eps)
    finally:
        a.send_signal(signal.SIGCONT)
    out, err = a.communicate("go\n", timeout=60)
    assert a.returncode == 1 and "failed: LeaseLost" in out, (out, err)
    assert_holds(Dataset.open(url, storage_options=server.options), eps)


def test_a_writer_that_lost_its_lease_while_its_successor_writes_deletes_nothing(s3):
    """Item 1, the successor still holding the lease when the stalled writer wakes."""
    bucket, server = s3
    url = f"{bucket}/x.zarr"
    a = lease_child(url, 1.5, server.env)
    a.send_signal(signal.SIGSTOP)
    time.sleep(2.0)
    eps = small_episodes(2, seed=2)
    b = DatasetWriter(url, workers=0, mode="a", lease_timeout=1.5, storage_options=server.options)
    try:
        b.ingest(eps)
        b.sync()
        a.send_signal(signal.SIGCONT)
        out, err = a.communicate("go\n", timeout=60)
        assert a.returncode == 1 and "failed: LeaseLost" in out, (out, err)
    finally:
        a.send_signal(signal.SIGCONT)
        b.close()
    assert_holds(Dataset.open(url, storage_options=server.options), eps)


def test_a_deleted_lock_file_does_not_admit_a_second_local_writer(tmp_path):
    """Item 6: with writer A alive, `rm .zarrfeed.lock` let writer B take over ("it never released it (its
    process ended)", which was false) and A died mid-write."""
    out = tmp_path / "d.zarr"
    a = lease_child(str(out), 60)
    try:
        (out / LOCK_FILE).unlink()
        with pytest.raises(LeaseHeld, match=f"being written by pid {a.pid}"):
            DatasetWriter(out, workers=0, mode="a")
        out_a, err = a.communicate("go\n", timeout=60)
        assert a.returncode == 0 and "closed" in out_a, (out_a, err)
    finally:
        a.kill()
    assert_holds(Dataset.open(out), small_episodes(0, seed=0) + list(
        synthetic.episodes(1, seed=9, frames=20, agents_per_frame=30)))


def test_a_local_writer_whose_lease_was_taken_stops_and_leaves_the_new_holders_document(tmp_path):
    """A stalled local writer (SIGSTOP, lock file deleted, heartbeat stale) is taken over; when it wakes, it
    finds the document is not its own: it stops, commits nothing and removes neither the document nor data."""
    out = tmp_path / "d.zarr"
    a = lease_child(str(out), 1.5)
    (out / LOCK_FILE).unlink()
    a.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2.0)
        eps = small_episodes(2, seed=3)
        b = DatasetWriter(out, workers=0, mode="a", lease_timeout=1.5)
        b.ingest(eps)
        b.sync()
        a.send_signal(signal.SIGCONT)
        out_a, err = a.communicate("go\n", timeout=60)
        assert a.returncode == 1 and "failed: LeaseLost" in out_a, (out_a, err)
        assert (out / "zarrfeed.lease").exists()  # still B's
        b.close()
    finally:
        a.send_signal(signal.SIGCONT)
        a.kill()
    assert_holds(Dataset.open(out), eps)


def test_an_s3_renewal_whose_earlier_reply_was_lost_keeps_the_lease(s3):
    """A renewal that landed but whose reply was lost (a client retry after a short read timeout) leaves this
    writer with a stale ETag: the next conditional PUT is refused with 412 although the lease is still its
    own. The document's token says so; the writer must not stop as if another had taken it over."""
    from zarrfeed.writer.lease import Lease

    from zarrfeed.core.location import Location

    bucket, server = s3
    lease = Lease(Location.of(f"{bucket}/x.zarr", server.options), timeout=60)
    lease.acquire()
    try:
        stale = lease._backend.etag
        assert lease.confirm()  # lands: the ETag changes
        lease._backend.etag = stale  # as if that reply had been lost
        assert lease.confirm() and not lease.lost
    finally:
        lease.release()


def test_a_lease_is_judged_by_its_holders_own_timeout(s3):
    """A writer with a long lease timeout heartbeats seldom and its fence lets it write until that timeout is
    nearly over; a writer with a shorter timeout must not take the lease over by its own, shorter rule. A
    lease document from another host is taken over only after the holder's own timeout without a heartbeat,
    and the refusal quotes that timeout."""
    import json

    from zarrfeed.core.location import Location
    from zarrfeed.writer.lease import LEASE_KEY, Holder, Lease

    bucket, server = s3
    location = Location.of(f"{bucket}/x.zarr", server.options)
    fs = server.fs()
    key = f"{bucket}/x.zarr/{LEASE_KEY}"
    t0, old = time.monotonic(), time.time() - 20  # 20 s without a heartbeat
    holder = Holder("another-host", 4242, None, old, old, "t0k3n", timeout=300.0)
    fs.pipe(key, holder.encode())
    with pytest.raises(LeaseHeld, match=r"pid 4242 on another-host .* after 300 s without a heartbeat"):
        Lease(location, timeout=5).acquire()
    assert json.loads(fs.cat(key))["token"] == "t0k3n"  # untouched
    assert holder.gone(5) is None and ticked(Holder("another-host", 4242, None, old, old, "t", timeout=10.0).gone(300),
                                             "no heartbeat for {} s (timeout 10 s)", 20, t0)
    legacy = json.loads(holder.encode())
    del legacy["timeout"]  # a document written before holders recorded their timeout: the taker's rule
    fs.pipe(key, json.dumps(legacy).encode())
    lease = Lease(location, timeout=5)
    lease.acquire()  # no heartbeat for 20 s > 5 s: taken over
    try:
        assert json.loads(fs.cat(key))["token"] == lease.holder.token
    finally:
        lease.release()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("where", ["s3", "local"])
def test_a_writer_paused_past_its_lease_writes_no_chunk_over_its_successor(where, workers, request, tmp_path):
    """A commits an episode, is paused (SIGSTOP) past its lease, B takes the lease over, appends and closes; A
    wakes and submits more. It used to write its rows over B's committed chunks (only a commit checked the
    lease), leaving rows of two writers mixed; now it stops before writing anything."""
    if where == "s3":
        bucket, server = request.getfixturevalue("s3")
        url, env, options = f"{bucket}/x.zarr", server.env, server.options
    else:
        url, env, options = str(tmp_path / "x.zarr"), None, None
    a = lease_child(url, 1.5, env, "--first", "--workers", str(workers))
    if where == "local":
        (Path(url) / LOCK_FILE).unlink()  # a stopped local process keeps its file lock; its document is stale
    a.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2.0)
        eps = small_episodes(3, seed=4)
        with DatasetWriter(url, workers=0, mode="a", lease_timeout=1.5, storage_options=options) as b:
            b.ingest(eps)
    finally:
        a.send_signal(signal.SIGCONT)
    out, err = a.communicate("go\n", timeout=60)
    assert a.returncode == 1 and "failed: LeaseLost" in out, (out, err)
    ds = Dataset.open(url, storage_options=options)
    assert_holds(ds, small_episodes(1, seed=8) + eps)
    report = ds.verify()
    assert report.ok and report.unverifiable == 0, str(report)


def test_the_fence_stops_a_worker_process_once_the_lease_is_released_or_lost(tmp_path):
    """Worker processes share the lease's deadline: a check in another process sees the parent revoke it."""
    import multiprocess
    from zarrfeed.writer.lease import Lease, LeaseLost

    from zarrfeed.core.location import Location

    lease = Lease(Location.of(tmp_path / "d.zarr"), timeout=60)
    lease.acquire()
    ctx = multiprocess.get_context("spawn")
    go, result = ctx.Event(), ctx.Queue()

    def child(fence, go, result):
        fence.check()  # held: passes
        result.put("ready")
        go.wait(30)
        try:
            fence.check()
            result.put("wrote")
        except LeaseLost as exc:
            result.put(f"stopped: {exc}")

    proc = ctx.Process(target=child, args=(lease.fence, go, result))
    proc.start()
    try:
        assert result.get(timeout=60) == "ready"
        lease.release()
        go.set()
        assert result.get(timeout=30).startswith("stopped:")
    finally:
        proc.join(30)


def test_a_cluster_task_writes_only_while_its_client_holds_the_lease(tmp_path):
    """A Dask write task shares no memory with its client: it reads the lease document before writing."""
    from zarrfeed.writer.lease import LeaseLost, check_held

    with DatasetWriter(tmp_path / "d.zarr", workers=0) as w:
        store = w.location.store("r")
        check_held(store, w.lease_token, w.location)
        with pytest.raises(LeaseLost, match="no longer holds the write lease"):
            check_held(store, "another-token", w.location)
    with pytest.raises(LeaseLost):  # released at close
        check_held(store, w.lease_token, w.location)


def test_a_writer_dead_on_another_host_is_taken_over_by_its_heartbeat_end_to_end(s3, caplog):
    """Every dead holder in the suite was a dead pid on this host or a file lock, so a lease whose
    holder stopped heartbeating on another machine was never taken over in any test (with that rule gone, a
    writer dying elsewhere locks an S3 dataset for ever). A lease document from another host with an old
    heartbeat is taken over by a DatasetWriter, saying so; a fresh one is not."""
    import json
    import logging

    from zarrfeed.writer.lease import LEASE_KEY, Holder

    bucket, server = s3
    url = f"{bucket}/elsewhere.zarr"
    eps = small_episodes(2, seed=61)
    with DatasetWriter(url, workers=0, chunks=SMALL, storage_options=server.options) as w:
        w.ingest(eps[:1])
    key = f"{bucket}/elsewhere.zarr/{LEASE_KEY}"
    fs = server.fs()
    fresh = Holder("another-host", 4242, None, time.time(), time.time(), "fresh", timeout=60.0)
    fs.pipe(key, fresh.encode())
    with pytest.raises(LeaseHeld, match="pid 4242 on another-host"):
        DatasetWriter(url, workers=0, mode="a", storage_options=server.options)
    assert json.loads(fs.cat(key))["token"] == "fresh"  # untouched
    t0, old = time.monotonic(), time.time() - 120
    fs.pipe(key, Holder("another-host", 4242, None, old, old, "stale", timeout=60.0).encode())
    with caplog.at_level(logging.WARNING, logger="zarrfeed"):
        with DatasetWriter(url, workers=0, mode="a", storage_options=server.options) as w:
            w.ingest(eps[1:])
    assert any("took over the write lease of pid 4242 on another-host" in r.getMessage()
               and ticked(r.getMessage(), "no heartbeat for {} s (timeout 60 s)", 120, t0) for r in caplog.records), \
        caplog.text
    assert_holds(Dataset.open(url, storage_options=server.options), eps)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_writer_whose_lease_document_was_deleted_commits_nothing_more(where, request, tmp_path):
    """With writer A alive, its lease document deleted by hand let writer B in at
    once, and A's next commit (before its next heartbeat) still landed and said "closed": rows its producer
    believed committed, then written over by B. A commit now renews the lease on the store first."""
    env, options = {}, None
    if where == "s3":
        bucket, server = request.getfixturevalue("s3")
        url, env, options = f"{bucket}/x.zarr", server.env, server.options
    else:
        url = str(tmp_path / "d.zarr")
    a = lease_child(url, 60, env, "--first")  # one episode committed; its next heartbeat in 10 s
    try:
        if where == "s3":
            server.fs().rm(f"{url}/zarrfeed.lease")
        else:
            (Path(url) / LOCK_FILE).unlink()
            (Path(url) / "zarrfeed.lease").unlink()
        eps = small_episodes(2, seed=3)
        with DatasetWriter(url, workers=0, mode="a", storage_options=options) as b:
            out_a, err = a.communicate("go\n", timeout=60)  # A writes and commits while B holds the lease
            assert a.returncode == 1 and "failed: LeaseLost" in out_a, (out_a, err)
            b.ingest(eps)
    finally:
        a.kill()
    first = list(synthetic.episodes(1, seed=8, frames=20, agents_per_frame=30))
    assert_holds(Dataset.open(url, storage_options=options), first + eps)


def test_a_lease_document_this_process_let_go_is_taken_over_at_once_on_s3(s3, caplog):
    """A release the store did not answer, or a renewal that landed after it, leaves a document naming this
    very process: it is not a live writer (its token is no lease held here), so the next writer of this process
    takes it over at once instead of waiting for the timeout (a resume after a paused S3 server was refused)."""
    from zarrfeed.core.location import Location
    from zarrfeed.writer.lease import LEASE_KEY, Lease

    bucket, server = s3
    url = f"{bucket}/x.zarr"
    location = Location.of(url, server.options)
    first = Lease(location, timeout=60)
    first.acquire()
    doc = first.holder.encode()
    first.release()
    server.fs().pipe(f"{url}/{LEASE_KEY}", doc)  # the late renewal
    with caplog.at_level("WARNING"), Lease(location, timeout=60):
        pass
    assert "this process released it" in caplog.text
    with Lease(location, timeout=60):  # a live lease of this process is still refused to a second one
        with pytest.raises(LeaseHeld):
            Lease(location, timeout=60).acquire()
