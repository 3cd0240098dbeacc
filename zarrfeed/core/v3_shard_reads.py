"""Inner chunks read out of zarr v3 shards: each shard's index, then only the chunks asked for.

A shard is one stored object holding many inner chunks and an index of where each lies (`v3_sharding`). To
read some of them, a reader needs the index first (a suffix range request when it is at the end, as zarr-python
writes it: no request for the object's size), then the bytes of each chunk; on an object store each step is
one round of concurrent range requests (`Store.get_ranges`), and chunks that lie next to each other in a shard
are read by one request. The index is read anew on every call: a writer may have appended to the shard since.
A shard written append-only (`v3_sharding.assemble`) keeps every chunk an older index points to where it was,
so an index and the chunk bytes read in two steps always agree.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import ChunkError
from .stores import Store
from .v3_sharding import ShardingSpec

EMPTY = 2**64 - 1  # an inner chunk left out of its shard: it holds only the fill value
GAP = 1 << 16  # chunks of one shard closer than this are read by one range request (a request costs more)


def read_indexes(store: Store, spec: ShardingSpec, shards: Sequence[str], table: str = ""
                 ) -> dict[str, np.ndarray | None]:
    """Each shard's decoded index ((n, 2) uint64: offset, bytes), None for a shard that is not stored;
    `ChunkError` naming `table` (if given) and the shard for an index that does not decode."""
    start, stop = spec.index_range(None)
    raws = store.get_ranges([(key, start, stop) for key in shards])
    out: dict[str, np.ndarray | None] = {}
    for key, raw in zip(shards, raws, strict=True):
        if raw is None:
            out[key] = None
            continue
        try:
            out[key] = spec.decode_index(raw)
        except ValueError as exc:
            raise ChunkError(f"{_table(table)}shard '{key}': its index cannot be read ({exc}); the file is truncated "
                             "or corrupt") from None
    return out


def inner_stored(store: Store, spec: ShardingSpec, places: Sequence[tuple[str, int]], table: str = ""
                 ) -> list[bool]:
    """Whether each inner chunk at `places` ((shard key, position)) is stored: its shard is, and its index
    entry is not that of a chunk left out."""
    indexes = read_indexes(store, spec, sorted({key for key, _ in places}), table)
    out = []
    for key, position in places:
        index = indexes[key]
        out.append(index is not None and not (int(index[position][0]) == EMPTY and int(index[position][1]) == EMPTY))
    return out


def read_inner_chunks(store: Store, spec: ShardingSpec, places: Sequence[tuple[str, int]], table: str = ""
                      ) -> list[bytes | None]:
    """The encoded bytes of each inner chunk at `places` ((shard key, position in the shard)); None for one
    whose shard is not stored or that its shard leaves out (all fill). Errors name `table`, if given."""
    indexes = read_indexes(store, spec, sorted({key for key, _ in places}), table)
    wanted: dict[str, list[tuple[int, int, int]]] = {}  # shard -> (offset, bytes, place number)
    for n, (key, position) in enumerate(places):
        index = indexes[key]
        if index is None:
            continue
        offset, nbytes = (int(v) for v in index[position])
        if offset == EMPTY and nbytes == EMPTY:
            continue
        wanted.setdefault(key, []).append((offset, nbytes, n))
    requests: list[tuple[str, int, int]] = []
    parts: list[list[tuple[int, int, int]]] = []  # per request: (start within it, bytes, place number)
    for key, spans in wanted.items():
        spans.sort()
        for offset, nbytes, n in spans:
            if requests and requests[-1][0] == key and offset - requests[-1][2] <= GAP \
                    and offset >= requests[-1][1]:
                first = requests[-1][1]
                requests[-1] = (key, first, max(requests[-1][2], offset + nbytes))
                parts[-1].append((offset - first, nbytes, n))
            else:
                requests.append((key, offset, offset + nbytes))
                parts.append([(0, nbytes, n)])
    out: list[bytes | None] = [None] * len(places)
    for (key, lo, hi), raw, spans in zip(requests, store.get_ranges(requests), parts, strict=True):
        if raw is None:  # gone between its index and its chunks: deleted (a table cut shorter), or another copy
            raise ChunkError(f"{_table(table)}shard '{key}': gone while it was read (its index was read a moment "
                             "before); the dataset was changed under this reader")
        if len(raw) != hi - lo:  # a shard is only ever replaced by a longer one (append-only): its index lies
            raise ChunkError(f"{_table(table)}shard '{key}': its index points outside the shard (bytes {lo:,}-"
                             f"{hi:,}, of which {len(raw):,} are stored); the shard is corrupt (restore it from a "
                             "copy)")
        view = memoryview(raw)
        for start, nbytes, n in spans:
            out[n] = bytes(view[start:start + nbytes])
    return out


def _table(table: str) -> str:
    return f"table '{table}': " if table else ""
