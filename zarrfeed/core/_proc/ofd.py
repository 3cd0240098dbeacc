"""Byte-range locks that belong to one process, on a memory file that several processes share.

Linux "open file description" (OFD) locks are owned by an open file description, not by a process or a
descriptor: each process opens a description of its own (through /proc/self/fd), so its locks exclude every
other process even though they all hold the same file, and the kernel drops them when the process dies,
SIGKILL included. A lock byte may lie beyond the end of the file (POSIX allows it), so lock bytes take no
room in the shared memory. fcntl's record locks would be dropped when any descriptor of the file is closed,
and flock locks a whole file: neither fits.

A wait inside fcntl (F_OFD_SETLKW) has no bound and nothing can look at it: a holder that is stopped (SIGSTOP, a
debugger) holds its locks for as long as it is stopped. `ProcessLocks.lock_watched` waits in short steps instead,
calling back between them (see `take_in_steps`), so that a caller can say the wait and end it.
"""
from __future__ import annotations

import fcntl
import os
import struct
import time
from typing import Callable

FIRST_STEP, LAST_STEP = 0.0005, 0.05  # seconds of a watched wait's steps: doubling from the first to the last


def take_in_steps(take: Callable[[float], bool], waiting: Callable[[], None]) -> None:
    """Wait for a lock that `take(step)` tries to take within `step` seconds, calling `waiting()` after each try
    that failed (it may raise, which ends the wait without the lock). The steps double from FIRST_STEP to
    LAST_STEP: a lock held briefly is taken within a millisecond or two, and a long wait is looked at every
    LAST_STEP."""
    step = FIRST_STEP
    while not take(step):
        waiting()
        step = min(2 * step, LAST_STEP)


def _flock(kind: int, start: int) -> bytes:
    return struct.pack("hhqqi", kind, os.SEEK_SET, start, 1, 0)


class ProcessLocks:
    """Lock bytes of the memory file `fd`, taken for this process (a forked child makes its own)."""

    def __init__(self, fd: int) -> None:
        self.fd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)

    def lock(self, start: int, wait: bool = True, shared: bool = False) -> bool:
        """Take byte `start` (exclusively, or `shared` with other processes' shared locks); False if
        `wait` is off and another process holds it."""
        op = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
        try:
            fcntl.fcntl(self.fd, op, _flock(fcntl.F_RDLCK if shared else fcntl.F_WRLCK, start))
            return True
        except (BlockingIOError, PermissionError):  # EAGAIN, or EACCES on some kernels: held
            return False

    def lock_watched(self, start: int, waiting: Callable[[], None], shared: bool = False) -> None:
        """Take byte `start` as `lock` does, waiting as long as another process holds it, but in steps that call
        `waiting()` between them (see `take_in_steps`; if it raises, the lock is not taken)."""
        def take(step: float) -> bool:
            if self.lock(start, wait=False, shared=shared):
                return True
            time.sleep(step)
            return False
        take_in_steps(take, waiting)

    def unlock(self, start: int) -> None:
        fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_UNLCK, start))

    def held(self, start: int) -> bool:
        """Whether another process holds byte `start`, exclusively or shared (this process's own locks never
        count)."""
        got = fcntl.fcntl(self.fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK, start))
        return struct.unpack("hhqqi", got)[0] != fcntl.F_UNLCK

    def close(self) -> None:
        """Drop every lock of this process on the file."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
