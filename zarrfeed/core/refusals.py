"""Writes the operating system refuses (a read-only file system, no permission, no space left, a disk quota used
up), said in the user's words: what could not be written, where the user named it, and why, in one line, as
`first.zarr: the agents mask cannot be stored in it (a read-only file system: first.zarr)`. The system's own
words name a file the user never heard of (a lock file, a chunk), sometimes as a bytes repr
(`[Errno 30] Read-only file system: b'first.zarr/.zarrfeed.lock'`). Every command and writer that writes
says a refusal through `refusal` and `write_refused`, so the wording is one."""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from typing import Any, Iterator

from .errors import WriteRefused

# why, by the system's error number
_WHY = {errno.EROFS: "a read-only file system", errno.EACCES: "no permission to write",
        errno.EPERM: "no permission to write", errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "the disk quota is used up"}
FULL = (errno.ENOSPC, errno.EDQUOT)  # refusals that freeing space ends


def read_only_mount(path: str | os.PathLike) -> bool:
    """Whether `path` is on a read-only mount."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def why_unwritable(path: str | os.PathLike, read_only: bool) -> str:
    """"a read-only file system: PATH" or "no permission to write: PATH"."""
    return f"{_WHY[errno.EROFS if read_only else errno.EACCES]}: {path}"


def refusal(exc: BaseException | None, where: Any) -> str | None:
    """Why the operating system refused a write, naming `where` (the place the user gave: a dataset, an output
    folder or file, not the file the system refused), e.g. "no space left on the device: first.zarr"; None
    when `exc` is not such a refusal. One that names a file elsewhere (an input read without permission, a lock
    in a temporary folder) is none: it is not `where` that was refused."""
    code = getattr(exc, "errno", None)
    if not isinstance(exc, OSError) or code not in _WHY:
        return None
    name = getattr(exc, "filename", None)
    if isinstance(name, (str, bytes)) and not _concerns(os.fsdecode(name), str(where)):
        return None
    return f"{_WHY[code]}: {where}"


def _concerns(path: str, where: str) -> bool:
    """Whether a refusal of `path` is one of `where`: `where` itself, a file inside it, a folder above it (made
    on the way to it), or a file beside it (written aside, then renamed into place)."""
    path, where = os.path.abspath(path), os.path.abspath(where)
    return _within(path, where) or _within(where, path) or os.path.dirname(path) == os.path.dirname(where)


def _within(path: str, where: str) -> bool:
    """Whether `path` is `where` or inside it (both absolute)."""
    return path == where or path.startswith(where.rstrip(os.sep) + os.sep)


def write_refused(exc: BaseException | None, where: Any, what: str, then: str = "", cli_then: str | None = None
                  ) -> WriteRefused | None:
    """`WriteRefused`: "WHERE: WHAT (WHY)" and `then` (what is kept, what to do; `cli_then` in the command
    line's words) if `exc` is a refusal (see `refusal`), else None."""
    why = refusal(exc, where)
    if why is None:
        return None
    said = f"{where}: {what} ({why})"
    return WriteRefused(said + then, getattr(exc, "errno", None), said + cli_then if cli_then is not None else None)


@contextmanager
def refused_writes(where: Any, what: str) -> Iterator[None]:
    """Raise a refusal inside as `WriteRefused` ("WHERE: WHAT (WHY)"); other errors as they are."""
    try:
        yield
    except OSError as exc:
        refused = write_refused(exc, where, what)
        if refused is None:
            raise
        raise refused from None
