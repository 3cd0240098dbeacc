"""Order 2: batches as mixed as a true shuffle whenever the table fits the loader's shuffle_bytes.
The order is specified (loader/ordering/order.py) and held to stored golden blocks, the same in C and Python, a
permutation of every epoch's rows with random access per block; a loader's default window is the whole table
up to shuffle_bytes (a function of the dataset and options, recorded in its state); a state saved in order 1
goes on in order 1."""
import contextlib
import hashlib
import statistics

import numpy as np
import pytest

import zarrfeed.loader.ordering.order as order_module
from zarrfeed.loader import AgentSampleLoader, EgoSampleLoader, Loader, SequenceLoader, WindowLoader
from zarrfeed.loader.ordering.order import block_count, block_starts, fill_block, strata
from zarrfeed.loader.ordering.plan import EpochPlan, selected_rows_per_chunk, window_chunks
from plans import plan_config

SIZES = [[20802] * 100, [1, 2, 3, 5, 63, 64, 65, 100, 7, 4099], [0, 5, 0, 3000], [20802] * 99 + [17], [1]]


def blocks_of(sizes, seed=3, epoch=1, window=2):
    sizes = np.array(sizes, np.int64)
    n = block_count(int(sizes.sum()))
    starts = block_starts(sizes, n)
    bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    mults, offsets = strata(sizes, seed, epoch, window)
    out = []
    for t in range(n):
        block = np.empty(int(starts[t + 1] - starts[t]), np.int64)
        fill_block(block, bases, sizes, mults, offsets, t, n, seed, epoch, window)
        out.append(block)
    return mults, offsets, out


def test_golden_blocks():
    """Stored order-2 blocks: a change of the algorithm fails here (states and tickets carry order 2)."""
    mults, offsets, blocks = blocks_of([20802] * 100)
    assert mults[:4].tolist() == GOLDEN_MULTS and offsets[:4].tolist() == GOLDEN_OFFSETS
    assert len(blocks) == 64 and blocks[0][:6].tolist() == GOLDEN_FIRST
    digest = hashlib.sha256(np.concatenate(blocks).astype("<i8").tobytes()).hexdigest()
    assert digest == GOLDEN_DIGEST


GOLDEN_MULTS = [8579, 18629, 8779, 10007]
GOLDEN_OFFSETS = [5898, 2929, 7582, 13063]
GOLDEN_FIRST = [2019448, 646195, 424119, 1631132, 525171, 1719489]
GOLDEN_DIGEST = "3cb7da13836f82983d288cd398ade36b657907f09562afb0f2d9cb2b94072477"


@pytest.mark.parametrize("sizes", SIZES, ids=range(len(SIZES)))
def test_c_and_python_give_the_same_blocks_and_every_row_once(sizes, monkeypatch):
    if order_module._order is None:
        pytest.skip("the C extension is not built here")
    c = blocks_of(sizes)
    monkeypatch.setattr(order_module, "_order", None)  # the fallback without a compiler
    py = blocks_of(sizes)
    assert np.array_equal(c[0], py[0]) and np.array_equal(c[1], py[1])
    assert all(np.array_equal(a, b) for a, b in zip(c[2], py[2], strict=True))
    rows = np.concatenate(c[2])
    assert np.array_equal(np.sort(rows), np.arange(sum(sizes)))


def test_multipliers_spread_the_rows_a_block_takes():
    """Each chunk's multiplier is coprime to its rows (a bijection) and its multiples k*a (k up to 256) stay
    s/(16k) from a multiple of the chunk's rows, so a block's share of a chunk is spread over it, never a few
    tight runs. (Checking the first 8 multiples only is not enough: a = 1891 of 20,802 rows put a block's 325
    rows in 11 runs.)"""
    sizes = np.array([20802, 4096, 65, 97, 1000, 99991], np.int64)
    for epoch in range(20):
        mults, offsets = strata(sizes, 0, epoch, 0)
        for a, b, s in zip(mults.tolist(), offsets.tolist(), sizes.tolist(), strict=True):
            assert np.gcd(a, s) == 1 and 0 <= b < s
            assert all(min(k * a % s, s - k * a % s) * 16 * k >= s for k in range(1, min(257, s)))
    # every block's share of a chunk is spread over the whole chunk: each sixteenth of it gets its share
    _, _, blocks = blocks_of([20802] * 100)
    for block in blocks[:8]:
        for j in range(0, 100, 7):
            rows = block[(block >= j * 20802) & (block < (j + 1) * 20802)] - j * 20802
            counts = np.bincount(rows * 16 // 20802, minlength=16)
            assert counts.min() >= 0.5 * len(rows) / 16 and counts.max() <= 1.5 * len(rows) / 16
    # and a batch of 4,096 holds as many distinct 84-row stretches (an L5Kit frame of agents) as a uniform
    # permutation's batches do
    order = np.concatenate(blocks)
    ours = [len(np.unique(b // 84)) for b in order[:4096 * 500].reshape(-1, 4096)]
    uniform = [len(np.unique(b // 84)) for b in
               np.random.default_rng(0).permutation(len(order))[:4096 * 500].reshape(-1, 4096)]
    assert statistics.median(ours) >= 0.99 * statistics.median(uniform)


def plan(n_rows, chunk_rows, batch, window, selection=None, **kw):
    config = plan_config(n_rows=n_rows, chunk_rows=chunk_rows, batch_size=batch, shuffle_window=window, **kw)
    return EpochPlan(config, kw.pop("epoch", 1), selection)


@pytest.mark.parametrize("selected", [False, True])
@pytest.mark.parametrize("window", [3, 40])
def test_every_row_once_and_random_access_by_block(selected, window):
    rng = np.random.default_rng(4)
    n, c = 100_003, 2999
    selection = selected_rows_per_chunk(n, c, rng.random(n) < 0.4) if selected else None
    p = plan(n, c, 777, window, selection, seed=9)
    rows = np.concatenate([p.batch_row_ids(k) for k in range(len(p))])
    expect = (np.sort(np.concatenate([i * c + s for i, s in enumerate(selection)])) if selected
              else np.arange(n))
    assert np.array_equal(np.sort(rows), expect)
    for pos in rng.integers(0, len(rows), 40).tolist() + [0, len(rows) - 1, 32767, 32768]:
        assert p.row_at(pos) == rows[pos]
        assert p.position_of(int(rows[pos])) == pos


def test_ranks_share_the_stratified_sequence():
    """Ranks take equal contiguous parts of one sequence, as in order 1: together every row once."""
    parts = [plan(50_000, 1000, 256, 50, rank=r, world_size=3, drop_last=True) for r in range(3)]
    rows = np.concatenate([np.concatenate([p.batch_row_ids(k) for k in range(len(p))]) for p in parts])
    assert len(np.unique(rows)) == len(rows) and len(rows) == 3 * (50_000 // 3 // 256) * 256


def distinct_chunks(order, batch, chunk_rows):
    full = len(order) // batch * batch
    return [len(np.unique(r // chunk_rows)) for r in order[:full].reshape(-1, batch)]


@pytest.mark.parametrize("batch", [4096, 256])
def test_batches_mix_chunks_at_least_as_a_uniform_permutation(batch):
    """100 chunks of 20,802 rows (an L5Kit scene each), the whole table one window: every batch holds at least
    as many distinct chunks as a uniform permutation's batches do (median and least); order 1's default window
    of 8 chunks held 16 at most (a batch that spans two windows)."""
    n, c = 100 * 20802, 20802
    p = plan(n, c, batch, 100)
    ours = distinct_chunks(np.concatenate([p.batch_row_ids(k) for k in range(len(p))]), batch, c)
    uniform = distinct_chunks(np.random.default_rng(0).permutation(n), batch, c)
    assert statistics.median(ours) >= statistics.median(uniform) and min(ours) >= min(uniform)
    if batch == 4096:
        assert min(ours) == 100
    old = plan(n, c, batch, 8, order=1)
    assert max(distinct_chunks(np.concatenate([old.batch_row_ids(k) for k in range(len(old))]), batch, c)) <= 16


def test_window_chunks_from_the_dataset_and_options_alone():
    assert window_chunks(1 << 30, 100, 241 << 20) == 100  # the whole table fits
    assert window_chunks(100 << 20, 100, 200 << 20) == 50
    assert window_chunks(1, 100, 200 << 20) == 8  # never fewer chunks than order 1's default window
    assert window_chunks(1, 3, 200 << 20) == 3
    with pytest.raises(ValueError, match="shuffle_bytes must be a positive number of bytes, got 0"):
        window_chunks(0, 1, 1)


def test_loaders_default_window_is_the_whole_table_and_mixes_every_chunk(small_dataset):
    """The loaders' default (fails with the fixed window of 8 chunks before): the whole table is one window and
    a batch holds rows of every chunk; a smaller shuffle_bytes gives a window of what fits, recorded in the
    state, the same on any machine."""
    path = small_dataset(12, 5, chunks={"agents": 500})
    with Loader(path, "agents", batch_size=512, num_workers=0) as loader:
        n, chunks = loader.dataset.rows["agents"], loader.dataset["agents"].chunks[0]
        assert loader.plan().config.window == -(-n // chunks) and len(loader.plan().windows) == 1
        assert loader.state().settings["shuffle_window"] == -(-n // chunks) and loader.state().order == 2
        rows = [b["_row"] for b in Loader(path, "agents", batch_size=512, num_workers=0, row_ids=True)]
        full = [r for r in rows if len(r) == 512]
        assert all(len(np.unique(r // chunks)) >= min(-(-n // chunks), 25) for r in full)
    with Loader(path, "agents", batch_size=512, num_workers=0, shuffle_bytes=10 * 500 * 116) as small:
        assert small.plan().config.window == 10
    # WindowLoader: 8 groups of samples (SequenceLoader 16), in order 2; the whole table once shuffle_bytes is
    # given and holds it (measured: gathering from the whole table cost WindowLoader 0.75x, SequenceLoader 0.65-0.85x)
    with WindowLoader(path, 2, 3, batch_size=16, num_workers=0) as windows, \
            WindowLoader(path, 2, 3, batch_size=16, num_workers=0, shuffle_bytes=1 << 30) as whole:
        assert windows.plan().config.window == 8 and windows.state().order == 2
        assert len(whole.plan().windows) == 1
    # the L5Kit sample loaders take Loader's default: the whole table when it fits, else what shuffle_bytes holds
    small_chunks = small_dataset(12, 5, chunks={"agents": 100, "frames": 20})
    for cls in (AgentSampleLoader, EgoSampleLoader):
        with cls(small_chunks, 2, 3, num_workers=0) as loader, \
                cls(small_chunks, 2, 3, num_workers=0, shuffle_bytes=1) as small:
            groups = len(loader.samples.sizes)
            assert groups > 8 and len(loader.plan().windows) == 1 and loader.plan().config.window == groups
            assert small.plan().config.window == 8 and len(small.plan().windows) == -(-groups // 8)


def test_sequence_loader_default_window_is_16_groups(dp_buffer):
    with SequenceLoader(dp_buffer, 16, 1, 7, batch_size=64, num_workers=0) as loader, \
            SequenceLoader(dp_buffer, 16, 1, 7, batch_size=64, num_workers=0, shuffle_bytes=1 << 30) as whole:
        assert loader.plan().config.window == 16
        assert len(whole.plan().windows) == 1


def test_window_and_sequence_states_saved_with_their_old_default_windows_go_on_in_them(small_dataset, dp_buffer):
    """WindowLoader's default window was 4 groups and SequenceLoader's 8 in earlier releases (8 and 16
    now): a run saved then resumes in its window with today's defaults, the same samples next."""
    path = small_dataset(12, 5, chunks={"agents": 100, "frames": 20})
    made = [(lambda **k: WindowLoader(path, 2, 3, batch_size=16, num_workers=0, seed=3, **k), 4, "frame_row"),
            (lambda **k: SequenceLoader(dp_buffer, 16, 1, 7, batch_size=64, num_workers=0, seed=3, **k), 8, "sample")]
    for make, old_window, key in made:
        with make(shuffle_window=old_window) as old:
            it = iter(old)
            next(it)
            state = old.state_dict()
            rest = [b[key].copy() for b in it]
        with make() as new:
            assert new.plan().config.window == 2 * old_window
            new.load_state_dict(state)
            assert new.state().settings["shuffle_window"] == old_window
            assert all(np.array_equal(a, b[key]) for a, b in zip(rest, new, strict=True))


def test_a_state_saved_in_order_1_goes_on_in_order_1(small_dataset):
    """A run saved before order 2 (order 1, shuffle_window 8 by default then) resumes mid-epoch with today's
    defaults in its own order and window: the same batches the old run would have read next."""
    path = small_dataset(12, 5, chunks={"agents": 500})
    args = dict(batch_size=300, num_workers=0, seed=4, row_ids=True)
    with Loader(path, "agents", shuffle_window=8, order=1, **args) as old:
        it = iter(old)
        for _ in range(3):
            next(it)
        state = old.state_dict()
        rest = [b["_row"].copy() for b in it]
    assert state["order"] == 1 and state["settings"]["shuffle_window"] == 8
    with Loader(path, "agents", **args) as new:
        new.load_state_dict(state)
        assert new.state().order == 1
        assert all(np.array_equal(a, b["_row"]) for a, b in zip(rest, new, strict=True))
    with Loader(path, "agents", shuffle_window=5, **args) as given:  # a window given is not overridden
        with pytest.raises(ValueError, match="shuffle_window=8; this loader has shuffle_window=5"):
            given.load_state_dict(state)


def test_an_order_given_against_a_state_at_an_epoch_start_is_taken_with_its_own_window(small_dataset):
    """At an epoch's start any order goes on (no row of the epoch was read), but an order
    given with a state of another order and window was refused naming shuffle_window, and passing it gave a
    loader of neither run's order. The given order goes on in its own window."""
    path = small_dataset(12, 5, chunks={"agents": 100, "frames": 20})
    for make in (lambda **k: Loader(path, "agents", batch_size=300, num_workers=0, seed=2, **k),
                 lambda **k: AgentSampleLoader(path, 2, 3, batch_size=16, num_workers=0, seed=2, **k)):
        with make() as saved:
            state = saved.state_dict()  # order 2, the whole table, at batch 0 of epoch 0
        with make(order=1) as own, make(order=1) as given:
            given.load_state_dict(state)
            assert given.state().order == 1
            assert given.plan().config.window == own.plan().config.window
            assert given.state().settings == own.state().settings


def test_the_resume_log_names_only_what_was_taken_from_the_state(small_dataset, caplog):
    """The log said a state's shuffle_window was taken whenever its order was, also when the
    window was the loader's own (given) or unchanged."""
    import logging

    path = small_dataset(12, 5, chunks={"agents": 500})
    args = dict(batch_size=300, num_workers=0, seed=4)
    with Loader(path, "agents", shuffle_window=8, order=1, **args) as old:
        it = iter(old)
        next(it)
        state = old.state_dict()
    for given, said in (({}, "epoch order 1, shuffle_window=8"), ({"shuffle_window": 8}, "epoch order 1:"),
                        ({"shuffle_window": 5}, None)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="zarrfeed"), Loader(path, "agents", **given, **args) as loader:
            with contextlib.suppress(ValueError):  # (the window given differs: refused)
                loader.load_state_dict(state)
        logged = [r.getMessage() for r in caplog.records if "resuming a run saved" in r.getMessage()]
        if said is None:
            assert not logged
        else:
            assert len(logged) == 1 and f"resuming a run saved with {said}" in logged[0], logged
    with Loader(path, "agents", **args) as new:  # a state of today's order and window: nothing taken, nothing said
        next(iter(new))
        today = new.state_dict()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zarrfeed"), Loader(path, "agents", **args) as loader:
        loader.load_state_dict(today)
    assert "resuming a run saved" not in caplog.text


def test_a_state_saved_with_another_default_window_goes_on_in_it(small_dataset):
    """AgentSampleLoader's default window was 4 groups in earlier releases and is the whole table now: a run saved
    then resumes with today's defaults in its window (the same samples next), locally and from a server; a loader
    given shuffle_window or shuffle_bytes is held to the state."""
    from zarrfeed.flight import FeedServer, RemoteAgentSampleLoader

    path = small_dataset(12, 5, chunks={"agents": 100, "frames": 20})
    args = dict(batch_size=16, num_workers=0, seed=3)
    with AgentSampleLoader(path, 2, 3, shuffle_window=4, **args) as old:  # what the default was
        it = iter(old)
        for _ in range(3):
            next(it)
        state = old.state_dict()
        rest = [b["agent_row"].copy() for b in it]
    with AgentSampleLoader(path, 2, 3, **args) as new:
        assert new.plan().config.window > 4
        assert sum(1 for _ in new)  # an epoch read: its workers were made for its own window
        new.load_state_dict(state)
        assert new.state().settings["shuffle_window"] == 4
        assert all(np.array_equal(a, b["agent_row"]) for a, b in zip(rest, new, strict=True))
    for given in ({"shuffle_window": 5}, {"shuffle_bytes": 1 << 30}):
        with AgentSampleLoader(path, 2, 3, **given, **args) as held:
            with pytest.raises(ValueError, match="shuffle_window=4; this loader has shuffle_window="):
                held.load_state_dict(state)
    with FeedServer(path, port=0, workers=0) as server:
        remote = RemoteAgentSampleLoader(server.url, 2, 3, batch_size=16, seed=3)
        remote.load_state_dict(state)
        assert all(np.array_equal(a, b["agent_row"]) for a, b in zip(rest, remote, strict=True))
        remote.close()


@pytest.mark.parametrize("given", [{}, {"shuffle_window": 20}])
def test_a_window_this_machine_cannot_hold_is_one_line_naming_the_option(small_dataset, monkeypatch, given):
    """The window is not shrunk to fit a machine (another machine would make another order): the loader says
    what it needs and which option makes it smaller, before any worker starts."""
    import zarrfeed.loader.loader as batches

    path = small_dataset(12, 5, chunks={"agents": 500})
    monkeypatch.setattr(batches, "available_memory", lambda: 100_000)
    option = "shuffle_window=20" if given else f"shuffle_bytes={1 << 30}"
    with Loader(path, "agents", batch_size=512, num_workers=2, **given) as loader:
        with pytest.raises(MemoryError, match=rf"MiB available: pass a smaller {option.split('=')[0]} than {option}"):
            next(iter(loader))
        assert loader.worker_pids == []


def test_the_last_window_is_as_large_as_the_others():
    """11 chunks and a window of 10 left a last window of 1 chunk, whose
    batches held one scene each, every epoch: order 2's windows are of equal size to a chunk."""
    p = plan(11 * 20000, 20000, 4096, 10)
    assert [len(w) for w in p.windows] == [6, 5]
    old = plan(11 * 20000, 20000, 4096, 10, order=1)
    assert [len(w) for w in old.windows] == [10, 1]  # order 1 is kept as it was (its states resume)


@pytest.mark.parametrize("kwargs, message", [
    ({"shuffle_window": 0}, r"shuffle_window must be an integer >= 1 \(or None: the default window\), got 0"),
    ({"shuffle_window": 1.5}, "shuffle_window must be an integer >= 1"),
    ({"shuffle_window": "8"}, "shuffle_window must be an integer >= 1"),
    ({"shuffle_window": True}, "shuffle_window must be an integer >= 1"),
    ({"order": True}, "order must be an integer >= 0, got True"),
    ({"order": 1.0}, "order must be an integer >= 0, got 1.0"),
    ({"order": 3}, r"order must be one of 1, 2 \(the epoch order's algorithm\), got 3"),
    ({"shuffle_bytes": -1, "shuffle_window": 3}, "shuffle_bytes must be an integer >= 1, got -1"),
])
def test_bad_order_options_are_one_line_at_construction(small_dataset, kwargs, message):
    """0 ran as 1, floats failed deep inside, True was an order."""
    path = small_dataset(3, 2, chunks={"agents": 500})
    for cls, args in ((Loader, (path,)), (WindowLoader, (path, 2, 3))):
        with pytest.raises(ValueError, match=message):
            cls(*args, num_workers=0, **kwargs)


def test_numpy_integers_are_plain_in_the_state(small_dataset):
    import json

    path = small_dataset(3, 2, chunks={"agents": 500})
    with Loader(path, num_workers=0, order=np.int64(2), shuffle_window=np.int64(8),
                shuffle_bytes=np.int64(1 << 30)) as loader:
        state = json.loads(json.dumps(loader.state_dict()))
    with Loader(path, num_workers=0, shuffle_window=8) as again:
        again.load_state_dict(state)


def test_row_order_and_order_1_default_to_windows_of_8_chunks(small_dataset):
    """shuffle=False reads in windows of 8 chunks, not the whole table decoded before its first batch (the window
    changes no order there), and order=1 alone is the order of earlier releases (windows of 8)."""
    path = small_dataset(12, 5, chunks={"agents": 500})
    with Loader(path, num_workers=0, shuffle=False) as rows, Loader(path, num_workers=0, order=1) as old, \
            Loader(path, num_workers=0, order=1, shuffle_window=8) as explicit:
        assert rows.plan().config.window == 8 == old.plan().config.window
        assert np.array_equal(old.plan().batch_row_ids(0), explicit.plan().batch_row_ids(0))


def test_a_refused_state_changes_nothing(small_dataset):
    """An order-1 state of another seed was refused but left the loader in
    order 1 with its window."""
    path = small_dataset(12, 5, chunks={"agents": 500})
    with Loader(path, "agents", shuffle_window=8, order=1, seed=1, num_workers=0, batch_size=300) as old:
        next(iter(old))
        state = old.state_dict()
    with Loader(path, "agents", seed=2, num_workers=0, batch_size=300) as new:
        before = new.plan().config
        with pytest.raises(ValueError, match="loader state has seed=1; this loader has seed=2"):
            new.load_state_dict(state)
        assert new.plan().config == before
        with pytest.raises(ValueError, match="the states of all 2 ranks"):
            new.load_state_dict([dict(state, settings=dict(state["settings"], world_size=2, seed=2))])
        assert new.plan().config == before


def test_an_order_given_is_not_changed_by_a_state(small_dataset):
    path = small_dataset(12, 5, chunks={"agents": 500})
    with Loader(path, "agents", num_workers=0, batch_size=300) as new:
        next(iter(new))
        state = new.state_dict()
    window = state["settings"]["shuffle_window"]
    with Loader(path, "agents", num_workers=0, batch_size=300, order=1, shuffle_window=window) as explicit:
        with pytest.raises(ValueError, match=r"^loader state has order=2 \(saved mid-epoch\); this loader has "
                                             r"order=1: pass order=2, or leave order out"):
            explicit.load_state_dict(state)
        assert explicit.plan().config.shuffling.order == 1


def test_an_order_given_against_a_mid_epoch_state_is_named_first(small_dataset):
    """`order=1` given with an order-2 state of another window was refused naming
    shuffle_window; following that hint, the next refusal said to finish the epoch with the release that saved
    it (this one). The order is named first, and it says to pass the state's order or leave it out."""
    path = small_dataset(12, 5, chunks={"agents": 100, "frames": 20})
    with WindowLoader(path, 2, 3, batch_size=16, num_workers=0, seed=3, shuffle_window=4) as saved:
        it = iter(saved)
        next(it)
        next(it)
        state = saved.state_dict()
    for given in ({"order": 1}, {"order": 1, "shuffle_window": 4}):
        with WindowLoader(path, 2, 3, batch_size=16, num_workers=0, seed=3, **given) as loader:
            with pytest.raises(ValueError, match=r"^loader state has order=2 \(saved mid-epoch\); this loader has "
                                                 r"order=1: pass order=2, or leave order out \(a state's order is "
                                                 r"taken\)$"):
                loader.load_state_dict(state)


def test_another_shuffle_bytes_is_named_when_a_state_is_refused(small_dataset):
    path = small_dataset(12, 5, chunks={"agents": 500})
    with Loader(path, "agents", num_workers=0) as a:
        state = a.state_dict()
    with Loader(path, "agents", num_workers=0, shuffle_bytes=10 * 500 * 116) as b:
        with pytest.raises(ValueError, match=r"a default window follows from shuffle_bytes"):
            b.load_state_dict(state)


def test_a_state_loaded_inside_a_loop_is_refused_and_changes_nothing(small_dataset):
    """A state loaded while a loop ran was dropped by the loop (which went on
    from its own place), or, changing the window, crashed it with an IndexError (its workers restarted under
    it); a remote loop went on with its stream while its position jumped. Refused in one line, locally and
    remotely; after the loop, the same state loads and the loader goes on from it."""
    from zarrfeed.flight import FeedServer, RemoteAgentSampleLoader

    path = small_dataset(12, 5, chunks={"agents": 100, "frames": 20})
    args = dict(batch_size=16, seed=3)
    with AgentSampleLoader(path, 2, 3, num_workers=0, shuffle_window=4, **args) as old:
        it = iter(old)
        for _ in range(10):
            next(it)
        state = old.state_dict()
        rest = [b["agent_row"].copy() for b in it]
    with FeedServer(path, port=0, workers=0) as server:
        remote = RemoteAgentSampleLoader(server.url, 2, 3, **args)
        for loader in (AgentSampleLoader(path, 2, 3, num_workers=1, **args), remote):
            for i, _ in enumerate(loader):
                if i == 2:
                    with pytest.raises(RuntimeError, match="^load_state_dict while this loader is being "
                                                           "iterated: leave the loop first"):
                        loader.load_state_dict(state)
                    break
            loader.load_state_dict(state)
            assert all(np.array_equal(a, b["agent_row"]) for a, b in zip(rest, loader, strict=True))
            loader.close()


def test_a_window_whose_agent_index_does_not_fit_is_one_line(small_dataset, monkeypatch):
    """AgentSampleLoader's workers each hold their window's agents (`motion.AgentPool`), each group those of the
    frames around its samples: with dense frames several times the window's agents (5.7x in one
    case). The room check counted only the decoded chunks, so such a window ran the machine out of memory
    instead of being refused naming the option."""
    import zarrfeed.loader.loader as batches
    from zarrfeed.core._proc.shm import ShmSpaceError

    path = small_dataset(12, 5, chunks={"agents": 100, "frames": 20})
    with AgentSampleLoader(path, 2, 3, num_workers=2) as loader:
        plan = loader.plan()
        decoded = max(len(loader.source.chunks_of(plan, w)) for w in range(len(plan.windows))) * \
            loader.source.chunk_bytes
        own = 2 * loader.source.worker_bytes()
        assert own > decoded  # (groups of 100 agents, each holding the agents of the frames around its samples)
        monkeypatch.setattr(batches, "available_memory", lambda: decoded + own // 2)
        with pytest.raises(ShmSpaceError, match=r"MiB of decoded chunks and \d+ MiB of its workers' own in memory "
                                                r"at once, .*pass a smaller shuffle_bytes"):
            next(iter(loader))
