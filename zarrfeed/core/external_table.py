"""Tables whose rows are not stored as zarr arrays: read from files of another format (Parquet columns, video
streams) and shown to the readers as a table of fixed-size chunks.

An `ExternalTable` has the part of `zarr_array.Array`'s interface that `core.chunks.read_rows`, the loader's
chunk fetcher and decoder, and `Dataset` use: `shape`, `chunks`, `dtype`, `table`, `path`, `chunk_key`,
`read_chunks`, `decode_into`, `has_chunk`. What `read_chunks` returns for a chunk is a `ChunkRead`, an empty
token naming it: `decode_into` then reads the chunk's rows straight into the caller's buffer (a loader's shared
memory), so a chunk's pixels or values are written once, where they are kept, with no copy on the way (the
decoding, a Parquet column to numpy or video frames to pixels, happens there, once per chunk, and the decoded
chunk is kept by the caches as any other). Such a table has no shards, no fill value and no zarr format.

`reads_own_chunks` tells the loader's `ChunkFetcher` to fetch its chunks through `read_chunks` on a remote
location too (there are no chunk objects to `cat`). A table is picklable and opens its files lazily, so a
reader worker is handed the object itself.
"""
from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np

from .errors import ChunkError


class ChunkRead(bytes):
    """What `ExternalTable.read_chunks` gives for chunk number `chunk`: no bytes (nothing is stored to check or
    cache), a token for `decode_into`, which reads the chunk where it is to be kept."""

    chunk: int

    def __new__(cls, chunk: int) -> "ChunkRead":
        made = super().__new__(cls)
        made.chunk = int(chunk)
        return made


class ExternalTable:
    """`rows` records of `dtype` read from files of another format, in chunks of `chunk_rows` (the last one
    zero-padded). Subclasses say how rows [start, stop) are read (`read_records`)."""

    reads_own_chunks: ClassVar[bool] = True  # the fetcher reads its chunks through `read_chunks`, never by key
    sharding = None
    missing_is_fill = False
    zarr_format = None

    def __init__(self, table: str, dtype: np.dtype, rows: int, chunk_rows: int, path: str) -> None:
        if chunk_rows < 1:
            raise ValueError(f"table '{table}': chunk_rows must be >= 1, got {chunk_rows}")
        self._table, self._dtype, self.rows, self.chunk_rows = table, np.dtype(dtype), int(rows), int(chunk_rows)
        self.path = path  # where its rows are read from (a file, or the folder of its files)

    @property
    def table(self) -> str:
        return self._table

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rows,)

    @property
    def chunks(self) -> tuple[int, ...]:
        return (self.chunk_rows,)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return 1

    @property
    def nchunks(self) -> int:
        return -(-self.rows // self.chunk_rows)

    def __len__(self) -> int:
        return self.rows

    def __repr__(self) -> str:
        return f"<zarrfeed {type(self).__name__} '{self.table}' ({self.rows}) {self.dtype} from {self.path}>"

    def chunk_key(self, index: int) -> str:
        """A name unique to chunk `index` of this table (there is no stored object of that name)."""
        return f"{self.table}#{index}"

    def has_chunk(self, index: int) -> bool:
        return 0 <= index < self.nchunks

    def read_chunks(self, indices: Sequence[int]) -> list[bytes | None]:
        """Each chunk as a `ChunkRead` (read by `decode_into`); None for an index past the last chunk."""
        return [ChunkRead(i) if self.has_chunk(i) else None for i in indices]

    def decode_into(self, raw: bytes | memoryview, out: np.ndarray) -> None:
        """Chunk `raw` (a `ChunkRead`; or the decoded bytes of one chunk, copied) into `out` (the bytes of one full
        chunk): its records straight into it, the rows past the table's end zeroed. `ValueError` if `out` is not
        one chunk's size."""
        size = self.chunk_rows * self.dtype.itemsize
        if out.size * out.itemsize != size:
            raise ValueError(f"{out.size * out.itemsize} bytes for a chunk of {size}")
        flat = out.view(np.uint8).reshape(-1)
        if not isinstance(raw, ChunkRead):
            data = np.frombuffer(raw, np.uint8)
            if data.size != size:
                raise ValueError(f"{data.size} bytes for a chunk of {size}")
            flat[:] = data
            return
        start, stop = raw.chunk * self.chunk_rows, min((raw.chunk + 1) * self.chunk_rows, self.rows)
        records = flat.view(self.dtype)
        records[stop - start:] = np.zeros(1, self.dtype)
        self.read_records_into(start, stop, records[:stop - start])

    def read_records_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Records [start, stop) of this table into `out` (records of `dtype`): `read_records`'s, copied, unless a
        table reads them in place."""
        records = self.read_records(start, stop)
        if records.shape != (stop - start,) or records.dtype != self.dtype:
            raise ChunkError(f"table '{self.table}': rows {start}-{stop} read as {records.shape} {records.dtype}, not "
                             f"{stop - start} records of {self.dtype}")
        out[:] = records

    def read_records(self, start: int, stop: int) -> np.ndarray:
        """Records [start, stop) of this table (`ChunkError` naming the file if they cannot be read)."""
        raise NotImplementedError


class MemoryTable(ExternalTable):
    """A table whose records are held in memory (a few per episode, read from a format's metadata)."""

    def __init__(self, table: str, records: np.ndarray, chunk_rows: int, path: str) -> None:
        super().__init__(table, records.dtype, len(records), chunk_rows, path)
        self.records = records

    def read_records(self, start: int, stop: int) -> np.ndarray:
        return self.records[start:stop]
