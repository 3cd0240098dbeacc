"""The commit protocol on its own (`Committer`), with no worker processes: the caller writes the rows in this
process, as a Dask task or a custom writer would, and the committer decides what readers see."""
import contextlib

import pytest
from expected import assert_holds
from formats import storage_layout
from zarrfeed.loader import Dataset
from zarrfeed.writer import L5KIT_SCHEMA, synthetic
from zarrfeed.writer.chunk_write import write_rows
from zarrfeed.writer.committer import Committer
from zarrfeed.writer.episode import relocate

from zarrfeed.core.keys import Position, fingerprint
from zarrfeed.core.location import Location


def episodes(n: int, seed: int) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=20, agents_per_frame=6))


class _OneWriter:  # the chunk locks of `write_rows` where one thread writes: nothing to hold off
    def __getitem__(self, key):
        return contextlib.nullcontext()


def write(c: Committer, episode: dict, starts: dict) -> list:
    """Write one placed episode's rows in this process; the chunk writes, per table."""
    out = {}
    for t, rows in relocate(episode, L5KIT_SCHEMA, starts).items():
        out[t] = write_rows(c.arrays[t], starts[t], rows, _OneWriter(), c.check_lease)
    return out


def rows_of(episode: dict) -> dict:
    return {t: len(a) for t, a in episode.items()}


def test_episodes_commit_in_the_order_placed_whatever_order_their_rows_are_stored(tmp_path, zarr_format):
    eps = episodes(3, seed=1)
    chunks = {"agents": 64, "frames": 16}
    c = Committer(Location.of(tmp_path / "d.zarr"), chunks=chunks, commit_interval=0,
                  layout=storage_layout(zarr_format, chunks))
    c.begin_input(fingerprint(eps[0]), resume=False)
    keys = [Position(fingerprint(eps[0]), i) for i in range(3)]
    starts = [c.place(k, rows_of(e), fingerprint(e)) for k, e in zip(keys, eps, strict=True)]
    for t in L5KIT_SCHEMA.tables:
        c.grow(t, starts[2][t] + len(eps[2][t]))
    writes = [write(c, e, s) for e, s in zip(eps, starts, strict=True)]
    for t in L5KIT_SCHEMA.tables:  # the last episode's rows stored first: nothing can commit yet
        c.stored(t, starts[2][t], starts[2][t] + len(eps[2][t]), writes[2][t])
    c.commit(force=True)
    assert not any(c.is_committed(k) for k in keys) and c.committed == {t: 0 for t in L5KIT_SCHEMA.tables}
    assert c.missing() == keys
    for t in L5KIT_SCHEMA.tables:
        c.stored(t, starts[0][t], starts[0][t] + len(eps[0][t]), writes[0][t])
    c.commit(force=True)
    assert [c.is_committed(k) for k in keys] == [True, False, False]
    assert Dataset.open(tmp_path / "d.zarr").rows["scenes"] == 1  # readers see the first episode only
    for t in L5KIT_SCHEMA.tables:
        c.stored(t, starts[1][t], starts[1][t] + len(eps[1][t]), writes[1][t])
    assert c.close()["scenes"] == 3
    ds = Dataset.open(tmp_path / "d.zarr")
    assert_holds(ds, eps)
    report = ds.verify()  # every chunk's digest recorded from the writes reported, and each matches
    assert ds.validate().ok and report.ok and report.verified > 0 and report.unverifiable == 0


def test_rows_written_elsewhere_are_reserved_and_reported_written(tmp_path, zarr_format):
    """The later episode's rows are stored first: in v3 the shards the two share are written by the later one
    first, then merged into by the earlier one."""
    eps = episodes(2, seed=2)
    chunks = {"agents": 16, "frames": 8, "scenes": 1, "traffic_light_faces": 8}
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=0, chunks=chunks,
                  layout=storage_layout(zarr_format, chunks))
    first = c.reserve("a", rows_of(eps[0]), fingerprint(eps[0]))
    second = c.reserve("b", rows_of(eps[1]), fingerprint(eps[1]))
    with pytest.raises(ValueError, match="key a: already committed or placed"):
        c.reserve("a", rows_of(eps[0]))
    later = write(c, eps[1], second)
    assert c.written("b", [w for ws in later.values() for w in ws]) == rows_of(eps[1])
    assert not c.is_committed("b")  # placed after "a", which is not written yet
    earlier = write(c, eps[0], first)
    c.written("a", [w for ws in earlier.values() for w in ws])
    assert c.is_committed("a") and c.is_committed("b")
    c.close()
    assert_holds(Dataset.open(tmp_path / "d.zarr"), eps)


def test_a_committer_that_fails_before_any_commit_removes_the_dataset_it_created(tmp_path):
    c = Committer(Location.of(tmp_path / "d.zarr"))
    c.reserve("a", {"scenes": 1})
    c.fail(RuntimeError("the input broke"))
    assert not (tmp_path / "d.zarr").exists()
    with pytest.raises(RuntimeError, match="is closed after an error: the input broke"):
        c.begin_input("x", resume=False)
    kept = Committer(Location.of(tmp_path / "e.zarr"))
    kept.fail(KeyboardInterrupt(), remove=False)  # a run meant to be resumed keeps what it made
    assert (tmp_path / "e.zarr").exists()


def test_a_reserved_key_keeps_its_fingerprint_and_a_table_left_out_reserves_no_rows(tmp_path):
    """What `reserve` records: the episode's fingerprint (an interrupted run's key is refused with another
    episode), and rows only for the tables named (a table left out of `rows` gets none)."""
    ep = episodes(1, seed=4)[0]
    ep["traffic_light_faces"] = ep["traffic_light_faces"][:0]
    ep["frames"]["traffic_light_faces_index_interval"] = 0
    rows = {t: n for t, n in rows_of(ep).items() if t != "traffic_light_faces"}
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=0)
    starts = c.reserve("a", rows, fingerprint(ep))
    c.reserve("b", rows, "fp-b")
    c.reserve("c", rows)  # no fingerprint given: nothing to check it by
    c.release()  # interrupted: none is written
    again = Committer(Location.of(tmp_path / "d.zarr"), mode="a", commit_interval=0)
    assert again.missing() == ["a", "b", "c"]
    again.check_resubmitted("a", fingerprint(ep))
    again.check_resubmitted("c", fingerprint(ep))
    with pytest.raises(ValueError, match=r"episode b: not the episode submitted under this key .*was fp-b"):
        again.check_resubmitted("b", "fp-other")
    again.release()
    c = Committer(Location.of(tmp_path / "e.zarr"), commit_interval=0)
    starts = c.reserve("a", rows, fingerprint(ep))
    stored = write(c, ep, starts)
    assert c.written("a", [w for ws in stored.values() for w in ws]) == {**rows, "traffic_light_faces": 0}
    assert c.close()["traffic_light_faces"] == 0
    assert_holds(Dataset.open(tmp_path / "e.zarr"), [ep])


def test_a_failed_committer_keeps_a_folder_it_found_and_never_removes_after_losing_its_lease(tmp_path, caplog):
    (tmp_path / "empty.zarr").mkdir()
    c = Committer(Location.of(tmp_path / "empty.zarr"))
    c.reserve("a", {"scenes": 1})
    c.fail(RuntimeError("the input broke"))
    assert (tmp_path / "empty.zarr").is_dir() and not any((tmp_path / "empty.zarr").iterdir())  # as it was
    c = Committer(Location.of(tmp_path / "d.zarr"))
    c.reserve("a", {"scenes": 1})
    (tmp_path / "d.zarr" / "zarrfeed.lease").unlink()  # the lease is no longer this writer's
    with caplog.at_level("WARNING", logger="zarrfeed.writer"):
        c.fail(RuntimeError("the input broke"))
    assert (tmp_path / "d.zarr" / ".zarray").exists() or (tmp_path / "d.zarr" / ".zgroup").exists()
    assert (f"{Location.of(tmp_path / 'd.zarr')}: not removing the dataset this writer created: its lease is no "
            "longer held") in caplog.messages


def test_a_committer_that_fails_commits_what_is_durable_first(tmp_path, zarr_format):
    """fail() after an error: the episodes already stored are committed before the lease goes (a resume then
    starts after them); the rows of one not stored are not."""
    eps = episodes(2, seed=6)
    chunks = {"agents": 16, "frames": 8, "scenes": 1, "traffic_light_faces": 8}
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=1000, chunks=chunks,  # no commit but the
                  layout=storage_layout(zarr_format, chunks))  # forced ones
    starts = [c.place(k, rows_of(e), fingerprint(e)) for k, e in zip("ab", eps, strict=True)]
    for t in L5KIT_SCHEMA.tables:
        c.grow(t, starts[1][t] + len(eps[1][t]))
    stored = write(c, eps[0], starts[0])
    for t in L5KIT_SCHEMA.tables:
        c.stored(t, starts[0][t], starts[0][t] + len(eps[0][t]), stored[t])
    c.fail(RuntimeError("the input broke"), remove=False)
    again = Committer(Location.of(tmp_path / "d.zarr"), mode="a")
    assert again.is_committed("a") and not again.is_committed("b") and again.missing() == ["b"]
    assert again.close()["scenes"] == 1
    assert_holds(Dataset.open(tmp_path / "d.zarr"), eps[:1])


def test_the_episodes_touching_a_range_are_those_with_rows_inside_it():
    """Which uncommitted episodes a failed write of rows [start, end) concerns (they are reported as lost):
    an episode ending where the range starts, or starting where it ends, has no row in it."""
    from zarrfeed.writer.commit_tracking import CommitTracker
    t = CommitTracker({"agents": 0})
    t.add_episode("a", {"agents": 0}, {"agents": 10})
    t.add_episode("b", {"agents": 10}, {"agents": 20})
    t.add_episode("c", {"agents": 20}, {"agents": 30})
    assert t.episodes_touching("agents", 10, 20) == ["b"]
    assert t.episodes_touching("agents", 9, 21) == ["a", "b", "c"]
    assert t.episodes_touching("agents", 30, 40) == [] and t.episodes_touching("agents", 0, 0) == []
    assert t.episodes_touching("agents", 25, 26) == ["c"]


def test_the_last_write_of_a_shared_chunk_is_told_by_its_links_or_not_at_all():
    """Which write of a chunk came last, from the `replaced` links alone: the one no other write replaced; when
    two writes both look last (a link missing), no digest is recorded rather than a wrong one."""
    from zarrfeed.writer.chunk_write import ChunkWrite
    from zarrfeed.writer.commit_tracking import _last
    first = ChunkWrite("agents", 0, 10, "d1", None, True)
    second = ChunkWrite("agents", 0, 20, "d2", "d1", True)
    third = ChunkWrite("agents", 0, 30, "d3", "d2", True)
    assert _last({third, first, second}) == (30, "d3")
    assert _last({first}) == (10, "d1") and _last({ChunkWrite("agents", 0, 10, "d1", "d1", True)}) == (10, "d1")
    assert _last({first, ChunkWrite("agents", 0, 20, "d2", None, True)}) is None  # two unlinked: unknown


def test_a_chunk_is_sealed_once_its_rows_are_committed_and_forgotten_once_recorded():
    """ChunkDigests.seal at its bounds: a chunk is sealed when its last row is
    committed, the table's last chunk too when the writer closes (`tail`) if any of its rows is committed, never a
    chunk past the committed rows; `forget` drops what a published commit recorded."""
    from zarrfeed.writer.chunk_write import ChunkWrite
    from zarrfeed.writer.commit_tracking import ChunkDigests
    digests = ChunkDigests({"agents": 10})
    digests.add([ChunkWrite("agents", i, 100 + i, f"d{i}") for i in range(4)])
    assert digests.seal({"agents": 19}) == {"agents": {0: (100, "d0")}}
    assert digests.seal({"agents": 20}) == {"agents": {0: (100, "d0"), 1: (101, "d1")}}
    assert digests.seal({"agents": 25}) == {"agents": {0: (100, "d0"), 1: (101, "d1")}}  # chunk 2 still open
    assert digests.seal({"agents": 30}, tail=True) == {"agents": {0: (100, "d0"), 1: (101, "d1"), 2: (102, "d2")}}
    assert digests.seal({"agents": 31}, tail=True)["agents"][3] == (103, "d3")
    digests.forget({"agents": {0: (100, "d0"), 2: (102, "d2")}})
    assert digests.seal({"agents": 40}) == {"agents": {1: (101, "d1"), 3: (103, "d3")}}


def test_a_give_up_interrupted_while_removing_still_releases_the_lease(tmp_path, monkeypatch):
    """`abandon` released the lease only if removing the dataset
    it created returned, so an interrupt there left the lease held, its heartbeat running, in this process."""
    c = Committer(Location.of(tmp_path / "d.zarr"))

    def interrupted() -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(c._lease, "confirm", interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.abandon()
    monkeypatch.undo()
    again = Committer(Location.of(tmp_path / "d.zarr"), mode="a")  # taken at once: the lease was released
    again.release()
