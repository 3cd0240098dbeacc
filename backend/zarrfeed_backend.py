"""zarrfeed's build backend: setuptools' own, with one file more in an editable install.

The checkout's layout (loader/ and writer/ beside zarrfeed/, installed as zarrfeed.loader and zarrfeed.writer)
is one a sys.path entry cannot express, so setuptools installs it editable (`pip install -e .`) through an
import hook that Python asks after searching sys.path. That search takes any folder named `zarrfeed` in the
current folder for a namespace package, and the hook is never asked: run from the folder that holds the clone
(itself named zarrfeed), or beside an empty `zarrfeed/`, `from zarrfeed import Loader` would fail ("unknown
location"). So the editable wheel also carries `zarrfeed-checkout.pth`, which puts build/checkout/ on sys.path: a
folder holding one link, zarrfeed -> the checkout's zarrfeed/. Python takes a package found there over any
namespace folder, and the hook still finds zarrfeed.loader and zarrfeed.writer, so files added later are seen,
as before. Strict and compat editable installs (`--config-settings editable_mode=...`), wheels and sdists are
setuptools' own (neither mode serves here: strict links every file into build/, so `python -c` run in the
checkout imports its zarrfeed/ without loader/ and writer/; compat cannot place them at all).
"""
from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403  (every other hook, as setuptools has it)

PTH = "zarrfeed-checkout.pth"
LINK = Path("build", "checkout", "zarrfeed")  # in the checkout (the current folder while a backend runs)


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    name = build_meta.build_editable(wheel_directory, config_settings, metadata_directory)
    settings = config_settings or {}
    if (settings.get("editable_mode") or settings.get("editable-mode") or "lenient") != "lenient":
        return name
    try:
        LINK.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(LINK):
            LINK.unlink()
        LINK.symlink_to(Path("..", "..", "zarrfeed"), target_is_directory=True)
    except OSError:  # no links on this file system: the install works as setuptools makes it
        return name
    add_to_wheel(Path(wheel_directory, name), PTH, f"{LINK.parent.resolve()}\n".encode())
    return name


def add_to_wheel(wheel: Path, name: str, data: bytes) -> None:
    """Write `data` as file `name` at the top of `wheel`, recorded in its RECORD (path, digest, size)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rewritten = wheel.with_name(wheel.name + ".part")
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as new:
        record = next(i for i in old.infolist() if i.filename.endswith(".dist-info/RECORD"))
        for item in old.infolist():
            if item is not record:
                new.writestr(item, old.read(item))
        new.writestr(name, data)
        lines = old.read(record).rstrip(b"\n") + b"\n"
        new.writestr(record, lines + f"{name},sha256={digest},{len(data)}\n".encode())
    os.replace(rewritten, wheel)
