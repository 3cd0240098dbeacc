"""Key-less episodes of a local DatasetWriter are exactly once: a refused episode (bad input) takes no position
of its input, with or without worker processes, so fixed and submitted again it keeps its place and resuming
the same input passes over every episode written."""
import json

import numpy as np
import pytest
from expected import expected_tables
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic, write_dataset
from zarrfeed.writer.committer import Committer
from zarrfeed.writer.dataset_writer import DatasetWriter

from zarrfeed.core.manifest import MANIFEST_KEY
from zarrfeed.core.keys import Position, fingerprint
from zarrfeed.core.location import Location

SMALL_CHUNKS = {"agents": 300, "frames": 20, "scenes": 2, "traffic_light_faces": 100}
WORKERS = pytest.mark.parametrize("workers", [0, 2])  # refused in the parent either way: both must agree


def episodes(n, seed=11):
    return list(synthetic.episodes(n, seed=seed, frames=4, agents_per_frame=3))


def broken(ep):
    """A copy of `ep` that check_episode refuses: its frames point past its agents."""
    bad = {k: v.copy() for k, v in ep.items()}
    bad["frames"]["agent_index_interval"][1, 1] = 10**6
    return bad


def holds_exactly(path, eps):
    ds = Dataset.open(path)
    assert ds.rows["scenes"] == len(eps) and ds.validate().ok
    want = expected_tables(eps)
    for t in ("scenes", "frames", "agents"):
        np.testing.assert_array_equal(ds[t][: ds.rows[t]], want[t])


def inputs(path):
    return json.loads((path / MANIFEST_KEY).read_text())["journal"]["inputs"]


@WORKERS
def test_a_refused_keyless_submit_takes_no_position(tmp_path, workers):
    e0, a, b = episodes(3)
    path = tmp_path / "d.zarr"
    write_dataset(path, [e0], chunks=SMALL_CHUNKS)
    with DatasetWriter(path, mode="a", workers=workers) as w:
        w.submit(a)
        with pytest.raises(ValueError, match=r"^episode 1: frames.agent_index_interval row 1"):
            w.submit(broken(b))
        assert w.submit(b)  # the refused one's place: position 1, as in the input [a, b]
    with DatasetWriter(path, mode="a", workers=workers) as w:
        assert w.ingest([a, b], resume=True)["episodes"] == 0  # both committed: passed over
    holds_exactly(path, [e0, a, b])


@WORKERS
def test_a_refused_first_keyless_submit_begins_no_input(tmp_path, workers):
    e0, a, b = episodes(3)
    path = tmp_path / "d.zarr"
    write_dataset(path, [e0], chunks=SMALL_CHUNKS)
    with DatasetWriter(path, mode="a", workers=workers) as w:
        with pytest.raises(ValueError, match=r"^episode 0: frames.agent_index_interval row 1"):
            w.submit(broken(a))
        w.submit(a)  # fixed: the first episode of the input [a, b], not of one begun by the broken one
        w.submit(b)
    assert fingerprint(broken(a)) not in inputs(path)
    with DatasetWriter(path, mode="a", workers=workers) as w:
        assert w.ingest([a, b], resume=True)["episodes"] == 0
    holds_exactly(path, [e0, a, b])


@WORKERS
def test_an_ingest_refused_midway_leaves_the_position_to_the_fixed_episode(tmp_path, workers):
    e0, a, b, c = episodes(4)
    path = tmp_path / "d.zarr"
    write_dataset(path, [e0], chunks=SMALL_CHUNKS)
    with DatasetWriter(path, mode="a", workers=workers) as w:
        with pytest.raises(ValueError, match=r"^episode 1: frames.agent_index_interval row 1"):
            w.ingest([a, broken(b), c])
        w.submit(b)  # fixed: position 1 of the same input
        w.submit(c)  # position 2
    with DatasetWriter(path, mode="a", workers=workers) as w:
        assert w.ingest([a, b, c], resume=True)["episodes"] == 0
    holds_exactly(path, [e0, a, b, c])


@WORKERS
def test_an_ingest_whose_first_episode_is_refused_begins_no_input(tmp_path, workers):
    e0, a, b = episodes(3)
    path = tmp_path / "d.zarr"
    write_dataset(path, [e0], chunks=SMALL_CHUNKS)
    with DatasetWriter(path, mode="a", workers=workers) as w:
        with pytest.raises(ValueError, match=r"^episode 0: frames.agent_index_interval row 1"):
            w.ingest([broken(a), b])
        w.submit(a)  # fixed: the input [a, b] begins with it
    assert list(inputs(path)) == [fingerprint(e0), fingerprint(a)]
    with DatasetWriter(path, mode="a", workers=workers) as w:
        assert w.ingest([a, b], resume=True)["episodes"] == 1  # b: a is committed
    holds_exactly(path, [e0, a, b])


def test_a_skipped_keyless_episode_keeps_its_position(tmp_path):
    """With on_error="skip" a bad episode is not refused: it is recorded as skipped in its place, as an ingest
    of the same episodes records it, so resuming that input passes over it too."""
    a, b, c = episodes(3)
    path = tmp_path / "d.zarr"
    bad = broken(b)
    with DatasetWriter(path, workers=0, on_error="skip", chunks=SMALL_CHUNKS) as w:
        assert w.submit(a) and not w.submit(bad) and w.submit(c)
    assert inputs(path) == {fingerprint(a): {"committed": [[0, 1], [2, 3]], "skipped": [[1, 2]]}}
    with DatasetWriter(path, mode="a", workers=0, on_error="skip") as w:
        assert w.ingest([a, bad, c], resume=True)["episodes"] == 0
    holds_exactly(path, [a, c])


@WORKERS
def test_an_episode_refused_as_not_the_one_placed_before_takes_no_position(tmp_path, workers):
    """An interrupted writer placed positions 0-2 of the input [a, b, c] (recorded, not committed). Resumed with
    [a], then key-less: another episode at position 1 is refused (not the one placed there), and b, submitted
    next, still takes position 1 (before: the refused one had used it up, and b was refused at position 2)."""
    a, b, c, other = episodes(4)
    path = tmp_path / "d.zarr"
    interrupted = Committer(Location.of(path), chunks=SMALL_CHUNKS, commit_interval=1000)
    interrupted.begin_input(fingerprint(a), resume=False)
    for i, ep in enumerate([a, b, c]):
        interrupted.place(Position(fingerprint(a), i), {t: len(v) for t, v in ep.items()}, fingerprint(ep))
    interrupted.commit(force=True)
    interrupted.release()
    with DatasetWriter(path, mode="a", workers=workers) as w:
        w.ingest([a], resume=True)
        with pytest.raises(ValueError, match=r"^episode 1: not the episode submitted under this key"):
            w.submit(other)
        assert w.submit(b) and w.submit(c)
    with DatasetWriter(path, mode="a", workers=workers) as w:
        assert w.ingest([a, b, c], resume=True)["episodes"] == 0
    holds_exactly(path, [a, b, c])
