"""Where a dataset lives: a local directory, a read-only `.zip`, or any fsspec URL with its storage options.

A `Location` is small and picklable, so writer and loader workers reopen exactly the store their parent
opened, with the same options. A URL is never turned into a local path, except `file://`, which names one.
`Location.store` opens the zarr v2 store of its kind (`stores`): local directories write every key to a
temporary file and rename it, so a reader never sees half a chunk; on fsspec URLs one PUT is atomic per object,
and only a key that does not exist reads as missing (a network error is never read as a missing chunk).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .errors import FormatError
from .refusals import read_only_mount, why_unwritable
from .s3 import S3_TIMEOUT, TIMEOUT_OPTION, s3_defaults
from .stores import DirectoryStore, FsspecStore, Store, ZipStore, reaching


def exists(fs: Any, path: str) -> bool:
    """Whether `path` exists on the fsspec filesystem `fs`; an error other than "not found" propagates. (fsspec's
    own `exists` and `isfile` answer False for any error: a network failure would read as "nothing there".)"""
    try:
        fs.info(path)
        return True
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class StoreSettings:
    """What differs between kinds of store, decided here once (`Location.settings`) so that no other module
    asks what kind of place a dataset is (tests/test_layout.py checks that none does)."""

    remote: bool  # a network store: its calls are bounded in time, chunks are fetched ahead and may be cached on disk
    segment_bytes: int  # the writer's shared-memory segments (an object store wants larger PUTs)
    growth_chunks: int  # a table grows by at least this many chunks at a time (each growth is a metadata write)
    renames: bool  # a file is written aside and renamed into place (a local disk); else one PUT is atomic
    lease: str  # how the write lease is held: "file" (a lock file), "s3" (conditional PUTs), "create" (exclusive
    # creates)
    read_only: str | None = None  # why nothing can be written here (None: it can)

    def bound(self, seconds: float) -> float | None:
        """`seconds` as the limit of a store call on a remote store; None (unbounded) on a local one."""
        return seconds if self.remote else None


DIRECTORY = StoreSettings(remote=False, segment_bytes=4 << 20, growth_chunks=4, renames=True, lease="file")
ZIP = StoreSettings(remote=False, segment_bytes=4 << 20, growth_chunks=4, renames=True, lease="file",
                    read_only="a .zip dataset is read-only")
S3 = StoreSettings(remote=True, segment_bytes=16 << 20, growth_chunks=64, renames=False, lease="s3")
OTHER_URL = StoreSettings(remote=True, segment_bytes=16 << 20, growth_chunks=64, renames=False, lease="create")


@dataclass(frozen=True, eq=False)
class Location:
    """A dataset's address (`url`: a local path or an fsspec URL) and the options of its filesystem."""

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    # on a local disk, whether each write is durable when it returns (fsynced: it survives a power loss, see
    # `stores.DirectoryStore`); object stores are durable once a PUT returns, whatever this says
    durable: bool = True

    @classmethod
    def of(cls, where: "str | os.PathLike | Location", storage_options: Mapping[str, Any] | None = None
           ) -> "Location":
        if isinstance(where, Location):
            if storage_options:
                return replace(where, storage_options={**where.storage_options, **storage_options})
            return where
        text = os.fspath(where)
        protocol = text.split("://", 1)[0] if "://" in text else None
        if protocol in ("file", "local"):  # a local path spelled as a URL: a directory store, whatever options
            # come with it (the local file system's one option, auto_mkdir, is what a directory store does
            # anyway); fsspec's local file system writes files in place, so a reader, or the committer reading
            # back a last chunk, could read one half-written, where a directory store writes a temporary file
            # and renames it
            return cls(text[len(protocol) + 3:] or "/", {})
        if protocol is not None and any(c in text for c in "*?["):
            # fsspec reads these as a pattern in every call that takes several paths (cat, rm, find): a dataset
            # at s3://b/scene[1].zarr would read, or delete, the keys of s3://b/scene1.zarr
            raise FormatError(f"{text}: a URL with *, ? or [ in it, which fsspec reads as a pattern (it could "
                              "read or delete another dataset's keys); rename the dataset")
        return cls(text, dict(storage_options or {}))

    # ------------------------------------------------------------ what kind of place
    @property
    def protocol(self) -> str | None:
        """The fsspec protocol of a URL ("s3", "gcs", ...), None for a local path."""
        return self.url.split("://", 1)[0] if "://" in self.url else None

    @property
    def is_local(self) -> bool:
        return self.protocol is None

    @property
    def is_zip(self) -> bool:
        return self.is_local and self.url.endswith(".zip")

    @property
    def settings(self) -> StoreSettings:
        """This kind of store's settings (see `StoreSettings`)."""
        if self.is_zip:
            return ZIP
        if self.is_local:
            return DIRECTORY
        return S3 if self.protocol in ("s3", "s3a") else OTHER_URL

    def existing_folder(self) -> bool:
        """Whether this is a local directory that exists (a writer that fails removes what it made, but not a
        folder that was there before it)."""
        return self.is_local and self.path.is_dir()

    def unwritable(self, *names: str) -> str | None:
        """Why nothing can be written here, or into the sub-folders `names` that exist (a .zip; on a local disk a
        read-only mount or a missing permission, which root too is refused on a read-only mount), or None."""
        if self.settings.read_only:
            return self.settings.read_only
        if not self.is_local:
            return None
        for path in (self.path, *(self.path / n for n in names)):
            if path.exists() and not os.access(path, os.W_OK):
                return why_unwritable(path, read_only_mount(path))
        return None

    def contents_tag(self) -> str:
        """A digest of what is stored here (every file's name, size and modification time, one listing; a
        .zip's size and modification time): it changes when anything stored changes."""
        h = hashlib.sha256()
        if self.is_zip:
            st = os.stat(self.url)
            h.update(f"{st.st_size}|{st.st_mtime_ns}".encode())
            return h.hexdigest()[:32]
        fs, root = self.filesystem()
        for path, info in sorted(fs.find(root, detail=True).items()):
            when = info.get("mtime") or info.get("LastModified") or info.get("ETag") or info.get("created")
            h.update(f"{path}|{info.get('size')}|{when}\n".encode())
        return h.hexdigest()[:32]

    @property
    def path(self) -> Path:
        """The local directory (only for local locations)."""
        assert self.is_local, self.url
        return Path(self.url)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    def place(self) -> str:
        """Where the dataset is, the same however it is spelled: a local path resolved (symbolic links, the
        working directory), a URL with the endpoint its storage options name (one bucket name on two S3
        servers is two places). Credentials are not part of it."""
        if self.is_local:
            return os.path.realpath(self.url)
        opts = self.storage_options
        endpoint = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
        return f"{self.url.rstrip('/')}@{endpoint}" if endpoint else self.url.rstrip("/")

    def same_place(self, other: "Location") -> bool:
        """Whether two locations name the same dataset (resolved local paths, or equal URLs)."""
        if self.is_local and other.is_local:
            return os.path.realpath(self.url) == os.path.realpath(other.url)
        return self.is_local == other.is_local and self.url.rstrip("/") == other.url.rstrip("/")

    def within(self, other: "Location") -> bool:
        """Whether this location is `other` or inside it (a folder or key prefix of it)."""
        if self.same_place(other):
            return True
        if self.is_local and other.is_local:
            return os.path.realpath(self.url).startswith(os.path.realpath(other.url).rstrip(os.sep) + os.sep)
        return self.is_local == other.is_local and self.url.startswith(other.url.rstrip("/") + "/")

    # ------------------------------------------------------------ fsspec
    @property
    def options(self) -> dict[str, Any]:
        """The storage options for fsspec: as given, with fsspec's listings cache off unless asked for (a
        dataset changes while it is written, and a cached listing would hide new keys: a reader would find no
        dataset), and on S3 the timeouts of `s3_defaults`; zarrfeed's own option taken out."""
        options = {"use_listings_cache": False, **self.storage_options}
        if self.protocol in ("s3", "s3a"):
            options = s3_defaults(options)
        options.pop(TIMEOUT_OPTION, None)
        return options

    @property
    def budget(self) -> float | None:
        """Seconds within which an S3 store that stops answering is reported (`zarrfeed_timeout`, 15 by
        default): what a whole short operation, such as opening a dataset, is bounded by; None elsewhere."""
        if self.protocol not in ("s3", "s3a"):
            return None
        return float(s3_defaults(self.storage_options).get(TIMEOUT_OPTION, S3_TIMEOUT))

    @property
    def fetch_tries(self) -> int | None:
        """How often the loader fetches a chunk before it gives up: on S3 once, since s3fs retries each call
        itself (see `s3_defaults`); elsewhere None (the loader's default)."""
        return 1 if self.protocol in ("s3", "s3a") else None

    def filesystem(self) -> tuple[Any, str]:
        """(fsspec filesystem, path within it); one line naming the package to install if it is missing."""
        import fsspec

        try:
            if self.is_local:
                return fsspec.core.url_to_fs(os.path.abspath(self.url))
            return fsspec.core.url_to_fs(self.url, **self.options)
        except ImportError as exc:
            raise FormatError(f"{self.url}: {exc} (pip install it to read or write {self.protocol}:// URLs)") \
                from None
        except ValueError as exc:  # "Protocol not known: ..."
            raise FormatError(f"{self.url}: {exc}") from None

    def parent(self) -> "Location | None":
        """The folder (or key prefix) this location is in: "." for a bare local name; None for a .zip file or a
        bucket's root."""
        url = self.url.rstrip("/")
        if self.is_zip:
            return None
        if self.is_local:
            return replace(self, url=os.path.dirname(url) or ".")
        head = url.rpartition("/")[0]
        return None if head.endswith(":/") else replace(self, url=head)

    def child(self, name: str) -> "Location":
        """The location of `name` inside this one (a sub-folder or key prefix)."""
        return replace(self, url=f"{self.url.rstrip('/')}/{name}")

    # ------------------------------------------------------------ zarr stores
    def store(self, mode: str = "r") -> Store:
        """The zarr v2 store of this location (on a URL read-only for mode "r"; a zip always is); mode "r"
        refuses a location that does not exist."""
        if self.is_zip:
            if mode != "r":
                raise FormatError(f"{self.url}: zip stores are read-only; write to a directory or an fsspec URL")
            if not self.path.is_file():
                raise FormatError(f"{self.url}: no such file")
            try:
                return ZipStore(self.url)
            except Exception as exc:  # zipfile.BadZipFile and friends
                raise FormatError(f"{self.url}: not a readable zip file ({exc})") from None
        if self.is_local:
            path = self.path
            if mode == "r" and not path.exists():
                raise FormatError(f"{self.url}: no such file or directory")
            if path.exists() and not path.is_dir():
                raise FormatError(f"{self.url}: not a directory, a .zip file or a URL")
            # (what a reader may write, a mask, is checked above the store)
            return DirectoryStore(self.url, durable=self.durable)
        try:
            fs, root = self.filesystem()  # a missing backend or an unknown protocol: one line
        except (OSError, TypeError) as exc:  # storage options the filesystem refuses
            raise FormatError(f"{self.url}: cannot open the store ({type(exc).__name__}: {exc})") from None
        return FsspecStore(fs, root, read_only=mode == "r")

    @reaching
    def entries(self, limit: int = 5) -> list[str]:
        """Up to `limit` names found directly at this location (to say what is there)."""
        if self.is_local:
            return sorted(os.listdir(self.url))[:limit] if self.path.is_dir() else []
        fs, root = self.filesystem()
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))[:limit]
        except FileNotFoundError:
            return []

    @reaching
    def remove(self, keep_root: bool = False) -> None:
        """Delete everything stored here, and a local directory itself unless `keep_root`."""
        if self.is_local and not keep_root and self.path.is_dir():
            shutil.rmtree(self.path)
        elif not self.is_local:
            fs, root = self.filesystem()
            if exists(fs, root):
                fs.rm(root, recursive=True)
        else:
            self.clear()

    @reaching
    def clear(self, keep: Callable[[str], bool] = lambda name: False, last: Sequence[str] = ()) -> None:
        """Delete every entry directly here (folders with their contents) except those whose name `keep`
        accepts; the location itself stays. The names `last` go last, in their order (what marks the place as
        a dataset: a clear interrupted leaves it recognisable)."""
        def order(name: str) -> int:
            return last.index(name) + 1 if name in last else 0

        if self.is_local:
            if not self.path.is_dir():
                return
            for entry in sorted(os.scandir(self.path), key=lambda e: order(e.name)):
                if keep(entry.name):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            return
        fs, root = self.filesystem()
        doomed = [p for p in fs.ls(root, detail=False) if not keep(p.rstrip("/").rsplit("/", 1)[-1])]
        for step in sorted({order(p.rstrip("/").rsplit("/", 1)[-1]) for p in doomed}):
            fs.rm([p for p in doomed if order(p.rstrip("/").rsplit("/", 1)[-1]) == step], recursive=True)

    def exists(self) -> bool:
        """Whether anything is stored here (a non-empty directory or key prefix)."""
        if self.is_local:
            return self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir()))
        return bool(self.entries(1))
