"""The epoch plan, against direct statements of its contract."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zarrfeed.loader.ordering.plan import EpochPlan, selected_rows_per_chunk
from plans import plan_config


def batches(plan: EpochPlan, selection=None) -> list[np.ndarray]:
    """Each batch as global row indices, computed from segments and window orders."""
    c = plan.config
    orders = {}
    out = []
    for k in range(len(plan)):
        rows = []
        for w, first, count in plan.segments(k):
            if w not in orders:
                local = plan.window_order(w)
                orders[w] = plan.windows[w][local // c.chunk_rows] * c.chunk_rows + local % c.chunk_rows
            rows.append(orders[w][first:first + count])
        out.append(np.concatenate(rows))
    return out


@settings(max_examples=150, deadline=None)
@given(n_rows=st.integers(0, 500), chunk=st.integers(1, 60), batch=st.integers(1, 70), window=st.integers(1, 5),
       shuffle=st.booleans(), drop_last=st.booleans(), world=st.integers(1, 4), seed=st.integers(0, 3))
def test_every_row_once_and_ranks_equal_disjoint_complete(n_rows, chunk, batch, window, shuffle, drop_last, world,
                                                          seed):
    per_rank = []
    for rank in range(world):
        cfg = plan_config(n_rows, chunk, batch, shuffle, seed, window, rank, world, drop_last)
        plan = EpochPlan(cfg, epoch=1)
        bs = batches(plan)
        assert len(bs) == len(plan)
        assert all(len(b) == batch for b in bs[:-1]) and (not bs or 0 < len(bs[-1]) <= batch)
        if drop_last:
            assert all(len(b) == batch for b in bs)
        per_rank.append(np.concatenate(bs) if bs else np.zeros(0, int))
        # window_batches agrees with the segments, and group_pieces with segments batch by batch
        wb = plan.window_batches()
        for k in range(len(plan)):
            for w in plan.batch_windows(k):
                assert wb[w][0] <= k <= wb[w][1]
        for k0 in range(0, len(plan), 3):
            count = min(3, len(plan) - k0)
            pieces = np.array(plan.group_pieces(k0, count)).reshape(-1, 5)
            for i in range(count):
                mine = pieces[pieces[:, 0] == i]
                assert [tuple(p[2:]) for p in mine.tolist()] == plan.segments(k0 + i)
                assert mine[:, 1].tolist() == np.concatenate([[0], np.cumsum(mine[:, 4])[:-1]]).tolist()
                assert mine[:, 4].sum() == plan.batch_rows(k0 + i)
    assert len({len(p) for p in per_rank}) == 1  # equal batch counts: no rank waits for another
    assert len({len(EpochPlan(plan_config(n_rows, chunk, batch, shuffle, seed, window, r, world, drop_last), 1))
                for r in range(world)}) == 1
    everything = np.concatenate(per_rank)
    if not drop_last:
        assert set(everything.tolist()) == set(range(n_rows))  # complete
        padding = len(everything) - n_rows
        assert padding == world * -(-n_rows // world) - n_rows  # only what evens out the ranks
        if world == 1:
            assert sorted(everything.tolist()) == list(range(n_rows))  # exactly once
    else:
        assert len(set(everything.tolist())) == len(everything)  # disjoint, nothing repeated
    if not shuffle and world == 1 and not drop_last:
        assert everything.tolist() == list(range(n_rows))  # row order


def test_order_depends_on_seed_and_epoch_only():
    cfg = plan_config(10_000, 500, 64, seed=3)
    a, b = batches(EpochPlan(cfg, 0)), batches(EpochPlan(cfg, 0))
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    c = batches(EpochPlan(cfg, 1))
    assert not (a[0] == c[0]).all()
    d = batches(EpochPlan(plan_config(10_000, 500, 64, seed=4), 0))
    assert not (a[0] == d[0]).all()


def test_shuffle_stays_within_windows_of_chunks():
    cfg = plan_config(20 * 100, 100, 50, shuffle_window=4)
    plan = EpochPlan(cfg, 0)
    first = np.concatenate(batches(plan)[:8])  # the first 400 rows: window 0's four chunks
    assert set(np.unique(first // 100)) == set(plan.windows[0].tolist())


def test_selection_by_mask_and_index():
    mask = np.zeros(1000, bool)
    mask[[3, 4, 250, 251, 999]] = True
    for rows in (mask, np.array([999, 3, 250, 4, 251])):
        sel = selected_rows_per_chunk(1000, 100, rows)
        plan = EpochPlan(plan_config(1000, 100, 2, shuffle_window=2), 0, sel)
        got = np.concatenate(batches(plan, sel))
        assert sorted(got.tolist()) == [3, 4, 250, 251, 999]
        assert sum(len(w) for w in plan.windows) == 3  # only chunks with selected rows are read
    with pytest.raises(ValueError, match="repeated"):
        selected_rows_per_chunk(1000, 100, np.array([1, 1]))
    with pytest.raises(ValueError, match=r"in \[0, 1000\)"):
        selected_rows_per_chunk(1000, 100, np.array([1000]))
    with pytest.raises(ValueError, match="one entry per committed row"):
        selected_rows_per_chunk(1000, 100, np.ones(10, bool))


def test_each_epoch_orders_a_window_anew():
    """A window order keyed without its epoch went unseen (only batch 0 of a many-chunk table was
    compared across epochs, where the chunk order differs anyway). On a table of one window, every epoch's
    order of its rows differs, and so do the batches a Loader yields."""
    config = plan_config(n_rows=5_000, chunk_rows=1_000, batch_size=100, seed=3, shuffle_window=8)
    orders = [EpochPlan(config, epoch).window_order(0) for epoch in range(3)]
    assert len(EpochPlan(config, 0).windows) == 1
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert not np.array_equal(orders[a], orders[b])
        assert (orders[a] == orders[b]).mean() < 0.01  # not the same order slightly moved: another one
