import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrfeed.core.links import IntervalChecker, check_link
from zarrfeed.core.schema import Link

LINK = Link("frames", "agent_index_interval", "agents")


def brute_force_count(iv: np.ndarray, n_child: int) -> int:
    """Independent statement of the rules: each row is wrong at most once; plus the end and empty cases."""
    count, prev = 0, 0
    for s, e in iv.tolist():
        if s > e or s < 0 or e > n_child or s != prev:
            count += 1
        prev = e
    if len(iv) == 0:
        return int(n_child > 0)
    return count + (prev != n_child)


def test_valid_tiling_has_no_violations():
    bounds = np.array([0, 3, 3, 10, 12])
    assert check_link(LINK, np.stack([bounds[:-1], bounds[1:]], -1), 12) == ([], 0)


def test_each_rule_names_the_row():
    iv = np.array([[0, 3], [4, 6], [5, 9], [9, 8], [8, 20]])
    violations, count = check_link(LINK, iv, 12)
    assert count == 5
    by_row = {v.row: v.message for v in violations[:-1]}
    assert "a gap" in by_row[1] and "previous interval ends at 3" in by_row[1]
    assert "an overlap" in by_row[2]
    assert "start > end" in by_row[3]
    assert "outside the rows of agents, [0, 12)" in by_row[4]
    assert "last interval ends at 20" in violations[-1].message and violations[-1].row == 4
    assert str(violations[0]).startswith("frames.agent_index_interval row 1:")


def test_first_must_start_at_zero_and_empty_parent_with_children():
    violations, _ = check_link(LINK, np.array([[1, 5]]), 5)
    assert "first interval must start at 0" in violations[0].message and violations[0].row == 0
    violations, count = check_link(LINK, np.zeros((0, 2), np.int64), 4)
    assert count == 1 and violations[0].row is None and "no frames rows" in violations[0].message


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 30), st.integers(-3, 30)), max_size=30), st.integers(0, 30),
       st.integers(1, 7))
def test_streamed_chunks_count_like_brute_force(pairs, n_child, chunk):
    iv = np.array(pairs, np.int64).reshape(-1, 2)
    checker = IntervalChecker(LINK, n_child, limit=1000)
    for s in range(0, len(iv), chunk):
        checker.feed(iv[s:s + chunk])
    violations = checker.finish()
    assert checker.count == len(violations) == brute_force_count(iv, n_child)
