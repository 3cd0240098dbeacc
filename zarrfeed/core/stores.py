"""Zarr v2 stores: keys such as `agents/12` or `data/img/3.0.0.0` mapped to bytes, one class per kind of place.

- `DirectoryStore`: a local directory. Each key is written to a temporary file beside it and renamed over it,
  so a reader never sees half an object (zarr 2's `DirectoryStore` did the same).
- `ZipStore`: a `.zip` file, read only (zarr 2's `ZipStore` layout: keys at the archive's root).
- `FsspecStore`: any fsspec URL (s3fs and friends); one PUT is atomic per object; several keys are read and
  written as concurrent requests.

Only a key that does not exist reads as missing (`get` returns None, `[]` raises `KeyError`): every other error
(a network failure, a permission) propagates, since a chunk read as missing becomes an error or fill values.
zarr-python 2's `FSStore` turned every `OSError` into `KeyError` unless told otherwise.
"""
from __future__ import annotations

import functools
import os
import shutil
import threading
import uuid
import zipfile
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from . import s3
from .errors import StoreUnreachable
from .files import OS_FILES, Files

PARTIAL = ".partial"  # the suffix of a local temporary file being written (never a key)

# what the clients below fsspec raise when no connection could be made, by name (botocore and aiohttp are there
# only with s3fs or an HTTP filesystem): refused, reset, a host that does not resolve, a connect that timed out
_CONNECTION_ERRORS = {"ConnectionError", "EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                      "ClientConnectorDNSError", "ServerDisconnectedError", "gaierror", "ProxyConnectionError"}
F = TypeVar("F", bound=Callable[..., Any])


def connection_failure(exc: BaseException) -> bool:
    """Whether `exc` says that no connection to a store could be made (by the names of its classes)."""
    return isinstance(exc, StoreUnreachable) or any(c.__name__ in _CONNECTION_ERRORS for c in type(exc).__mro__)


def unreachable(where: str, exc: BaseException) -> StoreUnreachable:
    """`StoreUnreachable` for the store at `where`, in one line, from the client's error `exc`."""
    if isinstance(exc, StoreUnreachable):
        return exc
    said = (str(exc).strip().splitlines() or [""])[0]
    return StoreUnreachable(f"{where}: cannot reach the store ({type(exc).__name__}: {said}); check the endpoint "
                            "(--storage-option endpoint_url=...) and the network")


def reaching(method: F) -> F:
    """Raise a connection failure inside a method of an object with a `url` (a store, a location) as
    `StoreUnreachable` naming it."""
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if connection_failure(exc):
                raise unreachable(self.url, exc) from None
            raise
    return call  # type: ignore[return-value]


class Store(ABC):
    """Keys to bytes. Subclasses implement `get_many`, `put_many`, `put_new`, `delete`, `listdir`, `keys` and
    `rmdir`; the mapping methods (`store[key]`, `key in store`, ...) are built on them."""

    read_only: bool = False

    # ------------------------------------------------------------ what each kind implements
    @abstractmethod
    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        """The values of those `keys` that exist (missing ones left out)."""

    @abstractmethod
    def put_many(self, values: Mapping[str, bytes]) -> None:
        """Store every key, each one atomically."""

    @abstractmethod
    def put_new(self, key: str, value: bytes) -> bool:
        """Store `key` only if it is absent, atomically where the store allows; False if it is there."""

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete `keys`; those already gone are no error."""

    @abstractmethod
    def listdir(self, prefix: str = "") -> list[str]:
        """The names directly under `prefix` (keys and sub-folders), sorted; [] if there is nothing."""

    @abstractmethod
    def keys(self) -> Iterator[str]:
        """Every key stored."""

    @abstractmethod
    def sizes(self, prefix: str = "", recursive: bool = False) -> dict[str, int]:
        """The objects directly under `prefix` (with `recursive`, also those in its sub-folders, named by their
        path below `prefix`): name -> bytes stored."""

    @abstractmethod
    def rmdir(self, prefix: str) -> None:
        """Delete every key under `prefix`."""

    def make_root(self) -> None:
        """Create the store's own folder, where a store has folders (a directory); nothing elsewhere."""

    def put_chunks(self, values: Mapping[str, bytes]) -> None:
        """Store chunks whose names the next commit makes durable (`sync_names`, before its manifest): on a
        local disk each chunk's bytes are durable when this returns, its folder is synced once per commit
        rather than once per call. Elsewhere, `put_many`."""
        self.put_many(values)

    def put_unsynced(self, values: Mapping[str, bytes]) -> list[str]:
        """Store objects that no commit names yet, as `put_chunks`, but leave their bytes' durability to
        `sync_objects`, which the commit that will name them calls first (a writer's workers then compress
        the next chunks while another thread waits for the disk). The keys that need it: none where a write
        is durable when it returns (an object store). Never for an object that a commit names already: until it
        is synced, a power loss can leave its name with none of its bytes."""
        self.put_chunks(values)
        return []

    def sync_objects(self, keys: Iterable[str]) -> None:
        """Make the bytes of objects `put_unsynced` stored durable."""

    def sync_names(self, prefixes: Iterable[str]) -> None:
        """Make the names stored under each of `prefixes` (a table's folder) durable: what `put_chunks` left to
        the commit. Nothing to do where a write is durable when it returns (an object store)."""

    def remove_partial(self, prefixes: Iterable[str]) -> None:
        """Delete the temporary files under each of `prefixes` (a table's folder, at any depth) that a writer
        stopped while it wrote left there (a worker killed after an error). Only the holder of the dataset's
        write lease may call this, with nothing writing there. Nothing to do where a write is one PUT."""

    # ------------------------------------------------------------ built on them
    def get_ranges(self, ranges: Sequence[tuple[str, int, int | None]]) -> list[bytes | None]:
        """The bytes [start, stop) of each (key, start, stop) (a negative start counts from the object's end,
        a stop of None is its end: Python's slices), None for a key that does not exist: how a reader takes
        an inner chunk out of a zarr v3 shard without reading the whole shard. Here: each object read whole
        once and sliced; stores that can read a range (files, object stores) read only the ranges."""
        whole = self.get_many(sorted({key for key, _, _ in ranges}))
        return [None if key not in whole else whole[key][start:stop] for key, start, stop in ranges]

    def get(self, key: str) -> bytes | None:
        return self.get_many([key]).get(key)

    def put(self, key: str, value: bytes) -> None:
        self.put_many({key: value})

    def __getitem__(self, key: str) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: bytes) -> None:
        self.put(key, bytes(value))

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self.delete([key])

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __iter__(self) -> Iterator[str]:
        return self.keys()

    def misplaced_group(self) -> str | None:
        """Where a dataset stored here under the wrong root is, and how to fix it, if the store can tell
        cheaply; None otherwise."""
        return None

    def _writable(self) -> None:
        if self.read_only:
            raise PermissionError(f"{self}: opened read-only")


class DirectoryStore(Store):
    """A local directory; keys are relative paths. With `durable` (the default), every write is durable when
    it returns: each temporary file is fsynced before it is renamed over its key, then the folders whose
    names changed are fsynced (and the parents of folders created), so a power loss keeps it whole or keeps
    what was there before, never a file half written or a name pointing nowhere (see `files`). Without it,
    writes survive a killed process but not a power loss: for scratch data."""

    files: Files = OS_FILES  # its file operations (the test suite puts a simulated power loss in their place)

    def __init__(self, path: str | os.PathLike, read_only: bool = False, durable: bool = True,
                 files: Files | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.read_only, self.durable = read_only, durable
        if files is not None:
            self.files = files

    def __repr__(self) -> str:
        return f"DirectoryStore({self.path!r})"

    def file(self, key: str) -> str:
        """The file that holds `key`."""
        return os.path.join(self.path, *key.split("/"))

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        out = {}
        for key in keys:
            try:
                with open(self.file(key), "rb") as f:
                    out[key] = f.read()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                pass
        return out

    def get_ranges(self, ranges: Sequence[tuple[str, int, int | None]]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for key, start, stop in ranges:
            try:
                with open(self.file(key), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    lo, hi, _ = slice(start, stop).indices(size)
                    f.seek(lo)
                    out.append(f.read(max(hi - lo, 0)))
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                out.append(None)
        return out

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and os.path.isfile(self.file(key))

    def make_root(self) -> None:
        """Create the store's folder (and its missing parents), durably: a dataset whose folder's own name was
        never synced into its parent disappears whole in a power loss, acknowledged commits with it."""
        self._writable()
        self._sync({os.path.dirname(made) for made in self.files.makedirs(self.path)})

    def _folder(self, path: str, changed: set[str]) -> None:
        """Make the folder of `path` (noting, in `changed`, the folders whose names change: it, and the parent
        of each folder created)."""
        folder = os.path.dirname(path)
        changed.add(folder)
        changed.update(os.path.dirname(made) for made in self.files.makedirs(folder))

    def _sync(self, folders: set[str]) -> None:
        if self.durable:
            for folder in sorted(folders, key=len, reverse=True):  # the innermost first, the root last
                self.files.sync_folder(folder)

    def put_many(self, values: Mapping[str, bytes]) -> None:
        self._sync(self._put(values, self.durable))

    def put_chunks(self, values: Mapping[str, bytes]) -> None:
        self._put_chunks(values, sync=self.durable)

    def put_unsynced(self, values: Mapping[str, bytes]) -> list[str]:
        self._put_chunks(values, sync=False)
        return list(values) if self.durable else []

    def sync_objects(self, keys: Iterable[str]) -> None:
        if self.durable:
            for key in keys:
                path = self.file(key)
                try:
                    self.files.sync_file(path)
                except OSError as exc:  # (os.fsync names no file)
                    raise OSError(exc.errno, exc.strerror, path) from exc

    def _put_chunks(self, values: Mapping[str, bytes], sync: bool) -> None:
        changed = self._put(values, sync)
        # a chunk directly in its table's folder (`agents/12`), or a v3 shard in its `c` folder (`agents/c/3`),
        # leaves that folder to the commit's `sync_names`; anything else (a folder made, a chunk deeper down)
        # is synced now
        later = {os.path.dirname(self.file(key)) for key in values
                 if key.count("/") == 1 or (key.count("/") == 2 and key.split("/")[1] == "c")}
        self._sync(changed - later)

    def sync_names(self, prefixes: Iterable[str]) -> None:
        folders = {self.file(p) if p else self.path for p in prefixes}
        self._sync(folders | {f"{f}/c" for f in folders if os.path.isdir(f"{f}/c")})

    def remove_partial(self, prefixes: Iterable[str]) -> None:
        self._writable()
        for prefix in prefixes:
            for folder, _, names in os.walk(self.file(prefix)):
                for name in names:
                    if name.endswith(PARTIAL):
                        try:
                            self.files.unlink(os.path.join(folder, name))
                        except FileNotFoundError:
                            pass

    def _put(self, values: Mapping[str, bytes], sync: bool) -> set[str]:
        """Write `values`, each to a temporary file (fsynced with `sync`), then rename them over their keys, in
        order, one after the other: documents that must change together (a replay buffer's lengths, see
        `Committer`) are seen apart only for the few renames; the folders whose names changed."""
        self._writable()
        changed: set[str] = set()
        written: list[tuple[str, str]] = []
        try:
            for key, value in values.items():
                path = self.file(key)
                self._folder(path, changed)
                temporary = f"{path}.{uuid.uuid4().hex}{PARTIAL}"
                written.append((temporary, path))
                self.files.write(temporary, value, sync=sync)
            for temporary, path in written:
                self.files.replace(temporary, path)
        finally:
            for temporary, _ in written:
                if os.path.exists(temporary):
                    self.files.unlink(temporary)
        return changed

    def put_new(self, key: str, value: bytes) -> bool:
        """A complete temporary file hard-linked into place: the link fails if the name exists, and a reader
        never sees the file before it is whole."""
        self._writable()
        path = self.file(key)
        changed: set[str] = set()
        self._folder(path, changed)
        temporary = f"{path}.{uuid.uuid4().hex}{PARTIAL}"
        try:
            self.files.write(temporary, value, sync=self.durable)
            try:
                self.files.link(temporary, path)
                created = True
            except FileExistsError:
                created = False
            except OSError:  # a file system without hard links: an exclusive create, then the bytes
                created = self.files.create_exclusive(path, value, sync=self.durable)
        finally:  # also after a write that failed (a full disk): no part of it is left
            if os.path.exists(temporary):
                self.files.unlink(temporary)
        if created:
            self._sync(changed)
        return created

    def delete(self, keys: Iterable[str]) -> None:
        """(Not synced: a deleted object that comes back after a power loss is one zarrfeed no longer lists, a
        commit log segment merged into another or a commit object past those kept.)"""
        self._writable()
        for key in keys:
            try:
                self.files.unlink(self.file(key))
            except (FileNotFoundError, IsADirectoryError):
                pass

    def listdir(self, prefix: str = "") -> list[str]:
        try:
            return sorted(os.listdir(self.file(prefix) if prefix else self.path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def sizes(self, prefix: str = "", recursive: bool = False) -> dict[str, int]:
        base = self.file(prefix) if prefix else self.path
        if recursive:
            found = {}
            for root, _, files in os.walk(base):
                rel = os.path.relpath(root, base).replace(os.sep, "/")
                for name in files:
                    found[name if rel == "." else f"{rel}/{name}"] = os.path.getsize(os.path.join(root, name))
            return found
        try:
            with os.scandir(base) as entries:
                return {e.name: e.stat().st_size for e in entries if e.is_file()}
        except (FileNotFoundError, NotADirectoryError):
            return {}

    def keys(self) -> Iterator[str]:
        for root, _, files in os.walk(self.path):
            rel = os.path.relpath(root, self.path)
            for name in files:
                yield name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"

    def rmdir(self, prefix: str) -> None:
        self._writable()
        shutil.rmtree(self.file(prefix) if prefix else self.path, ignore_errors=True)


class ZipStore(Store):
    """A `.zip` file holding a dataset at its root, read only. Reads are serialised by a lock: `zipfile` shares
    one file position between threads."""

    read_only = True

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._zip = zipfile.ZipFile(self.path, "r")
        self._names = set(self._zip.namelist())
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ZipStore({self.path!r})"

    def __getstate__(self) -> dict[str, Any]:  # workers reopen the file
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def close(self) -> None:
        self._zip.close()

    def misplaced_group(self) -> str | None:
        """A dataset zipped with its folder (`zip -r x.zip x.zarr`): the zip's root holds the folder, not the
        dataset."""
        inner = sorted(k[: -len("/.zgroup")] for k in self._names if k.endswith("/.zgroup"))
        if not inner:
            return None
        return (f"the dataset is in the folder '{inner[0]}' inside the zip; zip it from inside that folder: "
                f"cd {inner[0]} && zip -r0 ../{os.path.basename(self.path)} .")

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        with self._lock:
            return {k: self._zip.read(k) for k in keys if k in self._names}

    def __contains__(self, key: object) -> bool:
        return key in self._names

    def put_many(self, values: Mapping[str, bytes]) -> None:
        self._writable()

    def put_new(self, key: str, value: bytes) -> bool:
        self._writable()
        return False

    def delete(self, keys: Iterable[str]) -> None:
        self._writable()

    def rmdir(self, prefix: str) -> None:
        self._writable()

    def listdir(self, prefix: str = "") -> list[str]:
        start = f"{prefix.rstrip('/')}/" if prefix else ""
        return sorted({n[len(start):].split("/", 1)[0] for n in self._names
                       if n.startswith(start) and len(n) > len(start)})

    def keys(self) -> Iterator[str]:
        return iter(sorted(n for n in self._names if not n.endswith("/")))

    def sizes(self, prefix: str = "", recursive: bool = False) -> dict[str, int]:
        start = f"{prefix.rstrip('/')}/" if prefix else ""
        return {i.filename[len(start):]: i.compress_size for i in self._zip.infolist()
                if i.filename.startswith(start) and (recursive or "/" not in i.filename[len(start):])
                and not i.is_dir()}


class FsspecStore(Store):
    """Any fsspec filesystem under a root path (an S3 prefix, for example)."""

    def __init__(self, fs: Any, root: str, read_only: bool = False) -> None:
        self.fs, self.root, self.read_only = fs, root.rstrip("/"), read_only

    def __repr__(self) -> str:
        return f"FsspecStore({self.root!r})"

    @property
    def url(self) -> str:
        """The store's root as a URL (`s3://bucket/scenes.zarr`)."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"{protocol}://{self.fs._strip_protocol(self.root)}"

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    @reaching
    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        paths = {self._path(k): k for k in keys}
        got = self.fs.cat(list(paths), on_error="return")
        if not isinstance(got, dict):  # one path may come back as its bytes alone
            got = {next(iter(paths)): got}
        out = {}
        for path, value in got.items():
            if isinstance(value, (FileNotFoundError, KeyError, IsADirectoryError)):
                continue
            if isinstance(value, BaseException):
                raise value
            out[paths[path] if path in paths else paths[self.fs._strip_protocol(path)]] = value
        return out

    @reaching
    def get_ranges(self, ranges: Sequence[tuple[str, int, int | None]]) -> list[bytes | None]:
        """Range requests, concurrently (a negative start is a suffix range, which S3 answers without the
        object's size): on S3 each tried as any other call (`s3.cat_ranges`), elsewhere fsspec's `cat_ranges`."""
        if not ranges:
            return []
        paths = [self._path(k) for k, _, _ in ranges]
        starts, ends = [s for _, s, _ in ranges], [e for _, _, e in ranges]
        got = s3.cat_ranges(self.fs, paths, starts, ends)
        if got is None:
            got = self.fs.cat_ranges(paths, starts, ends, on_error="return")
        out: list[bytes | None] = []
        for value in got:
            if isinstance(value, (FileNotFoundError, KeyError, IsADirectoryError)):
                out.append(None)
            elif isinstance(value, BaseException):
                raise value
            else:
                out.append(bytes(value))
        return out

    @reaching
    def __contains__(self, key: object) -> bool:
        # not `fs.isfile`, which answers False for any error: a network failure read as "no .zgroup here"
        if not isinstance(key, str):
            return False
        try:
            return self.fs.info(self._path(key)).get("type") == "file"
        except FileNotFoundError:
            return False

    @reaching
    def put_many(self, values: Mapping[str, bytes]) -> None:
        self._writable()
        if values:
            self.fs.pipe({self._path(k): bytes(v) for k, v in values.items()})

    @reaching
    def put_new(self, key: str, value: bytes) -> bool:
        """An exclusive create (a conditional PUT, `If-None-Match: *`, on S3); on a filesystem that cannot
        create exclusively, a check and then a write."""
        self._writable()
        try:
            self.fs.pipe_file(self._path(key), value, mode="create")
            return True
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError, TypeError):
            pass
        if key in self:
            return False
        self.put(key, value)
        return True

    @reaching
    def delete(self, keys: Iterable[str]) -> None:
        self._writable()
        paths = [self._path(k) for k in keys]
        if paths:
            try:
                self.fs.rm(paths)
            except FileNotFoundError:
                for path in paths:
                    try:
                        self.fs.rm_file(path)
                    except FileNotFoundError:
                        pass

    @reaching
    def listdir(self, prefix: str = "") -> list[str]:
        try:
            entries = self.fs.ls(self._path(prefix.rstrip("/")), detail=False)
        except FileNotFoundError:
            return []
        return sorted({p.rstrip("/").rsplit("/", 1)[-1] for p in entries})

    @reaching
    def sizes(self, prefix: str = "", recursive: bool = False) -> dict[str, int]:
        path = self._path(prefix.rstrip("/"))
        try:
            if recursive:
                found = self.fs.find(path, detail=True)
                start = len(self.fs._strip_protocol(path).rstrip("/")) + 1
                return {name[start:]: int(e.get("size") or 0) for name, e in found.items() if e.get("type") == "file"}
            entries = self.fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0) for e in entries
                if e.get("type") == "file"}

    @reaching
    def keys(self) -> Iterator[str]:
        start = len(self.fs._strip_protocol(self.root)) + 1
        try:
            found = self.fs.find(self.root)
        except FileNotFoundError:
            return iter(())
        return iter(sorted(p[start:] for p in found))

    @reaching
    def rmdir(self, prefix: str) -> None:
        self._writable()
        try:  # not `fs.exists`, which answers False for any error
            self.fs.rm(self._path(prefix.rstrip("/")), recursive=True)
        except FileNotFoundError:
            pass


class MemoryStore(Store):
    """Keys in a dict: an in-memory array (an empty table read in place of a missing one)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        return {k: self.data[k] for k in keys if k in self.data}

    def put_many(self, values: Mapping[str, bytes]) -> None:
        self.data.update({k: bytes(v) for k, v in values.items()})

    def put_new(self, key: str, value: bytes) -> bool:
        if key in self.data:
            return False
        self.data[key] = bytes(value)
        return True

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.data.pop(key, None)

    def listdir(self, prefix: str = "") -> list[str]:
        start = f"{prefix.rstrip('/')}/" if prefix else ""
        return sorted({k[len(start):].split("/", 1)[0] for k in self.data if k.startswith(start)})

    def keys(self) -> Iterator[str]:
        return iter(sorted(self.data))

    def sizes(self, prefix: str = "", recursive: bool = False) -> dict[str, int]:
        start = f"{prefix.rstrip('/')}/" if prefix else ""
        return {k[len(start):]: len(v) for k, v in self.data.items()
                if k.startswith(start) and (recursive or "/" not in k[len(start):])}

    def rmdir(self, prefix: str) -> None:
        start = f"{prefix.rstrip('/')}/" if prefix else ""
        for k in [k for k in self.data if k.startswith(start)]:
            del self.data[k]
