"""A dataset's metadata is checked as strictly as its manifest, and nothing is appended onto a dataset that does
not validate: each case here is refused, never read as data or built on with exit 0."""
import json
from pathlib import Path
from typing import Any, Callable

import pytest
from expected import recount
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic, write_dataset
from zarrfeed.writer.dataset_writer import DatasetWriter

from zarrfeed.cli import main
from zarrfeed.core.errors import FormatError
from zarrfeed.core.location import Location
from zarrfeed.core.stores import DirectoryStore, MemoryStore

CHUNKS = {"agents": 500, "frames": 20, "scenes": 2, "traffic_light_faces": 100}
LEASE_FILES = ("zarrfeed.lease", ".zarrfeed.lock")


def make(path: Path, scenes: int = 3) -> Path:
    write_dataset(path, synthetic.episodes(scenes, seed=1, frames=20, agents_per_frame=30), chunks=CHUNKS,
                  workers=0)
    return path


@pytest.fixture
def ds_path(tmp_path) -> Path:
    return make(tmp_path / "d.zarr")


def edit(path: Path, change: Callable[[Any], Any]) -> None:
    """Change a JSON document in place (`change` edits it; what it returns is ignored)."""
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def stored(path: Path) -> dict[str, bytes]:
    """Every file of the dataset but the lease's, with its bytes: what an append that is refused must leave."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name not in LEASE_FILES}


def append(path: Path, capsys) -> tuple[int, str]:
    """`zarrfeed ingest --append` of one synthetic scene: (exit code, stderr)."""
    capsys.readouterr()
    code = main(["ingest", "--synthetic", "1", "--seed", "9", "--append", "--workers", "0", "-q", str(path)])
    return code, capsys.readouterr().err


def test_a_manifest_that_leaves_out_a_table_is_refused_and_nothing_is_appended(ds_path, capsys):
    """`committed` without agents read agents as 0 rows, and `ingest --append` wrote new agents from row 0 over
    the old ones."""
    edit(ds_path / "zarrfeed.json", lambda d: d["committed"].pop("agents"))
    before = stored(ds_path)
    line = ("zarrfeed.json: field 'committed' has no row count for table 'agents'; the manifest is damaged "
            "(restore it from a copy, or rewrite the dataset)")
    with pytest.raises(FormatError) as err:
        Dataset.open(ds_path)
    assert str(err.value) == line
    assert append(ds_path, capsys) == (2, f"zarrfeed: error: {line}\n")
    assert stored(ds_path) == before


def test_a_manifest_must_count_only_its_tables_and_hold_its_schema(ds_path):
    manifest = ds_path / "zarrfeed.json"
    edit(manifest, lambda d: d["committed"].update(lanes=4))
    with pytest.raises(FormatError, match=r"^zarrfeed.json: field 'committed.lanes' counts the rows of a table "
                                          "the schema does not have;"):
        Dataset.open(ds_path)
    edit(manifest, lambda d: (d["committed"].pop("lanes"), d.pop("schema")))
    with pytest.raises(FormatError, match=r"^zarrfeed.json: field 'schema' is missing; the manifest is damaged"):
        Dataset.open(ds_path)  # was a KeyError from deep inside


def test_a_pinned_commit_must_count_every_table(ds_path):
    first = ds_path / "zarrfeed.commits" / "0000000001.json"
    edit(first, lambda d: d["committed"].pop("frames"))
    with pytest.raises(FormatError) as err:
        Dataset.open(ds_path, commit=1)
    assert str(err.value).startswith("zarrfeed.commits/0000000001.json: field 'committed' has no row count for "
                                     "table 'frames'; ")
    edit(first, lambda d: d.update(commit=2, committed={t: 0 for t in CHUNKS}))
    with pytest.raises(FormatError, match=r"^zarrfeed.commits/0000000001.json: field 'commit' is 2, not the number"):
        Dataset.open(ds_path, commit=1)


def test_a_negative_chunk_size_in_a_zarray_is_refused_by_every_command(ds_path, capsys):
    """`chunks: [-500]` in agents/.zarray passed `validate` and loaded 0 rows with exit 0 (the same value in the
    manifest was refused)."""
    edit(ds_path / "agents" / ".zarray", lambda d: d.update(chunks=[-500]))
    before = stored(ds_path)
    line = ("table 'agents': agents/.zarray: field 'chunks' is [-500], not [rows per chunk] (one whole number "
            ">= 1); the array's metadata is damaged (restore it from a copy)")
    with pytest.raises(FormatError) as err:
        Dataset.open(ds_path)
    assert str(err.value) == line
    for command in (["validate", "-q"], ["load", "-q"], ["info"]):
        capsys.readouterr()
        assert main([*command, str(ds_path)]) == 2, command
        assert capsys.readouterr().err == f"zarrfeed: error: {line}\n"
    assert append(ds_path, capsys) == (2, f"zarrfeed: error: {line}\n")
    assert stored(ds_path) == before


@pytest.mark.parametrize("field, value, why", [
    ("chunks", [0], "field 'chunks' is [0], not [rows per chunk] (one whole number >= 1)"),
    ("chunks", [500.5], "field 'chunks' is [500.5], not [rows per chunk]"),
    ("chunks", [True], "field 'chunks' is [True], not [rows per chunk]"),
    ("chunks", [500, 1], "field 'chunks' is [500, 1], not [rows per chunk]"),
    ("chunks", [1000], "field 'chunks' is [1000], but the manifest's schema has 500 rows per chunk"),
    ("shape", [-5], "field 'shape' is [-5], not [rows] (one whole number >= 0)"),
    ("shape", ["1810"], "field 'shape' is ['1810'], not [rows]"),
    ("order", "X", "field 'order' is 'X', not 'C' or 'F'"),
    ("dimension_separator", "x", "field 'dimension_separator' is 'x', not '.' or '/'"),
    ("zarr_format", 3, "field 'zarr_format' is 3, not 2"),
    ("compressor", 5, "field 'compressor' is 5, not a codec"),
    ("compressor", {"id": "blosc", "cname": "zz", "clevel": 5, "shuffle": 1},
     "field 'compressor' is {'id': 'blosc', 'cname': 'zz', 'clevel': 5, 'shuffle': 1}, a codec that cannot be used"),
    ("filters", 5, "field 'filters' is 5, not a list of codecs"),
    ("filters", [{"id": "delta", "dtype": "<i8"}], "field 'filters' is {'id': 'delta', 'dtype': '<i8'}, a codec "
                                                   "that cannot be used"),
    ("fill_value", "AAAA", "field 'fill_value' holds 3 bytes, not one record of 116"),
    ("fill_value", 7, "field 'fill_value' is 7, not base64 of one record, or null"),
    ("fill_value", "A!!A", "field 'fill_value' is 'A!!A', not base64 of one record, or null"),
])
def test_each_field_of_a_zarray_that_zarrfeed_relies_on_is_checked_on_open(ds_path, field, value, why):
    """Each of these opened (and most read as rows, or failed later as a bare ValueError/TypeError or a chunk
    "truncated or corrupt")."""
    edit(ds_path / "agents" / ".zarray", lambda d: d.update({field: value}))
    with pytest.raises(FormatError) as err:
        Dataset.open(ds_path)
    assert str(err.value).startswith(f"table 'agents': agents/.zarray: {why}"), str(err.value)
    assert str(err.value).endswith("; the array's metadata is damaged (restore it from a copy)")


def test_what_zarrfeed_does_not_rely_on_stays_readable(ds_path, real_scene):
    """Strictness is for what zarrfeed relies on: the real scene, written by L5Kit (no manifest), opens and
    validates; so does a table stored with '/' as its separator or with no fill value."""
    ds = Dataset.open(real_scene)
    assert ds.rows["agents"] == 20_802 and ds.validate().ok
    edit(ds_path / "agents" / ".zarray", lambda d: d.update(dimension_separator="/", fill_value=None))
    assert Dataset.open(ds_path).validate().ok


def segment(path: Path) -> Path:
    """The dataset's one commit log segment (a dataset written in one go has one)."""
    (found,) = (path / "zarrfeed.log").iterdir()
    return found


def test_a_segment_recording_a_negative_chunk_size_is_refused_by_validate_and_append(ds_path, capsys):
    """A segment whose record says a chunk has -5 bytes was accepted (plain `validate` never
    read it; `--deep` then called a healthy chunk changed)."""
    seg = segment(ds_path)
    edit(seg, lambda d: d["chunks"]["agents"][0].__setitem__(1, -5))
    before = stored(ds_path)
    why = (f"zarrfeed.log/{seg.name}: field 'chunks.agents' entry 0: chunk 0's size -5 is not a size in bytes (a "
           "whole number >= 1); the commit log segment is damaged (restore it from a copy)")
    report = Dataset.open(ds_path).validate()
    assert report.count == 1 and str(report.violations[0]) == why
    code, err = append(ds_path, capsys)
    assert (code, err) == (2, f"zarrfeed: error: {why}\n")
    assert stored(ds_path) == before


@pytest.mark.parametrize("damage", ["truncated", "entries", "table"])
def test_plain_validate_reads_and_checks_every_segment(ds_path, capsys, damage):
    """A damaged segment passed `validate` without `--deep` (exit 0): it is small, so plain validate reads it."""
    seg = segment(ds_path)
    if damage == "truncated":
        seg.write_bytes(seg.read_bytes()[:100])
        why = "unreadable commit log segment (JSONDecodeError: "
    elif damage == "entries":  # an entry dropped: the manifest counted one more
        edit(seg, lambda d: d["chunks"]["agents"].pop())
        why = "holds 14 entries, but zarrfeed.json lists it with 15; the commit log segment is damaged"
    else:
        edit(seg, lambda d: d["chunks"].update(lanes=d["chunks"].pop("agents")))
        why = "records chunks of table 'lanes', which the schema does not have; the commit log segment is damaged"
    capsys.readouterr()
    assert main(["validate", "-q", str(ds_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{ds_path}: INVALID\n1 violation:\n  zarrfeed.log/{seg.name}: {why}"), out


def test_a_commit_number_set_backwards_is_refused_and_no_commit_is_rewritten(ds_path, capsys):
    """The manifest's commit set from 3 to 0 was accepted, and the next append wrote commit 1 again (with other
    rows: a reader pinned to commit 1 then read other rows)."""
    edit(ds_path / "zarrfeed.json", lambda d: d.update(commit=0))
    before = stored(ds_path)
    why = ("zarrfeed.commits/0000000003.json: commit 3 was made, but zarrfeed.json says the latest commit is 0: "
           "its commit number went backwards (restore it from a copy)")
    report = Dataset.open(ds_path).validate()
    assert [str(v) for v in report.violations] == [why]
    assert append(ds_path, capsys) == (2, f"zarrfeed: error: {ds_path}: {why}; nothing is appended to it\n")
    assert stored(ds_path) == before


def test_a_segment_numbered_above_the_commit_is_a_commit_number_gone_backwards(ds_path, capsys):
    """Commit objects are kept for the last 100 commits only: the log's own numbers tell too."""
    edit(ds_path / "zarrfeed.json", lambda d: d.update(commit=2))
    (ds_path / "zarrfeed.commits" / "0000000003.json").unlink()
    before = stored(ds_path)
    why = (f"zarrfeed.json: its commit number is 2, but it lists commit log segment zarrfeed.log/"
           f"{segment(ds_path).name}, made by commit 3: its commit number went backwards (restore it from a copy)")
    assert [str(v) for v in Dataset.open(ds_path).validate().violations] == [why]
    assert append(ds_path, capsys) == (2, f"zarrfeed: error: {ds_path}: {why}; nothing is appended to it\n")
    assert stored(ds_path) == before


def test_one_commit_object_past_the_manifest_may_be_an_older_writers_and_the_message_says_so(ds_path, capsys):
    """zarrfeed before these checks stored a commit's object before its manifest: a writer killed in between
    left object N + 1 with manifest N, which reads as a number gone backwards by one. Refused all the same
    (it cannot be told from one), with what to do if that is what happened."""
    edit(ds_path / "zarrfeed.json", lambda d: d.update(commit=2))
    code, err = append(ds_path, capsys)
    assert code == 2 and err.endswith("its commit number went backwards (restore it from a copy; or, if a writer "
                                      "older than zarrfeed's format checks was killed while committing, remove "
                                      "zarrfeed.commits/0000000003.json); nothing is appended to it\n"), err


def test_an_existing_commit_object_is_never_rewritten(ds_path):
    """The last guard, below the check on open: a commit object is created only if absent, on every store."""


    from zarrfeed.core import manifest_io as commits

    store = DirectoryStore(ds_path)
    first = (ds_path / "zarrfeed.commits" / "0000000001.json").read_bytes()
    with pytest.raises(FormatError, match=r"^zarrfeed.commits/0000000001.json: already exists, so commit 1 was "
                                          "made before; zarrfeed.json's commit number went backwards"):
        commits.record_commit(store, 1, {t: 7 for t in CHUNKS})
    assert (ds_path / "zarrfeed.commits" / "0000000001.json").read_bytes() == first
    assert not [p for p in (ds_path / "zarrfeed.commits").iterdir() if p.suffix != ".json"]  # no temporary left
    memory = MemoryStore()
    assert memory.put_new("k", b"1") and not memory.put_new("k", b"2")
    assert memory["k"] == b"1"


def test_an_existing_commit_object_is_never_rewritten_on_s3(s3):
    bucket, server = s3

    store = Location.of(f"{bucket}/d.zarr", server.options).store("w")
    assert store.put_new("zarrfeed.commits/0000000001.json", b"first")
    assert not store.put_new("zarrfeed.commits/0000000001.json", b"second")
    assert bytes(store["zarrfeed.commits/0000000001.json"]) == b"first"


def test_a_writer_stopped_between_publishing_and_recording_a_commit_loses_nothing(ds_path):
    """The manifest is published first, then its commit object: one missing for the latest commit is written by
    the next writer when it opens, and the dataset is valid meanwhile."""
    last = ds_path / "zarrfeed.commits" / "0000000003.json"
    recorded = last.read_bytes()
    last.unlink()
    assert Dataset.open(ds_path).validate().ok
    with DatasetWriter(ds_path, mode="a", workers=0) as w:
        w.ingest(synthetic.episodes(1, seed=9, frames=20, agents_per_frame=30))
    assert last.read_bytes() == recorded
    ds = Dataset.open(ds_path)
    assert ds.validate().ok and ds.rows["scenes"] == 4
    assert Dataset.open(ds_path, commit=3).rows["scenes"] == 3


def cut_frames(path: Path) -> None:
    """Commit fewer frames than the scenes cover (60 -> 50), as a damaged manifest would."""
    recount(path, "frames", 50)


@pytest.mark.parametrize("loader", ["WindowLoader", "AgentSampleLoader", "EgoSampleLoader"])
def test_row_counts_that_contradict_the_links_are_one_line_from_the_loaders(ds_path, loader):
    """These loaders raised a bare IndexError ("index 59 is out of bounds for axis 0 with size 50")."""
    import zarrfeed.loader

    cut_frames(ds_path)
    with pytest.raises(FormatError) as err:
        getattr(zarrfeed.loader, loader)(ds_path, num_workers=0)
    assert str(err.value) == (f"scenes.frame_index_interval row 2: interval [40, 60) is outside the rows of frames, "
                              f"[0, 50) (and 1 more): {ds_path} does not validate, so it is not loaded (zarrfeed "
                              "validate lists every violation)")


def test_no_append_onto_a_dataset_whose_links_do_not_validate(ds_path, capsys):
    """`--append` placed new frames at row 50, under the old scenes' frames [40, 60)."""
    cut_frames(ds_path)
    before = stored(ds_path)
    code, err = append(ds_path, capsys)
    assert (code, err) == (2, f"zarrfeed: error: scenes.frame_index_interval row 2: interval [40, 60) is outside "
                              f"the rows of frames, [0, 50) (and 1 more): the dataset does not validate, so nothing "
                              f"is appended to {ds_path} (zarrfeed validate lists every violation)\n")
    assert stored(ds_path) == before
    with pytest.raises(FormatError, match=r"^frames.agent_index_interval row 59: interval \[1767, 1810\) is outside "
                                          r"the rows of agents, \[0, 1800\) \(and 1 more\): the dataset does not"):
        recount(ds_path, "frames", 60)
        recount(ds_path, "agents", 1800)
        DatasetWriter(ds_path, mode="a", workers=0)
    assert stored(ds_path) == {**before, "zarrfeed.json": (ds_path / "zarrfeed.json").read_bytes()}


def test_a_commit_whose_object_landed_before_its_call_failed_is_published_by_the_next(tmp_path, monkeypatch):
    """A call that failed after its commit object landed (a reply lost, a timeout): the next call for the same
    number is this writer's own retry, and replaces the object instead of taking it for a number gone backwards."""
    from zarrfeed.writer.committer import Committer

    from zarrfeed.core import manifest_io as commits

    path = tmp_path / "d.zarr"
    c = Committer(Location.of(path), commit_interval=0)
    real, failed = commits.record_commit, []

    def reply_lost(store, number, committed, tails=None, replace=False, tag=None):
        real(store, number, committed, tails, replace, tag)
        if not failed:
            failed.append(number)
            raise OSError("the reply was lost")
    monkeypatch.setattr(commits, "record_commit", reply_lost)
    c.place("a", {"scenes": 0})
    with pytest.raises(OSError, match="the reply was lost"):
        c.commit(force=True)
    assert failed == [1] and c.commit_number == 0
    c.commit(force=True)
    assert c.commit_number == 1
    c.close()
    assert Dataset.open(path, commit=1).rows == {t: 0 for t in CHUNKS}
    assert [str(v) for v in Dataset.open(path).validate().violations] == []
