"""The journal of committed episodes, tested in this process (the writer's tests run it in the writer's own
processes). A wrong line here commits an episode twice or never on a resume."""
import random

import pytest
from zarrfeed.core.keys import Position
from zarrfeed.writer.journal import IndexRanges, Journal


def test_index_ranges_are_the_set_of_the_integers_added():
    """Against a plain set, for random additions of single indices and ranges, in any order: membership,
    iteration (sorted), length, and the ranges kept sorted, disjoint and never adjacent."""
    rng = random.Random(3)
    for _ in range(200):
        ranges, want = IndexRanges(), set()
        for _ in range(rng.randint(0, 12)):
            a = rng.randint(0, 40)
            b = a + rng.randint(-2, 6)
            if rng.random() < 0.3:
                ranges.add(a)
                want.add(a)
            else:
                ranges.add_range(a, b)
                want.update(range(a, b))
        assert list(ranges) == sorted(want) and len(ranges) == len(want)
        assert all((i in ranges) == (i in want) for i in range(-2, 50))
        spans = ranges.to_json()
        assert all(s < e for s, e in spans)
        assert all(spans[k][1] < spans[k + 1][0] for k in range(len(spans) - 1))  # disjoint, a gap between
        again = IndexRanges(spans)
        assert again.to_json() == spans and repr(again) == f"IndexRanges({spans})"


@pytest.mark.parametrize("spans, expect", [
    ([[0, 3], [3, 5]], [[0, 5]]),            # adjacent ranges merge
    ([[5, 8], [0, 2]], [[0, 2], [5, 8]]),    # out of order
    ([[0, 10], [2, 4]], [[0, 10]]),          # inside another
    ([[4, 4], [2, 1]], []),                  # empty and backwards ranges add nothing
    ([[0, 2], [4, 6], [1, 5]], [[0, 6]]),    # bridging two
])
def test_index_ranges_merge(spans, expect):
    assert IndexRanges(spans).to_json() == expect


def test_a_journal_says_what_is_done_and_survives_its_json():
    j = Journal()
    a, b = Position("in-a", 0), Position("in-a", 1)
    j.pending[a] = "fa"
    j.pending["k1"] = "fk"
    assert not j.done(a) and not j.done("k1") and not j.known_input("in-a")
    j.commit(a)
    j.skip(Position("in-a", 3))
    j.commit("k1")
    j.skip("k2")
    j.commit("k1")  # again: counted once, logged once
    j.last_input = "in-a"
    assert j.done(a) and j.done(Position("in-a", 3)) and not j.done(b) and not j.done(Position("in-b", 0))
    assert j.done("k1") and j.done("k2") and not j.done("k3")
    assert j.known_input("in-a") and a not in j.pending and "k1" not in j.pending
    assert j.committed_count() == 2  # a and k1 (skips are not commits)
    new = j.take_new()
    assert new == (["k1"], ["k2"]) and j.take_new() == ([], [])
    j.commit("k4")
    j.give_back(new)  # the commit that carried them failed: they go out with the next one, first
    assert j.take_new() == (["k1", "k4"], ["k2"])
    j.pending[b] = "fb"
    doc = j.to_json()
    assert doc == {"inputs": {"in-a": {"committed": [[0, 1]], "skipped": [[3, 4]]}},
                   "pending": [[{"input": "in-a", "index": 1}, "fb"]], "last_input": "in-a"}
    back = Journal.from_json(doc, committed=["k1", "k4"], skipped=["k2"])
    assert back.to_json() == doc and back.pending == {b: "fb"} and not back.legacy
    assert back.done(a) and back.done("k4") and back.done("k2") and not back.done(b)
    assert back.committed_count() == 3 and back.take_new() == ([], [])


def test_a_journal_from_older_manifests():
    """Format 2 kept the caller's keys inline: read, and written to the log at the next commit (take_new);
    a journal of version 1 (numbered input only) is legacy; no journal at all is an empty one."""
    old = Journal.from_json({"keys": {"committed": ["x", "y"], "skipped": ["z"]}}, committed=["x"])
    assert old.done("x") and old.done("y") and old.done("z")
    assert old.take_new() == (["y"], ["z"])  # x is in the log already
    assert Journal.from_json({"committed": [[0, 4]], "skipped": []}).legacy
    empty = Journal.from_json(None)
    assert empty.to_json() == {"inputs": {}, "pending": [], "last_input": None} and not empty.legacy
    assert empty.committed_count() == 0


def test_a_new_journal_and_inputs_without_one_of_their_sets():
    """A new journal is empty, not legacy, with no input yet; an input whose manifest part lacks a set has it empty."""
    new = Journal()
    assert new.to_json() == {"inputs": {}, "pending": [], "last_input": None} and new.legacy is False
    part = Journal.from_json({"inputs": {"a": {"committed": [[0, 2]]}, "b": {"skipped": [[5, 6]]}}})
    assert part.to_json()["inputs"] == {"a": {"committed": [[0, 2]], "skipped": []},
                                        "b": {"committed": [], "skipped": [[5, 6]]}}
    assert part.done(Position("a", 1)) and part.done(Position("b", 5)) and not part.done(Position("b", 0))
