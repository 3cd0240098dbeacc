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


def test_every_violation_is_said_where_and_what_in_one_line():
    """The exact lines (only their presence was tested): row numbers count across
    feeds, empty intervals and intervals starting at 0 are fine, the limit keeps the first ones and counts all."""
    from zarrfeed.core.links import Violation
    c = IntervalChecker(LINK, 10, limit=20)
    c.feed(np.array([[0, 0], [0, 3]], np.uint32))  # empty, then from 0: fine (any integer dtype)
    c.feed(np.array([[3, 2], [5, 7], [6, 8], [-1, 9], [9, 11]], np.int64))
    lines = [str(v) for v in c.finish()]
    assert lines == [
        "frames.agent_index_interval row 2: interval [3, 2) has start > end",
        "frames.agent_index_interval row 3: interval [5, 7) starts at 5 but the previous interval ends at 2 "
        "(a gap in agents)",
        "frames.agent_index_interval row 4: interval [6, 8) starts at 6 but the previous interval ends at 7 "
        "(an overlap in agents)",
        "frames.agent_index_interval row 5: interval [-1, 9) is outside the rows of agents, [0, 10)",
        "frames.agent_index_interval row 6: interval [9, 11) is outside the rows of agents, [0, 10)",
        "frames.agent_index_interval row 6: last interval ends at 11, but agents has 10 rows (they must be "
        "covered in order)",
    ]
    first = IntervalChecker(LINK, 10)
    first.feed(np.array([[2, 10]]))
    assert [str(v) for v in first.finish()] == [
        "frames.agent_index_interval row 0: interval [2, 10) starts at 2 but the first interval must start at 0 "
        "(a gap in agents)"]
    assert str(Violation("scenes", None, None, "no rows")) == "scenes: no rows"
    violations, count = check_link(LINK, np.array([[1, 2]] * 5), 2, limit=3)
    assert [v.row for v in violations] == [0, 1, 2] and count == 5  # the first 3 of 5
    assert check_link(LINK, np.array([[0, 1]]), 1, limit=0) == ([], 0)


def test_defaults_and_edges_of_each_rule():
    """The rules' defaults and edges: the default limit (20), an empty interval that is wrong only for where
    it starts, an interval starting at 0 that overlaps, and intervals compared as integers past 2**53 (where a
    float would round two different row numbers to one)."""
    iv = np.array([[1, 2]] * 25)
    violations, count = check_link(LINK, iv, 2)
    assert len(violations) == 20 and count == 25
    c = IntervalChecker(LINK, 2)
    c.feed(iv)
    assert len(c.finish()) == 20 and c.count == 25
    empty_late, _ = check_link(LINK, np.array([[3, 3]]), 3)
    assert [v.message for v in empty_late][0] == (
        "interval [3, 3) starts at 3 but the first interval must start at 0 (a gap in agents)")
    from_zero, _ = check_link(LINK, np.array([[0, 2], [0, 3]]), 3)
    assert [v.message for v in from_zero] == [
        "interval [0, 3) starts at 0 but the previous interval ends at 2 (an overlap in agents)"]
    big = 2**53 + 1
    assert check_link(LINK, np.array([[0, big], [big, big]], np.uint64), big) == ([], 0)
    assert check_link(LINK, np.array([[0, big - 1], [big - 1, big]], np.int64), big) == ([], 0)
    gap, count = check_link(LINK, np.array([[0, big - 1], [big, big]], np.int64), big)  # one row left out
    assert count == 1 and "(a gap in agents)" in gap[0].message
