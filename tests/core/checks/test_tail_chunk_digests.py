"""A table's last, partly filled chunk is checked on every read too.

A writer withdraws that chunk's record before it rewrites it and seals it again when it closes; one SIGKILLed
mid-ingest never does. Each commit records the digest of those rows, decoded (`tails`), and readers, `validate`
and a writer that appends or resumes compare it: a later change to the committed rows of that chunk (one that
still decodes) is refused, and a resume does not seal it under a fresh digest.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash
from expected import expected_tables
from formats import array, chunk_bytes, layout, put_chunk
from repo_paths import SUPPORT
from zarrfeed.loader import Dataset, Loader, LoaderError
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

from zarrfeed.core.chunks import ChunkError
from zarrfeed.core.dataset_format import FormatError
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array

# chunk sizes that no episode fills exactly (20 frames of 30 agents: 600 agents, 20 frames), so every table's
# last chunk is partly filled after each episode
CHUNKS = {"agents": 1000, "frames": 70, "scenes": 4, "traffic_light_faces": 333}


def episodes(n: int, seed: int = 0) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=20, agents_per_frame=30))


def killed_mid_ingest(out: Path, committed: int, more: int = 2, zarr_format: int = 2) -> None:
    """A writer in its own process commits `committed` episodes, has `more` placed, and is SIGKILLed: nothing of
    its close (the seal of the last chunks) runs."""
    code = f"""
import os, signal, sys, time
sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(SUPPORT)!r}]
from test_tail_chunk_digests import CHUNKS, episodes
from formats import layout
from zarrfeed.writer.dataset_writer import DatasetWriter
w = DatasetWriter(sys.argv[1], workers=1, chunks=CHUNKS, commit_interval=0, **layout({zarr_format}, CHUNKS))
eps = episodes({committed + more})
for ep in eps[:{committed}]:
    w.submit(ep)
w.sync()
for ep in eps[{committed}:]:
    w.submit(ep)
os.kill(os.getpid(), signal.SIGKILL)
"""
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]


def manifest(out: Path) -> dict:
    return json.loads((out / "zarrfeed.json").read_text())


def change_row(out: Path, table: str, row: int, field: str = "track_id") -> None:
    """Change `field` of `row` of `table` inside its chunk (a file of its own, or an inner chunk of a v3 shard),
    re-encoded so that it decodes fine."""
    arr = Array.open(DirectoryStore(out), table, read_only=True)
    c = arr.chunks[0]
    rows = arr.decode_chunk(chunk_bytes(out, table, row // c)).copy()
    rows[field][row % c] += 1
    put_chunk(out, table, row // c, arr.encode_chunk(rows))


def read_all(out: Path, **kw) -> None:
    with Loader(out, "agents", batch_size=256, num_workers=1, row_ids=True, copy=True, **kw) as loader:
        for _ in loader:
            pass


def test_a_killed_writer_records_the_rows_of_its_last_chunks(tmp_path, zarr_format):
    """Each commit records, per table whose last chunk is partly filled, the XXH3-64 of those committed rows: the
    same digest as a plain read of the array's rows (the format layer, not the loader) gives, and the chunk itself
    has no record (never sealed)."""
    out = tmp_path / "d.zarr"
    killed_mid_ingest(out, committed=3, zarr_format=zarr_format)
    doc = manifest(out)
    ds = Dataset.open(out)
    assert doc["committed"]["agents"] % CHUNKS["agents"]  # the case under test: a partly filled last chunk
    for table, n in doc["committed"].items():
        c = CHUNKS[table]
        if n % c == 0:
            assert table not in doc["tails"]
            continue
        rows = Array.open(DirectoryStore(out), table, read_only=True)[n // c * c:n]
        assert doc["tails"][table] == xxhash.xxh3_64_hexdigest(np.ascontiguousarray(rows).view(np.uint8)), table
        assert n // c not in ds.check.records.get(table, {})  # no record of the stored bytes: only the rows'
    numbered = json.loads((out / "zarrfeed.commits" / f"{doc['commit']:010d}.json").read_text())
    assert numbered["tails"] == doc["tails"]
    read_all(out)  # unchanged: read in full
    assert ds.validate().ok
    deep = ds.verify()  # validate --deep: the last chunks are checked by their rows, none is "not verifiable"
    assert deep.ok and deep.unverifiable == 0 and deep.verified == sum(-(-n // CHUNKS[t])
                                                                       for t, n in doc["committed"].items()), deep


def test_a_changed_row_of_a_killed_writers_last_chunk_is_refused_by_every_reader(tmp_path, zarr_format):
    out = tmp_path / "d.zarr"
    killed_mid_ingest(out, committed=3, zarr_format=zarr_format)
    n = manifest(out)["committed"]["agents"]
    last = n // CHUNKS["agents"]
    change_row(out, "agents", last * CHUNKS["agents"] + 1)  # a committed row of the last chunk
    key = array(out, "agents").chunk_key(last)
    named = f"chunk '{key}' .* is not the chunk that was committed"
    for cache in ("off", "host"):
        with pytest.raises(LoaderError, match=named):
            read_all(out, cache=cache)
    ds = Dataset.open(out)
    with pytest.raises(ChunkError, match=named):
        ds.to_arrow("agents")
    with pytest.raises(ChunkError, match=named):
        ds.read_rows("agents", n - 3, n)
    report = ds.validate()
    assert not report.ok and any(key in v.message for v in report.violations), report
    deep = ds.verify()
    assert len(deep.problems) == 1 and key in deep.problems[0], deep
    r = subprocess.run([sys.executable, "-m", "zarrfeed", "load", str(out), "--workers", "1", "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and key in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_resume_and_append_refuse_a_changed_last_chunk_before_anything_changes(tmp_path, zarr_format):
    """A resume or an append rewrites the last chunk and seals it: the change would be laundered."""
    out = tmp_path / "d.zarr"
    killed_mid_ingest(out, committed=3, zarr_format=zarr_format)
    n = manifest(out)["committed"]["frames"]
    change_row(out, "frames", n - 1, "timestamp")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and "lease" not in p.name}
    key = array(out, "frames").chunk_key(n // CHUNKS["frames"])
    for resume in (True, False):
        with pytest.raises(FormatError, match=f"table 'frames': chunk '{key}' does not "
                                              "hold the rows that were committed"):
            with DatasetWriter(out, workers=0, mode="a") as w:
                w.ingest(episodes(5), resume=resume)
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and "lease" not in p.name}
    assert after == before


def test_resume_after_the_kill_writes_every_episode_once_and_seals_the_last_chunks(tmp_path, zarr_format):
    out = tmp_path / "d.zarr"
    killed_mid_ingest(out, committed=3, zarr_format=zarr_format)
    with DatasetWriter(out, workers=1, mode="a") as w:
        w.ingest(episodes(5), resume=True)
    ds = Dataset.open(out)
    assert ds.validate().ok
    for name, want in expected_tables(episodes(5)).items():
        np.testing.assert_array_equal(ds.read_rows(name, 0, ds.rows[name]), want)
    doc = manifest(out)
    assert set(doc["tails"]) == {t for t, n in doc["committed"].items() if n % CHUNKS[t]}


def test_a_pinned_commit_checks_its_own_last_chunk_rows(tmp_path):
    """An older commit's last chunk was filled on by later commits (sealed whole or not): its rows below that
    commit's count are checked against what that commit recorded."""
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=CHUNKS, commit_interval=0) as w:
        for ep in episodes(4):
            w.submit(ep)
            w.sync()
    ds = Dataset.open(out)
    first = next(k for k in range(1, ds.commit) if Dataset.open(out, commit=k).rows["agents"] % CHUNKS["agents"])
    old = Dataset.open(out, commit=first)
    n = old.rows["agents"]
    assert n < ds.rows["agents"]
    old.read_rows("agents", 0, n)  # unchanged: read
    change_row(out, "agents", n - 1)
    with pytest.raises(ChunkError, match=f"chunk 'agents/{n // CHUNKS['agents']}'"):
        Dataset.open(out, commit=first).read_rows("agents", 0, n)


@pytest.mark.parametrize("edit, says", [
    (lambda doc: doc.pop("tails"), "field 'tails' is missing"),
    (lambda doc: doc["tails"].pop("agents"), "field 'tails' has no digest for table 'agents'"),
    (lambda doc: doc["tails"].update(agents="xyz"), "field 'tails.agents' is 'xyz', not an XXH3-64 digest"),
    (lambda doc: doc.update(tails=[]), "field 'tails' is [], not an object"),
    (lambda doc: doc["tails"].update(nosuch="0" * 16), "field 'tails.nosuch': the table has no partly filled last"),
    # format 4 requires them: taking out `every_chunk_recorded` too does not turn the check off (adversary 2.02)
    (lambda doc: (doc.pop("tails"), doc.pop("every_chunk_recorded")), "field 'tails' is missing"),
])
def test_a_manifest_edited_to_turn_the_check_off_is_refused(tmp_path, edit, says):
    out = tmp_path / "d.zarr"
    killed_mid_ingest(out, committed=3)
    doc = manifest(out)
    edit(doc)
    (out / "zarrfeed.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=f"zarrfeed.json: {says}".replace("[", r"\[").replace("]", r"\]")):
        Dataset.open(out)


def edit_commit_2(out: Path, edit, zarr_format: int = 2) -> None:
    """Write 3 episodes to `out` in `zarr_format`, one commit each, then `edit(doc)` numbered commit 2."""
    with DatasetWriter(out, workers=0, chunks=CHUNKS, commit_interval=0, **layout(zarr_format, CHUNKS)) as w:
        for ep in episodes(3):
            w.submit(ep)
            w.sync()
    key = out / "zarrfeed.commits" / f"{2:010d}.json"
    doc = json.loads(key.read_text())
    edit(doc)
    key.write_text(json.dumps(doc))


def test_a_numbered_commit_with_a_bad_digest_is_refused(tmp_path):
    out = tmp_path / "d.zarr"
    edit_commit_2(out, lambda doc: doc["tails"].update(agents=5))
    with pytest.raises(FormatError, match="field 'tails.agents' is 5, not an XXH3-64 digest"):
        Dataset.open(out, commit=2)


def test_a_commit_made_before_tails_were_recorded_opens_with_its_last_chunk_unchecked(tmp_path, zarr_format):
    """Numbered commits made before this version have no `tails`: they still open (their last chunk is read as
    before, unchecked but for the latest manifest's records; in v3 read again from its shard, no object of its
    own)."""
    out = tmp_path / "d.zarr"
    edit_commit_2(out, lambda doc: doc.pop("tails"), zarr_format)
    ds = Dataset.open(out, commit=2)
    assert ds.check.tails == {}
    ds.read_rows("agents", 0, ds.rows["agents"])


def test_a_closed_dataset_keeps_reading_while_another_writer_appends(tmp_path, zarr_format):
    """The rows check does not refuse a last chunk that a live writer is rewriting: rows below the reader's count
    are as they were in every version of the chunk (in v3, of every version of its shard, which the writer
    replaces whole)."""
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=CHUNKS, **layout(zarr_format, CHUNKS)) as w:
        w.ingest(episodes(3))
    ds = Dataset.open(out)
    n = ds.rows["agents"]
    want = ds.read_rows("agents", 0, n)
    with DatasetWriter(out, workers=0, mode="a", commit_interval=0) as w:
        for ep in episodes(3, seed=1):
            w.submit(ep)
            w.sync()
            np.testing.assert_array_equal(ds.read_rows("agents", 0, n), want)
            assert os.path.exists(out / "zarrfeed.json")
    np.testing.assert_array_equal(ds.read_rows("agents", 0, n), want)


def test_ingest_from_a_killed_writers_dataset_refuses_a_changed_last_chunk(tmp_path):
    """`ingest --from` copied the last chunk unchecked (the copy then sealed the changed rows as valid)."""
    out, copy = tmp_path / "d.zarr", tmp_path / "copy.zarr"
    killed_mid_ingest(out, committed=3)
    n = manifest(out)["committed"]["agents"]
    r = subprocess.run([sys.executable, "-m", "zarrfeed", "ingest", str(tmp_path / "ok.zarr"), "--from", str(out),
                        "--workers", "0", "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr  # unchanged: copied
    change_row(out, "agents", n - 1)
    r = subprocess.run([sys.executable, "-m", "zarrfeed", "ingest", str(copy), "--from", str(out), "--workers", "0",
                        "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and f"chunk 'agents/{n // CHUNKS['agents']}'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("how", ["removed", "changed"])
def test_a_live_writer_commits_nothing_over_a_last_chunk_changed_or_removed_under_it(tmp_path, how, workers):
    """Adversary 2.01 and 2.05: the last chunk's file removed (a clean-up script, a lost object) or a committed row
    of it changed while a writer appends: the writer merged its next rows into zeros (or the changed rows), the
    next commit recorded them as committed, and every check passed, exit 0."""
    out = tmp_path / "d.zarr"
    eps = episodes(8)
    with pytest.raises((FormatError, ChunkError), match="chunk 'agents/1'"):
        with DatasetWriter(out, workers=workers, chunks=CHUNKS, commit_interval=0) as w:
            for ep in eps[:3]:
                w.submit(ep)
                w.sync()
            n = manifest(out)["committed"]["agents"]
            assert n // CHUNKS["agents"] == 1 and n % CHUNKS["agents"]  # its last chunk is agents/1, partly filled
            if how == "removed":
                (out / "agents" / "1").unlink()
            else:
                change_row(out, "agents", n - 1)
            for ep in eps[3:]:
                w.submit(ep)
                w.sync()
    doc = manifest(out)
    assert doc["committed"]["agents"] == n  # nothing committed over it
    with pytest.raises(ChunkError, match="agents/1"):  # and the damage is refused, never read
        Dataset.open(out).read_rows("agents", 0, n)


def test_verify_of_a_dataset_opened_before_a_killed_append_reports_a_changed_row(tmp_path):
    """Adversary 2.03: a Dataset opened on a closed dataset (its last chunks sealed); another writer appends and is
    killed; a committed row of the reader's commit is changed: `verify` called the last chunks unverifiable and
    ok, while the same object's reads refused them."""
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=CHUNKS) as w:
        w.ingest(episodes(3))
    ds = Dataset.open(out)
    n = ds.rows["agents"]
    code = ("import os, signal, sys\nfrom zarrfeed.writer import synthetic\n"
            "from zarrfeed.writer.dataset_writer import DatasetWriter\n"
            "w = DatasetWriter(sys.argv[1], workers=0, mode='a', commit_interval=0)\n"
            "w.submit(next(iter(synthetic.episodes(1, seed=9, frames=20, agents_per_frame=5))))\nw.sync()\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert ds.verify().ok and ds.verify().unverifiable == 0  # rewritten since: checked by the reader's rows
    change_row(out, "agents", n - 1)
    report = ds.verify()
    assert len(report.problems) == 1 and f"agents/{n // CHUNKS['agents']}" in report.problems[0], report


def test_a_copy_whose_last_chunk_holds_a_later_appends_rows_reads_and_appends(tmp_path):
    """Adversary 2.04: a copy of a closed dataset that took the newer last chunk of a later append (a `cp` while a
    writer appends): every committed row of the copy is intact, and the rows past them are no commit's. It was
    refused as "not the chunk that was committed"; its committed rows are what is checked."""
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    with DatasetWriter(a, workers=0, chunks=CHUNKS) as w:
        w.ingest(episodes(3))
    shutil.copytree(a, b)
    want = Dataset.open(b).read_rows("agents", 0, Dataset.open(b).rows["agents"])
    with DatasetWriter(a, workers=0, mode="a") as w:
        w.ingest(episodes(1, seed=5))
    n = len(want)
    shutil.copyfile(a / "agents" / str(n // CHUNKS["agents"]), b / "agents" / str(n // CHUNKS["agents"]))
    np.testing.assert_array_equal(Dataset.open(b).read_rows("agents", 0, n), want)
    assert Dataset.open(b).verify().ok
    with DatasetWriter(b, workers=0, mode="a") as w:
        w.ingest(episodes(2, seed=6))
    ds = Dataset.open(b)
    assert ds.validate().ok and ds.verify().ok
    np.testing.assert_array_equal(ds.read_rows("agents", 0, n), want)
    np.testing.assert_array_equal(ds.read_rows("agents", n, ds.rows["agents"]),
                                  expected_tables(episodes(2, seed=6))["agents"])


def test_a_commit_reads_each_last_chunk_once(tmp_path, monkeypatch):
    """Adversary 3.03: a commit read the last chunk twice, once to check the last commit's rows, once to digest
    its own: a row changed between the two reads passed the check and was recorded. Both come from one read."""
    import zarrfeed.writer.committer as committer
    from zarrfeed.core.stores import DirectoryStore

    reads: list[list[str]] = []
    real_get, real_tails = DirectoryStore.get_many, committer.Committer._committed_tails

    def get_many(store, keys):
        if reads and reads[-1][0]:
            reads[-1][1].extend(keys)
        return real_get(store, keys)

    def committed_tails(self, *args):  # what the store reads while the committer checks and digests last chunks
        reads.append((True, []))
        try:
            return real_tails(self, *args)
        finally:
            reads[-1] = (False, reads[-1][1])
    monkeypatch.setattr(DirectoryStore, "get_many", get_many)
    monkeypatch.setattr(committer.Committer, "_committed_tails", committed_tails)
    with DatasetWriter(tmp_path / "d.zarr", workers=0, chunks=CHUNKS, commit_interval=0) as w:
        for ep in episodes(5):
            w.submit(ep)
            w.sync()
    assert sum(len(r) for _, r in reads) > 10  # the last chunks were read back, commit after commit
    assert all(len(r) == len(set(r)) for _, r in reads), reads


def test_an_append_to_a_format_3_dataset_checks_rows_changed_after_it_opened(tmp_path):
    """Adversary 3.02: a dataset of format 3 (last chunks sealed by their stored bytes, no `tails`): the append
    checked the chunk when it opened, and a row changed before its first commit was sealed as committed."""
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=CHUNKS) as w:
        w.ingest(episodes(3))
    doc = manifest(out)
    doc.update(zarrfeed=3)
    del doc["tails"], doc["every_chunk_recorded"]
    (out / "zarrfeed.json").write_text(json.dumps(doc))
    n = doc["committed"]["agents"]
    with pytest.raises(FormatError, match=f"chunk 'agents/{n // CHUNKS['agents']}' no longer holds the rows"):
        with DatasetWriter(out, workers=0, mode="a", commit_interval=0) as w:
            change_row(out, "agents", n - 1)
            w.ingest(episodes(2, seed=4))
    assert manifest(out)["committed"]["agents"] == n


def test_a_file_url_with_storage_options_writes_through_a_directory_store(tmp_path):
    """Adversary 3.01: `file://` with storage options went through fsspec's local file system, which writes files in
    place: the committer (and readers) read a last chunk half-written by a worker ("cannot be decoded"). A local
    path spelled as a URL is a directory store (writes renamed into place) whatever the options."""
    from zarrfeed.core.location import Location

    url = f"file://{tmp_path}/d.zarr"
    assert Location.of(url, {"auto_mkdir": True}).is_local
    with DatasetWriter(url, storage_options={"auto_mkdir": True}, workers=2, chunks=CHUNKS, commit_interval=0) as w:
        w.ingest(episodes(6))
    ds = Dataset.open(url, storage_options={"auto_mkdir": True})
    assert ds.validate().ok
    np.testing.assert_array_equal(ds.read_rows("agents", 0, ds.rows["agents"]), expected_tables(episodes(6))["agents"])
