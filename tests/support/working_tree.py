"""What the test suite finds in the repository's working tree before and after it runs: a test writes only
under its own temporary folders, so a run that leaves a file or a folder in the checkout (a dataset written to
the current folder by a child process, as `OUT/` once was) fails the session (see `conftest`)."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what running and building leave by design: caches, compiled extensions, the environments CI makes
CACHES = {"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", "build"}


def by_design(path: str) -> bool:
    return any(part in CACHES or part.startswith(".venv") or part.endswith((".so", ".egg-info"))
               for part in path.rstrip("/").split("/"))


def entries() -> set[str] | None:
    """Every untracked path of the checkout, ignored ones included (folders as one entry), and every entry of its
    root (git does not list an empty folder); None outside a git checkout (an installed copy of the tests, a
    source archive)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--ignored", "--untracked-files=normal"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    root = {p.name + "/" if p.is_dir() else p.name for p in ROOT.iterdir()}
    return root | {line[3:] for line in out.stdout.splitlines() if line[:2] in ("??", "!!")}


def left_behind(before: set[str], after: set[str]) -> list[str]:
    """The paths that appeared between `before` and `after`, except what running tests leaves by design."""
    return sorted(p for p in after - before if not by_design(p))
