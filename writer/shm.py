"""Shared-memory blocks that never outlive their owner in /dev/shm.

A block is a file in /dev/shm mapped by the owner and by its worker processes. The owner unlinks the name as
soon as every worker has mapped it: the memory stays shared through the mappings, and nothing is left in
/dev/shm if any process is killed afterwards. We use mmap directly rather than
`multiprocessing.shared_memory` because that module's resource tracker (Python 3.11) unlinks blocks that
workers merely attach to and warns of "leaked" segments at their exit.
"""
from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "zarrfeed-"


class ShmSpaceError(OSError):
    """/dev/shm cannot hold what is asked for (instead of a later "Bus error")."""


def check_room(nbytes: int, what: str) -> None:
    """Raise `ShmSpaceError` saying how much is needed if /dev/shm has less than `nbytes` free."""
    st = os.statvfs(SHM_DIR)
    free = st.f_bavail * st.f_frsize
    if free < nbytes:
        raise ShmSpaceError(f"{what} needs {nbytes / 2**20:.0f} MiB of shared memory but /dev/shm has "
                            f"{free / 2**20:.0f} MiB free; enlarge /dev/shm (docker: --shm-size) or use fewer "
                            "or smaller buffers")


class SharedBlock:
    """`size` bytes of shared memory, as `buf` (a writable memoryview)."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        self.name, self.size = name, size
        path = SHM_DIR / name
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            # MAP_POPULATE maps every page now, in one go, instead of one page fault per 4 KiB on first touch
            self._mmap = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            if create:
                path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)
        self.linked = create

    @classmethod
    def create(cls, size: int) -> "SharedBlock":
        """A new block named after this process, so stale blocks of dead owners can be found."""
        return cls(f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}", max(size, 1), create=True)

    @classmethod
    def attach(cls, name: str, size: int) -> "SharedBlock":
        return cls(name, size, create=False)

    def unlink(self) -> None:
        """Remove the name; mappings stay valid until closed."""
        if self.linked:
            (SHM_DIR / self.name).unlink(missing_ok=True)
            self.linked = False

    def close(self) -> None:
        self.unlink()
        self.buf.release()
        try:
            self._mmap.close()
        except BufferError:  # a numpy view still exports the buffer; the mapping goes with the last view
            pass


def reap_stale() -> list[str]:
    """Unlink zarrfeed blocks whose owner process no longer exists; return their names."""
    reaped = []
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        try:
            pid = int(path.name[len(PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
            reaped.append(path.name)
        except PermissionError:
            pass
    return reaped
