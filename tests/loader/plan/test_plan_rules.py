"""The epoch plan's and the order's rules one by one (loader/ordering/plan.py and loader/ordering/order.py, in
this process): which batches read a window, the refusals' lines, and that drop_last never repeats a row.
test_plan_contract.py holds the plan to its contract as a whole."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan_contract import batches
from zarrfeed.loader.ordering.order import permutation, shuffle
from zarrfeed.loader.ordering.plan import EpochPlan, WorkerPlans, selected_rows_per_chunk
from plans import plan_config


def brute_window_batches(plan: EpochPlan) -> dict[int, tuple[int, int]]:
    """(first, last) batch reading each window, from the batches' own segments (ties in reading order)."""
    out: dict[int, tuple[int, int]] = {}
    for k in range(len(plan)):
        for w in plan.group_windows(k, 1):
            first, last = out.get(w, (k, k))
            out[w] = (min(first, k), max(last, k))
    return dict(sorted(out.items(), key=lambda item: item[1]))


@settings(max_examples=150, deadline=None)
@given(n_rows=st.integers(1, 300), chunk=st.integers(1, 40), batch=st.integers(1, 50), window=st.integers(1, 4),
       shuffle_=st.booleans(), drop_last=st.booleans(), world=st.integers(1, 4), seed=st.integers(0, 3),
       cut=st.integers(0, 6))
def test_window_batches_and_row_ids_are_exactly_what_the_batches_read(n_rows, chunk, batch, window, shuffle_,
                                                                      drop_last, world, seed, cut):
    for rank in range(world):
        plan = EpochPlan(plan_config(n_rows, chunk, batch, shuffle_, seed, window, rank, world, drop_last), epoch=2)
        wb = plan.window_batches()
        assert wb == brute_window_batches(plan) and list(wb.items()) == list(brute_window_batches(plan).items())
        for k, want in enumerate(batches(plan)):
            got = plan.batch_row_ids(k)
            assert got.dtype == np.int64 and got.tolist() == want.tolist()
        # the rest of the epoch after `cut` batches, resumed as spans: the same rows, the same windows' batches
        spans = plan.remaining(min(cut, len(plan)))
        resumed = EpochPlan(plan.config, 2, spans=spans)
        assert resumed.window_batches() == brute_window_batches(resumed)
        rest = [r for k in range(len(resumed)) for r in resumed.batch_row_ids(k).tolist()]
        done = [r for k in range(min(cut, len(plan))) for r in plan.batch_row_ids(k).tolist()]
        assert sorted(done + rest) == sorted(r for k in range(len(plan)) for r in plan.batch_row_ids(k).tolist())


@pytest.mark.parametrize("n_rows, world, batch", [(10, 3, 2), (11, 4, 1), (7, 2, 3)])
def test_drop_last_never_repeats_a_row(n_rows, world, batch):
    seen = []
    for rank in range(world):
        plan = EpochPlan(plan_config(n_rows, 3, batch, True, 0, 2, rank, world, drop_last=True), epoch=0)
        seen += [r for k in range(len(plan)) for r in plan.batch_row_ids(k).tolist()]
        assert len(plan) == n_rows // world // batch
    assert len(seen) == len(set(seen)) == world * (n_rows // world // batch) * batch


def test_empty_spans_are_dropped_and_out_of_range_batches_refused():
    cfg = plan_config(20, 4, 3, True, 0, 2)
    plan = EpochPlan(cfg, 0, spans=[(0, 0), (5, 9), (9, 9)])
    assert plan.resumed_spans == ((5, 9),) and len(plan) == 2
    assert EpochPlan(cfg, 0).resumed_spans is None
    full = EpochPlan(cfg, 0)
    assert len(full) == 7
    for k0, count in ((-1, 1), (6, 2), (7, 1)):
        with pytest.raises(IndexError) as err:
            full.group_pieces(k0, count)
        assert str(err.value) == f"batches {k0}..{k0 + count - 1} of an epoch of 7"


@pytest.mark.parametrize("kwargs, line", [
    ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ({"shuffle_window": 0}, "shuffle_window must be an integer >= 1 (or None: the default window), got 0"),
    ({"rank": 2, "world_size": 2}, "rank must be in [0, world_size=2), got 2"),
    ({"rank": -1, "world_size": 2}, "rank must be an integer >= 0, got -1"),
])
def test_a_bad_plan_config_is_one_exact_line(kwargs, line):
    with pytest.raises(ValueError) as err:
        plan_config(**{"n_rows": 10, "chunk_rows": 4, "batch_size": 2, **kwargs})
    assert str(err.value) == line


def test_row_selections_and_their_refusals():
    assert [a.tolist() for a in selected_rows_per_chunk(10, 4, [])] == [[], [], []]  # an empty epoch
    assert [a.tolist() for a in selected_rows_per_chunk(10, 4, [0, 9, 5])] == [[0], [1], [1]]
    assert [a.dtype for a in selected_rows_per_chunk(10, 4, np.array([], np.int64))] == [np.int64] * 3
    for rows, line in [
        (np.array([1.0]), "rows: expected a 1-D integer index array or a boolean mask, got float64(1,)"),
        (np.zeros((0, 2), np.int64), "rows: expected a 1-D integer index array or a boolean mask, got int64(0, 2)"),
        (np.array([[1, 2]]), "rows: expected a 1-D integer index array or a boolean mask, got int64(1, 2)"),
        ([3, 3], "rows: the index array has repeated rows"),
        ([-1, 2], "rows: indices must be in [0, 10), got [-1, 2]"),
        ([2, 10], "rows: indices must be in [0, 10), got [2, 10]"),
    ]:
        with pytest.raises(ValueError) as err:
            selected_rows_per_chunk(10, 4, rows)
        assert str(err.value) == line


def test_worker_plans_keep_the_current_epoch_and_drop_others():
    plans = WorkerPlans(plan_config(20, 4, 3), None)
    first = plans.get(1)
    resumed = plans.get(1, ((5, 9),))
    assert plans.get(1) is first and plans.get(1, ((5, 9),)) is resumed  # both of this epoch kept
    plans.get(2)
    assert plans.get(1) is not first  # another epoch came between: made again


def test_shuffle_refuses_what_it_cannot_shuffle_in_place():
    line = "order: shuffle takes a writeable C-contiguous 1-D int64 array"
    a = np.arange(10, dtype=np.int64)
    readonly = a.copy()
    readonly.flags.writeable = False
    for bad in (a[::2], readonly, np.arange(10, dtype=np.int64).reshape(2, 5), np.arange(4, dtype=np.int32)):
        with pytest.raises(TypeError) as err:
            shuffle(bad, 0, 0, 0)
        assert str(err.value) == line
    for name, args in (("seed", (-1, 0, 0)), ("epoch", (0, "1", 0)), ("stream", (0, 0, 1.5))):
        with pytest.raises(ValueError, match=rf"^{name} must be "):
            permutation(3, *args)
