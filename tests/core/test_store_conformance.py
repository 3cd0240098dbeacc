"""What every store must do alike, as zarr's store tests check it: the same tests on a directory, a zip (which
is read-only: its writes are refused in one line) and the S3 test server. Round trip, commits readers can pin,
a killed ingest resumed to exactly its input, and one writer at a time."""
import os
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from expected import assert_holds, wait_for_scenes
from zarrfeed.loader import Dataset, Loader
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter
from zarrfeed.writer.lease import LeaseHeld

from repo_paths import SUPPORT
SMALL = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}
CHILD_EPISODES = dict(seed=5, frames=40, agents_per_frame=300)  # what writer_child.py writes


def episodes(n: int, seed: int) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=20, agents_per_frame=30))


@dataclass
class Store:
    """Where a test's datasets live: `url(name)` and the options to open it; a zip is written as a directory,
    then zipped (`publish`), and read from there."""

    kind: str
    root: str
    options: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    @property
    def writable(self) -> bool:
        return self.kind != "zip"

    def url(self, name: str) -> str:
        return f"{self.root}/{name}.zip" if self.kind == "zip" else f"{self.root}/{name}.zarr"

    def write(self, name: str, eps: list[dict], mode: str = "w") -> str:
        """Ingest `eps` into dataset `name` (for a zip: into a directory, zipped after); its URL."""
        target = f"{self.root}/{name}.zarr"
        with DatasetWriter(target, workers=2, chunks=SMALL, mode=mode, storage_options=self.options) as w:
            w.ingest(eps)
        if self.kind == "zip":
            out = Path(self.url(name))
            out.unlink(missing_ok=True)
            with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
                for p in Path(target).rglob("*"):
                    if p.is_file():
                        z.write(p, p.relative_to(target).as_posix())
        return self.url(name)

    def open(self, url: str, commit: int | None = None) -> Dataset:
        return Dataset.open(url, storage_options=self.options, commit=commit)


@pytest.fixture(params=["dir", "zip", "s3"])
def store(request, tmp_path) -> Store:
    if request.param == "s3":
        bucket, server = request.getfixturevalue("s3")
        return Store("s3", bucket, server.options, server.env)
    return Store(request.param, str(tmp_path))


class TestEveryStore:
    def test_round_trip(self, store):
        eps = episodes(3, seed=1)
        ds = store.open(store.write("d", eps))
        assert_holds(ds, eps)
        with Loader(ds, "agents", batch_size=500, num_workers=2, copy=True) as loader:
            rows = np.concatenate([b["track_id"] for b in loader])
        assert np.array_equal(np.sort(rows), np.sort(ds["agents"][:]["track_id"]))

    def test_a_reader_pins_a_commit_while_a_writer_appends(self, store):
        first, more = episodes(2, seed=2), episodes(2, seed=3)
        url = store.write("d", first)
        pinned = store.open(url).commit
        url = store.write("d", more, mode="a")
        assert_holds(store.open(url, commit=pinned), first)
        assert_holds(store.open(url), first + more)

    def test_a_killed_ingest_resumes_to_exactly_its_input(self, store):
        url = store.url("d")
        if not store.writable:
            with pytest.raises(ValueError, match="zip stores are read-only"):
                DatasetWriter(url, workers=0)
            return
        env = {**os.environ, **store.env}
        run = [sys.executable, str(SUPPORT / "writer_child.py"), url, "30", "2"]
        proc = subprocess.Popen([*run, "0.03"], env=env, stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()
        wait_for_scenes(url, 4, store.options)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        resumed = subprocess.run([*run, "0", "--resume"], env=env, capture_output=True, text=True, timeout=180)
        assert resumed.returncode == 0, resumed.stderr
        assert_holds(store.open(url), list(synthetic.episodes(30, **CHILD_EPISODES)))

    def test_one_writer_at_a_time(self, store):
        url = store.write("d", episodes(1, seed=4))
        if not store.writable:
            with pytest.raises(ValueError, match="zip stores are read-only"):
                DatasetWriter(url, workers=0, mode="a")
            return
        with DatasetWriter(url, workers=0, mode="a", storage_options=store.options) as w:
            with pytest.raises(LeaseHeld, match=f"being written by pid {os.getpid()}"):
                DatasetWriter(url, workers=0, mode="a", storage_options=store.options)
            w.ingest(episodes(1, seed=5))
        with DatasetWriter(url, workers=0, mode="a", storage_options=store.options):  # released at close
            pass
        assert store.open(url).rows["scenes"] == 2
