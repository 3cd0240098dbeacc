"""Chunks as they are stored: the digest of a chunk object's bytes (`digest`, recorded at each commit;
`rows_digest` for a table's last, partly filled chunk), the check of stored bytes against their record
(`check_chunk`), and a table's rows read chunk by chunk from those bytes (`read_rows`, `read_coordinates`,
`decode_chunk_into`). Below the committed rows a chunk that is missing or cannot be decoded raises `ChunkError`
naming the table and the chunk, never reads as fill values. Writing chunks is the writer's
(`zarrfeed.writer.chunk_write`).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import xxhash

from .errors import ChunkChanged, ChunkError
from .zarr_array import Array


def digest(data: bytes | memoryview) -> str:
    """The digest recorded for a stored chunk object: XXH3-64 of its bytes (about 20 GB/s, so computing it as a
    chunk is written costs a fraction of compressing it), as 16 hex digits."""
    return xxhash.xxh3_64_hexdigest(data)


def rows_digest(array: Array, key: str, raw: bytes | None, rows: int) -> str:
    """The digest of the first `rows` rows of chunk `key`, decoded from its stored bytes `raw`: what a commit
    records of a table's last, partly filled chunk (`manifest.TAILS`). Writers rewrite that chunk as they
    append, so its stored bytes change, but its rows below a commit's count never do: this digest holds for
    every later version of the chunk. `ChunkError` if the chunk is missing or cannot be decoded."""
    return rows_digests(array, key, raw, [rows])[0]


def rows_digests(array: Array, key: str, raw: bytes | None, rows: Sequence[int]) -> list[str]:
    """`rows_digest` for each count in `rows`, from one decode of the same bytes."""
    buf = np.empty(array.chunks[0] * array.dtype.itemsize, np.uint8)
    decode_chunk_into(array, key, raw, buf)
    return [digest(buf[:n * array.dtype.itemsize].data) for n in rows]


# what a reader checks each chunk's stored bytes with before decoding them (`chunk_check.ChunkCheck.check`):
# (array, chunk index, key, bytes or None if missing) -> the bytes to decode; raises `ChunkError`
Check = Callable[[Array, int, str, "bytes | None"], "bytes | None"]


def check_chunk(key: str, raw: bytes | None, record: tuple[int, str] | None, table: str | None = None) -> None:
    """Raise `ChunkError` if the stored bytes `raw` of chunk `key` of `table` (default: the key's folder, as in
    `table/index`) are not those its commit recorded (`record`: size and digest; None: nothing recorded,
    nothing to check)."""
    if record is None or raw is None:
        return
    size, expected = record
    got = digest(raw)
    if len(raw) != size or got != expected:
        name = table or key.rsplit('/', 1)[0]
        raise ChunkChanged(f"table '{name}': chunk '{key}' is not the chunk that was committed "
                         f"({len(raw)} bytes, digest {got}; the commit recorded {size} bytes, digest {expected}): "
                         "the file was changed or replaced")


def read_rows(array: Array, start: int, stop: int, fields: list[str] | None = None,
              digests: Mapping[int, tuple[int, str]] | None = None, check: Check | None = None) -> np.ndarray:
    """Rows [start, stop) of a 1-D table (only `fields`, if given), read chunk by chunk from its stored bytes
    (on an object store all at once, as concurrent requests). Unlike zarr's own reads, a chunk that is missing
    raises `ChunkError` instead of reading as fill values (below the committed rows a missing chunk is a lost
    one), and so does one that cannot be decoded; both name the table and the chunk. With `digests` (chunk
    index -> recorded size and digest), each chunk is first checked against its record; with `check` (a
    dataset's `ChunkCheck.check`, see `core.chunk_check`), each chunk's bytes are first passed through it."""
    dtype = array.dtype if fields is None else np.dtype([(f, array.dtype[f]) for f in fields])
    if stop <= start:
        return np.zeros(0, dtype)
    c, size = array.chunks[0], array.dtype.itemsize
    indices = range(start // c, (stop - 1) // c + 1)
    keys = [array.chunk_key(i) for i in indices]
    out = np.empty(stop - start, dtype)
    flat = out.view(np.uint8)
    buf: np.ndarray | None = None
    for i, key, raw in zip(indices, keys, array.read_chunks(list(indices)), strict=True):
        if digests is not None:
            check_chunk(key, raw, digests.get(i), array.table)
        if check is not None:
            raw = check(array, i, key, raw)
        lo, hi = max(start, i * c), min(stop, (i + 1) * c)
        if hi - lo == c and fields is None:  # a whole chunk: decoded straight into the output
            decode_chunk_into(array, key, raw, flat[(lo - start) * size:(hi - start) * size])
            continue
        if buf is None:
            buf = np.empty(c * size, np.uint8)
        decode_chunk_into(array, key, raw, buf)
        if fields is None:
            flat[(lo - start) * size:(hi - start) * size] = buf[(lo - i * c) * size:(hi - i * c) * size]
        else:
            records = buf.view(array.dtype)[lo - i * c:hi - i * c]
            for f in fields:
                out[f][lo - start:hi - start] = records[f]
    return out


def read_coordinates(array: Array, rows: np.ndarray, check: Check | None = None) -> np.ndarray:
    """The records at `rows` (any order, repeats allowed) of a 1-D table: each chunk they touch is fetched
    and decoded once, missing or broken chunks raise `ChunkError` as in `read_rows`, and so does one that
    `check` refuses."""
    rows = np.asarray(rows, np.int64)
    out = np.empty(len(rows), array.dtype)
    if not len(rows):
        return out
    c = array.chunks[0]
    indices = np.unique(rows // c)
    keys = [array.chunk_key(int(i)) for i in indices]
    raws = array.read_chunks([int(i) for i in indices])
    buf = np.empty(c * array.dtype.itemsize, np.uint8)
    for i, key, raw in zip(indices, keys, raws, strict=True):
        raw = raw if check is None else check(array, int(i), key, raw)
        decode_chunk_into(array, key, raw, buf)
        mine = rows // c == i
        out[mine] = buf.view(array.dtype)[rows[mine] - i * c]
    return out


def decode_chunk_into(array: Array, key: str, raw: bytes | None, out: np.ndarray) -> None:
    """Decode the stored bytes `raw` of chunk `key` into `out` (bytes of one full chunk), with no intermediate
    copy when the array has a Blosc compressor and no filters. Tables are read below their committed rows only,
    where every chunk was written: a missing one (`raw` None) raises `ChunkError`, never reads as zeros."""
    if raw is None and array.missing_is_fill:
        out[:] = array.decode_chunk(None).reshape(-1).view(np.uint8)
        return
    if raw is None:
        table = array.table or "table"
        c = array.chunks[0]
        stored, _, inner = key[len(array.path) + 1:].partition("#")  # `c/3#5`: inner chunk 5 of shard c/3
        found = array.meta.chunk_index(stored) if key.startswith(array.path + "/") else None
        found = found + int(inner) if found is not None and inner.isdigit() else found
        rows = f" (rows {found * c:,}-{(found + 1) * c:,})" if found is not None else ""
        raise ChunkError(f"table '{table}': chunk '{key}'{rows} is missing, below the committed rows; the dataset "
                         "is incomplete (zarrfeed validate lists every missing chunk)")
    try:
        array.decode_into(raw, out)
    except ChunkError:  # (a table that reads its rows as it decodes them, `external_table`, names what failed)
        raise
    except Exception as exc:
        name = array.table or "table"
        raise ChunkError(f"table '{name}': chunk '{key}' cannot be decoded ({type(exc).__name__}: {exc}); "
                         "the file is truncated or corrupt") from None
