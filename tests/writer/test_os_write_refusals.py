"""Writes the operating system refuses (a read-only file system, a full disk) are said in the
user's words, in one line naming what could not be written and where (not a lock file's bytes repr), and leave
nothing half-made; an ingest that runs out of space keeps every committed episode, and `--resume` once there is
space finishes it exactly: every episode once, as in the source.

A full disk is always tested through a store whose file operations fail with ENOSPC after a budget of bytes (it
cannot skip); a real one (a small tmpfs) and a read-only bind mount are tested where this process may mount
(root; chmod does not stop root), each unmounted after, else skipped saying why.
"""
from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zarrfeed.cli import main
from zarrfeed.core.files import Files
from zarrfeed.core.errors import WriteRefused
from zarrfeed.core.refusals import refusal, write_refused
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.loader import Dataset
from zarrfeed.loader import parquet_export
from zarrfeed.loader.parquet_export import export_parquet
from zarrfeed.writer import DatasetWriter, synthetic, write_dataset

N = 8  # episodes of the source


def zarrfeed(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zarrfeed.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def episodes(n: int = N, seed: int = 0) -> list[dict[str, np.ndarray]]:
    return list(synthetic.episodes(n, seed=seed, frames=60, agents_per_frame=20))


def tables(path) -> dict[str, np.ndarray]:
    ds = Dataset.open(path)
    return {t: ds.read_rows(t, 0, ds.rows[t]) for t in ds.tables}


def same(path, reference) -> None:
    """The dataset at `path` holds exactly the rows of the dataset at `reference`."""
    got, want = tables(path), tables(reference)
    assert list(got) == list(want)
    for t in want:
        assert got[t].shape == want[t].shape, t
        assert got[t].tobytes() == want[t].tobytes(), t


def a_prefix(path, reference) -> int:
    """The dataset at `path` holds the first k scenes of the dataset at `reference`, whole, nothing else: k."""
    got, want = tables(path), tables(reference)
    k = len(got["scenes"])
    f = want["scenes"]["frame_index_interval"][k - 1, 1] if k else 0  # their frames, agents and faces
    ends = {"scenes": k, "frames": f}
    for t, field in (("agents", "agent_index_interval"), ("traffic_light_faces", "traffic_light_faces_index_interval")):
        ends[t] = want["frames"][field][f - 1, 1] if f else 0
    assert {t: len(rows) for t, rows in got.items()} == ends
    for t in want:
        assert got[t].tobytes() == want[t][:ends[t]].tobytes(), t
    return k


def leftovers(path) -> list[str]:
    """Temporary files left anywhere under `path`."""
    return sorted(str(p) for p in Path(path).rglob("*") if ".partial" in p.name or ".tmp" in p.name
                  or p.name.startswith(".zarrfeed.lease."))


def files_and_times(path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(path)), p.stat().st_mtime_ns) for p in Path(path).rglob("*"))


def one_error_line(out: subprocess.CompletedProcess | tuple[int, str]) -> str:
    code, err = (out.returncode, out.stderr) if isinstance(out, subprocess.CompletedProcess) else out
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("zarrfeed: error: "), err
    assert "Errno" not in lines[0] and "b'" not in lines[0] and ".zarrfeed.lock" not in lines[0], lines[0]
    return lines[0].removeprefix("zarrfeed: error: ")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The episodes written in one go (what every ingest here must end up holding)."""
    path = tmp_path_factory.mktemp("source") / "source.zarr"
    write_dataset(path, episodes(), workers=0)
    return path


@pytest.mark.parametrize("exc, said", [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on the device: /data/d.zarr"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/data/d.zarr/agents/3.1a2b.partial"),
     "the disk quota is used up: /data/d.zarr"),
    (OSError(errno.EROFS, "Read-only file system", b"/data/d.zarr/.zarrfeed.lock"),
     "a read-only file system: /data/d.zarr"),
    (PermissionError(errno.EACCES, "Permission denied", "/data"), "no permission to write: /data/d.zarr"),
    (PermissionError(errno.EACCES, "Permission denied", "/data/.d.zarr.1.partial"),
     "no permission to write: /data/d.zarr"),
    (PermissionError(errno.EACCES, "Permission denied", "/inputs/scene.zarr/agents/0"), None),  # an input read
    (OSError(errno.ENOSPC, "No space left on device", "/tmp/zarrfeed-locks/agents.3"), None),  # not the dataset's
    (OSError(errno.EIO, "Input/output error", "/data/d.zarr/agents/3"), None),
    (PermissionError("Forbidden"), None),  # no errno: an object store's own words stay
    (ValueError("not an OSError"), None),
])
def test_what_a_refusal_names(exc, said):
    """The place the user named and why, never the file the system refused; a refusal of a file that is not
    that place's is no refusal of it (it keeps its own words)."""
    assert refusal(exc, "/data/d.zarr") == said
    made = write_refused(exc, "/data/d.zarr", "the episodes cannot be written to it")
    assert made is None if said is None else (str(made) == f"/data/d.zarr: the episodes cannot be written to it "
                                              f"({said})" and made.errno == exc.errno)


# ------------------------------------------------------------------------- a full disk, simulated
class FullDisk(Files):
    """The store's file operations, done for real until `budget` bytes are written, then every write fails with
    ENOSPC (a temporary file started, part of it written, as a full disk does). The count is in shared memory:
    writer workers forked from this process share it. `free()` makes room for everything."""

    def __init__(self, budget: int) -> None:
        self.left = multiprocessing.get_context("fork").Value("q", budget)

    def write(self, path: str, data: bytes, sync: bool) -> None:
        with self.left.get_lock():
            room = self.left.value
            self.left.value = max(0, room - len(data))
        if room >= len(data):
            return super().write(path, data, sync)
        with open(path, "wb") as f:
            f.write(data[:room])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    def create_exclusive(self, path: str, data: bytes, sync: bool) -> bool:
        if self.left.value < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return super().create_exclusive(path, data, sync)

    def free(self) -> None:
        with self.left.get_lock():
            self.left.value = 1 << 62


def stored_bytes(path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_full_disk_stops_the_python_writer_in_one_line_and_resume_finishes_exactly(source, tmp_path, monkeypatch,
                                                                                       workers):
    """The error is an OSError (errno ENOSPC) naming the dataset, what is committed and how to finish, from this
    process or a writer worker alike (it said "[Errno 28] No space left on device", or "writer worker 0 failed
    writing agents rows [...]: OSError: ..."); every committed episode is kept whole, no temporary file is left
    (nor one that a worker killed after the error was writing), and resuming once there is room writes each of the
    others once."""
    path = tmp_path / "d.zarr"
    disk = FullDisk(stored_bytes(source) // 2)
    monkeypatch.setattr(DirectoryStore, "files", disk)
    w = DatasetWriter(path, workers=workers, commit_interval=0, start_method="fork")
    (path / "agents" / "1.0a1b.partial").write_bytes(b"half a chunk")  # as a worker killed while it wrote leaves
    with pytest.raises(OSError) as stopped:
        with w:
            w.ingest(episodes())
    assert isinstance(stopped.value, WriteRefused) and stopped.value.errno == errno.ENOSPC
    said = str(stopped.value)
    assert re.fullmatch(re.escape(f"{path}: the episodes cannot be written to it (no space left on the device: "
                                  f"{path}); ") + r"(\d+) episodes? (is|are) committed \(\d+ scenes?, [^)]*\)\. "
                        + re.escape("Free space on it, then reopen with mode='a' and re-send missing() (or "
                                    "ingest(..., resume=True))."), said), said
    kept = a_prefix(path, source)
    assert said.split("); ", 1)[1].startswith(f"{kept} episode")  # what it says is what is there
    if workers == 0:  # committed after each episode, in this process: some are, before the disk fills
        assert kept > 0
    assert leftovers(path) == []
    disk.free()
    with DatasetWriter(path, mode="a", workers=workers, start_method="fork") as w:
        summary = w.ingest(episodes(), resume=True)
    assert summary["episodes"] == N - kept
    same(path, source)


class NoRoomForCommitObjects(Files):
    """Once `full`, the numbered commit objects (written after the manifest) fail with ENOSPC, half written; the
    rest is written: a commit whose manifest lands, then its publication fails."""

    full = False

    def write(self, path: str, data: bytes, sync: bool) -> None:
        if self.full and "zarrfeed.commits" in path:
            super().write(path, data[:len(data) // 2], sync)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().write(path, data, sync)


def test_what_a_full_disk_says_is_committed_is_what_readers_see(source, tmp_path, monkeypatch):
    """A commit whose manifest was stored before the disk filled is what readers see: the line counts it; the
    commit object that did not fit leaves no part of it."""
    path, all_of_them = tmp_path / "d.zarr", episodes()
    disk = NoRoomForCommitObjects()
    monkeypatch.setattr(DirectoryStore, "files", disk)
    with pytest.raises(WriteRefused) as stopped:
        with DatasetWriter(path, workers=0, commit_interval=0) as w:
            for i, ep in enumerate(all_of_them):
                disk.full = i == 3
                w.submit(ep, key=f"e{i}")
    assert a_prefix(path, source) == 4
    assert "; 4 episodes are committed (4 scenes, " in str(stopped.value), stopped.value
    assert leftovers(path) == []
    disk.full = False
    with DatasetWriter(path, mode="a", workers=0) as w:
        assert sum(w.submit(ep, key=f"e{i}") for i, ep in enumerate(all_of_them)) == N - 4
    same(path, source)


def test_a_full_disk_stops_the_command_in_one_line_and_resume_finishes_exactly(source, tmp_path, monkeypatch,
                                                                                capsys):
    """`zarrfeed ingest` (run in this process, on the simulated disk): one line saying what to do, exit 2; then
    `--resume` once there is room: the source, exactly."""
    path = tmp_path / "d.zarr"
    disk = FullDisk(stored_bytes(source) // 2)
    monkeypatch.setattr(DirectoryStore, "files", disk)
    code = main(["ingest", str(path), "--from", str(source), "--workers", "0", "-q"])
    said = one_error_line((code, capsys.readouterr().err))
    assert re.fullmatch(re.escape(f"{path}: the episodes cannot be written to it (no space left on the device: "
                                  f"{path}); ") + r"\d+ episodes? (is|are) committed \([^)]*\)\. "
                        + re.escape("Free space on it, then run the same command again with --resume to finish."),
                        said), said
    a_prefix(path, source)
    assert leftovers(path) == []
    disk.free()
    assert main(["ingest", str(path), "--from", str(source), "--workers", "0", "-q", "--resume"]) == 0
    same(path, source)


def test_a_full_disk_while_the_dataset_is_made_leaves_nothing(tmp_path, monkeypatch):
    """No room for a new dataset's documents: refused as the user's words, nothing left, and nothing held in
    this process (a writer opened once there is room takes the lease)."""
    path = tmp_path / "d.zarr"
    disk = FullDisk(0)
    monkeypatch.setattr(DirectoryStore, "files", disk)
    with pytest.raises(WriteRefused) as refused:
        DatasetWriter(path, workers=0)
    assert str(refused.value) == f"{path}: the dataset cannot be created (no space left on the device: {path})"
    assert not path.exists()
    disk.free()
    with DatasetWriter(path, workers=0) as w:
        w.ingest(episodes(1))
    assert Dataset.open(path).rows["scenes"] == 1


def test_a_full_disk_before_the_input_is_recorded_keeps_nothing_and_says_to_write_it_again(tmp_path, monkeypatch):
    """Room for the new dataset but not for the commit that records its input: nothing of the input is recorded,
    so the dataset goes (a resume would find nothing to finish) and the line says to write it again."""
    path = tmp_path / "d.zarr"
    disk = FullDisk(1 << 40)
    monkeypatch.setattr(DirectoryStore, "files", disk)
    w = DatasetWriter(path, workers=0)
    disk.left.value = 0  # full from here on
    with pytest.raises(WriteRefused) as stopped, w:
        w.ingest(episodes(2))
    assert str(stopped.value) == (f"{path}: the episodes cannot be written to it (no space left on the device: "
                                  f"{path}); nothing of this input is recorded. Free space on it, then write it again.")
    assert not path.exists()


def test_a_full_disk_leaves_no_part_of_an_export(source, tmp_path, monkeypatch):
    """`export_parquet`: one line naming the output, and neither part files nor the folders it made are left
    (a folder that was there stays, empty)."""
    real = parquet_export.pq.write_table

    def full(table, where, *args, **kwargs):
        real(table, where, *args, **kwargs)  # a file begun
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(parquet_export.pq, "write_table", full)
    for out in (tmp_path / "new", tmp_path / "there"):
        if out.name == "there":
            out.mkdir()
        with pytest.raises(WriteRefused, match="^" + re.escape(f"{out}: the Parquet files cannot be written there "
                                                                f"(no space left on the device: {out})") + "$"):
            export_parquet(source, out, workers=0)
        assert not out.exists() if out.name == "new" else list(out.iterdir()) == []


def test_a_full_disk_leaves_an_arrow_file_as_it_was(source, tmp_path, monkeypatch):
    """An Arrow IPC stream to a file is written aside and renamed: a stream the disk cannot hold leaves the
    file that was there as it was (it was truncated, then half written), and no part of the new one."""
    from zarrfeed.loader import arrow_bridge

    real = arrow_bridge._write_ipc

    def full(stream, sink):
        real(stream, sink)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), sink)

    out = tmp_path / "agents.arrows"
    out.write_bytes(b"an earlier export")
    monkeypatch.setattr(arrow_bridge, "_write_ipc", full)
    with pytest.raises(WriteRefused, match="^" + re.escape(f"{out}: the Arrow stream cannot be written there (no "
                                                            f"space left on the device: {out})") + "$"):
        arrow_bridge.write_ipc_stream(Dataset.open(source).to_batches("agents"), out)
    assert out.read_bytes() == b"an earlier export" and sorted(tmp_path.iterdir()) == [out]


# ------------------------------------------------------------------------- real mounts
@contextlib.contextmanager
def mounted(where: Path, *options: str, source: str = "tmpfs"):
    """`where` with a file system mounted on it (`mount -t tmpfs -o OPTIONS`, or with `source` a folder: a bind
    mount remounted read-only), unmounted after; the test is skipped, saying why, where it cannot mount."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting needs root and mount(8)")
    where.mkdir(exist_ok=True)
    if source == "tmpfs":
        command = [["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(where)]]
    else:
        command = [["mount", "--bind", source, str(where)], ["mount", "-o", "remount,bind,ro", str(where)]]
    done = 0
    try:
        for c in command:
            out = subprocess.run(c, capture_output=True, text=True)
            if out.returncode:
                pytest.skip(f"cannot mount here ({' '.join(c)}: {out.stderr.strip()})")
            done += 1
        yield where
    finally:
        if done:
            subprocess.run(["umount", str(where)], check=True, capture_output=True)


def test_a_read_only_mount_is_said_in_one_line_by_every_command_and_left_as_it_was(source, tmp_path):
    """Each command that writes: what could not be written where, and why, as `mask` says it (it said
    "[Errno 30] Read-only file system: b'first.zarr/.zarrfeed.lock'"); nothing is written."""
    src = tmp_path / "src"
    shutil.copytree(source, src / "first.zarr")
    before = files_and_times(src)
    with mounted(tmp_path / "ro", source=str(src)) as ro:
        cases = {
            ("ingest", "first.zarr", "--synthetic", 1, "--seed", 9, "--append", "-q"):
                "first.zarr: the dataset cannot be written (a read-only file system: first.zarr)",
            ("ingest", "first.zarr", "--from", source, "--resume", "-q"):
                "first.zarr: the dataset cannot be written (a read-only file system: first.zarr)",
            ("ingest", "first.zarr", "--synthetic", 1, "--overwrite", "-q"):
                "first.zarr: the dataset cannot be replaced (a read-only file system: first.zarr)",
            ("ingest", "new.zarr", "--synthetic", 1, "-q"):
                "new.zarr: the dataset cannot be created (a read-only file system: new.zarr)",
            ("ingest", "sub/new.zarr", "--synthetic", 1, "--workers", 0, "-q"):
                "sub/new.zarr: the dataset cannot be created (a read-only file system: sub/new.zarr)",
            ("export", "first.zarr", "pq", "-q"):
                "pq: the Parquet files cannot be written there (a read-only file system: pq)",
            ("export", "first.zarr", "x.arrows", "--format", "arrow", "-q"):
                "x.arrows: the Arrow stream cannot be written there (a read-only file system: x.arrows)",
            ("plot", "first.zarr", "--summary", "--out", "s.png"):
                "s.png: the plot cannot be written there (a read-only file system: s.png)",
            ("mask", "first.zarr", "--workers", 0, "-q"):
                "first.zarr: the agents mask cannot be stored in it (a read-only file system: first.zarr)",
        }
        for args, line in cases.items():
            out = zarrfeed(*args, cwd=ro)
            assert one_error_line(out) == line, args
        with pytest.raises(OSError) as refused:  # Python: the same, an OSError with the system's errno
            DatasetWriter(ro / "first.zarr", mode="a", workers=0)
        assert isinstance(refused.value, WriteRefused) and refused.value.errno == errno.EROFS
        assert str(refused.value) == (f"{ro / 'first.zarr'}: the dataset cannot be written (a read-only file "
                                      f"system: {ro / 'first.zarr'})")
    assert files_and_times(src) == before


def test_a_real_full_disk_stops_the_ingest_in_one_line_and_resume_finishes_exactly(source, tmp_path):
    """A tmpfs smaller than the dataset, with writer workers: one line, the committed episodes kept, no part of
    a file left; then the tmpfs made larger (space freed) and `--resume`: the source, exactly."""
    with mounted(tmp_path / "small", f"size={stored_bytes(source) // 2}") as small:
        path = small / "d.zarr"
        out = zarrfeed("ingest", path, "--from", source, "--workers", 2, "-q")
        said = one_error_line(out)
        assert said.startswith(f"{path}: the episodes cannot be written to it (no space left on the device: "
                               f"{path}); "), said
        assert said.endswith(". Free space on it, then run the same command again with --resume to finish."), said
        a_prefix(path, source)
        assert leftovers(path) == []
        subprocess.run(["mount", "-o", f"remount,size={4 * stored_bytes(source)}", str(small)], check=True)
        out = zarrfeed("ingest", path, "--from", source, "--workers", 2, "-q", "--resume")
        assert out.returncode == 0, out.stderr
        same(path, source)


def test_a_disk_already_full_leaves_nothing_and_its_lease_is_not_kept(source, tmp_path):
    """No room even for the lease's document: one line, no folder left behind, and this process holds nothing
    (a writer opened once there is room takes the lease); exports and plots leave no part of a file."""
    with mounted(tmp_path / "full", "size=256k") as full:
        filler = full / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):  # until the disk is full (ENOSPC)
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        path = full / "d.zarr"
        said = one_error_line(zarrfeed("ingest", path, "--synthetic", 1, "-q"))
        assert said == f"{path}: the dataset cannot be created (no space left on the device: {path})"
        with pytest.raises(WriteRefused, match="^" + re.escape(f"{path}: the dataset cannot be created (no space "
                                                               f"left on the device: {path})") + "$"):
            DatasetWriter(path, workers=0)
        for args, line in {
            ("export", source, full / "pq", "-q"): f"{full / 'pq'}: the Parquet files cannot be written there",
            ("export", source, full / "x.arrows", "--format", "arrow", "-q"):
                f"{full / 'x.arrows'}: the Arrow stream cannot be written there",
            ("plot", source, "--scene", 0, "--out", full / "s.png"): f"{full / 's.png'}: the plot cannot be "
                                                                      "written there",
        }.items():
            assert one_error_line(zarrfeed(*args)).startswith(line + " (no space left on the device: "), args
        assert sorted(p.name for p in full.iterdir()) == ["filler"]
        filler.unlink()
        with DatasetWriter(path, workers=0) as w:  # taken: the failed attempt left no lease held here
            w.ingest(episodes(1))
        assert Dataset.open(path).rows["scenes"] == 1
