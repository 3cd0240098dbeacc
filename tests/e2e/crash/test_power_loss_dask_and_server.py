"""A commit of the Dask path (`zarrfeed.writer.dask.ingest`) and of the server's ingestion (`zarrfeed serve`,
`RemoteWriter`) survives a power loss, as test_power_loss_local_writer.py shows for the local writer. Both run in
this process, so that every file operation goes through the simulated disk of tests/support/power_loss.py: the
Dask path on a `LocalCluster` of one worker thread (processes=False) on 127.0.0.1, the server as a `FeedServer`
on 127.0.0.1 whose handlers run in its threads, writing with workers=0. The power fails at one of
the file operations, chosen at random among all of them (seeded: a failure prints the path, the seed and the
operation; ZARRFEED_CRASH_POINTS sets how many per path); the disk as it would be after a restart is recovered and
opened, and the same episodes are sent again. Every wait is bounded: a hang fails the test at its crash point.

Acknowledged, on the Dask path: the episodes of every commit the client published (`ingest` commits as it goes,
over the contiguous prefix of episodes whose writes finished) and of every `ingest` that returned; here one ingest
of the first sources, then one of all of them with `resume=True`. On the server: what a `RemoteWriter.sync()` or
`close()` confirmed committed (its `submit` only says the server accepted the episode).

Always, before anything is sent again: every acknowledged episode is committed, what is committed is whole
episodes, the first ones in order (an episode not acknowledged is there whole or not at all; nothing that was
never written), and `validate` and `verify` pass (`zarrfeed validate --deep`). After the Dask ingest is resumed
(or every episode sent again to a new server): the dataset equals one written without a power loss.

Both paths run in zarr v3 too (small shards that sources, and the server's appends, share; ZARRFEED_CRASH_POINTS_V3
per path), and no file is ever written over in place.

The Dask path's operations follow the order its tasks finish in, and the server's the moments its writer commits
by time, so a seed and point replay a point near the same place, not always the same operation.
"""
import gc
import logging
import os
import random
import shutil
import threading
import time
from itertools import chain

import numpy as np
import pytest
from power_loss import PowerLoss, SimulatedDisk

from zarrfeed import Dataset
from zarrfeed.core.keys import Position, fingerprint
from zarrfeed.core.location import Location
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.flight import FeedServer, RemoteWriter
from zarrfeed.writer import synthetic, write_dataset
from zarrfeed.writer import dask as zdask
from zarrfeed.writer.committer import Committer

CRASH_POINTS = int(os.environ.get("ZARRFEED_CRASH_POINTS", "40"))  # per path; the run chooses among all ops
V3_CRASH_POINTS = int(os.environ.get("ZARRFEED_CRASH_POINTS_V3", "20"))  # per path, in zarr v3
WAIT = 30.0  # seconds any wait on the cluster or the server may take before the test fails (never a hang)


def pick(ops: int, seed: int, points: int = CRASH_POINTS) -> list[tuple[int, bool]]:
    """The crash points of a run (operation, tear), seeded."""
    rng = random.Random(seed)
    return [(op, rng.random() < 0.5) for op in sorted(rng.sample(range(1, ops + 1), min(points, ops)))]


def tables(path) -> dict[str, np.ndarray]:
    ds = Dataset.open(path)
    return {t: ds.read_rows(t, 0, ds.rows[t]) for t in ds.tables}


def unlock(recovered) -> None:
    """After a restart the writer's process is gone; here it is this test's own, still alive: its lease goes."""
    for name in ("zarrfeed.lease", ".zarrfeed.lock"):
        if (recovered / name).exists():
            (recovered / name).unlink()


def check_recovered(path, keys: list, episodes: list[dict], acked: set, expected: dict[str, np.ndarray]) -> None:
    """The recovered dataset, opened as a resume opens it, before anything is sent again: every acknowledged key
    committed, the committed keys the first k in order and the committed rows those of the first k episodes
    (each whole), and `validate` + `verify` pass."""
    committer = Committer(Location.of(path), mode="a")  # drops rows never committed, finishes a create
    try:
        done = [committer.is_committed(k) for k in keys]
    finally:
        committer.release()
    lost = [str(k) for k, d in zip(keys, done, strict=True) if k in acked and not d]
    assert not lost, f"acknowledged episodes lost by the power loss: {lost}"
    k = sum(done)
    assert done == [True] * k + [False] * (len(keys) - k), f"committed keys are not a prefix: {done}"
    ds = Dataset.open(path)
    for t, rows in expected.items():
        n = sum(len(ep.get(t, ())) for ep in episodes[:k])
        assert ds.rows[t] == n, f"table {t}: {ds.rows[t]} rows committed, the first {k} episodes hold {n}"
        assert ds.read_rows(t, 0, n).tobytes() == rows[:n].tobytes(), f"table {t}: not the first {k} episodes"
    report, verified = ds.validate(), ds.verify()
    assert report.ok and verified.ok, (report, verified)


def check_final(path, expected: dict[str, np.ndarray]) -> None:
    got = tables(path)
    for t, rows in expected.items():
        assert got[t].tobytes() == rows.tobytes(), f"table {t}: not the episodes once each, in order"
    ds = Dataset.open(path)
    report, verified = ds.validate(), ds.verify()  # `zarrfeed validate --deep`
    assert report.ok and verified.ok, (report, verified)


def replayable(path: str, seed: int, crash_at: int, ops: int, tear: bool, check) -> None:
    """Run `check()`; any failure names the path, seed and crash point."""
    try:
        check()
    except BaseException as exc:
        raise AssertionError(f"{path}: power loss at operation {crash_at} of {ops} (seed {seed}, tear={tear}): "
                             f"{type(exc).__name__}: {exc}") from exc


class NoFolderSync(SimulatedDisk):
    """A disk where fsyncing a folder does nothing (the names the writer creates or renames never become durable):
    what the negative tests use, to show the simulator would catch a writer that left them to the OS."""

    def sync_folder(self, path: str) -> None:
        with self._lock:
            self._op()


def loses(disk: SimulatedDisk, recovered, acked: set) -> bool:
    """Whether, after the restart, some acknowledged episode is not committed (its key, or the whole dataset,
    gone; or the dataset refused)."""
    if not acked:
        return False
    if not disk.recover(recovered) or not (recovered / "zarrfeed.json").exists():
        return True
    unlock(recovered)
    try:
        committer = Committer(Location.of(recovered), mode="a")
    except Exception:  # noqa: BLE001 -- a manifest torn or empty, a table missing: what it named is lost
        return True
    try:
        return any(not committer.is_committed(k) for k in acked)
    finally:
        committer.release()


def bounded(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` in a thread of its own, within WAIT seconds: a hang fails the test (naming the crash
    point) instead of holding it."""
    box: list = []

    def run() -> None:
        try:
            box.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # handed to the test's thread below
            box.append((False, exc))

    t = threading.Thread(target=run, name="test-bounded", daemon=True)
    t.start()
    t.join(WAIT)
    assert box, f"{getattr(fn, '__name__', fn)} did not return in {WAIT:g} s"
    ok, value = box.pop()
    if not ok:
        raise value
    return value


# ------------------------------------------------------------------------------------------------------- Dask
SOURCES = list(range(5))
FIRST_SOURCES = 2  # the first ingest's; the second resumes with all of them
D_CHUNKS = {"agents": 1000, "frames": 40, "scenes": 3, "traffic_light_faces": 200}  # chunks shared by sources
# zarr v3: shards of three agent chunks (of 100 rows), which neighbouring sources share
D_V3 = ({"agents": 100, "frames": 4, "scenes": 1, "traffic_light_faces": 20},
        {"zarr_format": 3, "shard_bytes": 3 * 100 * 116})


def _small(seed: int):
    return synthetic.episodes(2 + seed % 2, seed=seed, frames=10, agents_per_frame=12)


D_EPISODES = list(chain.from_iterable(_small(s) for s in SOURCES))
D_KEYS = [Position(fingerprint(D_EPISODES[0]), i) for i in range(len(D_EPISODES))]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A cluster of one worker thread in this process (so its tasks write through the simulated disk), on
    127.0.0.1, started and closed here (its scratch space in the test's temporary folder)."""
    pytest.importorskip("distributed")
    import dask
    from distributed import Client, LocalCluster

    scratch = {"temporary-directory": str(tmp_path_factory.mktemp("dask"))}  # the scheduler's and the worker's
    with dask.config.set(scratch), \
            LocalCluster(n_workers=1, processes=False, threads_per_worker=1, host="127.0.0.1", protocol="tcp",
                         dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False},
                         silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster, timeout=WAIT) as c:
        yield c


def recording(acked: set):
    """`Committer._write_manifest` that adds the keys a commit published to `acked` once it returned."""
    real = Committer._write_manifest

    def write_manifest(self, *args, **kwargs):
        real(self, *args, **kwargs)
        acked.update(k for k in D_KEYS if self.is_committed(k))
    return write_manifest


def dask_ingest(client, path, acked: set, v3: bool = False) -> None:
    """Ingest the first sources, then all of them resumed; the keys acknowledged so far are added to `acked`
    (`v3`: into a zarr v3 dataset, `D_V3`)."""
    chunks, layout = D_V3 if v3 else (D_CHUNKS, {})
    zdask.ingest(client, SOURCES[:FIRST_SOURCES], _small, path, chunks=chunks, commit_interval=0, **layout)
    acked.update(D_KEYS[:sum(len(list(_small(s))) for s in SOURCES[:FIRST_SOURCES])])  # returned: committed
    zdask.ingest(client, SOURCES, _small, path, resume=True, commit_interval=0)
    acked.update(D_KEYS)


def settle(client) -> None:
    """Wait until no task of the stopped ingest runs or waits to run on the cluster: none may write once the files
    are real again. (Those that ended stay in memory, or erred: the error of a task, raised again by the client's
    `Future.result()`, holds the ingest's frame, whose futures hold it, while the client holds their states.)"""
    gc.collect()  # what can be released is released
    deadline = time.monotonic() + WAIT
    while client.run_on_scheduler(lambda dask_scheduler: sum(ts.state not in ("memory", "erred", "released")
                                                             for ts in dask_scheduler.tasks.values())):
        assert time.monotonic() < deadline, "the tasks of the stopped ingest never ended"
        time.sleep(0.01)


REAL_WRITE = zdask._write


class PowerLossOnWorker(Exception):
    """A task of the cluster met the power loss. It reaches the client as an ordinary error: a BaseException that a
    task raised is raised again inside the client's event loop, where tornado lets it escape the coroutine that
    `Future.result()` waits on, which then waits for ever. (A real power loss stops the client too.)"""


def _write(*args, **kwargs):
    """`zarrfeed.writer.dask._write`, the task that writes a source's rows, with its PowerLoss sent as
    `PowerLossOnWorker`."""
    try:
        return REAL_WRITE(*args, **kwargs)
    except PowerLoss as exc:
        raise PowerLossOnWorker(str(exc)) from None


def dask_run(client, path, disk: SimulatedDisk, acked: set, ingest=None) -> None:
    """`ingest` (default `dask_ingest`) through the simulated disk, until it returns or the power fails."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DirectoryStore, "files", disk)
        mp.setattr(Committer, "_write_manifest", recording(acked))
        mp.setattr(zdask, "_write", _write)
        try:
            bounded(ingest or dask_ingest, client, path, acked)
        except (PowerLoss, PowerLossOnWorker):
            assert disk.dead, "PowerLoss, yet the power is on"
        finally:
            settle(client)


def reference_of_dask(client, path, v3: bool = False):
    """The dataset the Dask path writes without a power loss; and how many file operations that took."""
    disk = SimulatedDisk(path)
    acked: set = set()
    dask_run(client, path, disk, acked, ingest=lambda c, p, a: dask_ingest(c, p, a, v3))
    assert not disk.dead and acked == set(D_KEYS)
    assert (Dataset.open(path).tables["agents"].sharding is not None) == v3
    return tables(path), disk.ops


@pytest.fixture(scope="module")
def dask_reference(client, tmp_path_factory):
    return reference_of_dask(client, tmp_path_factory.mktemp("dask_reference") / "d.zarr")


@pytest.fixture(scope="module")
def dask_reference_v3(client, tmp_path_factory):
    return reference_of_dask(client, tmp_path_factory.mktemp("dask_reference_v3") / "d.zarr", v3=True)


def dask_crash_and_recover(client, tmp_path, crash_at: int, tear: bool, seed: int,
                           expected: dict[str, np.ndarray], v3: bool = False) -> None:
    path, recovered = tmp_path / f"d{crash_at}.zarr", tmp_path / f"r{crash_at}.zarr"
    disk = SimulatedDisk(path, crash_at=crash_at, tear=tear, seed=seed)
    acked: set = set()
    dask_run(client, path, disk, acked, ingest=lambda c, p, a: dask_ingest(c, p, a, v3))
    assert not disk.in_place, disk.in_place
    if not disk.dead:  # this run took fewer operations than the reference's (its tasks finished in another order)
        check_final(path, expected)
        return
    if not disk.recover(recovered):
        assert not acked, f"the dataset's folder did not survive, yet {len(acked)} episodes were acknowledged"
        return
    unlock(recovered)
    if not (recovered / "zarrfeed.json").exists():  # no commit survived: nothing was acknowledged either
        assert not acked, f"no manifest survived, yet {len(acked)} episodes were acknowledged"
        shutil.rmtree(recovered)
        bounded(dask_ingest, client, recovered, set(), v3)  # the place is free for a new dataset
    else:
        check_recovered(recovered, D_KEYS, D_EPISODES, acked, expected)
        summary = bounded(zdask.ingest, client, SOURCES, _small, recovered, resume=True)  # `--resume`
        assert summary.passed_over + summary.episodes == len(D_EPISODES), summary
    check_final(recovered, expected)


@pytest.mark.parametrize("seed", [1])
def test_every_committed_episode_of_the_dask_path_survives_a_power_loss(client, tmp_path, dask_reference, seed):
    expected, ops = dask_reference
    for crash_at, tear in pick(ops, seed):
        try:
            replayable("dask", seed, crash_at, ops, tear,
                       lambda: dask_crash_and_recover(client, tmp_path, crash_at, tear, seed, expected))  # noqa: B023
        finally:
            for p in tmp_path.iterdir():
                shutil.rmtree(p, ignore_errors=True)


def test_every_committed_episode_of_the_dask_path_into_v3_shards_survives_a_power_loss(client, tmp_path,
                                                                                        dask_reference_v3):
    """The same into zarr v3, whose shards the sources' tasks share (each writes a shard under its cluster-wide
    lock, replacing it whole)."""
    expected, ops = dask_reference_v3
    seed = 2
    for crash_at, tear in pick(ops, seed, V3_CRASH_POINTS):
        try:
            replayable("dask v3", seed, crash_at, ops, tear,
                       lambda: dask_crash_and_recover(client, tmp_path, crash_at, tear, seed, expected,  # noqa: B023
                                                      v3=True))
        finally:
            for p in tmp_path.iterdir():
                shutil.rmtree(p, ignore_errors=True)


def test_without_durability_the_dask_path_can_lose_committed_episodes(client, tmp_path):
    """The simulator tells the difference: a dataset holding the first sources (on disk before: durable), resumed
    with all of them by an ingest with `durable=False`: some crash point loses what a commit
    published (so the test above could fail)."""
    def prepare(path) -> None:
        zdask.ingest(client, SOURCES[:FIRST_SOURCES], _small, path, chunks=D_CHUNKS)

    def not_durable(client, path, acked) -> None:
        zdask.ingest(client, SOURCES, _small, path, resume=True, commit_interval=0, durable=False)

    prepare(tmp_path / "count.zarr")
    disk = SimulatedDisk(tmp_path / "count.zarr")
    dask_run(client, tmp_path / "count.zarr", disk, set(), ingest=not_durable)
    ops, failures = disk.ops, 0
    for crash_at in range(ops // 2, ops + 1, max(1, ops // 10)):
        path, recovered = tmp_path / f"d{crash_at}.zarr", tmp_path / f"r{crash_at}.zarr"
        prepare(path)
        disk = SimulatedDisk(path, crash_at=crash_at)
        acked: set = set()
        dask_run(client, path, disk, acked, ingest=not_durable)
        failures += loses(disk, recovered, acked)
    assert failures > 0


# ----------------------------------------------------------------------------------------------------- server
S_FIRST = list(synthetic.episodes(1, seed=100, frames=12, agents_per_frame=4))  # in the dataset before
S_EPISODES = [synthetic.episode(i, seed=37, frames=12, agents_per_frame=20) for i in range(10)]
S_KEYS = [Position(fingerprint(S_FIRST[0]), 0)] + [f"e{i}" for i in range(len(S_EPISODES))]
S_CHUNKS = {"agents": 700, "frames": 40, "scenes": 3, "traffic_light_faces": 90}
ACK_EVERY = 3  # RemoteWriter.sync() after every third episode


def serve(path) -> FeedServer:
    """A server in this process on 127.0.0.1 and a free port, its writer in its own threads (workers=0)."""
    return FeedServer(str(path), host="127.0.0.1", port=0, workers=0, ingest=True)


def stop(server: FeedServer) -> None:
    """Stop the server, within bounds: it commits what it accepted (on a dead disk that raises PowerLoss, and the
    Flight server is left to shut down here), then shuts down."""
    try:
        stopped = bounded(server.stop, grace=WAIT / 3)
    except PowerLoss:
        bounded(server.shutdown)
        return
    assert not stopped.calls_left, "calls were still open when the server stopped"


def send(path, acked: set) -> None:
    """Serve `path` and send S_EPISODES by key, acknowledging every ACK_EVERY with `sync()` (the keys acknowledged
    so far are added to `acked` when it returns) and all of them with `close()`."""
    server = serve(path)
    try:
        with RemoteWriter(server.url, timeout=WAIT, stall_timeout=WAIT / 3) as w:
            for i, ep in enumerate(S_EPISODES):
                w.submit(ep, key=f"e{i}")
                if i % ACK_EVERY == ACK_EVERY - 1:
                    w.sync()
                    acked.update(f"e{j}" for j in range(i + 1))
            w.close()
            acked.update(S_KEYS[1:])
    finally:
        stop(server)


def server_run(path, disk: SimulatedDisk, acked: set) -> None:
    """`send` through the simulated disk; after a power loss, whatever the producer was told (the server's call
    failed, or it went away) ends the run, and the server is stopped."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DirectoryStore, "files", disk)
        try:
            send(path, acked)
        except AssertionError:  # the server did not stop, or not in time
            raise
        except (Exception, PowerLoss):
            if not disk.dead:
                raise


# zarr v3: shards of three agent chunks of 100 rows; the server's appends go into the first episode's shards
S_V3 = ({"agents": 100, "frames": 5, "scenes": 1, "traffic_light_faces": 20},
        {"zarr_format": 3, "shard_bytes": 3 * 100 * 116})


def initial(path, v3: bool = False) -> None:
    """The dataset the server appends to (on disk before the simulation: durable; `v3`: in zarr v3, `S_V3`)."""
    chunks, layout = S_V3 if v3 else (S_CHUNKS, {})
    write_dataset(path, S_FIRST, workers=0, chunks=chunks, **layout)


def reference_of_server(path, v3: bool = False):
    initial(path, v3)
    disk = SimulatedDisk(path)
    acked: set = set()
    server_run(path, disk, acked)
    assert not disk.dead and acked == set(S_KEYS[1:])
    assert (Dataset.open(path).tables["agents"].sharding is not None) == v3
    return tables(path), disk.ops


@pytest.fixture(scope="module")
def server_reference(tmp_path_factory):
    return reference_of_server(tmp_path_factory.mktemp("server_reference") / "d.zarr")


@pytest.fixture(scope="module")
def server_reference_v3(tmp_path_factory):
    return reference_of_server(tmp_path_factory.mktemp("server_reference_v3") / "d.zarr", v3=True)


def server_crash_and_recover(tmp_path, crash_at: int, tear: bool, seed: int, expected: dict[str, np.ndarray],
                             v3: bool = False) -> None:
    path, recovered = tmp_path / f"d{crash_at}.zarr", tmp_path / f"r{crash_at}.zarr"
    initial(path, v3)
    disk = SimulatedDisk(path, crash_at=crash_at, tear=tear, seed=seed)
    acked: set = set()
    server_run(path, disk, acked)
    assert not disk.in_place, disk.in_place
    if not disk.dead:  # this run took fewer operations than the reference's (its writer committed less often)
        check_final(path, expected)
        return
    assert disk.recover(recovered), "the dataset's folder, there before, did not survive"
    unlock(recovered)
    check_recovered(recovered, S_KEYS, S_FIRST + S_EPISODES, acked, expected)
    send(recovered, set())  # a new server on the recovered dataset; every episode sent again by key
    check_final(recovered, expected)


@pytest.mark.parametrize("seed", [1])
def test_every_acknowledged_episode_of_the_server_survives_a_power_loss(tmp_path, server_reference, seed):
    expected, ops = server_reference
    for crash_at, tear in pick(ops, seed):
        try:
            replayable("serve", seed, crash_at, ops, tear,
                       lambda: server_crash_and_recover(tmp_path, crash_at, tear, seed, expected))  # noqa: B023
        finally:
            for p in tmp_path.iterdir():
                shutil.rmtree(p, ignore_errors=True)


def test_every_acknowledged_episode_of_the_server_into_v3_shards_survives_a_power_loss(tmp_path,
                                                                                        server_reference_v3):
    """The same into zarr v3: the server's writer appends into the shards of the dataset's last rows."""
    expected, ops = server_reference_v3
    seed = 2
    for crash_at, tear in pick(ops, seed, V3_CRASH_POINTS):
        try:
            replayable("serve v3", seed, crash_at, ops, tear,
                       lambda: server_crash_and_recover(tmp_path, crash_at, tear, seed, expected,  # noqa: B023
                                                        v3=True))
        finally:
            for p in tmp_path.iterdir():
                shutil.rmtree(p, ignore_errors=True)


def test_without_folder_syncs_the_server_can_lose_acknowledged_episodes(tmp_path, server_reference):
    """The simulator tells the difference: on a disk whose folder fsyncs do nothing (the server offers no
    durable=False), some crash point loses what `sync()` acknowledged (so the test above could fail)."""
    _, ops = server_reference
    failures = 0
    for crash_at in range(ops // 2, ops + 1, max(1, ops // 10)):
        path, recovered = tmp_path / f"d{crash_at}.zarr", tmp_path / f"r{crash_at}.zarr"
        initial(path)
        disk = NoFolderSync(path, crash_at=crash_at)
        acked: set = set()
        server_run(path, disk, acked)
        failures += loses(disk, recovered, acked)
    assert failures > 0
