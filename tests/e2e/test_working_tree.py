"""The repository holds no dataset, and a test run leaves nothing in it (the check itself: conftest)."""
import subprocess

import pytest
import working_tree

DATASET_FILES = {".zgroup", ".zarray", ".zattrs", ".zmetadata", "zarrfeed.json", "zarrfeed.lease"}


def test_no_tracked_file_belongs_to_a_dataset():
    try:
        tracked = subprocess.run(["git", "-C", str(working_tree.ROOT), "ls-files"], capture_output=True, text=True,
                                 check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    found = [p for p in tracked if p.rsplit("/", 1)[-1] in DATASET_FILES or p.rsplit("/", 1)[-1].startswith(
        "zarrfeed.commits") or any(part.endswith(".zarr") for part in p.split("/")[:-1])]
    assert not found, f"datasets committed to the repository: {found}"


def test_left_behind_names_new_paths_but_not_caches():
    before = {".venv/", "loader/__pycache__/"}
    after = before | {"OUT/", "zarrfeed-demo.zarr/", "tests/__pycache__/", ".venv-3.12/", "loader/_order.cpython-313"
                      "-x86_64-linux-gnu.so", ".pytest_cache/", "notes.txt"}
    assert working_tree.left_behind(before, after) == ["OUT/", "notes.txt", "zarrfeed-demo.zarr/"]

