"""Fetching stored chunk objects for the reader workers: many at a time, retried, optionally cached on disk.

On an object store one GET at a time is bound by latency, not bandwidth, so a worker asks for all the chunks
it must decode for a window at once (fsspec's `cat` of a list runs the requests concurrently). A transient
error (a dropped connection, a throttled request, a server restarting) is retried with exponential backoff;
after the last try the error names the chunk key and the store. Only a key that does not exist reads as
missing; nothing else is ever mistaken for a missing chunk (which zarr would read as fill values).

`cache_dir` keeps fetched chunk objects on local disk across epochs, bounded in bytes (least recently used
go first). Only complete chunks (every row committed) are cached: they never change while a writer appends.
Entries are keyed by the dataset's identity (its id, new each time a dataset is created), so an overwritten
dataset is never read from an old cache; a dataset written by other tools (no id) is identified by its URL
and array metadata and assumed not to change in place. We write this small cache ourselves because fsspec's
caching filesystems have no bound in bytes.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any

from writer.chunkio import ChunkError
from writer.store import Location

TRIES = 4
BACKOFF = 0.25  # seconds before the second try; doubled for each further one


@dataclass(frozen=True)
class FetchOptions:
    """How reader workers fetch chunks: the local cache (None: no cache) and its bound, and retries."""

    cache_dir: str | None = None
    cache_bytes: int = 8 << 30
    tries: int = TRIES


class DiskCache:
    """Files named by a digest of (dataset identity, chunk key) in one folder, at most `limit` bytes in all."""

    def __init__(self, folder: str, limit: int) -> None:
        self.folder, self.limit = folder, int(limit)
        os.makedirs(folder, exist_ok=True)
        self.used = self._scan()

    def _scan(self) -> int:
        return sum(e.stat().st_size for e in os.scandir(self.folder) if e.is_file() and e.name.endswith(".chunk"))

    def _path(self, ident: str) -> str:
        return os.path.join(self.folder, hashlib.blake2b(ident.encode(), digest_size=16).hexdigest() + ".chunk")

    def get(self, ident: str) -> bytes | None:
        path = self._path(ident)
        try:
            with open(path, "rb") as f:
                data = f.read()
            os.utime(path)  # recently used: evicted last
            return data
        except OSError:
            return None

    def put(self, ident: str, data: bytes) -> None:
        if len(data) > self.limit:
            return
        path = self._path(ident)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # other workers see the whole object or none
        self.used += len(data)
        if self.used > self.limit:
            self._evict()

    def _evict(self) -> None:
        """Delete least recently used entries until 90% of the bound (rescanned: other workers add too)."""
        entries = sorted((e.stat().st_mtime, e.stat().st_size, e.path) for e in os.scandir(self.folder)
                         if e.is_file() and e.name.endswith(".chunk"))
        used = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if used <= 0.9 * self.limit:
                break
            try:
                os.unlink(path)
                used -= size
            except FileNotFoundError:
                pass
        self.used = used


class ChunkFetcher:
    """Stored bytes of chunk keys of the dataset at `location` (None for a key that does not exist)."""

    def __init__(self, location: Location, store: Any, identity: str, options: FetchOptions) -> None:
        self.location, self.store, self.identity, self.options = location, store, identity, options
        self.remote = not location.is_local
        if self.remote:
            self.fs, self.root = location.filesystem()
        self.cache = DiskCache(options.cache_dir, options.cache_bytes) if options.cache_dir and self.remote else None
        self._ahead: dict[str, tuple[Any, int]] = {}  # key -> (future of a prefetch, its index in the result)
        self._pool: Any = None

    def prefetch(self, keys: list[str], cacheable: list[bool]) -> None:
        """Start fetching `keys` in a background thread (network waits release the GIL), for a later `fetch`."""
        if not self.remote:
            return
        todo = [(k, c) for k, c in zip(keys, cacheable, strict=True) if k not in self._ahead]
        if todo:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(1, thread_name_prefix="zarrfeed-fetch")
            ks, cs = [k for k, _ in todo], [c for _, c in todo]
            future = self._pool.submit(self._fetch_now, ks, cs)
            for i, k in enumerate(ks):
                self._ahead[k] = (future, i)

    def fetch(self, keys: list[str], cacheable: list[bool]) -> list[bytes | None]:
        if not self.remote:  # a local store: the page cache is the cache, and reads do not wait on a network
            return [self._local(k) for k in keys]
        out: list = [None] * len(keys)
        rest = []
        for i, key in enumerate(keys):
            ahead = self._ahead.pop(key, None)
            if ahead is None:
                rest.append(i)
                continue
            try:
                out[i] = ahead[0].result()[ahead[1]]
            except ChunkError:  # fetched ahead and failed: try again now, and report from here
                rest.append(i)
        if rest:
            values = self._fetch_now([keys[i] for i in rest], [cacheable[i] for i in rest])
            for i, value in zip(rest, values, strict=True):
                out[i] = value
        return out

    def _fetch_now(self, keys: list[str], cacheable: list[bool]) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(keys)
        todo = []
        for i, key in enumerate(keys):
            hit = self.cache.get(f"{self.identity}/{key}") if self.cache and cacheable[i] else None
            if hit is not None:
                out[i] = hit
            else:
                todo.append(i)
        for attempt in range(self.options.tries):
            if not todo:
                break
            if attempt:
                time.sleep(BACKOFF * 2 ** (attempt - 1))
            paths = [f"{self.root}/{keys[i]}" for i in todo]
            try:
                got = self.fs.cat(paths, on_error="return")
            except Exception as exc:  # the whole request failed: every key is retried
                got = {p: exc for p in paths}
            failed = []
            for i, path in zip(todo, paths, strict=True):
                value = got.get(path, FileNotFoundError(path))
                if isinstance(value, FileNotFoundError):
                    continue  # never written: reads as fill values, as in zarr
                if isinstance(value, BaseException):
                    failed.append((i, value))
                    continue
                out[i] = value
                if self.cache and cacheable[i]:
                    self.cache.put(f"{self.identity}/{keys[i]}", value)
            todo = [i for i, _ in failed]
            last = failed[0][1] if failed else None
        if todo:
            key = keys[todo[0]]
            raise ChunkError(f"table '{key.rsplit('/', 1)[0]}': chunk '{key}' could not be fetched from "
                             f"{self.location} after {self.options.tries} tries ({type(last).__name__}: "
                             f"{str(last).strip().splitlines()[0] if str(last).strip() else ''})")
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _local(self, key: str) -> bytes | None:
        try:
            return self.store[key]
        except KeyError:
            return None
