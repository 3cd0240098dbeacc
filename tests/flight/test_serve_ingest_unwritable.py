"""`zarrfeed serve --ingest` on a dataset it cannot write into (a read-only mount, a store that refuses writes,
one that fails otherwise): each upload is refused with one line, to the producer (PermissionError at
RemoteWriter, without the server's paths) and in the server's log (naming the dataset and why, no traceback);
the server goes on serving reads. Servers here listen on 127.0.0.1 only."""
import contextlib
import errno
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from zarrfeed.flight import FeedServer, RemoteLoader, RemoteWriter
from zarrfeed.flight import ingestion
from zarrfeed.writer import synthetic, write_dataset
from repo_paths import ROOT



def _dataset(where: Path) -> Path:
    path = where / "d.zarr"
    write_dataset(path, synthetic.episodes(2, seed=0, frames=12, agents_per_frame=4), workers=0)
    return path


def _episode() -> dict:
    return next(iter(synthetic.episodes(1, seed=5, frames=12, agents_per_frame=4)))


@contextlib.contextmanager
def read_only(path: Path):
    """`path` as a read-only bind mount of itself (root: chmod would not stop the writer), unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    bound = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True)
    if bound.returncode:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path), str(path)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_serve_ingest_on_a_read_only_mount_refuses_each_upload_in_one_line(tmp_path):
    path = _dataset(tmp_path)
    with read_only(path):
        proc = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "serve", str(path), "--port", "0",
                                 "--workers", "1", "--ingest"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT)
        try:
            line = proc.stdout.readline()
            assert line.startswith("serving on grpc://127.0.0.1:"), line + proc.stderr.read()
            url = line.split()[2]
            refusal = f"{url}: zarrfeed: uploads refused: this server cannot write into its dataset (Read-only " \
                      "file system)"
            with pytest.raises(PermissionError) as refused, RemoteWriter(url) as w:  # begin_input, then do_put
                w.ingest([_episode()])
            assert str(refused.value) == refusal
            with pytest.raises(PermissionError) as refused, RemoteWriter(url) as w:  # do_put at once
                w.submit(_episode(), key="drive-1")
            assert str(refused.value) == refusal
            with RemoteLoader(url, "scenes", batch_size=10) as remote:  # still serving
                assert sum(len(b["host"]) for b in remote) == 2
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "File " not in err, err
    logged = [x for x in err.splitlines() if " ERROR " in x]
    assert len(logged) == 2, err
    for x in logged:
        assert re.search(rf" ERROR zarrfeed: dataset {re.escape(str(path))}: uploads refused: its writer did not "
                         rf"open: {re.escape(str(path))}: the dataset cannot be written \(a read-only file system: ",
                         x), x


class _Refusing:
    """DatasetWriter as a store that refuses (or fails) the first write raises it: when it opens."""

    def __init__(self, exc: OSError) -> None:
        self.exc = exc

    def __call__(self, *args, **kwargs):
        raise self.exc


@pytest.mark.parametrize("exc, client_error, why", [
    (PermissionError(errno.EACCES, "Permission denied", "/srv/data/d.zarr/.zarrfeed.lock"), PermissionError,
     "Permission denied"),
    (OSError(errno.EROFS, "Read-only file system", "/srv/data/d.zarr/.zarrfeed.lock"), PermissionError,
     "Read-only file system"),
    (PermissionError("Forbidden"), PermissionError, "Forbidden"),  # an object store's, without errno
    (OSError(errno.ENOSPC, "No space left on device", "/srv/data/d.zarr/.zarrfeed.lock"), ValueError,
     "No space left on device"),
])
def test_a_store_that_refuses_writes_is_one_line_each_side(tmp_path, monkeypatch, exc, client_error, why):
    """In this process, a named dataset of a FeedServer whose writer cannot open: the producer's error names
    the dataset (not the server's path), the log names the dataset's location and the file, with no traceback."""
    path = _dataset(tmp_path)
    monkeypatch.setattr(ingestion, "DatasetWriter", _Refusing(exc))
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("zarrfeed.serve")  # its own handler: the server's log, whatever propagates
    log.addHandler(handler)
    try:
        with FeedServer({"drives": path}, port=0, workers=1, ingest=True) as server:
            for call in ("ingest", "submit"):
                with pytest.raises(client_error) as refused, RemoteWriter(server.url, dataset="drives") as w:
                    w.ingest([_episode()]) if call == "ingest" else w.submit(_episode(), key="drive-1")
                assert str(refused.value) == (f"{server.url}: " if client_error is PermissionError else "") + \
                    f"zarrfeed: uploads refused: this server cannot write into dataset 'drives' ({why})"
                assert "/srv/data" not in str(refused.value)
    finally:
        log.removeHandler(handler)
    records = [r for r in records if r.levelno >= logging.ERROR]
    assert len(records) == 2 and not any(r.exc_info for r in records), [r.getMessage() for r in records]
    assert all(r.getMessage() == f"zarrfeed: dataset 'drives' ({path}): uploads refused: its writer did not open: "
                                 f"{exc}" for r in records), [r.getMessage() for r in records]
