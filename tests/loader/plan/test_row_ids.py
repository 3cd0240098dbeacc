"""Which rows a batch holds: `row_ids=True` adds `_row`, each row's index in its table, computed
from the plan; it names exactly the rows the batch holds, every row of an epoch once, across a resume, with a
transform, as Arrow, and through the server."""
import numpy as np
import pytest
from zarrfeed.loader import Dataset, Loader


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(6, 31, chunks={"agents": 700, "frames": 100, "traffic_light_faces": 300}, frames=60,
                         agents_per_frame=25)


def rows_of(loader):
    return [b["_row"].copy() for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_batch_names_its_rows_and_an_epoch_names_every_row_once(data, workers):
    table = Dataset.open(data)["agents"][:]
    with Loader(data, batch_size=333, num_workers=workers, seed=4, shuffle_window=3, row_ids=True) as loader:
        for epoch in range(2):
            seen = []
            for b in loader:
                np.testing.assert_array_equal(b["track_id"], table["track_id"][b["_row"]])
                np.testing.assert_array_equal(b["centroid"], table["centroid"][b["_row"]])
                seen.append(b["_row"].copy())
            assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(len(table)))


def test_ranks_rows_and_a_resume_read_each_row_once(data):
    n = Dataset.open(data).rows["agents"]
    with Loader(data, batch_size=200, num_workers=0, seed=2, rank=0, world_size=2, row_ids=True) as r0, \
            Loader(data, batch_size=200, num_workers=0, seed=2, rank=1, world_size=2, row_ids=True) as r1:
        first = rows_of(r0)
        it = iter(r1)
        part = [next(it)["_row"].copy() for _ in range(3)]
        state = r1.state_dict()
    with Loader(data, batch_size=200, num_workers=0, seed=2, rank=1, world_size=2, row_ids=True) as resumed:
        resumed.load_state_dict(state)
        rest = rows_of(resumed)
    every = np.concatenate(first + part + rest)
    assert set(every.tolist()) == set(range(n)) and len(every) - n <= 1  # ranks even out with one repeated row


def test_row_ids_with_a_transform_and_as_arrow(data):
    table = Dataset.open(data)["agents"][:]

    def speed(batch):
        return {"speed": np.linalg.norm(batch["velocity"], axis=1)}

    with Loader(data, batch_size=500, num_workers=1, seed=1, transform=speed, row_ids=True) as loader:
        for b in loader:
            np.testing.assert_allclose(b["speed"], np.linalg.norm(table["velocity"][b["_row"]], axis=1))
    with Loader(data, batch_size=500, num_workers=0, seed=1, output="arrow", row_ids=True) as loader:
        rb = next(iter(loader))
        np.testing.assert_array_equal(rb.column("track_id").to_numpy(),
                                      table["track_id"][rb.column("_row").to_numpy()])


def test_remote_batches_carry_their_rows(data):
    from serve_process import Server
    from zarrfeed.flight import RemoteLoader

    s = Server(data)
    try:
        with RemoteLoader(s.url, "agents", batch_size=400, seed=5, row_ids=True) as remote, \
                Loader(data, batch_size=400, num_workers=0, seed=5, row_ids=True) as local:
            got, want = rows_of(remote), rows_of(local)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        with pytest.raises(ValueError, match="row_ids is for batches of rows"):
            from zarrfeed.flight.protocol import Ticket
            from zarrfeed.flight.protocol import TicketPlan
            Ticket("frames", TicketPlan(8), kind="windows", row_ids=True).check()
    finally:
        s.stop()


def epoch_rows(path, world, epoch=0, **kw):
    """Every row each rank reads in `epoch` of a run on `world` ranks, together (a Counter)."""
    from collections import Counter
    out = Counter()
    for r in range(world):
        with Loader(path, num_workers=0, rank=r, world_size=world, row_ids=True, **kw) as loader:
            loader.set_epoch(epoch)
            for b in loader:
                out.update(b["_row"].tolist())
    return out


@pytest.mark.parametrize("old, new, batch_size, shuffle_window", [(4, 3, 150, 3), (4, 1, 150, 3), (2, 4, 150, 3),
                                                                  (3, 3, 150, 3), (4, 3, 700, 8), (2, 3, 1100, 2)])
def test_an_epoch_resumed_on_another_number_of_ranks_reads_every_remaining_row_once(data, old, new, batch_size,
                                                                                     shuffle_window):
    """The states of all N old ranks, mid-epoch (each at its own batch), resume on M ranks: the rows
    read before and after are exactly those of the uninterrupted epoch (its rows once, and the few rows a run
    repeats to even out its ranks), each batch holds the rows it names, and the next epoch is the usual one of
    M ranks. (The row ids come from the consumer's plan and the rows from the workers': checking one against
    the other is what found workers gathering a resumed epoch by the usual plan.)"""
    from collections import Counter
    table = Dataset.open(data)["agents"][:]
    kw = dict(batch_size=batch_size, seed=7, shuffle_window=shuffle_window)
    before, states = Counter(), []
    for r in range(old):
        with Loader(data, num_workers=0, rank=r, world_size=old, row_ids=True, **kw) as loader:
            it = iter(loader)
            for _ in range(min(r + 1, len(loader) - 1)):  # each rank somewhere else in the epoch
                before.update(next(it)["_row"].tolist())
            states.append(loader.state_dict())
    after, batches = Counter(), []
    for j in range(new):
        with Loader(data, num_workers=1, rank=j, world_size=new, row_ids=True, **kw) as loader:
            loader.load_state_dict(states)
            assert loader.epoch == 0
            rows = []
            for b in loader:
                np.testing.assert_array_equal(b["track_id"], table["track_id"][b["_row"]])
                np.testing.assert_array_equal(b["centroid"], table["centroid"][b["_row"]])
                rows.append(b["_row"].copy())
            batches.append(len(rows))
            after.update(np.concatenate(rows).tolist() if rows else [])
            nxt = [b["_row"].copy() for b in loader]  # epoch 1: as a fresh run on `new` ranks
        with Loader(data, num_workers=0, rank=j, world_size=new, row_ids=True, **kw) as fresh:
            fresh.set_epoch(1)
            assert all(np.array_equal(a, b) for a, b in zip(nxt, [b["_row"].copy() for b in fresh], strict=True))
    assert before + after == epoch_rows(data, old, **kw)
    assert max(batches) - min(batches) <= 1


def test_a_resharded_epoch_saved_again_resumes_exactly_and_partial_states_are_refused(data):
    kw = dict(batch_size=150, seed=7, shuffle_window=3)
    states = []
    for r in range(2):
        with Loader(data, num_workers=0, rank=r, world_size=2, row_ids=True, **kw) as loader:
            it = iter(loader)
            next(it)
            states.append(loader.state_dict())
    with pytest.raises(ValueError, match=r"loader states of ranks \[0\] of a run on 2: the states of all 2"):
        Loader(data, num_workers=0, rank=0, world_size=3, **kw).load_state_dict(states[:1])
    with pytest.raises(ValueError, match="loader state has batch_size=150; this loader has batch_size=100"):
        Loader(data, num_workers=0, rank=0, world_size=3, **{**kw, "batch_size": 100}).load_state_dict(states)
    with Loader(data, num_workers=0, rank=1, world_size=3, row_ids=True, **kw) as a:
        a.load_state_dict(states)
        it = iter(a)
        first = [next(it)["_row"].copy() for _ in range(2)]
        saved = a.state_dict()
        rest = [b["_row"].copy() for b in it]
    assert saved["spans"] is not None
    with Loader(data, num_workers=0, rank=1, world_size=3, row_ids=True, **kw) as b:
        b.load_state_dict(saved)
        again = [x["_row"].copy() for x in b]
    assert all(np.array_equal(x, y) for x, y in zip(again, rest, strict=True)) and len(again) == len(rest)
    assert first


def test_window_samples_resumed_on_another_number_of_ranks_are_each_read_once(data):
    """The same for WindowLoader, whose samples name their frame in `frame_row`: every sample of the epoch
    once, each holding its own frames."""
    from collections import Counter

    from zarrfeed.loader import WindowLoader
    frames = Dataset.open(data)["frames"][:]
    kw = dict(history=3, future=4, batch_size=40, seed=3, shuffle_window=2)
    whole, before, states = Counter(), Counter(), []
    for r in range(2):
        with WindowLoader(data, num_workers=0, rank=r, world_size=2, **kw) as loader:
            whole.update(t for b in loader for t in b["frame_row"].tolist())
            it = iter(loader)
            for _ in range(r + 2):
                before.update(next(it)["frame_row"].tolist())
            states.append(loader.state_dict())
    after = Counter()
    for j in range(3):
        with WindowLoader(data, num_workers=1, rank=j, world_size=3, **kw) as loader:
            loader.load_state_dict(states)
            for b in loader:
                t = b["frame_row"]
                np.testing.assert_array_equal(b["frames/timestamp"][:, 3], frames["timestamp"][t])
                after.update(t.tolist())
    assert before + after == whole


@pytest.mark.parametrize("ego", [False, True])
def test_l5kit_samples_resumed_on_another_number_of_ranks_are_each_read_once(data, ego):
    """The same for AgentSampleLoader (a sample names its row in `agent_row`) and EgoSampleLoader (`frame_row`):
    every sample once, each computed at its own row."""
    from collections import Counter

    from zarrfeed.loader import AgentSampleLoader, EgoSampleLoader
    make, key = (EgoSampleLoader, "frame_row") if ego else (AgentSampleLoader, "agent_row")
    ds = Dataset.open(data)
    kw = dict(history=3, future=4, batch_size=64, seed=3, shuffle_window=2)
    if not ego:
        kw["min_history"] = 0
    whole, before, states = Counter(), Counter(), []
    for r in range(2):
        with make(data, num_workers=0, rank=r, world_size=2, **kw) as loader:
            whole.update(x for b in loader for x in b[key].tolist())
            it = iter(loader)
            for _ in range(r + 2):
                before.update(next(it)[key].tolist())
            states.append(loader.state_dict())
    after = Counter()
    table = ds["frames"][:] if ego else ds["agents"][:]
    for j in range(3):
        with make(data, num_workers=1, rank=j, world_size=3, **kw) as loader:
            loader.load_state_dict(states)
            for b in loader:
                rows = b[key]
                want = table["ego_translation"][rows][:, :2] if ego else table["centroid"][rows]
                np.testing.assert_array_equal(b["centroid"], want)
                after.update(rows.tolist())
    assert before + after == whole


def _old_run(data, world, steps, **kw):
    """Each of `world` ranks reads steps[r] batches and saves its state: (rows read, states)."""
    from collections import Counter
    before, states = Counter(), []
    for r in range(world):
        with Loader(data, num_workers=0, rank=r, world_size=world, row_ids=True, **kw) as loader:
            it = iter(loader)
            for _ in range(steps[r]):
                before.update(next(it)["_row"].tolist())
            states.append(loader.state_dict())
    return before, states


def test_states_loaded_before_use_ranks_are_shared_out_among_the_new_ranks(data):
    """A Loader made with the default rank 0 of 1 takes its rank later (`use_ranks`, as `to_torch()` does under
    torch.distributed): the states loaded before are shared out again among those ranks (not every new
    rank reading every remaining row)."""
    from collections import Counter
    kw = dict(batch_size=300, seed=7, shuffle_window=3)
    table = Dataset.open(data)["agents"][:]
    before, states = _old_run(data, 3, [2, 1, 3], **kw)
    after = Counter()
    for j in range(2):
        with Loader(data, num_workers=0, row_ids=True, **kw) as loader:
            loader.load_state_dict(states)
            loader.use_ranks(j, 2)
            for b in loader:
                np.testing.assert_array_equal(b["track_id"], table["track_id"][b["_row"]])
                after.update(b["_row"].tolist())
    assert before + after == epoch_rows(data, 3, **kw)
    with Loader(data, num_workers=0, **kw) as loader:  # one rank's state, before use_ranks: says what to do
        with pytest.raises(ValueError, match=r"call use_ranks\(rank, world_size\) or to_torch\(\) before"):
            loader.load_state_dict(states[1])
        with pytest.raises(ValueError, match=r"no loader states given"):
            loader.load_state_dict([])


def test_a_resharded_drop_last_epoch_reads_only_the_rows_the_run_would_have_read(data):
    """With drop_last, the rows past a rank's last whole batch are never read by its epoch: resumed on other
    ranks, they are not read either."""
    kw = dict(batch_size=700, seed=2, shuffle_window=2, drop_last=True)
    before, states = _old_run(data, 3, [1, 2, 1], **kw)
    after = epoch_rows_resumed(data, states, 2, **kw)
    assert before + after == epoch_rows(data, 3, **kw)


def test_states_saved_at_an_epochs_end_resume_on_other_ranks_as_their_own_next_epoch(data):
    """States saved after every rank finished epoch 0 say (epoch 1, batch 0): on M ranks, epoch 1 is then the
    M ranks' own epoch 1, batch for batch."""
    kw = dict(batch_size=500, seed=5, shuffle_window=2)
    states = []
    for r in range(3):
        with Loader(data, num_workers=0, rank=r, world_size=3, **kw) as loader:
            for _ in loader:
                pass
            states.append(loader.state_dict())
    for j in range(2):
        with Loader(data, num_workers=0, rank=j, world_size=2, row_ids=True, **kw) as resumed, \
                Loader(data, num_workers=0, rank=j, world_size=2, row_ids=True, **kw) as fresh:
            resumed.load_state_dict(states)
            fresh.set_epoch(1)
            got, want = [b["_row"].copy() for b in resumed], [b["_row"].copy() for b in fresh]
            assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def epoch_rows_resumed(path, states, world, **kw):
    """The rows `world` new ranks read after loading `states`, together (a Counter)."""
    from collections import Counter
    out = Counter()
    for j in range(world):
        with Loader(path, num_workers=0, rank=j, world_size=world, row_ids=True, **kw) as loader:
            loader.load_state_dict(states)
            for b in loader:
                out.update(b["_row"].tolist())
    return out
