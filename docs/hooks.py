"""MkDocs hook: lets mkdocstrings read `zarrfeed.writer` and `zarrfeed.loader` where they are installed from.

The repository keeps them in ./writer and ./loader (setuptools' package-dir), which a static reader of
./zarrfeed cannot find. Before the build, a folder of symbolic links is laid out as the installed package is
(every entry of zarrfeed/, plus each subpackage where `importlib` finds it) and given to the Python handler
as its search path, so the reference is read from the source, with its annotations, without importing it.
"""
from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

MOVED = ("zarrfeed.writer", "zarrfeed.loader")  # subpackages whose folder is not under zarrfeed/


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"docs: package {name} is not installed here (pip install -e '.[docs]')")
    return Path(next(iter(spec.submodule_search_locations)))


def installed_layout() -> Path:
    """A temporary folder holding `zarrfeed/` laid out as installed, made of links into the source."""
    root = Path(tempfile.mkdtemp(prefix="zarrfeed-api-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    top = root / "zarrfeed"
    top.mkdir()
    for entry in _package_dir("zarrfeed").iterdir():
        if entry.name != "__pycache__" and entry.name not in {m.split(".")[1] for m in MOVED}:
            (top / entry.name).symlink_to(entry)
    for name in MOVED:
        (top / name.split(".")[1]).symlink_to(_package_dir(name))
    return root


@event_priority(100)  # before mkdocstrings makes its handlers, in its own on_config
def on_config(config: Any) -> Any:
    handlers = config.plugins["mkdocstrings"].config.handlers
    handlers.setdefault("python", {})["paths"] = [str(installed_layout())]
    return config
