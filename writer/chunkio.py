"""Writing rows to a table at a global row offset.

Whole chunks have one writer (the rows were reserved for it), so they are encoded here and stored directly,
with no lock and no read: exactly the bytes zarr would store (the array's filters, then its compressor); on
an object store all whole chunks of a segment are sent at once (concurrent PUTs), since one at a time waits
on the network for each.
A chunk that the rows only partly cover is shared with another reservation, so it is read, merged and
written back through zarr under the synchronizer's per-chunk lock. The store writes every chunk file to a
temporary name and renames it, so a chunk is never torn.
"""
from __future__ import annotations

import numcodecs
import numpy as np
import zarr


def chunk_key(array: zarr.Array, index: int) -> str:
    """Store key of a 1-D array's chunk `index` (the dimension separator only joins dimensions)."""
    return f"{array.path}/{index}" if array.path else str(index)


def encode_chunk(array: zarr.Array, rows: np.ndarray) -> bytes:
    """One full chunk of rows encoded as zarr does: filters in order, then the compressor."""
    data = np.ascontiguousarray(rows)
    for f in array.filters or ():
        data = f.encode(data)
    return array.compressor.encode(data) if array.compressor else data.tobytes()


def write_rows(array: zarr.Array, locked: zarr.Array, start: int, rows: np.ndarray) -> int:
    """Write `rows` at `start`; `locked` is the same array opened with a synchronizer and
    `cache_metadata=False`. Returns how many chunks needed the lock."""
    c = array.chunks[0]
    end = start + len(rows)
    first_whole = -(-start // c) * c
    last_whole = end // c * c
    if first_whole >= last_whole:  # no whole chunk: one or two partial chunks
        locked[start:end] = rows
        return len({start // c, (end - 1) // c}) if len(rows) else 0
    shared = 0
    if start < first_whole:
        locked[start:first_whole] = rows[: first_whole - start]
        shared += 1
    store = array.chunk_store
    whole = {chunk_key(array, lo // c): encode_chunk(array, rows[lo - start: lo - start + c])
             for lo in range(first_whole, last_whole, c)}
    if isinstance(store, zarr.storage.FSStore):  # one concurrent request per chunk, not one after another
        store.setitems(whole)
    else:
        for key, data in whole.items():
            store[key] = data
    if last_whole < end:
        locked[last_whole:end] = rows[last_whole - start:]
        shared += 1
    return shared


class ChunkError(ValueError):
    """A chunk cannot be read; the message names the table and the chunk key."""


def read_rows(array: zarr.Array, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a 1-D array through zarr; a chunk that cannot be decoded raises ChunkError naming
    the table and the chunk (zarr's own error names neither: "error during blosc decompression: -1")."""
    if stop <= start:
        return np.zeros(0, array.dtype)
    try:
        return array[start:stop]
    except Exception:
        pass
    step = array.chunks[0]
    out = np.empty(stop - start, array.dtype)
    for first in range(start // step * step, stop, step):  # again chunk by chunk, to name the broken one
        a, b = max(first, start), min(first + step, stop)
        try:
            out[a - start:b - start] = array[a:b]
        except Exception as exc:
            name = array.path or "table"
            raise ChunkError(f"table '{name}': chunk '{chunk_key(array, first // step)}' cannot be decoded "
                             f"({type(exc).__name__}: {exc}); the file is truncated or corrupt") from None
    return out


def read_chunk_into(array: zarr.Array, index: int, out: np.ndarray) -> None:
    """Decode chunk `index` of a 1-D array into `out` (bytes of one full chunk); see `decode_chunk_into`."""
    key = chunk_key(array, index)
    try:
        raw = array.chunk_store[key]
    except KeyError:
        raw = None
    decode_chunk_into(array, key, raw, out)


def decode_chunk_into(array: zarr.Array, key: str, raw: bytes | None, out: np.ndarray) -> None:
    """Decode the stored bytes `raw` of chunk `key` into `out` (bytes of one full chunk), with no intermediate
    copy when the array has a Blosc compressor and no filters. A chunk never written (`raw` None) reads as the
    fill value."""
    if raw is None:
        out.view(array.dtype)[:] = array.fill_value if array.fill_value is not None else np.zeros(1, array.dtype)[0]
        return
    try:
        comp = array.compressor
        if isinstance(comp, numcodecs.Blosc) and not array.filters:
            # Blosc accepts a larger `out` silently; its 16-byte header says the decoded size (bytes 4-8)
            header = bytes(memoryview(raw)[:16])
            size = int.from_bytes(header[4:8], "little") if len(header) == 16 else -1
            if size != out.nbytes:
                raise ValueError(f"it decodes to {size} bytes, a chunk holds {out.nbytes}")
            comp.decode(raw, out=out)
            return
        data = comp.decode(raw) if comp else raw
        for f in reversed(array.filters or ()):
            data = f.decode(data)
        data = np.frombuffer(memoryview(data).cast("B"), np.uint8) if not isinstance(data, np.ndarray) else data
        if data.nbytes != out.nbytes:
            raise ValueError(f"it decodes to {data.nbytes} bytes, a chunk holds {out.nbytes}")
        out[:] = data.reshape(-1).view(np.uint8)
    except Exception as exc:
        name = array.path or "table"
        raise ChunkError(f"table '{name}': chunk '{key}' cannot be decoded ({type(exc).__name__}: {exc}); "
                         "the file is truncated or corrupt") from None
