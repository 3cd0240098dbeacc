"""A simulated power loss for `DirectoryStore`, in the spirit of RocksDB's FaultInjectionTestFS: the store's file
operations (`zarrfeed.core.files.Files`) are done for real, and recorded as a disk would keep them: a file's bytes
are durable once it is fsynced, a name created, replaced or removed in a folder once the folder is fsynced. At a
chosen operation the power fails (`PowerLoss`, raised there and by every operation after it); `recover` then
writes the folder as the disk would hold it after a restart: the folders' durable names, each naming the bytes
its file held when it was last fsynced (a file never fsynced is empty, or with `tear`, a random part of what was
written to it). What was on disk before the simulation started is durable. `in_place` lists the files written
over where they stood (none, for a store that writes each object aside and renames it over the old one).
"""
from __future__ import annotations

import os
import random
import threading

from zarrfeed.core.files import Files

FOLDER = "folder"  # a name that is a folder (what `entries` map a name to, instead of a file's number)


class PowerLoss(BaseException):
    """The machine lost power (a BaseException: nothing in zarrfeed may catch it as an error and go on)."""


class SimulatedDisk(Files):
    """The file operations of stores under `root` (see the module's docstring). `crash_at`: the operation
    (counted from 1) at which the power fails; None: never. `ops` counts those made so far."""

    def __init__(self, root: str | os.PathLike, crash_at: int | None = None, tear: bool = False,
                 seed: int = 0) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.crash_at, self.tear, self.rng = crash_at, tear, random.Random(seed)
        self.ops, self.dead = 0, False
        self.in_place: list[str] = []  # files written over where they are (a store writes aside and renames)
        self._lock = threading.RLock()
        self._next = 0
        self._inode: dict[str, int] = {}  # path -> its file's number, now
        self._written: dict[int, bytes] = {}  # file -> the bytes written to it
        self._synced: dict[int, bytes] = {}  # file -> the bytes it held when last fsynced
        self._names: dict[str, dict[str, int | str]] = {}  # folder -> name -> file or FOLDER, now
        self._durable: dict[str, dict[str, int | str]] = {}  # folder -> its names when last fsynced
        top = os.path.dirname(self.root)
        self._scan(top, depth=0)

    # ------------------------------------------------------------ what was there before: durable
    def _scan(self, folder: str, depth: int) -> None:
        names: dict[str, int | str] = {}
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                names[entry.name] = FOLDER
                if depth > 0 or entry.path == self.root:  # the root's siblings are not ours to follow
                    self._scan(entry.path, depth + 1)
            elif entry.is_file(follow_symlinks=False) and (depth > 0 or entry.path == self.root):
                n = self._file(entry.path)
                with open(entry.path, "rb") as f:
                    self._written[n] = self._synced[n] = f.read()
                names[entry.name] = n
        self._names[folder] = names
        self._durable[folder] = dict(names)

    def _file(self, path: str) -> int:
        self._next += 1
        self._inode[path] = self._next
        return self._next

    # ------------------------------------------------------------ the power
    def _op(self) -> None:
        """Count one operation; the power fails at `crash_at`, and stays off."""
        if self.dead:
            raise PowerLoss("the power is off")
        self.ops += 1
        if self.crash_at is not None and self.ops >= self.crash_at:
            self.dead = True
            raise PowerLoss(f"power lost at operation {self.ops}")

    def _set(self, path: str, value: int | str | None) -> None:
        folder, name = os.path.split(path)
        names = self._names.setdefault(folder, {})
        if value is None:
            names.pop(name, None)
        else:
            names[name] = value

    # ------------------------------------------------------------ Files, recorded
    def write(self, path: str, data: bytes, sync: bool) -> None:
        with self._lock:
            self._op()
            if path in self._inode:
                self.in_place.append(os.path.relpath(path, self.root))
            super().write(path, data, sync=False)
            n = self._inode.get(path) or self._file(path)
            self._written[n] = bytes(data)
            self._set(path, n)
            if sync:
                self._op()  # (no real fsync: what it would make durable is recorded instead)
                self._synced[n] = bytes(data)

    def sync_file(self, path: str) -> None:
        with self._lock:
            self._op()
            n = self._inode[path]
            self._synced[n] = self._written[n]

    def replace(self, source: str, target: str) -> None:
        with self._lock:
            self._op()
            super().replace(source, target)
            self._inode[target] = self._inode.pop(source)
            self._set(target, self._inode[target])
            self._set(source, None)

    def link(self, source: str, target: str) -> None:
        with self._lock:
            self._op()
            super().link(source, target)
            self._inode[target] = self._inode[source]
            self._set(target, self._inode[target])

    def create_exclusive(self, path: str, data: bytes, sync: bool) -> bool:
        with self._lock:
            self._op()
            if not super().create_exclusive(path, data, sync=False):
                return False
            n = self._file(path)
            self._written[n] = bytes(data)
            self._set(path, n)
            if sync:
                self._op()
                self._synced[n] = bytes(data)
            return True

    def unlink(self, path: str) -> None:
        with self._lock:
            self._op()
            super().unlink(path)
            self._inode.pop(path, None)
            self._set(path, None)

    def makedirs(self, path: str) -> list[str]:
        with self._lock:
            made, missing = [], []
            while not os.path.isdir(path):
                missing.append(path)
                path = os.path.dirname(path)
            for folder in reversed(missing):
                self._op()
                os.mkdir(folder)
                self._set(folder, FOLDER)
                self._names[folder] = {}
                made.append(folder)
            return made

    def sync_folder(self, path: str) -> None:
        with self._lock:
            self._op()
            self._durable[path] = dict(self._names.get(path, {}))

    # ------------------------------------------------------------ after the restart
    def recover(self, into: str | os.PathLike) -> bool:
        """Write the root folder as the disk holds it after the power loss into `into` (which must not exist);
        False if the root itself did not survive (its name was never made durable in its parent)."""
        with self._lock:
            top, name = os.path.split(self.root)
            if self._durable.get(top, {}).get(name) != FOLDER:
                return False
            self._copy(self.root, os.fspath(into))
            return True

    def _copy(self, folder: str, out: str) -> None:
        os.mkdir(out)
        for name, what in sorted(self._durable.get(folder, {}).items()):
            if what == FOLDER:
                self._copy(os.path.join(folder, name), os.path.join(out, name))
                continue
            data = self._synced.get(what)
            if data is None:  # named durably, its bytes never synced: empty, or torn
                written = self._written.get(what, b"")
                data = written[:self.rng.randrange(len(written) + 1)] if self.tear and written else b""
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
