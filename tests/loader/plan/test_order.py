"""zarrfeed's epoch order: a permutation zarrfeed specifies, the same in C and in Python, equal to
stored golden orders (a change of the algorithm fails here), with random access by window, versioned in
loader states and tickets, and statistically as good a shuffle as numpy's."""
import hashlib

import numpy as np
import pytest

import zarrfeed.loader.ordering.order as order_module
from zarrfeed.loader.ordering.order import CHUNKS, VERSION, inverse, permutation, shuffle
from zarrfeed.loader.ordering.plan import EpochPlan
from plans import plan_config

SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 97, 128, 1000, 1023, 1024, 1025, 4099, 65537]


def test_golden_orders():
    """Stored orders: a change of the algorithm (or of numpy, or of a compiler) fails here. (Order 2, the
    default, shuffles its blocks with this permutation: tests/test_order_stratified.py.)"""
    assert VERSION == 2
    assert permutation(10, 0, 0, 0).tolist() == [0, 6, 9, 3, 1, 4, 8, 2, 5, 7]
    assert permutation(17, 42, 3, 5).tolist() == [11, 8, 7, 16, 0, 3, 2, 6, 13, 5, 9, 12, 15, 4, 1, 14, 10]
    assert permutation(12, 7, 1, CHUNKS).tolist() == [7, 2, 0, 3, 6, 10, 1, 11, 8, 5, 9, 4]
    for args, first, digest in (
            ((4000, 5, 2, 1), [463, 3016, 493, 1267, 1356, 573, 2957, 3737],
             "9789e7f79d2abdb95fd0ca4d959c35b9e749a42584665b1ec681ec5ad8cc2b11"),
            ((100_003, 2**63 - 1, 9, 4), [9315, 99430, 89220, 52354, 95382, 59398, 41945, 6340],
             "ba0ac9c04bb73dc3e2932521303ce5a5a37389ff3fcd1338e625764bcc1e6dbf")):
        p = permutation(*args)
        assert p[:8].tolist() == first
        assert hashlib.sha256(p.astype("<i8").tobytes()).hexdigest() == digest


@pytest.mark.parametrize("n", SIZES)
def test_c_and_python_give_the_same_permutation(n, monkeypatch):
    if order_module._order is None:
        pytest.skip("the C extension is not built here")
    keys = ((0, 0, 0), (99, 3, 12), (2**63 - 1, 10**6, CHUNKS))
    c = [permutation(n, *k) for k in keys]
    monkeypatch.setattr(order_module, "_order", None)  # the fallback without a compiler
    for k, perm in zip(keys, c, strict=True):
        p = permutation(n, *k)
        assert p.dtype == np.int64 and np.array_equal(p, perm) and np.array_equal(np.sort(p), np.arange(n))
        assert np.array_equal(p[inverse(p)], np.arange(n))


@pytest.mark.parametrize("python", [False, True])
def test_shuffling_an_array_in_place_is_indexing_it_by_the_permutation(python, monkeypatch):
    """The loader shuffles a window's rows in place (no permutation made, no gather): the same as taking them
    in the permutation's order, since Fisher-Yates' swaps do not depend on the contents."""
    if python:
        monkeypatch.setattr(order_module, "_order", None)
    rows = np.random.default_rng(5).integers(0, 10**9, 5000).astype(np.int64)
    assert np.array_equal(shuffle(rows.copy(), 8, 2, 3), rows[permutation(5000, 8, 2, 3)])
    with pytest.raises(TypeError, match="C-contiguous 1-D int64"):
        shuffle(rows.astype(np.int32), 8, 2, 3)


def test_bad_keys_are_one_line():
    with pytest.raises(ValueError, match=r"seed must be in \[0, 18446744073709551616\), got -1"):
        permutation(10, -1, 0, 0)


@pytest.mark.parametrize("n, keys", [(16, 4000), (5000, 300)])
def test_as_good_a_shuffle_as_numpys(n, keys):
    """Over many keys: where each element lands is uniform (chi-square per position and value, per degree
    of freedom about 1), the mean displacement is a random permutation's ((n^2 - 1) / 3n), adjacent elements
    are as correlated as in numpy's permutations (-1 / (n - 1)) and fixed points as rare (1 on average)."""
    ours = np.stack([permutation(n, seed, 0, 0) for seed in range(keys)])
    theirs = np.stack([np.random.default_rng([seed, 0]).permutation(n) for seed in range(keys)])

    def figures(perms: np.ndarray) -> dict[str, float]:
        counts = np.zeros((n, n))
        for pos in range(n):
            counts[pos] = np.bincount(perms[:, pos], minlength=n)
        expected = keys / n
        chi2 = ((counts - expected) ** 2 / expected).sum() / (n * (n - 1))
        displacement = np.abs(perms - np.arange(n)).mean()
        corr = np.mean([np.corrcoef(p[:-1], p[1:])[0, 1] for p in perms])
        fixed = (perms == np.arange(n)).sum(axis=1).mean()
        return {"chi2": chi2, "displacement": displacement, "corr": corr, "fixed": fixed}

    a, b = figures(ours), figures(theirs)
    assert 0.9 < a["chi2"] < 1.1 and 0.9 < b["chi2"] < 1.1, (a, b)
    want = (n * n - 1) / (3 * n)
    assert abs(a["displacement"] - want) < 0.02 * want and abs(b["displacement"] - want) < 0.02 * want, (a, b)
    assert abs(a["corr"] + 1 / (n - 1)) < 0.015 and abs(b["corr"] + 1 / (n - 1)) < 0.015, (a, b)
    assert abs(a["fixed"] - 1) < 0.2 and abs(b["fixed"] - 1) < 0.2, (a, b)


def test_large_orders_are_far_from_the_identity_and_from_each_other():
    """At n = 100,000 over 30 seeds the correlation with the identity has a random permutation's spread
    (1 / sqrt(n) = 0.0032), and two epochs share about one fixed point."""
    n = 100_000
    corr = [np.corrcoef(permutation(n, s, 0, 0), np.arange(n))[0, 1] for s in range(30)]
    assert np.sqrt(np.mean(np.square(corr))) < 2 / np.sqrt(n)
    assert (permutation(n, 3, 0, 0) == permutation(n, 3, 1, 0)).sum() < 10


@pytest.mark.parametrize("selection", [False, True])
def test_an_epochs_rows_and_positions_are_found_by_window(selection):
    """EpochPlan.row_at(p) is the row at position p of the epoch's sequence and position_of its inverse,
    from the order of p's window alone: what resuming or re-splitting an epoch needs."""
    config = plan_config(n_rows=10_000, chunk_rows=700, batch_size=64, seed=11, shuffle_window=3)
    sel = None
    if selection:
        rng = np.random.default_rng(0)
        sel = [np.sort(rng.choice(min(700, 10_000 - c * 700), size=200, replace=False)) for c in range(15)]
    plan = EpochPlan(config, 4, sel)
    sequence = np.concatenate([plan.window_order(w, np.array([c * 700 for c in plan.windows[w]]))
                               for w in range(len(plan.windows))])
    for p in np.random.default_rng(1).choice(plan.total, 300, replace=False):
        row = plan.row_at(int(p))
        assert row == sequence[p] and plan.position_of(row) == p
    for p in (0, plan.total - 1):  # the ends
        assert plan.row_at(p) == sequence[p] and plan.position_of(plan.row_at(p)) == p
    for p in (plan.total, -1):
        with pytest.raises(IndexError, match=f"^position {p} outside an epoch of {plan.total} rows$"):
            plan.row_at(p)
    if selection:
        unselected = next(r for r in range(700) if r not in set(sel[0].tolist()))
        past = int(sel[0][-1]) + 1  # after the chunk's last selected row
        for row in (unselected, past, -1, 15 * 700, 15 * 700 + 3):  # the last three: chunks that do not exist
            with pytest.raises(ValueError, match=f"^row {row} is not selected$"):
                plan.position_of(row)
    else:  # the last chunk holds 200 rows: row 10,000 and beyond are in no chunk of the epoch
        for row in (10_000, 10_000 + 299, -1, 15 * 700 + 3):
            with pytest.raises(ValueError, match=f"^row {row} is not in this epoch$"):
                plan.position_of(row)


def test_a_state_saved_mid_epoch_with_numpys_order_is_refused_at_an_epochs_start_taken(small_dataset):
    """States carry the order's version: one saved before zarrfeed had its own order (no "order" field) is
    refused mid-epoch in one line saying what to do, and taken at an epoch's start (no row seen yet)."""
    from zarrfeed.loader import Loader

    path = small_dataset(2, 3, chunks={"agents": 500})
    with Loader(path, "agents", batch_size=100, num_workers=0) as loader:
        state = loader.state_dict()
        assert state["order"] == VERSION
        old = {k: v for k, v in state.items() if k != "order"}
        with pytest.raises(ValueError, match=r"saved mid-epoch \(batch 3 of epoch 1\) with epoch order 0 "
                                             r"\(numpy's Generator.*resume from the start of epoch 2"):
            loader.load_state_dict({**old, "epoch": 1, "batch": 3})
        loader.load_state_dict({**old, "epoch": 1, "batch": 0})
        assert loader.state_dict()["epoch"] == 1


def test_a_ticket_of_another_order_is_refused():
    from zarrfeed.flight.protocol import Ticket
    from zarrfeed.flight.protocol import TicketPlan

    raw = Ticket("agents", TicketPlan(10)).to_json().replace(b'"order": 2', b'"order": 0')
    with pytest.raises(ValueError, match="ticket: epoch order 0; this server orders epochs with orders 1, 2"):
        Ticket.decode(raw)
    # a client of order 1 (before order 2: no order in its plan) is served in its order
    old = Ticket("agents", TicketPlan.from_dict({"batch_size": 10, "shuffle_window": 8})).to_json()
    old = old.replace(b', "order": 2', b"")
    old = old.replace(b'"batch": 0', b'"order": 1, "batch": 0')
    assert Ticket.decode(old).plan.shuffling.order == 1
    # top-level order 2, the plan's 1
    mixed = Ticket("agents", TicketPlan.from_dict({"batch_size": 10, "order": 1})).to_json()
    with pytest.raises(ValueError, match="ticket: plan.order 1 and order 2 differ"):
        Ticket.decode(mixed)


@pytest.mark.parametrize("python", [False, True])
def test_numpy_integer_seeds_are_the_same_seed_and_others_are_one_line(python, monkeypatch, small_dataset):
    """np.int64 seeds overflowed, np.uint64 crashed the C path and gave another
    order in Python, a float seed raised a raw TypeError."""
    from zarrfeed.loader import Loader

    if python:
        monkeypatch.setattr(order_module, "_order", None)
    for seed in (np.int64(3), np.uint64(3), np.int32(3)):
        assert np.array_equal(permutation(100, seed, np.int64(1), 2), permutation(100, 3, 1, 2))
    path = small_dataset(2, 3, chunks={"agents": 500})
    with Loader(path, "agents", batch_size=100, num_workers=0, seed=np.uint64(7)) as a, \
            Loader(path, "agents", batch_size=100, num_workers=0, seed=7) as b:
        assert all(np.array_equal(x["track_id"], y["track_id"]) for x, y in zip(a, b, strict=True))
        assert type(a.state_dict()["settings"]["seed"]) is int
    for bad in (3.0, "3", True):
        with pytest.raises(ValueError, match="seed must be an integer"):
            Loader(path, "agents", seed=bad)


@pytest.mark.parametrize("edit", [{"order": [1]}, {"batch": "3"}, {"epoch": "1"}, {"epoch": None},
                                  {"epoch": 1.0}, {"settings": [1]}, {"batch": 2.5}, {"order": True},
                                  {"order": 1.0}, {"version": "1"}])
def test_a_hand_edited_state_is_refused_in_one_line(edit, small_dataset):
    from zarrfeed.loader import Loader

    path = small_dataset(2, 3, chunks={"agents": 500})
    with Loader(path, "agents", batch_size=100, num_workers=0) as loader:
        with pytest.raises(ValueError, match="loader state") as err:
            loader.load_state_dict({**loader.state_dict(), **edit})
        assert "\n" not in str(err.value)


def test_a_ticket_without_an_order_is_an_old_clients_and_refused():
    from zarrfeed.flight.protocol import Ticket
    from zarrfeed.flight.protocol import TicketPlan

    for raw in (Ticket("agents", TicketPlan(10), batch=5).to_json().replace(b', "order": 2', b""),
                Ticket("agents", TicketPlan(10)).to_json().replace(b'"order": 2', b'"order": true')):
        with pytest.raises(ValueError, match="ticket: epoch order"):
            Ticket.decode(raw)
    # every seed a local loader takes
    Ticket.decode(Ticket("agents", TicketPlan.from_dict({"batch_size": 10, "seed": 2**63 + 5})).to_json())
