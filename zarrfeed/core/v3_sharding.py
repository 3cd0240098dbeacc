"""Shards of zarr v3's `sharding_indexed` codec: many inner chunks stored as one object, and an index saying where
each one lies, read and written by zarrfeed itself.

Written from the specification (https://zarr-specs.readthedocs.io/en/latest/v3/codecs/sharding-indexed/): a
shard holds its inner chunks' encoded bytes and an index of `(offset, nbytes)` uint64 pairs, one per inner
chunk in C order over the shard's grid of inner chunks, encoded by `index_codecs` (`bytes`, and a `crc32c` of
the index); the index lies at the shard's start or end (`index_location`). An inner chunk that holds only the
fill value is left out, its pair both 2**64 - 1 (`MISSING`). Offsets count from the shard's first byte, so at
"start" the data begins after the index (whose size is fixed).

Writing is append-only (`assemble`): a shard rewritten with new or replaced inner chunks keeps every byte its
old index pointed to at the same offset, and adds the new bytes after them. So a reader that read the old index
and then reads the new shard (another object version, a longer file) still finds at each old offset the bytes
it expects; only a reader of the new index sees the new chunks. `compact` drops the bytes no index points to,
for a shard that no writer appends to any more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from .errors import MetaError

if TYPE_CHECKING:
    from .v3_codecs import CodecChain

MISSING = 2**64 - 1  # offset and nbytes of an inner chunk that is not stored (it reads as the fill value)
INDEX_LOCATIONS = ("start", "end")
DEFAULT_INDEX_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]


@dataclass(frozen=True)
class ShardingSpec:
    """A checked `sharding_indexed` configuration for shards of `shard_shape` values: inner chunks of
    `chunk_shape` encoded by `codecs`, their index by `index_codecs`, the index at `index_location`."""

    shard_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    codecs: "CodecChain"
    index_codecs: "CodecChain"
    index_location: str = "end"

    @classmethod
    def parse(cls, config: dict[str, Any], dtype: np.dtype, shard_shape: tuple[int, ...], where: str,
              parse_chain: Callable[..., "CodecChain"]) -> "ShardingSpec":
        """A `sharding_indexed` codec's configuration for shards of `shard_shape` (the array's chunk shape);
        `parse_chain(codecs, dtype, chunk_shape, where)` parses the inner and index chains. `MetaError` naming
        `where` and the field for one zarrfeed does not read."""
        inner = config.get("chunk_shape")
        if not (isinstance(inner, list) and len(inner) == len(shard_shape)
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in inner)):
            raise MetaError(f"{where}: field 'chunk_shape' is {inner!r}, not one whole number >= 1 per dimension "
                            f"of the shard shape {list(shard_shape)}")
        if any(s % c for s, c in zip(shard_shape, inner, strict=True)):
            raise MetaError(f"{where}: field 'chunk_shape' is {inner}, which does not divide the shard shape "
                            f"{list(shard_shape)} (the array's chunk shape) into whole inner chunks")
        location = config.get("index_location", "end")
        if location not in INDEX_LOCATIONS:
            raise MetaError(f"{where}: field 'index_location' is {location!r}, not 'start' or 'end'")
        codecs = parse_chain(config["codecs"], dtype, tuple(inner), f"{where} codecs")
        grid = tuple(s // c for s, c in zip(shard_shape, inner, strict=True))
        index = parse_chain(config.get("index_codecs", DEFAULT_INDEX_CODECS), np.dtype("<u8"), (*grid, 2),
                            f"{where} index_codecs")
        if index.encoded_size() is None:
            raise MetaError(f"{where}: field 'index_codecs' is {index.to_json()!r}: an index must keep a fixed size "
                            "('bytes', 'transpose' and 'crc32c' only)")
        return cls(tuple(shard_shape), tuple(inner), codecs, index, location)

    # ------------------------------------------------------------ the index
    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        """The shard's grid of inner chunks."""
        return tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape, strict=True))

    @property
    def inner_per_shard(self) -> int:
        """How many inner chunks one shard holds (entries of its index)."""
        return math.prod(self.chunks_per_shard)

    @property
    def index_nbytes(self) -> int:
        """Bytes of the encoded index."""
        return self.index_codecs.encoded_size() or 0

    def index_range(self, shard_size: int | None = None) -> tuple[int, int | None]:
        """Where the index lies in a shard, as (start, stop): (0, index_nbytes) at "start"; at "end" a suffix,
        (-index_nbytes, None), when the shard's size is unknown (an object store's suffix range request), else
        the absolute range."""
        n = self.index_nbytes
        if self.index_location == "start":
            return 0, n
        return (-n, None) if shard_size is None else (shard_size - n, shard_size)

    def index_bytes(self, shard: bytes | memoryview) -> memoryview:
        """The encoded index of a whole shard; `ValueError` if the shard is shorter than one."""
        view, n = memoryview(shard).cast("B"), self.index_nbytes
        if len(view) < n:
            raise ValueError(f"the shard is {len(view)} bytes, shorter than its index ({n})")
        return view[:n] if self.index_location == "start" else view[len(view) - n:]

    def decode_index(self, raw: bytes | memoryview) -> np.ndarray:
        """The index, (inner_per_shard, 2) uint64 of (offset, nbytes) in C order of the inner chunks, both
        `MISSING` for one not stored; `ValueError` if it does not decode (a crc32c checksum mismatch)."""
        out = np.empty(self.inner_per_shard * 16, np.uint8)
        try:
            self.index_codecs.decode_into(raw, out)
        except ValueError as exc:
            raise ValueError(f"shard index: {exc}") from None
        entries = out.view("<u8").reshape(-1, 2)
        half = (entries[:, 0] == MISSING) != (entries[:, 1] == MISSING)
        if half.any():
            raise ValueError(f"shard index: entry {int(np.argmax(half))} is half missing ({entries[half][0]})")
        return entries

    def encode_index(self, entries: np.ndarray) -> bytes:
        """(inner_per_shard, 2) uint64 entries encoded by `index_codecs`."""
        values = np.ascontiguousarray(entries, "<u8").reshape((*self.chunks_per_shard, 2))
        return self.index_codecs.encode(values)

    def data_range(self, shard_size: int) -> tuple[int, int]:
        """Where a shard of `shard_size` bytes holds inner chunks: everything but its index."""
        n = self.index_nbytes
        return (n, shard_size) if self.index_location == "start" else (0, shard_size - n)

    def check(self, entries: np.ndarray, shard_size: int) -> None:
        """`ValueError` if a stored inner chunk lies outside the data of a shard of `shard_size` bytes."""
        lo, hi = self.data_range(shard_size)
        live = entries[:, 0] != MISSING
        starts, sizes = entries[live, 0], entries[live, 1]
        bad = (starts < lo) | (starts > hi) | (sizes > hi - np.minimum(starts, hi))
        if bad.any():
            i = int(np.flatnonzero(live)[np.argmax(bad)])
            raise ValueError(f"shard index: inner chunk {i} at {entries[i].tolist()} lies outside the shard's "
                             f"data (bytes {lo}-{hi})")

    def chunks(self, shard: bytes | memoryview) -> dict[int, memoryview]:
        """Every stored inner chunk of a whole shard, by its index in C order -> its encoded bytes (no copy)."""
        view = memoryview(shard).cast("B")
        entries = self.decode_index(self.index_bytes(view))
        self.check(entries, len(view))
        return {int(i): view[int(entries[i, 0]):int(entries[i, 0] + entries[i, 1])]
                for i in np.flatnonzero(entries[:, 0] != MISSING)}


def assemble(spec: ShardingSpec, old: bytes | memoryview | None, new: Mapping[int, bytes | None]) -> bytes:
    """A shard holding `old`'s inner chunks (a stored shard; None: none) with `new` ones (inner index in C order
    -> encoded bytes; None or empty: now missing, reads as fill) added or replaced, append-only: every byte of
    `old`'s data keeps its offset, the new bytes follow it in index order, and the index is rewritten (at "end"
    it moves past the new bytes; at "start" it keeps its fixed size). A reader that read `old`'s index and then
    reads this shard finds every chunk that index points to, unchanged; replaced chunks' old bytes stay until
    `compact`. `ValueError` if `old` does not decode, `IndexError` for an inner index outside the shard."""
    n = spec.inner_per_shard
    if old is None:
        kept, entries = memoryview(b""), np.full((n, 2), MISSING, "<u8")
    else:
        view = memoryview(old).cast("B")
        entries = spec.decode_index(spec.index_bytes(view)).copy()
        spec.check(entries, len(view))
        lo, hi = spec.data_range(len(view))
        kept = view[lo:hi]
    at = (spec.index_nbytes if spec.index_location == "start" else 0) + len(kept)
    added: list[Any] = []
    for i in sorted(new):
        if not 0 <= i < n:
            raise IndexError(f"inner chunk {i} of a shard of {n}")
        data = new[i]
        if not data:
            entries[i] = MISSING
            continue
        entries[i] = (at, len(data))
        added.append(data)
        at += len(data)
    index = spec.encode_index(entries)
    parts = [index, kept, *added] if spec.index_location == "start" else [kept, *added, index]
    return b"".join(parts)


def compact(spec: ShardingSpec, shard: bytes | memoryview) -> bytes:
    """The shard with only its stored inner chunks, packed in index order (the bytes of replaced chunks
    dropped): for a shard no writer appends to any more, since offsets move."""
    return assemble(spec, None, {i: bytes(b) for i, b in spec.chunks(shard).items()})
