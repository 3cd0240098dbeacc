"""The commit log (zarrfeed.core.commit_log): segments, their JSON, and how they merge like a binary counter, so a
writer that commits N times stores O(log N) segments and rewrites each entry O(log N) times."""
import json
import re

import pytest

from zarrfeed.core.commit_log import LOG_PREFIX, MAX_ENTRIES, CommitLog, Segment
from zarrfeed.core.errors import FormatError


def test_a_segments_length_counts_every_entry():
    seg = Segment(committed=[1, "a"], skipped=[3],
                  chunks={"agents": {0: (10, "00000000000000d0"), 1: None}, "frames": {4: None}})
    assert len(seg) == 6
    assert Segment.from_json(seg.to_json(), "k") == seg


@pytest.mark.parametrize("raw, why", [(b"{not json", "JSONDecodeError"), (b'{"committed": []}', "KeyError"),
                                      (b'[]', "TypeError")])
def test_an_unreadable_segment_is_named_with_what_is_wrong(raw, why):
    with pytest.raises(FormatError) as err:
        Segment.from_json(raw, "zarrfeed.log/0000000003-abcd0123.json")
    assert str(err.value).startswith(f"zarrfeed.log/0000000003-abcd0123.json: unreadable commit log segment ({why}: ")


GOOD = "0123456789abcdef"


@pytest.mark.parametrize("chunks, why", [
    ({"agents": [[0, -5, GOOD]]}, "field 'chunks.agents' entry 0: chunk 0's size -5 is not a size in bytes (a whole "
                                  "number >= 1)"),
    ({"agents": [[0, 10, GOOD], [1, 0, GOOD]]}, "field 'chunks.agents' entry 1: chunk 1's size 0 is not a size"),
    ({"agents": [[0, 10.0, GOOD]]}, "field 'chunks.agents' entry 0: chunk 0's size 10.0 is not a size"),
    ({"agents": [[0, "10", GOOD]]}, "field 'chunks.agents' entry 0: chunk 0's size '10' is not a size"),
    ({"agents": [[0, True, GOOD]]}, "field 'chunks.agents' entry 0: chunk 0's size True is not a size"),
    ({"agents": [[0, None, GOOD]]}, "field 'chunks.agents' entry 0: chunk 0's size None is not a size"),
    ({"frames": [[-1, 10, GOOD]]}, "field 'chunks.frames' entry 0: chunk index -1 is not a whole number >= 0"),
    ({"frames": [[1.0, 10, GOOD]]}, "field 'chunks.frames' entry 0: chunk index 1.0 is not a whole number >= 0"),
    ({"frames": [[3, 10, GOOD], [3, None, None]]}, "field 'chunks.frames' entry 1: chunk 3 is recorded twice"),
    ({"frames": [[0, 10, "xyz"]]}, "field 'chunks.frames' entry 0: chunk 0's digest 'xyz' is not an XXH3-64 digest"),
    ({"frames": [[0, 10, None]]}, "field 'chunks.frames' entry 0: chunk 0's digest None is not an XXH3-64 digest"),
    ({"frames": [[0, 10]]}, "field 'chunks.frames' entry 0 is [0, 10], not [index, size, digest]"),
    ({"frames": {"0": [10, GOOD]}}, "field 'chunks.frames' is not a list of [index, size, digest] records"),
    ([], "field 'chunks' is not an object of tables"),
])
def test_a_segment_entry_is_checked_as_strictly_as_the_manifest(chunks, why):
    """A segment recording a chunk of -5 bytes (or 10.0, or "10", or True) was accepted: `int()`
    turned each into a size. Every entry is checked, and the message names the file and the entry."""
    raw = json.dumps({"committed": [], "skipped": [], "chunks": chunks}).encode()
    with pytest.raises(FormatError) as err:
        Segment.from_json(raw, "zarrfeed.log/0000000003-abcd0123.json")
    assert str(err.value).startswith(f"zarrfeed.log/0000000003-abcd0123.json: {why}"), str(err.value)
    assert str(err.value).endswith("; the commit log segment is damaged (restore it from a copy)")


@pytest.mark.parametrize("what", ["committed", "skipped"])
def test_the_keys_must_be_lists(what):
    raw = json.dumps({"committed": [], "skipped": [], "chunks": {}, what: "abc"}).encode()
    with pytest.raises(FormatError, match=f"^seg.json: field '{what}' is not a list of episode keys;"):
        Segment.from_json(raw, "seg.json")


@pytest.mark.parametrize("key", [True, 1.5, None, [1]])
def test_an_episode_key_of_another_type_is_refused(key):
    raw = json.dumps({"committed": ["a", key], "skipped": [], "chunks": {}}).encode()
    with pytest.raises(FormatError) as err:
        Segment.from_json(raw, "seg.json")
    assert str(err.value) == ("seg.json: an episode key that is not a str or an int; the commit log segment is "
                              "damaged (restore it from a copy)")


def one(key) -> Segment:
    return Segment(committed=[key])


def test_segments_merge_like_a_binary_counter():
    """After n commits the levels are the binary digits of n (highest first), and each commit merges exactly the
    segments of the levels it carries into."""
    log = CommitLog()
    for n in range(1, 9):
        stored, doomed = log.add(one(n), commit=n)
        levels = [r.level for r in log.refs]
        assert levels == [i for i, bit in reversed(list(enumerate(reversed(bin(n)[2:])))) if bit == "1"], n
        assert len(doomed) == (n & -n).bit_length() - 1, n  # the trailing ones of n - 1
        assert list(stored) == [log.refs[-1].key] and not set(doomed) & set(log.contents)
        assert [r.entries for r in log.refs] == [2**lv for lv in levels]
    assert log.whole().committed == list(range(1, 9))
    assert log.add(Segment(), commit=9) == ({}, [])  # nothing to add: nothing stored


def test_segments_merge_up_to_max_entries_and_no_further():
    exact = CommitLog()
    exact.add(Segment(committed=list(range(MAX_ENTRIES - 1))), commit=1)
    _, doomed = exact.add(one("last"), commit=2)
    assert len(doomed) == 1 and [r.entries for r in exact.refs] == [MAX_ENTRIES]
    over = CommitLog()
    over.add(Segment(committed=list(range(MAX_ENTRIES))), commit=1)
    _, doomed = over.add(one("next"), commit=2)
    assert doomed == [] and [(r.level, r.entries) for r in over.refs] == [(0, MAX_ENTRIES), (0, 1)]


def test_segment_keys_sort_by_commit():
    log = CommitLog()
    stored, _ = log.add(one(1), commit=7)
    assert re.fullmatch(rf"{re.escape(LOG_PREFIX)}/0000000007-[0-9a-f]{{8}}\.json", next(iter(stored)))
