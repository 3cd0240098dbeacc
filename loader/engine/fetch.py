"""Fetching stored chunk objects for the reader workers: many at a time, retried, optionally cached on disk.

On an object store one GET at a time is bound by latency, not bandwidth, so a worker asks for all the chunks
it must decode for a window at once (fsspec's `cat` of a list runs the requests concurrently). A transient
error (a dropped connection, a throttled request, a server restarting) is retried with exponential backoff;
after the last try the error names the chunk key and the store. Only a key that does not exist reads as
missing, and a missing chunk is refused by the decoder (zarr would read it as fill values).

`cache_dir` keeps fetched chunk objects on local disk across epochs, bounded in bytes (least recently used
go first). Entries are named by what they contain: the digest their commit recorded for the chunk. So a copy
of a dataset, an overwritten one, or another dataset never reads another's chunk (a name that copies share,
such as the dataset's id, would let them), and only chunks with a recorded digest are cached: sealed ones,
which no writer changes any more. What is fetched is checked against the record before it is cached or
used, and a hit is checked again when read (a disk can flip bits too; hashing a chunk costs a small
fraction of decoding it). We write this small cache ourselves because fsspec's caching filesystems have no bound
in bytes and name entries by path.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from ...core.chunks import check_chunk, digest
from ...core.errors import ChunkError
from ...core.location import Location
from ...core.zarr_array import Array

Record = tuple[int, str]  # a chunk's recorded size and digest


@dataclass(frozen=True)
class ChunkRef:
    """Chunk `index` of `array`: what a worker fetches (its array says where the bytes are: an object of its
    own, or a range of a v3 shard)."""

    array: Array
    index: int

    @property
    def key(self) -> str:
        return self.array.chunk_key(self.index)

TRIES = 4
BACKOFF = 0.25  # seconds before the second try; doubled for each further one


@dataclass(frozen=True)
class FetchOptions:
    """How reader workers fetch chunks: the local cache (None: no cache) and its bound, and retries."""

    cache_dir: str | None = None
    cache_bytes: int = 8 << 30
    tries: int = TRIES


class DiskCache:
    """Chunk objects in one folder, each named by its recorded size and digest, at most `limit` bytes in all.

    A layer below the chunk caches (`chunk_cache.ChunkCache`: decoded chunks in shared memory, which the
    scheduler pins): this one keeps the stored bytes a worker fetched, so that a chunk decoded again (in a later
    epoch, by another loader or run) is read from local disk rather than the object store. Only the worker's
    fetcher uses it; the scheduler never sees it."""

    def __init__(self, folder: str, limit: int) -> None:
        self.folder, self.limit = folder, int(limit)
        os.makedirs(folder, exist_ok=True)
        self.used = self._scan()

    def _scan(self) -> int:
        return sum(e.stat().st_size for e in os.scandir(self.folder) if e.is_file() and e.name.endswith(".chunk"))

    def _path(self, record: Record) -> str:
        return os.path.join(self.folder, f"{record[1]}-{record[0]}.chunk")

    def get(self, record: Record) -> bytes | None:
        """The cached object with this size and digest, or None (absent, or damaged on disk: then removed)."""
        path = self._path(record)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if len(data) != record[0] or digest(data) != record[1]:
            _unlink(path)
            return None
        os.utime(path)  # recently used: evicted last
        return data

    def put(self, record: Record, data: bytes) -> None:
        if len(data) > self.limit:
            return
        path = self._path(record)
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
            _unlink(path)
            used -= size
        self.used = used


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:  # another worker evicted it first
        pass


class ChunkFetcher:
    """Stored bytes of chunk keys of the dataset at `location` (None for a key that does not exist). Each key
    comes with the size and digest its commit recorded, or None: a recorded chunk is checked (and may be
    cached on disk), an unrecorded one is neither."""

    def __init__(self, location: Location, store: Any, options: FetchOptions) -> None:
        self.location, self.store, self.options = location, store, options
        self.remote = location.settings.remote
        if self.remote:
            self.fs, self.root = location.filesystem()
        self.cache = DiskCache(options.cache_dir, options.cache_bytes) if options.cache_dir and self.remote else None
        self._ahead: dict[str, tuple[Any, int]] = {}  # key -> (future of a prefetch, its index in the result)
        self._pool: Any = None

    def prefetch(self, refs: list[ChunkRef], records: list[Record | None]) -> None:
        """Start fetching `refs` in a background thread (network waits release the GIL), for a later `fetch`."""
        if not self.remote:
            return
        todo = [(c, r) for c, r in zip(refs, records, strict=True) if c.key not in self._ahead]
        if todo:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(1, thread_name_prefix="zarrfeed-fetch")
            cs, rs = [c for c, _ in todo], [r for _, r in todo]
            future = self._pool.submit(self._fetch_now, cs, rs)
            for i, c in enumerate(cs):
                self._ahead[c.key] = (future, i)

    def fetch(self, refs: list[ChunkRef], records: list[Record | None]) -> list[bytes | None]:
        """The stored bytes of each chunk (None: not stored), checked against its record."""
        if not self.remote:  # a local store: the page cache is the cache, and reads do not wait on a network
            return [self._check(c, raw, r) for c, raw, r in zip(refs, _read(refs), records, strict=True)]
        out: list = [None] * len(refs)
        rest = []
        for i, ref in enumerate(refs):
            ahead = self._ahead.pop(ref.key, None)
            if ahead is None:
                rest.append(i)
                continue
            try:
                out[i] = ahead[0].result()[ahead[1]]
            except ChunkError:  # fetched ahead and failed: try again now, and report from here
                rest.append(i)
        if rest:
            values = self._fetch_now([refs[i] for i in rest], [records[i] for i in rest])
            for i, value in zip(rest, values, strict=True):
                out[i] = value
        return out

    def _fetch_now(self, refs: list[ChunkRef], records: list[Record | None]) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(refs)
        todo = []
        for i, ref in enumerate(refs):
            record = records[i]
            hit = self.cache.get(record) if self.cache and record is not None else None
            if hit is not None:
                out[i] = hit
            else:
                todo.append(i)
        last: BaseException | None = None
        for attempt in range(self.options.tries):
            if not todo:
                break
            if attempt:
                time.sleep(BACKOFF * 2 ** (attempt - 1))
            got = self._attempt([refs[i] for i in todo])
            failed = []
            for i, value in zip(todo, got, strict=True):
                if isinstance(value, FileNotFoundError):
                    continue  # missing: left None, which the decoder refuses (never fill values)
                if isinstance(value, BaseException):
                    failed.append((i, value))
                    continue
                out[i] = self._check(refs[i], value, records[i])
                record = records[i]
                if self.cache and record is not None:
                    self.cache.put(record, value)
            todo = [i for i, _ in failed]
            last = failed[0][1] if failed else None
        if todo:
            key = refs[todo[0]].key
            tries = "1 try" if self.options.tries == 1 else f"{self.options.tries} tries"
            raise ChunkError(f"table '{refs[todo[0]].array.table}': chunk '{key}' could not be fetched from "
                             f"{self.location} after {tries} ({type(last).__name__}: "
                             f"{str(last).strip().splitlines()[0] if str(last).strip() else ''})")
        return out

    def _attempt(self, refs: list[ChunkRef]) -> list[bytes | BaseException]:
        """One try at every chunk: its bytes, or the error its request met (FileNotFoundError: not stored). Chunks
        of their own object are fetched by one concurrent `cat`; inner chunks of shards, and chunks of tables not
        stored as zarr arrays (`core.external_table`), through their array (a failure there fails every chunk of
        that array, which is tried again)."""
        out: list[bytes | BaseException] = [FileNotFoundError()] * len(refs)
        plain = [i for i, c in enumerate(refs) if not _through_array(c.array)]
        if plain:
            paths = [f"{self.root}/{refs[i].key}" for i in plain]
            try:
                got = self.fs.cat(paths, on_error="return")
            except Exception as exc:  # the whole request failed: every key is retried
                got = {p: exc for p in paths}
            for i, path in zip(plain, paths, strict=True):
                out[i] = got.get(path, FileNotFoundError(path))
        sharded: dict[int, list[int]] = {}
        for i, c in enumerate(refs):
            if _through_array(c.array):
                sharded.setdefault(id(c.array), []).append(i)
        for group in sharded.values():
            array = refs[group[0]].array
            try:
                values: list[bytes | BaseException] = [FileNotFoundError() if v is None else v
                                                       for v in array.read_chunks([refs[i].index for i in group])]
            except ChunkError:
                raise
            except Exception as exc:
                values = [exc] * len(group)
            for i, value in zip(group, values, strict=True):
                out[i] = value
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _check(self, ref: ChunkRef, raw: bytes | None, record: Record | None) -> bytes | None:
        """`raw`, if it is what the commit recorded (or nothing was recorded); else `ChunkError`."""
        check_chunk(ref.key, raw, record, ref.array.table)
        return raw



def _through_array(array: Array) -> bool:
    """Whether `array`'s chunks are read through its `read_chunks` rather than fetched as objects by key: inner
    chunks of v3 shards, and tables whose rows are not zarr chunks (`ExternalTable.reads_own_chunks`)."""
    return array.sharding is not None or bool(getattr(array, "reads_own_chunks", False))


def _read(refs: list[ChunkRef]) -> list[bytes | None]:
    """Each chunk's stored bytes, read array by array (a shard's index once for all its chunks asked for)."""
    out: list[bytes | None] = [None] * len(refs)
    by_array: dict[int, list[int]] = {}
    for i, ref in enumerate(refs):
        by_array.setdefault(id(ref.array), []).append(i)
    for group in by_array.values():
        for i, raw in zip(group, refs[group[0]].array.read_chunks([refs[i].index for i in group]), strict=True):
            out[i] = raw
    return out
