"""The locks under which a chunk that two writers share is read, merged and written back.

`ChunkLocks(folder)[key]` is an inter-process file lock for chunk `key` (fasteners), the file named after the
key inside `folder`: what zarr 2's `ProcessSynchronizer` is, kept as it was now that zarr-python is no longer
imported. Picklable, so worker processes lock the same files as their parent.
"""
from __future__ import annotations

import os

import fasteners


class ChunkLocks:
    """A mapping from chunk key to a lock that holds across processes on this machine."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = os.fspath(folder)

    def __getitem__(self, key: str) -> fasteners.InterProcessLock:
        return fasteners.InterProcessLock(os.path.join(self.folder, *key.split("/")))
