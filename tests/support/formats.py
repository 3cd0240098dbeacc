"""The zarr formats a writer test runs in: v2 (the default) and v3 with shards that are small against their inner
chunks, so that a shard holds several of them and is shared by segments, episodes and writers; and the bytes of
one chunk in either format, for tests that damage or compare chunks."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from zarrfeed.core.schema import L5KIT_SCHEMA, Schema
from zarrfeed.core.storage_layout import StorageLayout
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.v3_sharding import assemble
from zarrfeed.core.zarr_array import Array

FORMATS = (2, 3)


def layout(zarr_format: int, chunks: Mapping[str, int] | None = None, schema: Schema = L5KIT_SCHEMA,
           per_shard: int = 3) -> dict[str, Any]:
    """The writer options of a new dataset in `zarr_format`: none for v2; for v3, `shard_bytes` of `per_shard`
    inner chunks of the table whose chunks hold the most bytes (more of each other table's)."""
    if zarr_format == 2:
        return {}
    rows = {n: (chunks or {}).get(n, t.chunk_rows) for n, t in schema.tables.items()}
    largest = max(rows[n] * t.dtype.itemsize for n, t in schema.tables.items())
    return {"zarr_format": 3, "shard_bytes": per_shard * largest}


def storage_layout(zarr_format: int, chunks: Mapping[str, int] | None = None, schema: Schema = L5KIT_SCHEMA
                   ) -> StorageLayout:
    """`layout` as a `Committer` takes it."""
    return StorageLayout(**layout(zarr_format, chunks, schema))


def array(path: Path, table: str) -> Array:
    return Array.open(DirectoryStore(path), table)


def object_file(path: Path, table: str, index: int) -> Path:
    """The file holding chunk `index` of `table`: the chunk's own (v2), or its shard's (v3)."""
    return path.joinpath(*array(path, table).chunk_key(index).partition("#")[0].split("/"))


def chunk_bytes(path: Path, table: str, index: int) -> bytes | None:
    """The stored bytes of chunk `index` of `table` (an inner chunk of a v3 shard: its bytes in the shard)."""
    return array(path, table).read_chunks([index])[0]


def put_chunk(path: Path, table: str, index: int, data: bytes | None) -> None:
    """Store `data` as chunk `index` of `table` (None: remove it): a v2 chunk's file is written or deleted in
    place; in a v3 shard the inner chunk is replaced or left out, the shard's other chunks kept."""
    arr = array(path, table)
    file = object_file(path, table, index)
    if arr.sharding is None:
        if data is None:
            file.unlink()
        else:
            file.write_bytes(data)
        return
    spec = arr.sharding
    file.write_bytes(assemble(spec, file.read_bytes(), {index % spec.inner_per_shard: data}))
