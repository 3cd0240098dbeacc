"""Writing rows into a table's chunks: whole chunks with no lock, shared chunks merged under their lock.

In a sharded (zarr v3) table many chunks share one stored object, which every write reads and writes back
whole (`Array.write_chunks`): there each write holds the lock of its shard, whole chunks too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.chunks import decode_chunk_into, digest
from ..core.zarr_array import Array


@dataclass(frozen=True)
class ChunkWrite:
    """One chunk object stored by a writer: its table and index, the size and digest of the bytes stored, and
    for a chunk shared with another writer (read, merged, written back under its lock) the digest of the
    object it replaced (None: there was none). The committer follows these links to tell which write of a
    shared chunk came last, whatever order the reports arrive in."""

    table: str
    index: int
    size: int
    digest: str
    replaced: str | None = None
    shared: bool = False
    unsynced: bool = False  # its bytes are not durable yet: the committer syncs them before a commit names it


def write_rows(array: Array, start: int, rows: np.ndarray, synchronizer: Any,
               guard: Callable[[], None] | None = None, sync_later: bool = False) -> list[ChunkWrite]:
    """Write `rows` at `start`; `synchronizer[key]` is a lock for a chunk key (zarr's synchronizer protocol).
    Whole chunks are encoded and stored with no lock and no read; a chunk the rows only partly cover is read,
    merged and written back under its lock. `guard()` is called just before each store write and raises to
    stop it (a writer whose lease may be lost). `sync_later`: whole chunks of an unsharded array are stored
    without waiting for their bytes to be durable (`ChunkWrite.unsynced`; the caller's committer syncs them:
    `Committer.stored`); a whole chunk is one no commit names yet, for a writer only appends. Returns what
    was stored, chunk by chunk."""
    guard = guard or _no_guard
    c = array.chunks[0]
    end = start + len(rows)
    if not len(rows):
        return []
    first_whole = -(-start // c) * c
    last_whole = end // c * c
    out = []
    if first_whole >= last_whole:  # no whole chunk: one or two partial chunks
        for lo in sorted({start // c * c, (end - 1) // c * c}):
            a, b = max(start, lo), min(end, lo + c)
            out.append(_merge(array, synchronizer, lo // c, a - lo, rows[a - start:b - start], guard))
        return out
    if start < first_whole:
        out.append(_merge(array, synchronizer, start // c, start % c, rows[: first_whole - start], guard))
    whole = {lo // c: array.encode_chunk(rows[lo - start: lo - start + c]) for lo in range(first_whole, last_whole, c)}
    unsynced: list[str] = []
    if array.sharding is None:
        guard()
        if sync_later:
            unsynced = array.write_new_chunks(whole)
        else:
            array.write_chunks(whole, durable_later=True)  # on an object store one concurrent request per chunk
    else:
        by_shard: dict[str, dict[int, bytes]] = {}
        for i, data in whole.items():
            by_shard.setdefault(object_key(array, i), {})[i] = data
        for key, part in by_shard.items():
            with synchronizer[key]:
                guard()
                array.write_chunks(part, durable_later=True)
    out.extend(ChunkWrite(array.table, i, len(data), digest(data), unsynced=bool(unsynced))
               for i, data in whole.items())
    if last_whole < end:
        out.append(_merge(array, synchronizer, last_whole // c, 0, rows[last_whole - start:], guard))
    return out


def _no_guard() -> None:
    pass


def object_key(array: Array, index: int) -> str:
    """The key of the stored object holding chunk `index`: the chunk's own, or its shard's (what its lock
    is named by)."""
    return array.chunk_key(index).partition("#")[0]


def _merge(array: Array, synchronizer: Any, index: int, offset: int, rows: np.ndarray,
           guard: Callable[[], None]) -> ChunkWrite:
    """Write `rows` at row `offset` of chunk `index`, which another writer may share: under the chunk's lock,
    read it (a chunk not yet written holds zeros, as zarr's fill value), merge, encode, store."""
    key = array.chunk_key(index)
    c, size = array.chunks[0], array.dtype.itemsize
    buf = np.zeros(c * size, np.uint8)
    with synchronizer[object_key(array, index)]:
        before = array.read_chunks([index])[0]
        if before is not None:
            decode_chunk_into(array, key, before, buf)
        buf[offset * size:(offset + len(rows)) * size] = np.ascontiguousarray(rows).view(np.uint8).reshape(-1)
        data = array.encode_chunk(buf.view(array.dtype))
        guard()
        array.write_chunks({index: data}, durable_later=True)
    return ChunkWrite(array.table, index, len(data), digest(data), digest(before) if before is not None else None,
                      shared=True)
