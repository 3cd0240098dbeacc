"""The committer's rules one by one, in this process (the end-to-end tests reach these lines through worker
processes, where a wrong line goes unseen): how it opens, what it refuses and with which line, how far it grows
arrays, what a commit publishes and what it withdraws, and what is left after close, fail and a store that does
not answer."""
import contextlib
import json
import shutil
import threading

import numcodecs
import numpy as np
import pytest
from formats import storage_layout
from test_commit_protocol import episodes, rows_of, write
from zarrfeed.loader import Dataset
from zarrfeed.writer import L5KIT_SCHEMA
from zarrfeed.writer.chunk_write import write_rows
from zarrfeed.writer.committer import Committer, key_order

from zarrfeed.core import manifest_io as commits, dataset_format, commit_log_reads as log_reads, manifest
from zarrfeed.core.keys import Position, fingerprint
from zarrfeed.core.schema import Schema, Table
from zarrfeed.core.errors import FormatError, StoreTimeout
from zarrfeed.core.location import Location
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array

TABLES = list(L5KIT_SCHEMA.tables)


def put(c: Committer, key, ep: dict) -> dict:
    """Place, write and report one episode."""
    starts = c.place(key, rows_of(ep), fingerprint(ep))
    for t in TABLES:
        c.grow(t, starts[t] + len(ep[t]))
    stored = write(c, ep, starts)
    for t in TABLES:
        c.stored(t, starts[t], starts[t] + len(ep[t]), stored[t])
    return starts


class _NoLocks:  # one thread writes: the chunk locks of `write_rows` have nothing to hold off
    def __getitem__(self, key):
        return contextlib.nullcontext()


_NO_LOCKS = _NoLocks()


def zeros(c: Committer, table: str, start: int, end: int) -> list:
    """Store rows [start, end) of `table` (zeros); the chunk writes to report: a commit reads back the rows of each
    table's last chunk to record them, so rows reported stored must be."""
    c.grow(table, end)
    return write_rows(c.arrays[table], start, np.zeros(end - start, c.arrays[table].dtype), _NO_LOCKS)


def logged_chunks(path) -> dict:
    """The chunk records of the dataset's commit log as the latest manifest lists it."""
    store = DirectoryStore(path)
    return log_reads.read_log(store, commits.read_manifest(store)).whole().chunks


def test_mode_and_what_a_location_must_hold(tmp_path):
    with pytest.raises(ValueError) as err:
        Committer(Location.of(tmp_path / "d.zarr"), mode="x")
    assert str(err.value) == "mode must be 'w' or 'a', got 'x'"
    loc = Location.of(tmp_path / "none.zarr")
    with pytest.raises(FormatError) as err:  # appending to nothing: refused before the lease makes a folder
        Committer(loc, mode="a")
    assert str(err.value) == f"{loc}: no dataset to append to or resume (nothing is stored there)"
    assert not (tmp_path / "none.zarr").exists()
    c = Committer(Location.of(tmp_path / "d.zarr"))
    c.close()
    loc = Location.of(tmp_path / "d.zarr")
    with pytest.raises(FormatError) as err:  # overwrite is not the default
        Committer(loc)
    assert str(err.value) == (f"{loc}: already exists and is not empty; append to it (mode='a'), finish an "
                              "interrupted ingest into it (mode='a' and ingest(..., resume=True)), or replace it "
                              "(overwrite=True)")
    assert err.value.cli == (f"{loc}: already exists and is not empty; append to it (--append), finish an "
                             "interrupted ingest into it (--resume), or replace it (--overwrite)")
    other = tmp_path / "other"
    other.mkdir()
    for name in "abcde":
        (other / name).write_text("x")
    with pytest.raises(FormatError) as err:
        Committer(Location.of(other), overwrite=True)
    assert str(err.value) == (f"{Location.of(other)}: not a zarr dataset (it holds a, b, c, d, ...); refusing to "
                              "overwrite it")
    (other / "e").unlink()
    (other / "d").unlink()
    with pytest.raises(FormatError) as err:
        Committer(Location.of(other), overwrite=True)
    assert str(err.value).endswith("(it holds a, b, c); refusing to overwrite it")


def test_what_a_new_dataset_is_made_with(tmp_path):
    """Chunks, compressor and lease timeout reach the dataset; commits are at most a second apart by default."""
    c = Committer(Location.of(tmp_path / "d.zarr"), chunks={"agents": 48}, compressor=numcodecs.Zlib(level=3),
                  lease_timeout=7.0)
    assert c.commit_interval == 1.0
    assert c.arrays["agents"].chunks == (48,) and c.arrays["agents"].compressor == numcodecs.Zlib(level=3)
    assert json.loads((tmp_path / "d.zarr" / "zarrfeed.lease").read_bytes())["timeout"] == 7.0
    c.close()


def test_appending_checks_the_schema_and_the_stored_rows(tmp_path):
    path = tmp_path / "d.zarr"
    c = Committer(Location.of(path), commit_interval=0)
    put(c, "a", episodes(1, seed=1)[0])
    c.close()
    loc = Location.of(path)
    other = L5KIT_SCHEMA.tables["agents"].dtype.descr[:-1]  # the agents' dtype without its last field
    changed = Schema({**L5KIT_SCHEMA.tables, "agents": Table("agents", np.dtype(other),
                                                             L5KIT_SCHEMA.tables["agents"].chunk_rows)},
                     L5KIT_SCHEMA.links)
    with pytest.raises(FormatError) as err:
        Committer(loc, changed, mode="a")
    assert str(err.value) == f"{loc}: table 'agents' does not match the schema to append"
    extra = Schema({**L5KIT_SCHEMA.tables, "more": Table("more", L5KIT_SCHEMA.tables["scenes"].dtype, 8)},
                   L5KIT_SCHEMA.links)
    with pytest.raises(FormatError) as err:  # a table the dataset lacks: the same line, not a KeyError
        Committer(loc, extra, mode="a")
    assert str(err.value) == f"{loc}: table 'more' does not match the schema to append"
    with pytest.raises(FormatError) as err:
        Committer(loc, Schema(L5KIT_SCHEMA.tables, L5KIT_SCHEMA.links[:-1]), mode="a")
    assert str(err.value) == f"{loc}: its links differ from the schema to append"
    Array.open(DirectoryStore(path), "agents").resize(3)  # fewer rows than committed: damaged
    with pytest.raises(FormatError) as err:
        Committer(loc, mode="a")
    committed = commits.read_manifest(DirectoryStore(path))["committed"]["agents"]
    assert str(err.value) == (f"{loc}: table 'agents': {committed} rows committed but the array holds 3; the "
                              "dataset is damaged")


def test_appending_to_a_dataset_of_another_tool(tmp_path):
    """No manifest: the shapes are the rows, commits start at 1, a table it lacks is made empty and writable.
    (Its frames point at no faces: one that points at faces it lacks does not validate, and is refused.)"""
    path = tmp_path / "d.zarr"
    c = Committer(Location.of(path), commit_interval=0)
    ep = episodes(1, seed=2)[0]
    ep["traffic_light_faces"] = ep["traffic_light_faces"][:0]
    ep["frames"]["traffic_light_faces_index_interval"] = 0
    put(c, "a", ep)
    c.close()
    (path / manifest.MANIFEST_KEY).unlink()
    (path / ".zmetadata").unlink()
    for name in ("zarrfeed.commits", "zarrfeed.log", "traffic_light_faces"):
        shutil.rmtree(path / name)
    again = Committer(Location.of(path), mode="a", commit_interval=0)
    assert again.committed == {**rows_of(ep), "traffic_light_faces": 0} and again.commit_number == 0
    tl = again.arrays["traffic_light_faces"]
    assert tl.shape == (0,) and tl.dtype == L5KIT_SCHEMA.tables["traffic_light_faces"].dtype
    assert tl.chunks == (L5KIT_SCHEMA.tables["traffic_light_faces"].chunk_rows,)
    assert tl.compressor == again.arrays["agents"].compressor
    assert tl.fill_value.tobytes() == bytes(tl.dtype.itemsize)
    again.begin_input("x", resume=False)
    assert again.commit_number == 1
    again.close()
    doc = commits.read_manifest(DirectoryStore(path))
    assert doc["dataset_id"] == again.dataset_id and len(again.dataset_id) > 8


def test_appending_keeps_the_identity_journal_and_log(tmp_path, zarr_format):
    path = tmp_path / "d.zarr"
    c = Committer(Location.of(path), commit_interval=0, layout=storage_layout(zarr_format))
    put(c, "a", episodes(1, seed=3)[0])
    c.skip("bad")
    c.close()
    again = Committer(Location.of(path), mode="a", commit_interval=0)
    assert again.dataset_id == c.dataset_id and again.commit_number == c.commit_number
    assert again.is_committed("a") and again.is_committed("bad") and not again.is_committed("c")
    again.release()
    store = DirectoryStore(path)
    doc = commits.read_manifest(store)
    orphan = f"zarrfeed.log/{doc['commit'] + 5:010d}-deadbeef.json"
    store[orphan] = b'{"committed": [], "skipped": [], "chunks": {}}'  # a commit that never published
    Committer(Location.of(path), mode="a").release()
    assert orphan not in log_reads.log_keys(store)
    gone = doc["log"][0]["key"]
    del store[gone]
    loc = Location.of(path)
    with pytest.raises(FormatError) as err:
        Committer(loc, mode="a")
    assert str(err.value) == f"{loc}: commit log segment '{gone}' is missing; the dataset is damaged"


def test_arrays_grow_in_large_steps_and_are_trimmed_at_close(tmp_path):
    c = Committer(Location.of(tmp_path / "d.zarr"), chunks={"agents": 10}, commit_interval=1000)

    def length() -> int:
        return Array.open(DirectoryStore(tmp_path / "d.zarr"), "agents").shape[0]
    c.grow("agents", 1)
    assert length() == 40  # 4 chunks on a local disk
    c.grow("agents", 40)
    assert length() == 40
    c.grow("agents", 41)
    assert length() == 80  # doubled
    c.grow("agents", 1000)
    assert length() == 1000
    ep = episodes(1, seed=4)[0]
    put(c, "a", ep)  # not committed yet: the interval is long
    assert c.committed["agents"] == 0
    assert c.close()["agents"] == len(ep["agents"])  # close commits what is stored, then trims
    assert length() == len(ep["agents"])
    meta = json.loads((tmp_path / "d.zarr" / ".zmetadata").read_bytes())["metadata"]
    assert meta["agents/.zarray"]["shape"] == [len(ep["agents"])]
    remote = Committer(Location.of("memory://grow-steps/d.zarr"), chunks={"agents": 10})
    remote.grow("agents", 1)
    assert Array.open(remote.store, "agents").shape == (640,)  # 64 chunks on an object store
    remote.release()


def test_a_commit_with_nothing_new_publishes_nothing_and_old_segments_are_deleted(tmp_path):
    path = tmp_path / "d.zarr"
    c = Committer(Location.of(path), commit_interval=0)
    eps = episodes(3, seed=5)
    put(c, "a", eps[0])
    c.commit(force=True)
    assert c.commit_number == 1
    store = DirectoryStore(path)
    assert log_reads.log_keys(store)[0].startswith("zarrfeed.log/0000000001-")
    c.commit(force=True)
    assert c.commit_number == 1  # nothing new: no commit
    put(c, "b", eps[1])
    c.commit()
    put(c, "c", eps[2])
    c.commit()
    listed = {r["key"] for r in commits.read_manifest(store)["log"]}
    assert c.commit_number == 3 and set(log_reads.log_keys(store)) == listed  # merged ones deleted
    c.close()


def test_a_commit_that_fails_is_published_whole_by_the_next(tmp_path, monkeypatch):
    path = tmp_path / "d.zarr"
    c = Committer(Location.of(path), commit_interval=0)
    eps = episodes(2, seed=6)
    put(c, "a", eps[0])
    c.commit()
    real = commits.write_manifest

    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(commits, "write_manifest", broken)
    put(c, "b", eps[1])
    with pytest.raises(OSError, match="disk full"):
        c.commit()
    assert c.commit_number == 1
    monkeypatch.setattr(commits, "write_manifest", real)
    c.commit(force=True)
    assert c.commit_number == 2
    store = DirectoryStore(path)
    whole = log_reads.read_log(store, commits.read_manifest(store)).whole()
    assert whole.committed == ["a", "b"]
    c.close()
    assert Dataset.open(path).rows["scenes"] == 2


def test_a_last_chunk_recorded_by_a_closed_writer_is_withdrawn_before_it_is_written_again(tmp_path, zarr_format):
    """Its digest would no longer match: withdrawn (None) by a commit before the first write there, sealed again
    at close; a table not written to keeps its record; a writer that writes nothing keeps every record (in v3,
    the last inner chunk of a shard that the next write replaces whole)."""
    path = tmp_path / "d.zarr"
    chunks = {"agents": 64, "frames": 16, "scenes": 4}
    c = Committer(Location.of(path), chunks=chunks, commit_interval=0, layout=storage_layout(zarr_format, chunks))
    ep = episodes(1, seed=7)[0]
    put(c, "a", ep)
    c.close()
    na, nf = len(ep["agents"]), len(ep["frames"])
    assert na % 64 and nf % 16
    before = logged_chunks(path)
    assert before["agents"][na // 64] is not None and before["frames"][nf // 16] is not None
    idle = Committer(Location.of(path), mode="a", commit_interval=1000)
    idle.begin_input("x", resume=False)  # a commit, but nothing is written: nothing withdrawn
    assert logged_chunks(path) == before
    idle.release()
    assert Dataset.open(path).verify().unverifiable == 0
    c = Committer(Location.of(path), mode="a", commit_interval=1000)
    frames_only = {t: a[:0] if t == "agents" else a for t, a in ep.items()}
    frames_only["frames"] = frames_only["frames"].copy()
    frames_only["frames"]["agent_index_interval"] = 0
    starts = c.place("b", rows_of(frames_only), fingerprint(frames_only))  # forced commit: tails withdrawn
    now = logged_chunks(path)
    assert now["agents"][na // 64] is None and now["frames"][nf // 16] is None
    for t in TABLES:
        c.grow(t, starts[t] + len(frames_only[t]))
    stored = write(c, frames_only, starts)
    for t in TABLES:
        c.stored(t, starts[t], starts[t] + len(frames_only[t]), stored[t])
    c.close()
    after = logged_chunks(path)
    assert after["agents"][na // 64] == before["agents"][na // 64]  # not written to: sealed again as it was
    assert after["frames"][nf // 16] not in (None, before["frames"][nf // 16])
    report = Dataset.open(path).verify()
    assert report.ok and report.unverifiable == 0


def test_keys_are_listed_in_a_natural_order(tmp_path):
    assert sorted(["b", 10, Position("y", 1), 2, "a", Position("x", 10), Position("x", 2)], key=key_order) == [
        Position("x", 2), Position("x", 10), Position("y", 1), 2, 10, "a", "b"]
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=1000)
    for key in (10, "b", 2, Position("x", 3)):
        c.place(key, {"scenes": 1})
    c.skip(7)
    assert c.is_committed(7) and c.is_known(7) and not c.is_committed(2) and c.is_known(2)
    with pytest.raises(TypeError, match="an episode key is a str or an int"):
        c.skip(1.5)
    assert c.missing() == [Position("x", 3), 2, 10, "b"]
    assert c.episodes_touching("scenes", 1, 3) == ["b", 2] and c.episodes_touching("frames", 0, 1) == []
    c.release()


def test_begin_input_refusals_say_what_to_do(tmp_path):
    loc = Location.of(tmp_path / "d.zarr")
    c = Committer(loc, commit_interval=1000)
    c.begin_input("fp-1", resume=False)  # recorded with a commit of its own, whatever the interval
    assert c.commit_number == 1
    c.place(Position("fp-1", 0), {"scenes": 1})
    c.commit(force=True)  # the placed key is recorded (not committed: its rows are not stored)
    with pytest.raises(ValueError) as err:
        c.begin_input("fp-1", resume=False)
    assert str(err.value) == (f"{loc}: this input was ingested before (0 of its parts are committed; its "
                              "fingerprint is fp-1); finish it (resume=True), or give its episodes other keys "
                              "(keys=) to write them a second time")
    assert "finish it (--resume); writing the same episodes a second time" in err.value.cli
    with pytest.raises(ValueError) as err:
        c.begin_input("fp-2", resume=True)
    assert str(err.value) == (f"{loc}: cannot resume with this input (its fingerprint is fp-2): the interrupted "
                              "ingest had another (fp-1); resume with the same input, or append this one without "
                              "resume (--append)")
    c.release()
    again = Committer(loc, mode="a", commit_interval=1000)
    again.begin_input("fp-1", resume=True)
    assert again.missing() == [Position("fp-1", 0)]
    again.release()


def test_a_closed_committer_says_so_and_keeps_the_error(tmp_path):
    loc = Location.of(tmp_path / "d.zarr")
    c = Committer(loc)
    c.close()
    with pytest.raises(RuntimeError) as err:
        c.place("a", {"scenes": 1})
    assert str(err.value) == f"the writer of {loc} is closed"
    c = Committer(Location.of(tmp_path / "e.zarr"))
    boom = ValueError("boom")

    def fails():
        raise boom
    with pytest.raises(ValueError):
        c.guarded(fails)
    assert c.error is boom and c.closed


def test_empty_rows_are_not_tracked_and_stored_rows_are_committed_at_close(tmp_path):
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=1000)
    c.place("a", {"scenes": 1})
    c.stored("frames", 0, 0, ())  # nothing stored: no segment of the tracker
    c.stored("scenes", 0, 1, zeros(c, "scenes", 0, 1))
    assert c.close()["scenes"] == 1


class Hang:
    """A store call that never returns (until the test ends)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, *args, **kwargs):
        self.release.wait(30)


@pytest.mark.parametrize("call, then, line", [
    ("set_length", "grow", "growing agents to 40 rows"),
    ("write_manifest", "commit", "publishing commit 1"),
    ("set_length", "close", "setting the length of agents"),
    ("consolidate", "close", "consolidating the metadata"),
])
def test_a_store_that_does_not_answer_is_one_line_naming_the_call(tmp_path, monkeypatch, call, then, line):
    loc = Location.of(tmp_path / "d.zarr")
    c = Committer(loc, chunks={"agents": 10}, store_timeout=0.3, commit_interval=1000)
    if then == "close" and call == "set_length":
        c.grow("agents", 5)
    hang = Hang()
    monkeypatch.setattr(commits if call == "write_manifest" else dataset_format, call, hang)
    try:
        with pytest.raises(StoreTimeout) as err:
            if then == "grow":
                c.grow("agents", 1)
            elif then == "commit":
                c.place("a", {"scenes": 1})
                c.stored("scenes", 0, 1, zeros(c, "scenes", 0, 1))
                c.commit(force=True)
            else:
                c.close()
        assert str(err.value) == f"{loc}: {line}: no answer in 0.3 s"
        if then == "close":
            assert c.error is err.value and c.closed
    finally:
        hang.release.set()
        c.release()


def test_a_failed_last_commit_is_said(tmp_path, monkeypatch, caplog):
    loc = Location.of(tmp_path / "d.zarr")
    c = Committer(loc, commit_interval=1000)
    c.place("a", {"scenes": 1})
    c.stored("scenes", 0, 1, zeros(c, "scenes", 0, 1))

    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(commits, "write_manifest", broken)
    with caplog.at_level("WARNING", logger="zarrfeed.writer"):
        c.fail(RuntimeError("the input broke"), remove=False)
    assert caplog.messages == [f"{loc}: the last commit after the error did not land; what was stored since "
                               "commit 0 is not committed (resume to write it)"]
    monkeypatch.undo()
    caplog.clear()
    c = Committer(Location.of(tmp_path / "e.zarr"), commit_interval=1000)
    with caplog.at_level("WARNING", logger="zarrfeed.writer"):
        c.fail(RuntimeError("the input broke"), remove=False)
    assert caplog.messages == []


def test_releasing_again_leaves_the_next_writers_lease_alone(tmp_path):
    loc = Location.of(tmp_path / "d.zarr")
    c = Committer(loc)
    c.close()
    nxt = Committer(loc, mode="a")
    c.release()
    c.close()
    nxt.check_lease()  # still held
    nxt.close()


def test_a_new_dataset_publishes_no_commit_until_something_changes(tmp_path):
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=0)
    c.commit(force=True)
    assert c.commit_number == 0
    c.close()


def test_commits_wait_for_their_interval_unless_forced(tmp_path):
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=1000)
    c.place("a", {"scenes": 1})
    c.stored("scenes", 0, 1, zeros(c, "scenes", 0, 1))
    c.commit()
    assert c.commit_number == 0 and not c.is_committed("a")
    c.commit(force=True)
    assert c.commit_number == 1 and c.is_committed("a")
    c.close()


def test_an_empty_range_reported_at_the_start_of_a_stored_one_loses_nothing(tmp_path):
    """An episode with no rows of a table reports [s, s): it must not replace the range [s, e) of the next
    episode reported before it (that episode would then never commit)."""
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=0)
    c.place("a", {"scenes": 1, "frames": 2})
    c.place("b", {"scenes": 1, "frames": 0})
    c.place("c", {"scenes": 1, "frames": 3})
    c.stored("frames", 2, 5, zeros(c, "frames", 2, 5))  # c's frames first
    c.stored("frames", 2, 2, ())  # then b's none
    c.stored("frames", 0, 2, zeros(c, "frames", 0, 2))
    c.stored("scenes", 0, 3, zeros(c, "scenes", 0, 3))
    c.commit(force=True)
    assert [c.is_committed(k) for k in "abc"] == [True, True, True]
    assert c.close() == {"scenes": 3, "frames": 5, "agents": 0, "traffic_light_faces": 0}


def test_reopening_drops_rows_stored_past_the_last_commit(tmp_path, zarr_format):
    path = tmp_path / "d.zarr"
    c = Committer(Location.of(path), commit_interval=0, layout=storage_layout(zarr_format))
    put(c, "a", episodes(1, seed=8)[0])
    c.commit(force=True)
    c.grow("agents", 10_000)  # rows past the commit (a writer killed mid-write)
    c.release()
    again = Committer(Location.of(path), mode="a")
    assert Array.open(DirectoryStore(path), "agents").shape == (again.committed["agents"],)
    again.release()


def test_a_key_placed_without_a_fingerprint_cannot_be_checked_on_resume(tmp_path):
    c = Committer(Location.of(tmp_path / "d.zarr"), commit_interval=0)
    c.place("k", {"scenes": 1})
    c.commit(force=True)
    c.release()
    again = Committer(Location.of(tmp_path / "d.zarr"), mode="a")
    again.check_resubmitted("k", "any-fingerprint")  # nothing to check it by: accepted
    again.release()


def test_a_table_made_on_append_takes_the_datasets_compressor(tmp_path):
    path = tmp_path / "d.zarr"
    c = Committer(Location.of(path), compressor=numcodecs.Zlib(level=2))
    c.close()
    shutil.rmtree(path / "traffic_light_faces")
    again = Committer(Location.of(path), mode="a")
    assert again.arrays["traffic_light_faces"].compressor == numcodecs.Zlib(level=2)
    again.close()


def test_resuming_a_dataset_whose_last_input_is_not_recorded(tmp_path):
    """A journal that lists inputs but not the last one (written before `last_input` was kept) says so."""
    path = tmp_path / "d.zarr"
    loc = Location.of(path)
    c = Committer(loc)
    c.begin_input("fp-1", resume=False)
    c.close()
    doc = json.loads((path / manifest.MANIFEST_KEY).read_bytes())
    del doc["journal"]["last_input"]
    (path / manifest.MANIFEST_KEY).write_text(json.dumps(doc))
    again = Committer(loc, mode="a")
    with pytest.raises(ValueError, match=r"the interrupted ingest had another \(unknown\);"):
        again.begin_input("fp-2", resume=True)
    again.release()


def test_a_manifest_that_does_not_count_a_table_is_refused_before_anything_changes(tmp_path):
    """Such a table used to count 0 committed rows, and an append wrote it again from row 0 over the
    rows it held. zarrfeed never writes such a manifest (its first commit counts every table, one made by the
    append included), so it is damage: refused, and the dataset left as it was."""
    path = tmp_path / "d.zarr"
    Committer(Location.of(path)).close()
    doc = json.loads((path / manifest.MANIFEST_KEY).read_bytes())
    del doc["committed"]["traffic_light_faces"]
    (path / manifest.MANIFEST_KEY).write_text(json.dumps(doc))
    before = sorted(p.name for p in path.rglob("*"))
    with pytest.raises(FormatError, match="^zarrfeed.json: field 'committed' has no row count for table "
                                          "'traffic_light_faces'; the manifest is damaged"):
        Committer(Location.of(path), mode="a")
    assert sorted(p.name for p in path.rglob("*")) == before


def test_a_dataset_made_while_a_writer_waits_for_the_lease_is_never_removed(tmp_path, monkeypatch):
    """A writer that found the location empty, then took the lease after another
    writer had made and committed a dataset there, refused (right) and then removed the location as its own
    (the other's committed rows gone). What it made is decided with the lease held."""
    from zarrfeed.writer.lease import Lease
    path = tmp_path / "d.zarr"
    real = Lease.acquire

    def acquire(self):  # the other writer comes between the check and the lease
        monkeypatch.setattr(Lease, "acquire", real)
        other = Committer(Location.of(path), commit_interval=0)
        put(other, "a", episodes(1, seed=9)[0])
        other.close()
        return real(self)
    monkeypatch.setattr(Lease, "acquire", acquire)
    with pytest.raises(FormatError, match="already holds a dataset"):
        Committer(Location.of(path))
    assert Dataset.open(path).rows["scenes"] == 1


def test_the_lease_files_of_a_writer_that_died_starting_are_no_dataset(tmp_path):
    """A writer killed after taking the lease and before making the dataset leaves only lease files: a new
    dataset may be made there (the dead holder's lease is taken over), and there is nothing to append to."""
    import subprocess
    import sys
    path = tmp_path / "d.zarr"
    subprocess.run([sys.executable, "-c", "import os, sys\nfrom zarrfeed.writer.lease import Lease\n"
                    "from zarrfeed.core.location import Location\nLease(Location.of(sys.argv[1])).acquire()\n"
                    "os._exit(0)", str(path)], check=True)
    assert sorted(p.name for p in path.iterdir()) == [".zarrfeed.lock", "zarrfeed.lease"]
    loc = Location.of(path)
    with pytest.raises(FormatError) as err:
        Committer(loc, mode="a")
    assert str(err.value) == f"{loc}: no dataset to append to or resume (nothing is stored there)"
    c = Committer(loc)
    c.close()
    assert Dataset.open(path).rows["scenes"] == 0


def test_appending_to_a_folder_that_is_no_dataset_writes_nothing_there(tmp_path):
    folder = tmp_path / "junk"
    folder.mkdir()
    (folder / "README").write_text("mine")
    with pytest.raises(FormatError, match=r"not a zarr group \(no \.zgroup\)"):
        Committer(Location.of(folder), mode="a")
    assert [p.name for p in folder.iterdir()] == ["README"]


def test_a_store_that_fails_once_the_lease_is_held_leaves_the_location_alone(tmp_path, monkeypatch):
    """Until the location is listed with the lease held, the writer has made nothing there to remove."""
    path = tmp_path / "d.zarr"
    calls = []
    real = Committer._holds_data

    def holds_data(self):
        calls.append(1)
        if len(calls) > 1:
            raise OSError("the listing failed")
        return real(self)
    monkeypatch.setattr(Committer, "_holds_data", holds_data)
    with pytest.raises(OSError, match="the listing failed"):
        Committer(Location.of(path))
    assert path.is_dir()  # what the lease left, nothing removed
