"""The file operations of the store of a local directory (`stores`), in one place: what it writes, syncs, renames, links
and deletes. `OS_FILES` does them on the machine's file system; the test suite puts a simulated power loss in
their place (tests/power_loss.py), which keeps, at a chosen operation, only what was made durable.

Durability on a local file system, as POSIX gives it: a file's bytes survive a power loss once the file is
fsynced, and a name created, replaced or removed in a directory once that directory is fsynced (a rename is
durable only then: nora 723, doltlite 509). The directory store orders them: a temporary file written and
fsynced, renamed over its key, then the directory fsynced.
"""
from __future__ import annotations

import os


class Files:
    """File operations on the machine's file system (`OS_FILES`)."""

    def write(self, path: str, data: bytes, sync: bool) -> None:
        """Create or truncate `path` and write `data`; with `sync`, fsync it before returning."""
        with open(path, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())

    def sync_file(self, path: str) -> None:
        """fsync the file at `path`: its bytes become durable (written earlier, perhaps by another process)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target)

    def link(self, source: str, target: str) -> None:
        """A hard link; `FileExistsError` if `target` exists."""
        os.link(source, target)

    def create_exclusive(self, path: str, data: bytes, sync: bool) -> bool:
        """Create `path` with `data` only if it does not exist (False if it does)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        return True

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def makedirs(self, path: str) -> list[str]:
        """Create `path` and its missing parents; the folders created, outermost first."""
        made = []
        while not os.path.isdir(path):
            made.append(path)
            path = os.path.dirname(path)
        for folder in reversed(made):
            try:
                os.mkdir(folder)
            except FileExistsError:  # made meanwhile by another writer
                pass
        return made[::-1]

    def sync_folder(self, path: str) -> None:
        """fsync a folder: the names created, replaced or removed in it become durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


OS_FILES = Files()
