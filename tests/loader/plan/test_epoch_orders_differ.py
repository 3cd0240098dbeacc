"""No part of an epoch's order repeats the last epoch's.

With a table in one chunk, or windows of one chunk, the chunk order cannot change between epochs: what changes
an epoch's order is then the window's own shuffle alone. Order 1 shuffles a window with the epoch in its seed;
order 2 sends each chunk's rows to the window's blocks by a per-epoch bijection (`order.strata`) and shuffles
each block. A shuffle or a strata that ignored the epoch would repeat an epoch's order, or which rows each
block holds, epoch after epoch; with many chunks in a window the chunk order hides it."""
import numpy as np
import pytest
from zarrfeed.loader.ordering.order import BLOCK_ROWS, block_count, block_starts
from zarrfeed.loader.ordering.plan import EpochPlan, PlanConfig
from plans import plan_config

N = 3 * BLOCK_ROWS + 1234  # several of order 2's blocks


def epoch_order(config: PlanConfig, epoch: int) -> np.ndarray:
    return EpochPlan(config, epoch).batch_row_ids(0)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("chunk_rows", [N, N // 4])
def test_each_epoch_orders_a_one_chunk_window_otherwise(order, chunk_rows):
    config = plan_config(n_rows=N, chunk_rows=chunk_rows, batch_size=N, shuffle_window=1, order=order, seed=11)
    orders = [epoch_order(config, e) for e in range(4)]
    for last, this in zip(orders, orders[1:], strict=False):
        assert sorted(this.tolist()) == list(range(N))
        # the position of every row moves: fewer than 1% of the rows keep theirs (a uniform shuffle: 1 / rows)
        assert (this == last).mean() < 0.01
        if order == 2 and chunk_rows == N:  # which rows each block holds changes too, not only their order
            starts = block_starts(np.array([N], np.int64), block_count(N)).tolist()
            for lo, hi in zip(starts[:-1], starts[1:], strict=False):
                overlap = len(np.intersect1d(this[lo:hi], last[lo:hi])) / (hi - lo)
                assert overlap < 0.5, f"block at {lo}: {overlap:.0%} of its rows are the last epoch's"
