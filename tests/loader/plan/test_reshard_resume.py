"""An epoch resumed on another number of ranks when little of it is left: a rank whose share of the
rest is empty yields nothing for that epoch and goes on at batch 0 of the next, like every other rank, for
every loader; the rows read before the save and after it are the uninterrupted epoch's, each once.

The cases leave fewer rows than new ranks, so some share is empty: such a rank must not take its position
(0 of 0 batches) for a finished epoch and read the whole of its next one instead."""
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarrfeed.loader import (AgentSampleLoader, Dataset, EgoSampleLoader, Loader, LoaderError, SequenceLoader,
                             WindowLoader)

CHUNK_ROWS = (1, 3, 7, 16)


@pytest.fixture(scope="module")
def tables(small_dataset):
    """Datasets whose agents table is chunked in each of CHUNK_ROWS rows (about 150 agents each)."""
    return {c: small_dataset(1, 5, chunks={"agents": c}, frames=30, agents_per_frame=5) for c in CHUNK_ROWS}


def rows_of(batches, key="_row"):
    return [b[key].copy() for b in batches]


def run_old(make, world, steps, finish, key):
    """Each of `world` ranks reads steps[r] batches (finish[r]: a rank that read its last batch also leaves
    the loop by itself, so its state says the next epoch); the rows read, and every rank's state."""
    before, states = Counter(), []
    for r in range(world):
        with make(r, world) as loader:
            it = iter(loader)
            for _ in range(steps[r]):
                before.update(next(it)[key].tolist())
            if finish[r] and steps[r] == len(loader):
                assert list(it) == []
            states.append(loader.state_dict())
    return before, states


def whole_epoch(make, world, epoch, key):
    """The rows of `epoch` of an uninterrupted run on `world` ranks (a Counter: the rows repeated to even out
    the ranks count twice)."""
    out = Counter()
    for r in range(world):
        with make(r, world) as loader:
            loader.set_epoch(epoch)
            for b in loader:
                out.update(b[key].tolist())
    return out


def check_resumed(make, states, before, old, new, epoch, key):
    """Load `states` into `new` ranks: every row of `epoch` once with those read before, batch counts within
    one of each other, and each rank then at batch 0 of epoch + 1, whose batches are a fresh run's."""
    after, counts = Counter(), []
    for j in range(new):
        with make(j, new) as loader:
            loader.load_state_dict(states)
            assert loader.epoch == epoch
            got = rows_of(loader, key)
            counts.append(len(got))
            after.update(np.concatenate(got).tolist() if got else [])
            assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (epoch + 1, 0)
            nxt = rows_of(loader, key)
        with make(j, new) as fresh:
            fresh.set_epoch(epoch + 1)
            want = rows_of(fresh, key)
        assert len(nxt) == len(want) and all(np.array_equal(a, b) for a, b in zip(nxt, want, strict=True))
    untouched = all(s["epoch"] == epoch and s["batch"] == 0 and s["spans"] is None for s in states)
    # nothing read of the epoch: it is the new run's own, its ranks evened out by repeating rows as usual
    assert before + after == whole_epoch(make, new if untouched else old, epoch, key)
    assert max(counts) - min(counts) <= 1


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(st.data())
def test_every_row_of_a_resharded_epoch_once_whatever_is_left(tables, data):
    """Random table sizes (a selection of the first rows), chunk sizes, batch sizes, windows, N -> M ranks and
    positions (none read, some, all but the last, all of them, all and the loop left by itself)."""
    chunk = data.draw(st.sampled_from(CHUNK_ROWS), label="chunk rows")
    path = tables[chunk]
    n = data.draw(st.integers(1, Dataset.open(path).rows["agents"]), label="rows")
    kw = dict(batch_size=data.draw(st.integers(1, 9), label="batch"), seed=data.draw(st.integers(0, 3)),
              shuffle=data.draw(st.booleans(), label="shuffle"), drop_last=data.draw(st.booleans(), label="drop"),
              shuffle_window=data.draw(st.integers(1, 4), label="window"))
    old, new = data.draw(st.integers(1, 5), label="N"), data.draw(st.integers(1, 7), label="M")
    epoch = data.draw(st.integers(0, 1), label="epoch")
    rows = np.arange(n)

    def make(rank, world):
        loader = Loader(path, num_workers=0, rank=rank, world_size=world, row_ids=True, rows=rows, **kw)
        loader.set_epoch(epoch)
        return loader

    sizes = []
    for r in range(old):
        with make(r, old) as loader:
            sizes.append(len(loader))
    # each rank anywhere in its epoch; most often near its end, where the rest is smaller than M
    steps = [data.draw(st.one_of(st.integers(0, s), st.integers(max(0, s - 1), s)), label=f"steps {r}")
             for r, s in enumerate(sizes)]
    finish = [data.draw(st.booleans(), label=f"finish {r}") for r in range(old)]
    before, states = run_old(make, old, steps, finish, "_row")
    if all(s["epoch"] == epoch + 1 for s in states):  # every rank finished: the new run's own next epoch
        return
    check_resumed(make, states, before, old, new, epoch, "_row")


def test_the_issues_loader_case_reads_row_25_once(small_dataset):
    """50 rows in chunks of 7, batches of 4, saved after 12 of 13 batches, resumed on 3 ranks
    (rank 0 read 5 batches, ranks 1 and 2 one each, row 25 twice)."""
    path = small_dataset(1, 5, chunks={"agents": 7}, frames=30, agents_per_frame=5)

    def make(rank, world):
        return Loader(path, num_workers=0, rank=rank, world_size=world, row_ids=True, rows=np.arange(50),
                      batch_size=4, seed=1)

    before, states = run_old(make, 1, [12], [False], "_row")
    check_resumed(make, states, before, 1, 3, 0, "_row")


def test_states_of_a_resharded_epoch_saved_at_its_start_share_out_only_its_rest(small_dataset):
    """A run resumed on 3 ranks from 2 saves at once, before reading (each new rank at batch 0 of its share of
    the rest); resumed again on 4 ranks, the rows the first run read are not read again (they were: states at
    batch 0 were taken for an epoch nothing of which had been read)."""
    path = small_dataset(1, 5, chunks={"agents": 7}, frames=30, agents_per_frame=5)

    def make(rank, world):
        return Loader(path, num_workers=0, rank=rank, world_size=world, row_ids=True, batch_size=5, seed=2)

    before, first = run_old(make, 2, [3, 1], [False, False], "_row")
    second = []
    for j in range(3):
        with make(j, 3) as loader:
            loader.load_state_dict(first)
            second.append(loader.state_dict())
    assert all(s["batch"] == 0 and s["spans"] for s in second)
    check_resumed(make, second, before, 2, 4, 0, "_row")


def test_a_state_of_an_empty_share_saved_again_goes_on_at_the_next_epoch(small_dataset):
    """An empty share's state, saved before its (empty) loop and loaded again, still yields nothing for the
    epoch and then goes on at batch 0 of the next."""
    path = small_dataset(1, 5, chunks={"agents": 7}, frames=30, agents_per_frame=5)

    def make(rank, world):
        return Loader(path, num_workers=0, rank=rank, world_size=world, row_ids=True, rows=np.arange(50),
                      batch_size=4, seed=1)

    _, states = run_old(make, 1, [12], [False], "_row")  # 2 rows left, for 3 ranks
    shares = []
    for j in range(3):
        with make(j, 3) as loader:
            loader.load_state_dict(states)
            shares.append((len(loader), loader.state_dict()))
    (rank, (_, saved)), = [(j, s) for j, s in enumerate(shares) if s[0] == 0]
    assert saved["spans"] == []
    with make(rank, 3) as again, make(rank, 3) as fresh:
        again.load_state_dict(saved)
        assert rows_of(again) == []
        fresh.set_epoch(1)
        assert again.state_dict()["epoch"] == 1 and len(again) == len(fresh)
        assert all(np.array_equal(a, b) for a, b in zip(rows_of(again), rows_of(fresh), strict=True))


SAMPLE_LOADERS = {
    "windows": (WindowLoader, "frame_row", dict(history=3, future=4)),
    "agents": (AgentSampleLoader, "agent_row", dict(history=3, future=4, min_history=0)),
    "ego": (EgoSampleLoader, "frame_row", dict(history=3, future=4)),
}


@pytest.mark.parametrize("kind", sorted(SAMPLE_LOADERS))
@pytest.mark.parametrize("old, new, batch_size", [(1, 2, 1), (1, 3, 2), (2, 5, 1), (3, 2, 1), (2, 4, 3)])
def test_sample_loaders_resumed_with_less_left_than_ranks(small_dataset, kind, old, new, batch_size):
    """WindowLoader, AgentSampleLoader and EgoSampleLoader with the last batch of rank 0 unread."""
    path = small_dataset(1, 5, chunks={"agents": 40, "frames": 8}, frames=30, agents_per_frame=3)
    cls, key, kw = SAMPLE_LOADERS[kind]
    check_last_batch_left(lambda r, w: cls(path, num_workers=0, rank=r, world_size=w, seed=2,
                                           batch_size=batch_size, **kw), old, new, key)


def check_last_batch_left(make, old, new, key):
    """Old ranks that read all their batches but rank 0's last, resumed on `new` ranks, more than the samples
    left (see check_resumed)."""
    steps = []
    for r in range(old):
        with make(r, old) as loader:
            steps.append(len(loader) - (r == 0))
            if r == 0:
                left = loader.plan().batch_rows(len(loader) - 1)
    assert left < new, "the case under test: fewer samples left than ranks"
    before, states = run_old(make, old, steps, [True] * old, key)
    check_resumed(make, states, before, old, new, 0, key)


@pytest.mark.parametrize("old, new, episodes", [(1, 2, None), (2, 3, [0, 1]), (1, 4, [2])])
def test_sequence_loader_resumed_with_little_left(dp_buffer, old, new, episodes):
    """A SequenceLoader case (batches of 6, rank 0's last batch unread, resumed on more ranks: rank 0
    read the next epoch's half, 2,824 samples twice); fewer episodes, for smaller remainders."""
    def make(r, w):
        return SequenceLoader(dp_buffer, sequence_length=4, batch_size=6, num_workers=0, rank=r, world_size=w,
                              seed=3, keys=["action"], episodes=episodes)

    with make(0, old) as loader:
        assume_left = loader.plan().batch_rows(len(loader) - 1)
    if assume_left >= new:  # batch 6 leaves more: cut at one sample left instead (batch 1 for these)
        def make(r, w):  # noqa: F811
            return SequenceLoader(dp_buffer, sequence_length=4, batch_size=1, num_workers=0, rank=r,
                                  world_size=w, seed=3, keys=["action"], episodes=episodes)
    check_last_batch_left(make, old, new, "sample")


def test_a_remote_loader_resumes_an_empty_share_as_a_local_one(small_dataset):
    """A remote loader given the state of a rank whose share of the rest is empty (saved before its empty loop)
    yields nothing for that epoch and goes on at batch 0 of the next, as a local loader does; a state with rows
    left in a resharded epoch is still refused (the server plans usual shares only)."""
    from serve_process import Server

    from zarrfeed.flight import RemoteLoader
    path = small_dataset(1, 5, chunks={"agents": 7}, frames=30, agents_per_frame=5)
    kw = dict(batch_size=Dataset.open(path).rows["agents"] - 1, seed=1, row_ids=True)  # 1 row left, for 3 ranks
    _, states = run_old(lambda r, w: Loader(path, num_workers=0, rank=r, world_size=w, **kw), 1, [1], [False],
                        "_row")
    shares = []
    for j in range(3):
        with Loader(path, num_workers=0, rank=j, world_size=3, **kw) as loader:
            loader.load_state_dict(states)
            shares.append(loader.state_dict())
    empty = next(s for s in shares if s["spans"] == [])
    some = next(s for s in shares if s["spans"])
    s = Server(path)
    try:
        with RemoteLoader(s.url, "agents", rank=empty["settings"]["rank"], world_size=3, **kw) as remote, \
                Loader(path, num_workers=0, rank=empty["settings"]["rank"], world_size=3, **kw) as fresh:
            remote.load_state_dict(empty)
            assert len(remote) == 0 and rows_of(remote) == []
            assert (remote.state_dict()["epoch"], remote.state_dict()["batch"]) == (1, 0)
            fresh.set_epoch(1)
            got, want = rows_of(remote), rows_of(fresh)
            assert len(got) == len(want) > 0 and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        with RemoteLoader(s.url, "agents", rank=some["settings"]["rank"], world_size=3, **kw) as remote:
            with pytest.raises(ValueError, match="resharded on another number of ranks: resume it with a local"):
                remote.load_state_dict(some)
    finally:
        s.stop()


def test_a_remote_loader_that_reconnects_to_another_copy_refuses_to_go_on(small_dataset, tmp_path):
    """Two copies of one dataset, appended differently (the same id and commit number, other rows),
    served one after the other on one port as a failover to a replica would be: the loader reading an epoch
    from the first, reconnected to the second, finished the epoch with its rows. It raises one line now, with
    no batch of the second copy yielded."""
    import shutil
    import time

    from serve_process import TRANSFORMS, Server

    from zarrfeed.flight import RemoteLoader
    from zarrfeed.writer import DatasetWriter, synthetic
    base = small_dataset(8, 8, chunks={"agents": 2000}, frames=60, agents_per_frame=20)  # batches in 3 groups
    x, y = tmp_path / "x.zarr", tmp_path / "y.zarr"
    shutil.copytree(base, x)
    shutil.copytree(base, y)
    ep = next(iter(synthetic.episodes(1, seed=9, frames=20, agents_per_frame=5)))
    moved = {**ep, "agents": ep["agents"].copy()}
    moved["agents"]["track_id"] += 1000
    for path, new in ((x, ep), (y, moved)):
        with DatasetWriter(path, workers=0, mode="a") as w:
            w.ingest([new])
    assert Dataset.open(x).commit == Dataset.open(y).commit and Dataset.open(x).rows == Dataset.open(y).rows
    s = Server(x, "--transforms", str(TRANSFORMS))
    restarted = None
    got = []
    try:
        remote = RemoteLoader(s.url, "agents", batch_size=20, seed=3, transform="slow",
                              transform_args={"seconds": 0.01}, reconnect_timeout=60)
        with remote, pytest.raises(LoaderError) as err:
            for i, batch in enumerate(remote):
                got.append(batch["track_id"].copy())
                if i == 2:  # mid-epoch: the server dies and one serving the other copy starts on its port
                    s.kill()
                    time.sleep(0.5)
                    restarted = Server(y, "--port", s.port, "--transforms", str(TRANSFORMS))
        message = str(err.value)
        assert "\n" not in message and "came back with another copy of this dataset" in message, message
        assert 3 <= len(got) < len(remote)  # what the first server had sent before it died, and no more
        assert remote.state_dict()["batch"] == len(got)  # where it stood on the first copy: resumable there
    finally:
        if restarted is not None:
            restarted.stop()
        else:
            s.kill()


def test_a_remote_loaders_state_at_an_epochs_end_needs_no_call_to_the_server(small_dataset):
    """A checkpoint after an epoch asked the server for the next epoch's plan, so
    with the server stopped (a restart, a pause) `state_dict()` waited for the call's timeout, then raised a line
    naming no server. The state holds nothing that depends on the epoch besides the position."""
    import os
    import signal

    from serve_process import Server

    from zarrfeed.flight import RemoteLoader
    path = small_dataset(1, 5, chunks={"agents": 7}, frames=30, agents_per_frame=5)
    s = Server(path)
    try:
        with RemoteLoader(s.url, "agents", batch_size=40, seed=1, timeout=5) as remote:
            n = len(rows_of(remote, "track_id"))
            os.kill(s.proc.pid, signal.SIGSTOP)
            try:
                state = remote.state_dict()
            finally:
                os.kill(s.proc.pid, signal.SIGCONT)
        with Loader(path, num_workers=0, batch_size=40, seed=1) as local:
            assert n == len(local) and len(rows_of(local, "track_id")) == n
            assert state == local.state_dict()  # (epoch 1, batch 0), as a local loader's
    finally:
        s.stop()
