"""Every commit records each chunk's size and digest, `validate --deep` and `Dataset.verify()` check them,
`ingest --from` and the disk cache read only what was committed, the manifest's shape is checked, and a commit
costs the same after thousands of keyed episodes as after one."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from expected import expected_tables, recount
from formats import layout
from zarrfeed.loader import Dataset, Loader
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

from zarrfeed.core.manifest import MANIFEST_KEY

from zarrfeed.core.manifest_io import read_manifest
from zarrfeed.core.stores import DirectoryStore

SMALL = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}


def episodes(n: int, seed: int, frames: int = 40, agents: int = 40) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=frames, agents_per_frame=agents))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zarrfeed", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def written(tmp_path):
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=SMALL) as w:
        w.ingest(episodes(6, seed=0))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_every_chunk_of_a_closed_dataset_is_recorded_shared_chunks_included(tmp_path, workers, zarr_format):
    """Small episodes flushed often: many chunks are written by two segments (read, merged, written back); in v3
    every shard is written by several."""
    out = tmp_path / "d.zarr"
    eps = episodes(30, seed=1, frames=7, agents=13)
    with DatasetWriter(out, workers=workers, chunks=SMALL, commit_interval=0.0, **layout(zarr_format, SMALL)) as w:
        for i, ep in enumerate(eps[:20]):
            w.submit(ep)
            if i % 3 == 0:
                w.sync()
        assert w.shared_chunks > 0
    with DatasetWriter(out, workers=workers, mode="a") as w:  # the tail chunk is rewritten by the append
        w.ingest(eps[20:])
    ds = Dataset.open(out)
    report = ds.verify()
    chunks = sum(-(-ds.rows[t] // a.chunks[0]) for t, a in ds.tables.items())
    assert report.ok and report.verified == chunks and report.unverifiable == 0, str(report)
    for name, arr in expected_tables(eps).items():
        np.testing.assert_array_equal(ds[name][: ds.rows[name]], arr)


def test_validate_deep_names_a_replaced_chunk_and_a_flipped_bit(written):
    assert cli("validate", str(written), "--deep", "-q").returncode == 0
    shutil.copyfile(written / "agents" / "2", written / "agents" / "1")  # decodes fine, links still valid
    r = cli("validate", str(written), "-q")  # plain validate reads every chunk, checked: it sees it too
    assert r.returncode == 1 and "chunk 'agents/1' of" in r.stdout and "is not the chunk that was committed" in r.stdout
    r = cli("validate", str(written), "--deep", "-q")
    assert r.returncode == 1 and "chunk 'agents/1' is not the chunk that was committed" in r.stdout, r
    raw = bytearray((written / "frames" / "0").read_bytes())
    raw[len(raw) // 2] ^= 0x10
    (written / "frames" / "0").write_bytes(bytes(raw))
    report = Dataset.open(written).verify()
    assert not report.ok and {p.split("'")[3] for p in report.problems} == {"agents/1", "frames/0"}


def test_a_missing_commit_log_segment_is_named_as_damage_not_as_a_busy_writer(written):
    """With `zarrfeed.log/*` deleted, validate --deep said "its commit log keeps changing while it is read"."""
    segments = sorted((written / "zarrfeed.log").iterdir())
    assert segments
    for seg in segments:
        seg.unlink()
    r = cli("validate", str(written), "--deep", "-q")
    assert r.returncode == 2 and "keeps changing" not in r.stderr, r
    assert f"commit log segment 'zarrfeed.log/{segments[-1].name}', which is missing" in r.stderr, r.stderr
    assert "damaged" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_ingest_from_refuses_a_chunk_that_is_not_the_committed_one(written, tmp_path):
    shutil.copyfile(written / "agents" / "2", written / "agents" / "1")
    r = cli("ingest", str(tmp_path / "c.zarr"), "--from", str(written), "-q")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r
    assert f"chunk 'agents/1' of {written} is not the chunk that was committed" in r.stderr
    assert not (tmp_path / "c.zarr").exists()


def test_a_dataset_without_digests_is_not_verifiable_rather_than_valid(real_scene):
    r = cli("validate", str(real_scene), "--deep", "-q")  # exit 3: not checked
    assert r.returncode == 3 and "not verifiable" in r.stdout and ": valid" not in r.stdout, r
    assert not Dataset.open(real_scene).verify().recorded


def test_the_disk_cache_never_serves_a_copys_chunks(s3, tmp_path):
    """Item 4: the cache keyed chunks by dataset id, which a copy keeps: after different appends, a loader of
    the copy read 19,165 of 41,679 rows from the original."""
    bucket, server = s3
    fs = server.fs()
    a, b = f"{bucket}/a.zarr", f"{bucket}/b.zarr"
    base = episodes(3, seed=2)
    with DatasetWriter(a, workers=0, chunks=SMALL, storage_options=server.options) as w:
        w.ingest(base)
    fs.copy(f"{a}/", f"{b}/", recursive=True)  # a copy: same dataset id
    more = {a: episodes(3, seed=3), b: episodes(3, seed=4)}
    for url, eps in more.items():
        with DatasetWriter(url, workers=0, mode="a", storage_options=server.options) as w:
            w.ingest(eps)
    assert Dataset.open(a, storage_options=server.options).dataset_id == \
        Dataset.open(b, storage_options=server.options).dataset_id
    cache = tmp_path / "cache"
    for url in (a, b, a):
        with Loader(url, "agents", batch_size=500, num_workers=1, shuffle=False, storage_options=server.options,
                    cache_dir=cache, copy=True) as loader:
            got = np.concatenate([batch["centroid"] for batch in loader])
        want = expected_tables(base + more[url])["agents"]["centroid"]
        np.testing.assert_array_equal(got, want)
    assert list(cache.glob("*.chunk"))


def test_a_cached_chunk_damaged_on_disk_is_fetched_again(s3, tmp_path):
    bucket, server = s3
    url = f"{bucket}/d.zarr"
    eps = episodes(4, seed=5)
    with DatasetWriter(url, workers=0, chunks=SMALL, storage_options=server.options) as w:
        w.ingest(eps)
    cache = tmp_path / "cache"
    kw = dict(batch_size=500, num_workers=1, shuffle=False, storage_options=server.options, cache_dir=cache,
              copy=True)
    with Loader(url, "agents", **kw) as loader:
        list(loader)
    for path in cache.glob("*.chunk"):
        path.write_bytes(b"x" + path.read_bytes()[1:])
    with Loader(url, "agents", **kw) as loader:
        got = np.concatenate([batch["centroid"] for batch in loader])
    np.testing.assert_array_equal(got, expected_tables(eps)["agents"]["centroid"])


@pytest.mark.parametrize("field, value, named", [
    ("commit", "abc", "'commit'"), ("journal", "x", "'journal'"), ("committed", {"scenes": -1}, "'committed.scenes'"),
    ("log", [{"key": 3}], "'log'")])
def test_a_manifest_with_a_field_of_the_wrong_type_is_one_line_naming_it(written, tmp_path, field, value, named):
    """Item 7: `info` and `validate` said valid, `--append` printed a traceback."""
    doc = json.loads((written / MANIFEST_KEY).read_bytes())
    doc[field] = value
    (written / MANIFEST_KEY).write_text(json.dumps(doc))
    before = sorted(p.relative_to(written).as_posix() for p in written.rglob("*"))
    for args in (["info", str(written)], ["validate", str(written), "-q"],
                 ["ingest", str(written), "--synthetic", "1", "--append", "-q"]):
        r = cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r)
        assert len(r.stderr.strip().splitlines()) == 1 and named in r.stderr, (args, r.stderr)
    assert sorted(p.relative_to(written).as_posix() for p in written.rglob("*")) == before


def _set(path: str, value):
    def edit(doc):
        *parents, last = path.split(".")
        for part in parents:
            doc = doc[part]
        doc[last] = value
    return edit


@pytest.mark.parametrize("edit, named", [
    (_set("schema", {}), "'schema'"), (_set("schema.tables", 5), "'schema'"),
    (_set("schema.tables.agents.dtype", 7), "'schema'"), (_set("schema.links", 5), "'schema'"),
    (_set("schema.links", [["a", "b"]]), "'schema'"), (_set("schema.attrs", 5), "'schema.attrs'"),
    (_set("zarrfeed", 99), "'zarrfeed'"), (_set("digest", 5), "'digest'"),
    (_set("journal.keys", {"committed": [5, [1], {"a": 1}]}), "'journal.keys'"),
    (_set("journal.pending", [[{"a": 1}, "fp"]]), "'journal.pending'"),
    (_set("journal.inputs", {"x": {"committed": [[5, 2]]}}), "'journal.inputs.x'")])
def test_a_manifest_whose_parts_have_the_wrong_shape_is_one_line_naming_them(written, edit, named):
    """Schema parts of the wrong type gave tracebacks in every command, wrong
    journal entries in --append, and a future format, an unknown digest or a backwards range were accepted."""
    doc = json.loads((written / MANIFEST_KEY).read_bytes())
    edit(doc)
    (written / MANIFEST_KEY).write_text(json.dumps(doc))
    before = sorted(p.relative_to(written).as_posix() for p in written.rglob("*"))
    for args in (["info", str(written)], ["validate", str(written), "-q"], ["load", str(written), "-q"],
                 ["ingest", str(written), "--synthetic", "1", "--append", "-q"]):
        r = cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r)
        assert len(r.stderr.strip().splitlines()) == 1 and named in r.stderr, (args, r.stderr)
    assert sorted(p.relative_to(written).as_posix() for p in written.rglob("*")) == before


def test_a_commit_costs_the_same_after_thousands_of_keyed_episodes(tmp_path):
    """Item 8: the journal was rewritten whole at every commit (38 bytes per key: 20,000 keyed episodes made a
    762 KiB manifest rewritten every second). Keys now go to log segments written once and merged like a
    binary counter; resume stays exact."""
    out = tmp_path / "d.zarr"
    tiny = next(synthetic.episodes(1, seed=6, frames=1, agents_per_frame=1))
    sizes, commits = {}, 0
    with DatasetWriter(out, workers=0, commit_interval=3600) as w:
        for i in range(3000):
            w.submit(tiny, key=f"drive-{i:06d}-{'x' * 20}")
            if i % 10 == 9:
                w.sync()
                commits += 1
            if i + 1 in (300, 3000):
                sizes[i + 1] = len((out / MANIFEST_KEY).read_bytes())
        assert not w.submit(tiny, key="drive-000007-" + "x" * 20)
    doc = read_manifest(DirectoryStore(out))
    assert sizes[3000] < 2 * sizes[300] + 1000, sizes  # not 10 times: the manifest does not hold the keys
    assert len(doc["log"]) <= commits.bit_length() + 2, doc["log"]
    assert len(os.listdir(out / "zarrfeed.log")) == len(doc["log"])  # merged-away segments are deleted
    with DatasetWriter(out, workers=0, mode="a") as w:  # resume: every key is known, nothing is written twice
        assert all(w.is_committed(f"drive-{i:06d}-{'x' * 20}") for i in range(3000))
        assert not any(w.submit(tiny, key=f"drive-{i:06d}-{'x' * 20}") for i in range(0, 3000, 7))
    assert Dataset.open(out).rows["scenes"] == 3000
    assert Dataset.open(out).verify().ok


def test_verify_while_a_writer_appends_reports_no_false_corruption(written):
    """The last chunk of each table is sealed when its writer closes and withdrawn when the next one opens:
    a verify that read the old records and then finds the chunk rewritten checks it by its committed rows (the
    commit's `tails`), and finds it neither corrupt nor unverifiable."""
    ds = Dataset.open(written)
    assert ds.digests()  # the records as they were: last chunks sealed
    with DatasetWriter(written, workers=0, mode="a") as w:
        w.ingest(episodes(1, seed=7))
        w.sync()
        report = ds.verify()
        assert report.ok and report.unverifiable == 0, str(report)
    assert Dataset.open(written).verify().unverifiable == 0


def test_a_segment_of_a_commit_that_never_published_is_removed_by_the_next_writer(written):
    orphan = written / "zarrfeed.log" / "0000000099-deadbeef.json"
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_text('{"committed": ["k"], "skipped": [], "chunks": {}}')
    with DatasetWriter(written, workers=0, mode="a") as w:
        assert not w.is_committed("k")
    assert not orphan.exists()


def test_a_writer_that_appends_nothing_leaves_every_chunk_verifiable(written):
    """A resume with nothing left to write withdrew the last chunks' records at open and
    never sealed them again ("3 not verifiable")."""
    with DatasetWriter(written, workers=2, mode="a") as w:
        assert w.committed == Dataset.open(written).rows
    report = Dataset.open(written).verify()
    assert report.ok and report.unverifiable == 0, str(report)


@pytest.mark.parametrize("how", ["refused", "failed"])
def test_a_refused_or_failed_append_that_wrote_nothing_leaves_every_chunk_verifiable(written, how):
    """Opening for append published a commit withdrawing the last chunks'
    records; an append refused ("ingested before") or failing before any write left them withdrawn for good,
    and a chunk swapped in there later validated --deep "valid". Now they are withdrawn only just before the
    first write into them."""
    with pytest.raises(ValueError if how == "refused" else RuntimeError):
        with DatasetWriter(written, workers=0, mode="a") as w:
            if how == "refused":
                w.ingest(episodes(6, seed=0))  # "ingested before"
            raise RuntimeError("the producer died")
    report = Dataset.open(written).verify()
    assert report.ok and report.unverifiable == 0, str(report)
    last = sorted(int(p.name) for p in (written / "agents").iterdir() if p.name.isdigit())[-1]
    shutil.copyfile(written / "agents" / "0", written / "agents" / str(last))  # a valid chunk, not this one
    r = cli("validate", str(written), "--deep", "-q")
    assert r.returncode == 1, r
    assert f"chunk 'agents/{last}' of {written} is not the chunk that was committed" in r.stdout, r


def test_an_append_refuses_a_dataset_whose_committed_rows_are_not_in_its_arrays(written):
    """With a manifest committing more rows than an array holds (readers refuse
    it), --append grew the array and committed the gap as zero rows, exit 0."""
    recount(written, "agents", json.loads((written / MANIFEST_KEY).read_text())["committed"]["agents"] + 77)
    before = sorted(p.name for p in written.rglob("*"))
    r = cli("ingest", str(written), "--synthetic", "1", "--seed", "99", "--append", "-q")
    assert r.returncode == 2 and "rows committed but the array holds" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in written.rglob("*")) == before  # nothing changed


def test_a_copys_loader_state_is_refused(written, tmp_path):
    """Two copies of a dataset, appended differently to the same commit number,
    share its id and commit number, so a state saved on one resumed on the other (one epoch of two datasets)."""
    x, y = tmp_path / "x.zarr", tmp_path / "y.zarr"
    shutil.copytree(written, x)
    shutil.copytree(written, y)
    ep = episodes(1, seed=1)[0]
    moved = {**ep, "agents": ep["agents"].copy()}
    moved["agents"]["centroid"] += 1000  # the same rows, other values
    for path, new in ((x, ep), (y, moved)):
        with DatasetWriter(path, workers=0, mode="a") as w:
            w.ingest([new])
    assert Dataset.open(x).commit == Dataset.open(y).commit and Dataset.open(x).rows == Dataset.open(y).rows
    with Loader(x, batch_size=500, num_workers=0) as on_x, Loader(y, batch_size=500, num_workers=0) as on_y:
        it = iter(on_x)
        next(it)
        state = on_x.state_dict()
        with pytest.raises(ValueError, match="loader state was made on another copy of this dataset"):
            on_y.load_state_dict(state)
        with Loader(x, batch_size=500, num_workers=0) as again:  # the same copy resumes
            again.load_state_dict(state)
        old = {k: v for k, v in state.items() if k != "commit_tag"}  # saved before states recorded it: taken
        on_y.load_state_dict(old)


def test_a_state_resumes_on_its_pinned_commit_after_appends_and_copies_stay_apart(written, tmp_path):
    """A pinned commit took the tag of the latest commit's log, so a state saved at
    commit c was refused as "another copy" by `Loader(..., commit=c)` once anything was appended (the advice the
    refusal of another commit gives). A commit's tag is recorded with it and never changes; a copy appended
    differently to the same number is still told apart, pinned or not."""
    y = tmp_path / "y.zarr"
    shutil.copytree(written, y)
    c = Dataset.open(written).commit
    with Loader(written, batch_size=500, num_workers=0) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    ep = episodes(1, seed=1)[0]
    moved = {**ep, "agents": ep["agents"].copy()}
    moved["agents"]["centroid"] += 1000
    for path, new in ((written, ep), (y, moved)):
        for _ in range(2):  # two commits past c
            with DatasetWriter(path, workers=0, mode="a") as w:
                w.ingest([new], keys=[f"k{_}"])
    assert Dataset.open(written, commit=c).commit_tag == state["commit_tag"]
    with Loader(written, batch_size=500, num_workers=0, commit=c) as again:
        again.load_state_dict(state)
        assert again.state_dict()["batch"] == 1
    later = Dataset.open(written).commit
    with Loader(written, batch_size=500, num_workers=0, commit=later) as on_x, \
            Loader(y, batch_size=500, num_workers=0, commit=later) as on_y:
        with pytest.raises(ValueError, match="loader state was made on another copy of this dataset"):
            on_y.load_state_dict(on_x.state_dict())
        pinned_x, pinned_y = (Dataset.open(p, commit=later - 1).commit_tag for p in (written, y))
        assert pinned_x and pinned_y and pinned_x != pinned_y


def _copies(base, tmp_path):
    x, y = tmp_path / "x.zarr", tmp_path / "y.zarr"
    shutil.copytree(base, x)
    shutil.copytree(base, y)
    return x, y


def _state_after(path, batches=3, **kw):
    with Loader(path, batch_size=10, num_workers=0, fields=["centroid"], **kw) as loader:
        it = iter(loader)
        for _ in range(batches):
            next(it)
        return loader.state_dict()


APPEND_AND_DIE = """
import os, signal, sys
from zarrfeed.writer import DatasetWriter, synthetic
ep = next(iter(synthetic.episodes(1, seed=11, frames=10, agents_per_frame=5)))
ep["agents"]["centroid"] += float(sys.argv[2])
w = DatasetWriter(sys.argv[1], workers=0, mode="a")
w.ingest([ep])
w.sync()  # committed: the tail chunks not sealed, no keys in the log, so no new log segment
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_copies_whose_commit_adds_no_log_segment_are_told_apart(tmp_path):
    """A commit's tag was its newest log segment's key, and a commit that
    adds no segment (rows that fill no chunk, no keys) kept the one before: two copies appended differently to
    the same commit number had one tag, and a state saved on one resumed on the other (rows of both in one
    epoch). Each commit has a tag of its own now."""
    from zarrfeed.writer import write_dataset
    base = tmp_path / "b.zarr"  # every table ends on a chunk boundary: no tail chunk to withdraw either
    write_dataset(base, synthetic.episodes(2, seed=5, frames=20, agents_per_frame=5), workers=0,
                  chunks={"agents": 210, "frames": 40, "scenes": 2, "traffic_light_faces": 141})
    x, y = _copies(base, tmp_path)
    for path, bump in ((x, 0.0), (y, 1000.0)):
        r = subprocess.run([sys.executable, "-c", APPEND_AND_DIE, str(path), str(bump)], capture_output=True,
                           timeout=120)
        assert r.returncode == -9, r.stderr
    assert Dataset.open(x).commit == Dataset.open(y).commit and Dataset.open(x).rows == Dataset.open(y).rows
    assert Dataset.open(x).commit_tag != Dataset.open(y).commit_tag
    with Loader(y, batch_size=10, num_workers=0, fields=["centroid"]) as on_y:
        with pytest.raises(ValueError, match="loader state was made on another copy of this dataset"):
            on_y.load_state_dict(_state_after(x))


def _as_before_tags(path):
    """What a zarrfeed that recorded no commit tags leaves: none in the manifest or the commit objects."""
    for f in [path / MANIFEST_KEY, *(path / "zarrfeed.commits").glob("*.json")]:
        doc = json.loads(f.read_text())
        doc.pop("commit_tag", None)
        f.write_text(json.dumps(doc))


def test_a_state_of_a_commit_made_before_tags_still_tells_the_copies_apart(written, tmp_path):
    """Copies appended differently to commit c by a zarrfeed that recorded
    no tags; a state saved on one (tagged with the newest log segment, as such readers saw it) was refused on the
    other until that one was appended to, then taken by `Loader(commit=c)` there (the commit object had no tag:
    not checked). The first writer of this zarrfeed records the latest commit's tag in its object."""
    x, y = _copies(written, tmp_path)
    ep = episodes(1, seed=1)[0]
    moved = {**ep, "agents": ep["agents"].copy()}
    moved["agents"]["centroid"] += 1000
    for path, new in ((x, ep), (y, moved)):
        with DatasetWriter(path, workers=0, mode="a") as w:
            w.ingest([new])
        _as_before_tags(path)
    c = Dataset.open(x).commit
    state = _state_after(x)
    for path in (x, y):  # a later append, by this zarrfeed
        with DatasetWriter(path, workers=0, mode="a") as w:
            w.ingest(episodes(1, seed=2))
    with Loader(y, batch_size=10, num_workers=0, fields=["centroid"], commit=c) as on_y:
        with pytest.raises(ValueError, match="loader state was made on another copy of this dataset"):
            on_y.load_state_dict(state)
    with Loader(x, batch_size=10, num_workers=0, fields=["centroid"], commit=c) as on_x:
        on_x.load_state_dict(state)
        assert on_x.state_dict()["batch"] == 3
