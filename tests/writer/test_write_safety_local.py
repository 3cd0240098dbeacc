"""On local disks, every path that could lose, duplicate or mix rows is impossible or refused before anything
changes: resume and append, killed writers, two writers at once, overwrites, ingest from itself, pinned
commits, leases that cannot be renewed (core/test_s3.py has the object-store side)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from expected import expected_tables, wait_for_scenes
from formats import layout
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter
from zarrfeed.writer.lease import LeaseHeld

from zarrfeed.cli import main
from zarrfeed.core.dataset_format import consolidate
from zarrfeed.core.manifest_io import read_manifest
from zarrfeed.core.stores import DirectoryStore

from repo_paths import SUPPORT
SMALL = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}


def small_episodes(n: int, seed: int) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=20, agents_per_frame=30))


def assert_holds(path, episodes) -> None:
    """The dataset at `path` is valid and holds exactly `episodes`, in order, each once."""
    ds = Dataset.open(path)
    assert ds.validate().ok
    for name, arr in expected_tables(episodes).items():
        assert ds.rows[name] == len(arr), name
        np.testing.assert_array_equal(ds[name][: ds.rows[name]], arr)


def test_append_then_resume_writes_every_episode_once(tmp_path, zarr_format):
    """Item 1: resume numbered its input from 0 while the journal numbered the whole dataset."""
    out = tmp_path / "d.zarr"
    first, more = small_episodes(2, seed=0), small_episodes(5, seed=1)
    with DatasetWriter(out, workers=0, chunks=SMALL, **layout(zarr_format, SMALL)) as w:
        w.ingest(first)
    w = DatasetWriter(out, workers=2, mode="a", chunks=SMALL)
    for ep in more[:2]:
        w.submit(ep)
    w.sync()
    w.submit(more[2])
    w.abort()  # as a crash after two of the five were committed
    assert Dataset.open(out).rows["scenes"] in (4, 5)
    with DatasetWriter(out, workers=2, mode="a") as w:
        assert [k.index for k in w.missing()] in ([], [2])
        w.ingest(more, resume=True)
        assert w.missing() == []
    assert_holds(out, first + more)
    with DatasetWriter(out, workers=0, mode="a") as w:  # resume after resume: nothing more to write
        assert w.ingest(more, resume=True)["episodes"] == 0
    assert_holds(out, first + more)


def test_resume_after_a_partial_commit_of_a_killed_process(tmp_path):
    out = tmp_path / "d.zarr"
    child = subprocess.Popen([sys.executable, str(SUPPORT / "writer_child.py"), str(out), "30", "2", "0.03"],
                             stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    wait_for_scenes(out, 5)
    child.send_signal(signal.SIGKILL)
    child.wait()
    for _ in range(2):  # resume, then resume again
        r = subprocess.run([sys.executable, str(SUPPORT / "writer_child.py"), str(out), "30", "2", "0", "--resume"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert_holds(out, list(synthetic.episodes(30, seed=5, frames=40, agents_per_frame=300)))


def test_two_writers_at_once_the_second_is_refused_and_changes_nothing(tmp_path, zarr_format):
    """Item 2: the second writer overwrote the first's rows, and validate() said valid."""
    out = tmp_path / "d.zarr"
    eps = small_episodes(6, seed=2)
    with DatasetWriter(out, workers=0, chunks=SMALL, **layout(zarr_format, SMALL)) as w:
        w.ingest(eps[:2])
    first = DatasetWriter(out, workers=2, mode="a")
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    with pytest.raises(LeaseHeld, match=rf"being written by pid {os.getpid()} on .*last heartbeat"):
        DatasetWriter(out, workers=2, mode="a")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    first.ingest(eps[2:])
    first.close()
    assert_holds(out, eps)


def test_a_writer_in_another_process_holds_the_lease_until_it_dies(tmp_path):
    out = tmp_path / "d.zarr"
    child = subprocess.Popen([sys.executable, str(SUPPORT / "writer_child.py"), str(out), "200", "1", "0.05"],
                             stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    try:
        with pytest.raises(LeaseHeld, match=f"pid {child.pid}"):
            DatasetWriter(out, workers=0, mode="a")
        r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "ingest", str(out), "--synthetic", "1", "--append",
                            "-q"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and f"being written by pid {child.pid}" in r.stderr
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with DatasetWriter(out, workers=0, mode="a") as w:  # its holder is dead: taken over at once
        assert w.committed["scenes"] >= 0
    assert Dataset.open(out).validate().ok


def test_ingest_from_itself_is_refused(tmp_path):
    """Item 3: `ingest X --from X --overwrite` destroyed the source."""
    out = tmp_path / "x.zarr"
    eps = small_episodes(3, seed=3)
    with DatasetWriter(out, workers=0) as w:
        w.ingest(eps)
    for extra in (["--overwrite"], ["--append"], []):
        r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "ingest", str(out), "--from", f"file://{out}",
                            *extra, "-q"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "the output is also the input" in r.stderr and "Traceback" not in r.stderr
    assert_holds(out, eps)


@pytest.mark.parametrize("command", [["ingest", "{out}", "--synthetic", "1", "--overwrite"],
                                     ["demo", "--out", "{out}", "--scenes", "1"]])
def test_overwrite_refuses_a_folder_that_is_not_a_dataset(tmp_path, command, capsys):
    """Item 4: --overwrite and demo --out deleted a folder with the user's files in it."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    (out / "data").mkdir()
    assert main([c.format(out=out) for c in command]) == 2
    err = capsys.readouterr().err
    assert "not a zarr dataset (it holds data, thesis.tex); refusing to overwrite it" in err
    assert (out / "thesis.tex").read_text() == "years of work" and sorted(os.listdir(out)) == ["data", "thesis.tex"]


def test_overwrite_replaces_a_dataset(tmp_path, capsys):
    out = tmp_path / "d.zarr"
    assert main(["ingest", str(out), "--synthetic", "2", "--seed", "0", "-q"]) == 0
    assert main(["ingest", str(out), "--synthetic", "1", "--seed", "1", "--overwrite", "-q"]) == 0
    assert_holds(out, list(synthetic.episodes(1, seed=1)))


class Killed(BaseException):
    """The process died here (a BaseException: nothing in zarrfeed goes on after it)."""


def test_an_overwrite_killed_while_it_clears_is_finished_by_overwriting_again(tmp_path, monkeypatch, capsys):
    """An overwrite killed after its clear had deleted `.zgroup` (entries went in
    the directory's order) left a folder every option refused: `--overwrite` as "not a zarr dataset",
    `--append`/`--resume` as "not a zarr group". The marks of a dataset now go last, so at whichever deletion
    the writer dies, `--overwrite` again finishes the job."""
    import shutil

    out = tmp_path / "d.zarr"
    assert main(["ingest", str(out), "--synthetic", "2", "--seed", "0", "--workers", "0", "-q"]) == 0
    keep = tmp_path / "keep.zarr"
    shutil.copytree(out, keep)
    deletions = len([n for n in os.listdir(out) if not n.startswith((".zarrfeed", "zarrfeed.lease"))])
    real_unlink, real_rmtree = os.unlink, shutil.rmtree
    for dies_at in range(deletions):
        shutil.rmtree(out)
        shutil.copytree(keep, out)
        done = [0]

        def counted(real):
            def delete(path, *args, **kwargs):
                if done[0] == dies_at:
                    raise Killed
                done[0] += 1
                return real(path, *args, **kwargs)
            return delete

        with monkeypatch.context() as m:
            m.setattr(os, "unlink", counted(real_unlink))
            m.setattr(shutil, "rmtree", counted(real_rmtree))
            with pytest.raises(Killed):
                DatasetWriter(out, workers=0, overwrite=True)
        assert main(["ingest", str(out), "--synthetic", "1", "--seed", "1", "--workers", "0", "--overwrite",
                     "-q"]) == 0, (dies_at, capsys.readouterr().err)
        assert_holds(out, list(synthetic.episodes(1, seed=1)))


def test_a_writer_killed_while_writing_its_first_manifest_leaves_nothing_in_the_way(tmp_path, capsys):
    """Killed during the fsync of its first manifest's temporary file, a writer left
    the lease's files and `zarrfeed.json.<uuid>.partial`; that file counted as data, so a new ingest, `--resume`
    and `--overwrite` were all refused. Temporary files are leftovers, as the lease's are: a new ingest goes on
    and removes them."""
    out = tmp_path / "d.zarr"
    out.mkdir()
    (out / ".zarrfeed.lock").write_bytes(b"")
    (out / "zarrfeed.lease").write_text(json.dumps({"host": "gone", "pid": 1, "pid_start": 1, "started": 0,
                                                    "heartbeat": 0, "token": "t", "timeout": 1}))
    (out / "zarrfeed.json.0123456789abcdef0123456789abcdef.partial").write_bytes(b'{"commit": 0, "comm')
    assert main(["ingest", str(out), "--synthetic", "2", "--workers", "0", "-q"]) == 0, capsys.readouterr().err
    assert_holds(out, list(synthetic.episodes(2)))
    assert not [n for n in os.listdir(out) if n.endswith(".partial")]


def test_resume_with_other_input_is_refused_before_anything_changes(tmp_path, capsys):
    """Item 5: `--resume --seed 5` after an interrupted `--seed 0` ingest mixed both inputs."""
    out = tmp_path / "d.zarr"
    eps = list(synthetic.episodes(4, seed=0))
    w = DatasetWriter(out, workers=0)
    w.submit(eps[0])
    w.submit(eps[1])
    w.sync()
    w.abort()  # interrupted after 2 of 4
    before = read_manifest(DirectoryStore(out))
    assert main(["ingest", str(out), "--synthetic", "4", "--seed", "5", "--resume", "-q"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume with this input" in err and len(err.strip().splitlines()) == 1
    assert read_manifest(DirectoryStore(out))["committed"] == before["committed"]
    assert main(["ingest", str(out), "--synthetic", "4", "--seed", "0", "--append", "-q"]) == 2  # a repeat
    err = capsys.readouterr().err
    assert "was ingested before (2 of its episodes are committed" in err and "finish it (--resume)" in err
    assert "resume=True" not in err and "mode=" not in err  # the command line's words, not Python's
    assert main(["ingest", str(out), "--synthetic", "4", "--seed", "0", "--resume", "-q"]) == 0
    assert_holds(out, eps)


def crash_after(out: Path, script: str) -> None:
    """Run `script` (with `out`, the dataset's path, and `small_episodes` defined) in a process that is then SIGKILLed:
    a real crash, nothing cleaned up."""
    code = ("import os, signal, sys\nsys.path[:0] = sys.argv[2:4]\nfrom test_write_safety_local import small_episodes\n"
            "from zarrfeed.writer.dataset_writer import DatasetWriter\nout = sys.argv[1]\n" + script +
            "\nos.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code, str(out), str(Path(__file__).parent), str(SUPPORT)],
                       capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]


def test_a_resumed_episode_must_be_the_one_submitted_before(tmp_path):
    out = tmp_path / "d.zarr"
    eps = small_episodes(3, seed=6)
    crash_after(out, "w = DatasetWriter(out, workers=0, commit_interval=3600)\n"
                "eps = small_episodes(3, seed=6)\n"
                "w.ingest(eps[:1])\n"
                "w.submit(eps[1])\n"
                "w.committer.commit(force=True)  # its key is recorded as submitted; its rows are not written")
    other = small_episodes(3, seed=7)
    with DatasetWriter(out, workers=0, mode="a") as w:
        assert w.missing() and str(w.missing()[0]) == "1"
        with pytest.raises(ValueError, match="episode 1: not the episode submitted under this key"):
            w.ingest([eps[0], other[1], eps[2]], resume=True)


def test_caller_keys_make_retries_idempotent(tmp_path, zarr_format):
    out = tmp_path / "d.zarr"
    eps = small_episodes(4, seed=8)
    with DatasetWriter(out, workers=2, **layout(zarr_format)) as w:
        assert w.submit(eps[0], key="scene-a") and w.submit(eps[1], key=7)
        assert not w.submit(eps[0], key="scene-a")  # in flight: not twice
        w.sync()
        assert w.is_committed("scene-a") and w.is_committed(7)
    with DatasetWriter(out, workers=0, mode="a") as w:
        summary = w.ingest(eps, keys=["scene-a", 7, "c", "d"])  # a producer retrying everything
        assert summary["episodes"] == 2
        with pytest.raises(TypeError, match="str or an int"):
            w.submit(eps[0], key=3.5)
    assert_holds(out, eps)


def test_file_urls_write_where_they_point(tmp_path, monkeypatch):
    """Item 6 (local half): `file://` URLs wrote a folder named `file:` in the working directory."""
    monkeypatch.chdir(tmp_path)
    eps = small_episodes(2, seed=9)
    with DatasetWriter(f"file://{tmp_path}/u.zarr", workers=0) as w:
        w.ingest(eps)
    assert not (tmp_path / "file:").exists()
    assert_holds(tmp_path / "u.zarr", eps)


def test_nothing_of_the_locks_is_left_in_the_dataset_after_a_crash(tmp_path):
    """Item 7: `.zarrfeed-locks/agents/.zarray` stayed and broke zarr.consolidate_metadata."""
    out = tmp_path / "d.zarr"
    crash_after(out, "w = DatasetWriter(out, workers=2, chunks={'agents': 2000, 'frames': 100, 'scenes': 4, "
                     "'traffic_light_faces': 500}, commit_interval=0.001, segment_bytes=1 << 16)\n"
                     "for ep in small_episodes(10, seed=10):\n"
                     "    w.submit(ep)  # partial segments: chunks two segments share are written under the locks\n"
                     "w.sync()")
    inside = [p.relative_to(out).as_posix() for p in out.rglob("*")]
    assert not any("lock" in p and ".zarray" in p for p in inside), inside
    consolidate(DirectoryStore(out))  # every metadata document in the folder, parsed, into .zmetadata
    meta = json.loads((out / ".zmetadata").read_text())["metadata"]
    assert sorted(k.split("/")[0] for k in meta if k.endswith("/.zarray") and k.count("/") == 1) == \
        ["agents", "frames", "scenes", "traffic_light_faces"]


def test_zip_is_read_only_and_a_missing_backend_is_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="zip stores are read-only"):
        DatasetWriter(tmp_path / "d.zip")
    assert main(["info", "gcs://bucket/d.zarr"]) == 2
    err = capsys.readouterr().err
    assert "Please install gcsfs" in err and len(err.strip().splitlines()) == 1
    assert main(["info", "nosuch://bucket/d.zarr"]) == 2
    assert "Protocol not known: nosuch" in capsys.readouterr().err


def test_export_to_stdout_needs_the_arrow_format_and_unwritable_output_is_one_line(real_scene, tmp_path, capsys):
    assert main(["export", str(real_scene), "-"]) == 2
    assert "add --format arrow" in capsys.readouterr().err
    a_file = tmp_path / "notes.txt"  # unwritable for any user, root included: a file is no folder
    a_file.write_text("x")
    assert main(["ingest", str(a_file / "d.zarr"), "--synthetic", "1", "-q"]) == 2
    err = capsys.readouterr().err
    assert "Not a directory" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert a_file.read_text() == "x"


def test_readers_pin_a_commit(tmp_path):
    out = tmp_path / "d.zarr"
    eps = small_episodes(3, seed=11)
    with DatasetWriter(out, workers=0) as w:
        w.ingest(eps[:1])
        pinned = w.commit
        rows = dict(w.committed)
        w.ingest(eps[1:])
    assert Dataset.open(out).rows != rows
    assert Dataset.open(out, commit=pinned).rows == rows
    with pytest.raises(ValueError, match="the latest commit is"):
        Dataset.open(out, commit=10_000)
    for bad in (-1, 1.5, True):  # -1 was said to be "no longer kept"
        with pytest.raises(ValueError, match=rf"^commit {bad!r}: not a commit number \(a whole number >= 0\)$"):
            Dataset.open(out, commit=bad)


def test_create_never_writes_over_a_dataset_made_meanwhile(tmp_path):
    """Two mode-"w" writers that both found the folder empty: the second must not reset the first's manifest."""
    from zarrfeed.writer import L5KIT_SCHEMA

    from zarrfeed.core.dataset_format import create

    out = tmp_path / "d.zarr"
    eps = small_episodes(2, seed=12)
    with DatasetWriter(out, workers=0) as w:
        w.ingest(eps)
    with pytest.raises(ValueError, match="already holds a dataset"):
        create(DirectoryStore(out), L5KIT_SCHEMA)
    assert_holds(out, eps)


def test_a_lease_that_cannot_be_renewed_stops_commits_before_another_writer_may_take_it(tmp_path, monkeypatch):
    """Heartbeats that fail (a store that does not answer) must stop this writer's commits before the lease
    expires for everyone else; otherwise two writers could both commit."""
    from zarrfeed.writer.lease import Lease, LeaseLost

    from zarrfeed.core.location import Location

    (tmp_path / "d").mkdir()
    lease = Lease(Location.of(tmp_path / "d"), timeout=0.6)
    lease.acquire()
    try:
        lease.check()  # fresh: fine

        def no_answer(holder):
            raise OSError("connection timed out")

        monkeypatch.setattr(lease._backend, "renew", no_answer)
        deadline = time.monotonic() + 5
        with pytest.raises(LeaseLost, match="not been renewed"):
            while time.monotonic() < deadline:
                lease.check()
                time.sleep(0.02)
    finally:
        lease.release()


def test_a_store_call_that_never_returns_is_one_line_after_its_bound():
    from zarrfeed.core.bounded_calls import bounded
    from zarrfeed.core.errors import StoreTimeout

    t0 = time.monotonic()
    with pytest.raises(StoreTimeout) as err:
        bounded(0.3, lambda: time.sleep(30), "s3://b/d.zarr: publishing commit 7")
    assert time.monotonic() - t0 < 2
    assert str(err.value).startswith("s3://b/d.zarr: publishing commit 7: no answer in") and "\n" not in str(err.value)
    assert bounded(1, lambda: 42, "x") == 42
    with pytest.raises(KeyError):
        bounded(1, lambda: {}["k"], "x")
