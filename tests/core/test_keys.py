"""Episode keys and fingerprints: what tells one input, and one episode, from another."""
import numpy as np
import pytest


def test_a_change_in_any_table_or_field_changes_the_fingerprint():
    """A fingerprint that left out a table (the last one, traffic-light faces) passed the suite, and
    an input differing only there would have been taken for one ingested before. A change of one value in any
    table and any field, in its first or its last row, changes the fingerprint; so does a row more or less."""
    from zarrfeed.core.keys import fingerprint
    from zarrfeed.writer import synthetic

    episode = next(synthetic.episodes(1, seed=3, frames=40, agents_per_frame=8))
    base = fingerprint(episode)
    changed = 0
    for table, arr in episode.items():
        for field in arr.dtype.names:
            for row in (0, len(arr) - 1):
                other = {t: a.copy() for t, a in episode.items()}
                flat = other[table][field].reshape(len(arr), -1).view(np.uint8)
                flat[row, 0] ^= 1  # one bit of one value
                assert fingerprint(other) != base, (table, field, row)
                changed += 1
        shorter = {**episode, table: arr[:-1]}
        assert fingerprint(shorter) != base, table
    assert changed >= 2 * sum(len(a.dtype.names) for a in episode.values())


@pytest.mark.parametrize("how", ["local", "remote"])
def test_fewer_keys_than_episodes_is_one_line_naming_the_episode(tmp_path, how):
    """DatasetWriter.ingest and RemoteWriter.ingest say which episode has no key (RemoteWriter let a bare
    StopIteration out)."""
    from zarrfeed.writer import DatasetWriter, synthetic, write_dataset
    eps = list(synthetic.episodes(3, seed=3, frames=10, agents_per_frame=3))
    path = tmp_path / "d.zarr"
    write_dataset(path, eps[:1], workers=0)
    with pytest.raises(ValueError, match=r"keys: fewer keys than episodes \(none for episode 2\)"):
        if how == "local":
            with DatasetWriter(path, mode="a", workers=0) as w:
                w.ingest(eps, keys=["a", "b"])
        else:
            from zarrfeed.flight import FeedServer, RemoteWriter
            with FeedServer(str(path), port=0, workers=1, ingest=True) as server, RemoteWriter(server.url) as w:
                w.ingest(eps, keys=["a", "b"])


@pytest.mark.parametrize("bad", [True, False, 1.0, b"k", ("a", 1), ["a"]])  # (None: no key, the next position)
def test_a_key_is_a_string_an_integer_or_a_position(bad, tmp_path):
    """True would be the key 1 (True == 1 in Python): an episode under key=True, and another under key=1, would
    be one and the same to the journal; bools, floats, bytes and containers are refused before anything is
    written, in one line."""
    from zarrfeed.loader import Dataset
    from zarrfeed.writer import DatasetWriter, synthetic

    from zarrfeed.core.keys import Position, check_key
    assert check_key("k") == "k" and check_key(7) == 7 and check_key(Position("in", 3)) == Position("in", 3)
    with pytest.raises(TypeError, match=f"^an episode key is a str or an int, got {type(bad).__name__} "):
        check_key(bad)
    ep = next(synthetic.episodes(1, seed=2, frames=10, agents_per_frame=3))
    with DatasetWriter(tmp_path / "d.zarr", workers=0) as w:
        with pytest.raises(TypeError, match="an episode key is a str or an int"):
            w.submit(ep, key=bad)
        assert w.submit(ep, key=1)
    assert Dataset.open(tmp_path / "d.zarr").rows["scenes"] == 1


def test_fingerprints_are_the_same_in_every_release():
    """Fingerprints are stored (a manifest's inputs and pending episodes): a release that computed them another
    way would refuse to resume every dataset written before it. Fixed values of fixed episodes, so a change
    fails here (the tests above compare fingerprints with each other only). The
    middle of a long table is not read, as documented: a change there leaves the fingerprint as it was."""
    from zarrfeed.core.keys import fingerprint
    big = {"agents": np.arange(5000, dtype="<i8"), "scenes": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8", (2,))])}
    assert fingerprint(big) == "8c92eb8aff0cea65"
    middle = {t: a.copy() for t, a in big.items()}
    middle["agents"][2500] = -1
    assert fingerprint(middle) == "8c92eb8aff0cea65"
    assert fingerprint({"a": np.zeros(0, "<i4")}) == "f8cec4c4a727d90a"  # an empty table: name, dtype, length
    assert fingerprint({"a": [1, 2, 3]}) == "8b3570da207715cd"  # not an array: its length only
    assert fingerprint({"b": 5}) == "2226478a73f1e2a6"  # no length at all
    assert fingerprint([1, 2]) == "771f620b37b46443"  # not a mapping: its type's name


def test_fingerprints_of_int_table_names_and_many_dimensional_tables():
    """Table names are ordered as text (ints and strs may mix: 10 before 2), and a many-dimensional table is read
    as its bytes, first and last 4 KiB (every table in the tests was flat and named
    by a str). numpy reads reshape(-2) as reshape(-1): that mutant is listed as equivalent."""
    from zarrfeed.core.keys import fingerprint
    assert fingerprint({10: np.arange(3), 2: np.arange(4), "x": np.arange(2)}) == "907c27854c008d19"
    grid = np.arange(3000.0).reshape(1000, 3)
    assert fingerprint({"x": grid}) == "fd06cd6f18af35bc"
    grid[500, 1] = -1  # the middle of 24 000 bytes: not read
    assert fingerprint({"x": grid}) == "fd06cd6f18af35bc"
