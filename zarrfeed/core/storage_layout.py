"""How a dataset's tables are stored: the zarr format (2, the default; or 3), and for v3 the rows of a shard.

The format is a property of the store, not of the data: the same schema, rows and commits in v2 or v3 are
the same dataset. A v3 table is sharded along its first axis: a shard holds `shard_rows` rows (whole inner
chunks of the table's `chunk_rows`), with a crc32c checksum on every inner chunk and on the shard's index.
`shard_bytes` (decoded) sets how many chunks a shard holds: DEFAULT_SHARD_BYTES keeps a shard of the
bench's L5Kit tables at a few MB compressed (14 agent chunks, one frames chunk), which cuts the objects of
a dataset by ten or more on an object store while a writer still writes each shard whole in one PUT (its
segments end on shard boundaries: a shard written in parts is read and written back for each part).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np

from .errors import FormatError, MetaError
from .v3_codecs import CodecChain, bytes_json, compressor_json
from .v3_meta import ArrayMetaV3
from .zarr_meta import ArrayMeta

DEFAULT_SHARD_BYTES = 16 << 20
# a shard is written whole (read back and rewritten to append to it) and a writer holds one shard's rows in each
# of its shared-memory segments: larger ones cost memory and rewrites, and buy nothing on any store
MAX_SHARD_BYTES = 2 << 30
# inner chunks of a shard at most: its index (16 bytes a chunk) is read before any chunk of it, so a table of
# small chunks (a replay buffer's 250 steps of 2 floats: 2 KB) would otherwise get an index of 130 KB per 16 MiB
# shard, read to fetch one chunk of 2 KB; with this bound an index is at most 16 KiB
MAX_CHUNKS_PER_SHARD = 1024
FORMATS = (2, 3)


@dataclass(frozen=True)
class StorageLayout:
    """A dataset's storage: `zarr_format` 2 or 3; for 3, the decoded bytes a shard holds at most."""

    zarr_format: int = 2
    shard_bytes: int = DEFAULT_SHARD_BYTES

    def __post_init__(self) -> None:
        if self.zarr_format not in FORMATS:
            raise ValueError(f"zarr_format must be 2 or 3, got {self.zarr_format!r}")
        if isinstance(self.shard_bytes, bool) or not isinstance(self.shard_bytes, int) or \
                not 1 <= self.shard_bytes <= MAX_SHARD_BYTES:
            raise ValueError(f"shard_bytes must be a whole number of bytes from 1 to {MAX_SHARD_BYTES:,} (2 GiB), got "
                             f"{self.shard_bytes!r}")

    def shard_rows(self, chunk_rows: int, row_bytes: int) -> int:
        """Rows of a shard: the most whole chunks that fit in `shard_bytes` decoded, at least one, at most
        `MAX_CHUNKS_PER_SHARD`."""
        return chunk_rows * max(1, min(self.shard_bytes // max(chunk_rows * row_bytes, 1), MAX_CHUNKS_PER_SHARD))

    def array_meta(self, shape: tuple[int, ...], chunk_rows: int, dtype: np.dtype,
                   compressor: numcodecs.abc.Codec | None, fill_value: Any = None,
                   where: str = "") -> ArrayMeta | ArrayMetaV3:
        """The document of a new array (0 rows, or `shape`) chunked along its first axis."""
        if self.zarr_format == 2:
            return ArrayMeta.new(shape, chunk_rows, dtype, compressor, fill_value=fill_value)
        dtype = np.dtype(dtype)
        row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        shard = self.shard_rows(chunk_rows, row_bytes)
        try:  # inner chunks: `bytes`, the compressor's v3 codec, a crc32c; the index: `bytes`, a crc32c
            inner = [bytes_json(dtype)] + ([compressor_json(compressor, dtype)] if compressor is not None else []) \
                + [{"name": "crc32c"}]
        except MetaError as exc:
            raise FormatError(f"{where}: {exc}") from None
        codecs = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [chunk_rows, *shape[1:]], "codecs": inner,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]
        chain = CodecChain.parse(codecs, dtype, (shard, *shape[1:]), where or "zarr.json")
        return ArrayMetaV3.new(shape, chunk_rows, dtype, chain, shard_rows=shard, fill_value=fill_value)

    def to_json(self) -> dict[str, Any]:
        return {"zarr_format": self.zarr_format, "shard_bytes": self.shard_bytes}

    @classmethod
    def from_json(cls, doc: Any) -> "StorageLayout":
        """The layout a manifest records (`None`: a v2 dataset, as every dataset was before v3)."""
        if doc is None:
            return cls()
        return cls(int(doc["zarr_format"]), int(doc["shard_bytes"]))
