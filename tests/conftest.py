import os
import shutil
import signal
import stat
import uuid
import zipfile
from pathlib import Path

import pytest
import working_tree
from formats import FORMATS
from repo_paths import DP_BUFFER, DP_SAMPLES, REAL_SCENE
from s3server import S3Server
from zarrfeed.writer import synthetic, write_dataset

# A test sees only what it made: this session's host caches and budget ledger are in a namespace of their own
# (its child processes inherit it), so another copy of the suite, or a user's loaders, on this machine are
# invisible to it, and it to them.
os.environ["ZARRFEED_CACHE_NAMESPACE"] = f"tests-{os.getpid()}-{uuid.uuid4().hex[:8]}"

# Tests send Ctrl+C (SIGINT) to the commands they start. A suite started with SIGINT ignored or blocked (a
# background job of a non-interactive shell, nohup) passes that on to every child, which would never see it:
# those tests test zarrfeed, not the shell that started the suite.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})



def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_TREE_BEFORE] = working_tree.entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if it left anything in the checkout (`working_tree`)."""
    before, after = session.config.stash.get(_TREE_BEFORE, None), working_tree.entries()
    if before is None or after is None:
        return
    if left := working_tree.left_behind(before, after):
        session.config.get_terminal_writer().line(
            f"\nthe test run left {len(left)} path(s) in the working tree: {', '.join(left)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_TREE_BEFORE = pytest.StashKey["set[str] | None"]()



@pytest.fixture(params=FORMATS, ids=lambda f: f"v{f}")
def zarr_format(request) -> int:
    """The zarr format of the datasets a test writes (2, then 3: see formats.layout for the writer's options)."""
    return request.param


@pytest.fixture(scope="session")
def real_scene() -> Path:
    """The real L5Kit scene in ../shared/data (read-only); skipped outside CI when absent, required under CI."""
    if not REAL_SCENE.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"the real L5Kit scene is missing at {REAL_SCENE} (required under CI)")
        pytest.skip(f"the real L5Kit scene is not at {REAL_SCENE}")
    return REAL_SCENE


@pytest.fixture(scope="session")
def dp_buffer() -> Path:
    """Diffusion Policy's replay buffer in ../shared/data, written by its own `ReplayBuffer.add_episode`
    (read-only); skipped outside CI when absent, required under CI."""
    for path in (DP_BUFFER, DP_SAMPLES):
        if not path.exists():
            if os.environ.get("CI"):
                pytest.fail(f"Diffusion Policy's data is missing at {path} (required under CI)")
            pytest.skip(f"Diffusion Policy's data is not at {path}")
    return DP_BUFFER


@pytest.fixture(scope="session")
def dp_samples(dp_buffer):
    """What Diffusion Policy's own `SequenceSampler` returned on `dp_buffer` (see ../shared/data/README.md)."""
    import numpy as np

    with np.load(DP_SAMPLES) as data:
        return {k: data[k] for k in data.files}


def writable_copy(source: Path, out: Path) -> Path:
    """A copy of the read-only `source` at `out` that tests may change."""
    shutil.copytree(source, out)
    for p in [out, *out.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return out


@pytest.fixture
def dp_copy(dp_buffer, tmp_path) -> Path:
    """A writable copy of Diffusion Policy's replay buffer, for tests that change it."""
    return writable_copy(dp_buffer, tmp_path / "buffer.zarr")


@pytest.fixture
def real_copy(real_scene, tmp_path) -> Path:
    """A writable copy of the real scene, for tests that break it."""
    return writable_copy(real_scene, tmp_path / "scene.zarr")


@pytest.fixture
def real_zip(real_scene, tmp_path) -> Path:
    """The real scene as a zip store (stored, not deflated, as zarr's ZipStore writes)."""
    out = tmp_path / "scene.zip"
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for p in real_scene.rglob("*"):
            if p.is_file():
                z.write(p, p.relative_to(real_scene).as_posix())
    return out


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server):
    """A fresh bucket on the test S3 server: (bucket URL, server)."""
    return s3_server.bucket(), s3_server


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """A factory of small synthetic datasets, each made once per session for its arguments (read them, do not
    change them): small_dataset(scenes, seed, frames=..., agents_per_frame=..., chunks={...}) -> its path."""
    made: dict[tuple, Path] = {}

    def make(scenes: int, seed: int, chunks: dict | None = None, **shape) -> Path:
        key = (scenes, seed, tuple(sorted((chunks or {}).items())), tuple(sorted(shape.items())))
        if key not in made:
            path = tmp_path_factory.mktemp("data") / "d.zarr"
            write_dataset(path, synthetic.episodes(scenes, seed=seed, **shape), chunks=chunks, workers=0)
            made[key] = path
        return made[key]

    return make
