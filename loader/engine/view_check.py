"""A debug mode for the classic bug of a zero-copy loader: using a batch's views after asking for the next
(docs/architecture.md#views).

With `check_views=True` (or the environment variable ZARRFEED_CHECK_VIEWS=1) each batch is copied into a page
of memory of its own, and when the next batch is asked for, that memory is made unreadable (`mprotect`
PROT_NONE). Touching a stale view then stops the process at once with a segmentation fault, and Python's
faulthandler (enabled here) prints the line that touched it, instead of the training silently reading
another batch's rows. Sealed buffers are reused after `keep` batches, so a view kept that long goes unseen.
It copies every batch: for debugging only.
"""
from __future__ import annotations

import collections
import ctypes
import faulthandler
import mmap
import os

import numpy as np

_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def requested(check_views: bool | None) -> bool:
    """`check_views`, or if it is None the environment variable ZARRFEED_CHECK_VIEWS."""
    if check_views is not None:
        return bool(check_views)
    return os.environ.get("ZARRFEED_CHECK_VIEWS", "").strip().lower() not in ("", "0", "false", "no")


class _Page:
    def __init__(self, size: int) -> None:
        self.size = -(-max(size, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.mem = mmap.mmap(-1, self.size)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))

    def protect(self, prot: int) -> None:
        if _libc.mprotect(self.address, self.size, prot) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mprotect: {os.strerror(err)}")


class ViewChecker:
    """Hands out each batch as views of its own memory, sealed when the next batch is asked for."""

    def __init__(self, keep: int = 256) -> None:
        faulthandler.enable()
        self._keep = keep
        self._sealed: collections.deque[_Page] = collections.deque()
        self._current: _Page | None = None

    def hand_out(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.seal()
        need = sum(-(-a.nbytes // 64) * 64 for a in batch.values())
        page = None
        if len(self._sealed) >= self._keep:
            page = self._sealed.popleft()
            if page.size < need:
                page = None
            else:
                page.protect(_PROT_RW)
        page = page or _Page(need)
        out, offset = {}, 0
        for name, a in batch.items():
            view = np.frombuffer(page.mem, a.dtype, count=a.size, offset=offset).reshape(a.shape)
            view[...] = a
            out[name] = view
            offset += -(-a.nbytes // 64) * 64
        self._current = page
        return out

    def seal(self) -> None:
        """Make the batch handed out last unreadable (its views now fault when touched)."""
        if self._current is not None:
            self._current.protect(_PROT_NONE)
            self._sealed.append(self._current)
            self._current = None
