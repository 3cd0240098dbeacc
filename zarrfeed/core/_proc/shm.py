"""Shared memory that never appears in /dev/shm and is freed when the last process using it exits.

A block is an anonymous memory file (`memfd_create`) mapped by its owner; worker processes started with
`fork` inherit the mapping, and those started with `spawn` or `forkserver` receive a duplicate of its file
descriptor when the block is pickled into their arguments. There is no name to unlink, so a crash of any
process, even SIGKILL, leaks nothing, and /dev/shm's size (64 MiB in a default Docker container, the usual
cause of "Bus error" in other loaders) does not limit it. We do not use `multiprocessing.shared_memory`:
its blocks are named files in /dev/shm, and its resource tracker (Python 3.11) unlinks blocks that workers
merely attach to.
"""
from __future__ import annotations

import mmap
import os
import sys
from typing import Any

from ..errors import ShmSpaceError

if not hasattr(os, "memfd_create"):  # Linux only: say so at import, not with an AttributeError mid-ingest
    raise ImportError(f"zarrfeed runs on Linux (it shares memory through memfd_create and reads /proc); this "
                      f"is {sys.platform}. On macOS or Windows, run it in a Linux container or VM.")


def available_memory() -> int:
    """Bytes of memory available for new allocations (MemAvailable), or a large number if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def check_room(nbytes: int, what: str) -> None:
    """Raise `ShmSpaceError` saying how much is needed if less than `nbytes` of memory is available."""
    free = available_memory()
    if free < nbytes:
        raise ShmSpaceError(f"{what} needs {nbytes / 2**20:.0f} MiB of shared memory but only "
                            f"{free / 2**20:.0f} MiB is available; use fewer or smaller buffers")


class SharedBlock:
    """`size` bytes of shared memory, as `buf` (a writable memoryview). With `populate` (default) every page
    is mapped now, in one go, instead of one page fault per 4 KiB on first touch; without it, pages are
    mapped as they are first written (for large blocks filled a little at a time, such as a cache that keeps
    a whole table: populating it would delay the first batch in each process that maps it)."""

    def __init__(self, size: int, fd: int | None = None, populate: bool = True) -> None:
        self.size = max(int(size), 64)
        self.populate = populate
        if fd is None:
            fd = os.memfd_create("zarrfeed", os.MFD_CLOEXEC)
            os.ftruncate(fd, self.size)
        self._fd = fd
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        self._mmap = mmap.mmap(fd, self.size, flags=flags)
        self.buf = memoryview(self._mmap)

    @property
    def fd(self) -> int:
        """The memory file's descriptor (-1 once closed)."""
        return self._fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocess.reduction import DupFd  # valid while a worker is being started

        return _attach, (DupFd(self._fd), self.size, self.populate)

    def close(self) -> None:
        """Unmap and close; the memory is freed once no process maps it."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            self.buf.release()
            self._mmap.close()
        except BufferError:  # a numpy view still exports the buffer; the mapping goes with the last view
            pass
        finally:
            os.close(fd)


def _attach(dup: Any, size: int, populate: bool) -> SharedBlock:
    return SharedBlock(size, fd=dup.detach(), populate=populate)
