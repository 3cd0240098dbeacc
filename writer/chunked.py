"""Appending rows to a zarr table in whole chunks.

Rows gather in one reused chunk-sized buffer and each full chunk is written with one aligned assignment, which
zarr encodes without reading anything back. The array's shape grows in large steps (never per append); the
caller trims it to the final row count.
"""
from __future__ import annotations

import numpy as np
import zarr


class ChunkedAppender:
    """Writes rows to `array` from row `start` on, one whole chunk at a time (the first may be partial)."""

    def __init__(self, array: zarr.Array, start: int = 0) -> None:
        self.array = array
        self.chunk = array.chunks[0]
        self.pos = start  # rows handed to `append` end here
        self._buf = np.zeros(self.chunk, array.dtype)
        self._buf_start = start - start % self.chunk
        self._fill = start % self.chunk
        if self._fill:  # resume inside a chunk: keep the rows already there
            self._buf[: self._fill] = array[self._buf_start:start]

    def append(self, rows: np.ndarray) -> None:
        done = 0
        while done < len(rows):
            take = min(self.chunk - self._fill, len(rows) - done)
            self._buf[self._fill:self._fill + take] = rows[done:done + take]
            self._fill += take
            done += take
            if self._fill == self.chunk:
                self._write()
        self.pos += len(rows)

    def flush(self) -> None:
        """Write the partial last chunk (rows past `pos` in it are zeros, as zarr would store them)."""
        if self._fill:
            self._buf[self._fill:] = 0
            self._write(keep=True)

    def _write(self, keep: bool = False) -> None:
        end = self._buf_start + self.chunk
        if end > self.array.shape[0]:
            self.array.resize(max(end, 2 * self.array.shape[0]))
        self.array[self._buf_start:end] = self._buf
        if not keep:
            self._buf_start, self._fill = end, 0
