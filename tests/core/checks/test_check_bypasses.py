"""The chunk check has no way around it: each test changes a chunk and reads it through a path that could skip
the check. A checked reader never uses what an unchecked one decoded, an append does not launder a changed tail
chunk, a manifest or commit log edited to record nothing does not turn the checks off, a `.zarray` adds no
filters the schema does not know, and validate and `Dataset.chunks` check what they decode."""
from __future__ import annotations

import json

import numpy as np
import pytest
from expected import expected_tables
from test_checked_reads import NAMED, SMALL, cli, damage, episodes, one_line_error
from zarrfeed.core.errors import FormatError
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group
from zarrfeed.loader import Dataset, Loader, LoaderError
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter


@pytest.fixture
def written(tmp_path):
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=SMALL) as w:
        w.ingest(episodes(6, seed=0))
    return out


@pytest.mark.parametrize("workers", [0, 1])
def test_a_checked_loader_never_reads_what_an_unchecked_one_decoded_into_the_host_cache(written, workers):
    damage(written, "swap")
    want = expected_tables(episodes(6, seed=0))["agents"]["track_id"]
    with Loader(written, "agents", batch_size=500, num_workers=workers, cache="host", verify_chunks=False,
                copy=True) as unchecked:
        got = np.concatenate([b["track_id"] for b in unchecked])
        assert len(got) == len(want)  # the cache is filled with every chunk, the swapped ones too
        with pytest.raises(LoaderError, match=NAMED):
            with Loader(written, "agents", batch_size=500, num_workers=workers, cache="host", row_ids=True,
                        copy=True) as checked:
                for b in checked:
                    assert np.array_equal(b["track_id"], want[b["_row"]])


def snapshot(path) -> dict[str, bytes]:
    """Every file of the dataset but the lease's (a refused writer takes the lease and gives it back)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and "lease" not in p.name}


def last_chunk(path, table: str = "agents") -> tuple[int, int]:
    ds = Dataset.open(path)
    c, n = ds[table].chunks[0], ds.rows[table]
    assert n % c, "the test needs a partly filled last chunk"
    return (n - 1) // c, n


@pytest.mark.parametrize("how", ["rows", "swap", "missing"])
def test_an_append_refuses_a_last_chunk_that_is_not_the_committed_one(written, how):
    """The append rewrites the last, partly filled chunk with its rows read back: a changed one would be sealed
    again under a fresh digest (laundered) and a missing one filled with zeros; refused before anything changes."""
    last, n = last_chunk(written)
    key = written / "agents" / str(last)
    if how == "rows":  # the rows changed and stored again as zarr would (the file is another, valid chunk)
        a = Group.open(DirectoryStore(written))["agents"]
        block = a[last * 2000:n]
        block["centroid"] += 1000.0
        a[last * 2000:n] = block
    elif how == "swap":
        key.write_bytes((written / "agents" / "0").read_bytes())
    else:
        key.unlink()
    before = snapshot(written)
    with pytest.raises(FormatError, match=rf"table 'agents': chunk 'agents/{last}' .*nothing is appended"):
        DatasetWriter(written, workers=0, mode="a", chunks=SMALL)
    assert snapshot(written) == before
    r = cli("ingest", str(written), "--append", "--synthetic", "1", "--workers", "0", "-q")
    assert f"agents/{last}" in one_line_error(r)
    assert snapshot(written) == before


def test_an_append_onto_an_unchanged_last_chunk_goes_on(written):
    last, n = last_chunk(written)
    with DatasetWriter(written, workers=0, mode="a", chunks=SMALL) as w:
        w.ingest(episodes(1, seed=7))
    ds = Dataset.open(written)
    assert ds.rows["agents"] > n and ds.verify().ok
    want = expected_tables(episodes(6, seed=0) + episodes(1, seed=7))["agents"]["track_id"]
    assert np.array_equal(ds.read_rows("agents", 0, ds.rows["agents"])["track_id"], want)


def edit_manifest(path, edit) -> None:
    doc = json.loads((path / "zarrfeed.json").read_text())
    edit(doc)
    (path / "zarrfeed.json").write_text(json.dumps(doc))


def drop_entries(path, table: str, indices: tuple[int, ...]) -> None:
    """Remove the records of chunks `indices` of `table` from the commit log (the manifest's count adjusted)."""
    def edit(doc):
        for ref in doc["log"]:
            seg = json.loads((path / ref["key"]).read_text())
            kept = [e for e in seg["chunks"].get(table, []) if e[0] not in indices]
            ref["entries"] -= len(seg["chunks"].get(table, [])) - len(kept)
            seg["chunks"][table] = kept
            (path / ref["key"]).write_text(json.dumps(seg))
    edit_manifest(path, edit)


@pytest.mark.parametrize("how, names", [
    ("digest deleted", "field 'digest' is missing"), ("digest null", "field 'digest' is None"),
    ("log emptied", "field 'log' is empty"), ("entries removed", r"chunk 'agents/3' .*has no record")])
def test_a_manifest_or_log_edited_to_record_nothing_is_refused(written, how, names):
    damage(written, "swap")
    if how == "entries removed":
        drop_entries(written, "agents", (3, 4))
    else:
        edit_manifest(written, {"digest deleted": lambda d: d.pop("digest"),
                                "digest null": lambda d: d.update(digest=None),
                                "log emptied": lambda d: d.update(log=[])}[how])
    with pytest.raises(FormatError, match=names):
        Dataset.open(written).to_arrow("agents")
    with pytest.raises((FormatError, LoaderError), match=names):
        with Loader(written, "agents", batch_size=500, num_workers=0, cache="off") as loader:
            for _ in loader:
                pass
    r = cli("validate", str(written), "--deep", "-q")
    assert r.returncode != 0 and "valid" != r.stdout.strip(), r
    r = cli("ingest", str(written), "--append", "--synthetic", "1", "--workers", "0", "-q")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r


def test_a_dataset_an_earlier_zarrfeed_adopted_keeps_opening_and_appending(written):
    """zarrfeed 0.2 adopted another tool's dataset without recording the chunks that were there: its manifest
    has no 'every_chunk_recorded', and those chunks read as unverifiable, not as damage. An append onto it
    keeps it that way (it cannot know which chunks were there before)."""
    doc = json.loads((written / "zarrfeed.json").read_text())
    assert doc["every_chunk_recorded"] is True  # made by this zarrfeed: every chunk recorded
    drop_entries(written, "agents", (3, 4))
    edit_manifest(written, lambda d: d.pop("every_chunk_recorded"))
    before = Dataset.open(written).to_arrow("agents")
    r = cli("ingest", str(written), "--append", "--synthetic", "1", "--workers", "0", "-q")
    assert r.returncode == 0, r
    after = Dataset.open(written)
    assert after.to_arrow("agents").slice(0, before.num_rows).equals(before)
    assert "every_chunk_recorded" not in json.loads((written / "zarrfeed.json").read_text())
    assert Dataset.open(written).validate().ok


def test_a_crashed_writers_last_chunk_without_a_record_is_not_refused(written):
    """The one chunk that may lack a record: a table's last, partly filled one (see chunk_check); it is checked
    by its committed rows (the commit's `tails`), so even `verify` calls none of it unverifiable."""
    last, _ = last_chunk(written)
    drop_entries(written, "agents", (last,))
    ds = Dataset.open(written)
    assert len(ds.to_arrow("agents")) == ds.rows["agents"]
    assert ds.verify().ok and ds.verify().unverifiable == 0


def test_an_append_onto_another_tools_dataset_records_its_chunks_as_unknown(real_copy):
    """Adopted chunks (there before zarrfeed's first commit) get an entry with no digest: read and verified as
    "not verifiable", while those the append writes are checked."""
    before = Dataset.open(real_copy)
    n, c = before.rows["agents"], before["agents"].chunks[0]
    with DatasetWriter(real_copy, workers=0, mode="a") as w:
        w.ingest(list(synthetic.episodes(1, seed=3)))
    ds = Dataset.open(real_copy)
    report = ds.verify()
    assert report.ok and report.unverifiable >= n // c and report.verified >= 1, str(report)
    assert np.array_equal(ds.read_rows("agents", 0, n), before.read_rows("agents", 0, n))
    assert cli("validate", str(real_copy), "-q").returncode == 0


@pytest.mark.parametrize("change, names", [
    (lambda m: m.update(filters=[{"id": "shuffle", "elementsize": 4}]), "field 'filters'"),
    (lambda m: m.update(compressor={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 0, "blocksize": 0}),
     "field 'compressor'")])
def test_a_zarray_whose_codecs_are_not_those_written_is_refused(written, change, names):
    """Chunks untouched (their digests match) but decoded through other codecs: other rows, refused on open."""
    meta_path = written / "agents" / ".zarray"
    meta = json.loads(meta_path.read_text())
    change(meta)
    meta_path.write_text(json.dumps(meta))
    (written / ".zmetadata").unlink(missing_ok=True)
    with pytest.raises(FormatError, match=rf"table 'agents': agents/\.zarray: {names} .*manifest's schema"):
        Dataset.open(written)
    r = cli("validate", str(written), "--deep", "-q")
    assert r.returncode == 2 and "agents/.zarray" in one_line_error(r), r


def test_the_zarray_of_another_tools_dataset_is_not_compared(real_copy):
    assert Dataset.open(real_copy).rows["agents"] > 0  # no manifest: no schema that says what was written


@pytest.mark.parametrize("how", ["swap", "flip"])
def test_validate_and_chunks_check_what_they_read(written, how):
    """`validate` decoded every chunk and called a changed one valid (exit 0) while every other read refused it;
    `Dataset.chunks` handed its rows out. Now a changed chunk is a violation naming table and chunk (the rest
    still checked), and `chunks` raises; unchecked when asked."""
    damage(written, how)
    ds = Dataset.open(written)
    report = ds.validate()
    changed = [v for v in report.violations if "is not the chunk that was committed" in v.message]
    assert not report.ok and [v.table for v in changed][:1] == ["agents"], report.violations
    assert "chunk 'agents/3'" in changed[0].message
    r = cli("validate", str(written), "-q")
    assert r.returncode == 1 and "agents/3" in r.stdout + r.stderr, r
    with pytest.raises(ValueError, match=r"chunk 'agents/3'.*is not the chunk that was committed"):
        for _ in ds.chunks("agents"):
            pass
    assert sum(len(b) for _, b in Dataset.open(written, verify_chunks=False).chunks("agents")) == ds.rows["agents"]
