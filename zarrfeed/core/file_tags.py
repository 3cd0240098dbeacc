"""What tells one state of a file from another without reading it: its size, modification time and identity
(inode; an object store's ETag, LastModified, generation or version) as its filesystem states them.

Files read in place by several processes over a long time (a LeRobot root's data and video files) are tagged
once when the dataset is opened; every read checks the file still has that tag after reading it, so that a file
replaced or rewritten under an open loader is refused in one line rather than read as a mix of old and new.
"""
from __future__ import annotations

import io
import os
from typing import Any

from .errors import ChunkError

Tag = tuple[tuple[str, str], ...]
# what a file's `fs.info` says that changes when its contents are replaced (local: inode and mtime; S3: ETag and
# LastModified; GCS: generation; any: size). Never "created": on Linux it is the ctime, which chmod changes.
KEYS = ("size", "mtime", "ino", "ETag", "etag", "LastModified", "last_modified", "generation", "VersionId",
        "version_id", "md5Hash")


def tag_of(info: dict[str, Any]) -> Tag:
    """The tag of a file described by `info` (an fsspec `info` dict)."""
    return tuple((k, str(info[k])) for k in KEYS if info.get(k) is not None)


def file_tag(fs: Any, path: str) -> Tag | None:
    """The tag of the file at `path` of `fs` as it is now; None when there is no such file."""
    invalidate = getattr(fs, "invalidate_cache", None)
    if invalidate is not None and not _local(fs):
        invalidate(path)  # (an object store's filesystem may answer from its listing cache)
    try:
        return tag_of(fs.info(path))
    except FileNotFoundError:
        return None


def check_unchanged(fs: Any, path: str, name: str, recorded: Tag | None) -> None:
    """`ChunkError` naming `name` if the file at `path` no longer has the tag `recorded` (taken when its dataset
    was opened): its contents may differ from what the rest of the dataset was read with."""
    now = file_tag(fs, path)
    if now != recorded:
        what = "appeared" if recorded is None else "is gone" if now is None else "was replaced or rewritten"
        raise ChunkError(f"{name}: {what} since the dataset was opened (its size, time or identity differ); "
                         "open the dataset again to read it as it is now")


def check_handle(handle: Any, name: str, recorded: Tag | None) -> None:
    """`ChunkError` naming `name` if the open file `handle` is not the file tagged `recorded`: a handle kept open
    across reads must be checked itself, since its path may have been swapped to another file while it was
    opened and back since. Local files by `fstat`; others by what the handle was opened with (an fsspec file's
    `details`: ETag, size...), comparing what both state."""
    details = getattr(handle, "details", None)
    if isinstance(details, dict):
        now = dict(tag_of(details))
    else:
        try:
            st = os.fstat(handle.fileno())
        except (AttributeError, OSError, io.UnsupportedOperation):
            return  # (nothing to tell it by: the path's check after each read is all there is)
        now = dict(tag_of({"size": st.st_size, "mtime": st.st_mtime, "ino": st.st_ino}))
    then = dict(recorded or ())
    shared = now.keys() & then.keys()
    if recorded is None or any(now[k] != then[k] for k in shared):
        raise ChunkError(f"{name}: was replaced or rewritten since the dataset was opened (the file opened is "
                         "another); open the dataset again to read it as it is now")


def _local(fs: Any) -> bool:
    protocol = getattr(fs, "protocol", "")
    return "file" in (protocol if isinstance(protocol, (tuple, list)) else (protocol,))
