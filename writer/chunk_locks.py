"""The locks under which a chunk that two writers share is read, merged and written back.

`ChunkLocks(folder)[key]` is an inter-process file lock for chunk `key` (fasteners), the file named after the key
inside `folder`: what zarr 2's `ProcessSynchronizer` is, without importing zarr-python. Picklable, so worker processes
lock the same files as their parent. `private_folder()` makes the folder a writer's locks live in, and removes those
of writers that were killed before they could.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import fasteners

from .lease import process_start

PREFIX = "zarrfeed-chunk-locks-"


class ChunkLocks:
    """A mapping from chunk key to a lock that holds across processes on this machine."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = os.fspath(folder)

    def __getitem__(self, key: str) -> fasteners.InterProcessLock:
        return fasteners.InterProcessLock(os.path.join(self.folder, *key.split("/")))


def private_folder() -> str:
    """A new folder in the temporary directory for this process's chunk locks, named after the process (its pid
    and start time). Its writer removes it when closed; one killed cannot, so the folders of processes that no
    longer run are removed here first (a test suite that kills writers left about 150 an hour)."""
    remove_abandoned()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{process_start(os.getpid())}-")


def remove_abandoned() -> None:
    """Remove the lock folders of processes that no longer run (a folder named without a process is left)."""
    top = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(top) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        pid, start, *_ = name[len(PREFIX):].split("-") + ["", ""]
        if not (pid.isdigit() and start.isdigit()):
            continue  # not named after a process (an older zarrfeed's): left alone
        if str(process_start(int(pid))) == start:
            continue  # its process still runs
        shutil.rmtree(os.path.join(top, name), ignore_errors=True)
