import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest
from s3server import S3Server

REAL_SCENE = Path(os.environ.get("ZARRFEED_REAL_SCENE")
                  or Path(__file__).resolve().parents[2] / "shared" / "data" / "l5kit_single_scene.zarr")


@pytest.fixture(scope="session")
def real_scene() -> Path:
    """The real L5Kit scene in ../shared/data (read-only); skipped outside CI when absent, required under CI."""
    if not REAL_SCENE.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"the real L5Kit scene is missing at {REAL_SCENE} (required under CI)")
        pytest.skip(f"the real L5Kit scene is not at {REAL_SCENE}")
    return REAL_SCENE


@pytest.fixture
def real_copy(real_scene, tmp_path) -> Path:
    """A writable copy of the real scene, for tests that break it."""
    out = tmp_path / "scene.zarr"
    shutil.copytree(real_scene, out)
    for p in [out, *out.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return out


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
