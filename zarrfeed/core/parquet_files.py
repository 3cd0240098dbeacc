"""Parquet files that several tables read in one process (a LeRobot dataset: one table per column of its data
files), each file opened once and each range of row groups read once for all of those columns.

Measured on a LeRobot data file (7 columns, 1,024 rows): reading the columns one at a time costs 3.4 ms, all
of them in one read 1.25 ms, and opening the file and parsing its footer 1.4 ms more each time. A loader's
window asks each column table for the same rows, one after another, so the read is kept for the next ones.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np

from .file_tags import Tag, check_handle
from .location import Location

KEEP_FILES = 8  # files kept open per process
KEEP_READS = 16  # row-group ranges kept (a few hundred KB of columns each)


class ParquetFiles:
    """The Parquet files below `location` whose `columns` tables read; `read` hands out the columns of a range
    of row groups. Pickled without its open files and reads: each process opens its own."""

    def __init__(self, location: Location, columns: Sequence[str], tags: Mapping[str, Tag | None] | None = None
                 ) -> None:
        self.location, self.columns = location, list(columns)
        self.tags = dict(tags) if tags is not None else None  # each opened file is checked against its tag
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._fs: Any = None
        self._root = ""
        self._files: OrderedDict[str, tuple[Any, Any]] = OrderedDict()  # name -> (open file, ParquetFile)
        self._reads: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        self._bounds: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # (a worker may decode in several threads)

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "columns": self.columns, "tags": self.tags}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _mine(self) -> None:
        """In a process forked after files were opened (a worker started with "fork"), forget the parent's: their
        file offsets are shared with it, so reads in both would race. (Before taking the lock: the parent may have
        held it when it forked.)"""
        if self._pid != os.getpid():
            self._reset()

    def filesystem(self) -> tuple[Any, str]:
        """The store's filesystem and the dataset's root on it."""
        self._mine()
        if self._fs is None:
            self._fs, self._root = self.location.filesystem()
        return self._fs, self._root

    def row_group_bounds(self, name: str) -> np.ndarray:
        """The first row of each row group of file `name`, and its row count last."""
        self._mine()
        with self._lock:
            return self._bounds_of(name)

    def read(self, name: str, first: int, last: int) -> Any:
        """Row groups [first, last) of file `name`, the `columns` it has, as a pyarrow Table."""
        key = (name, first, last)
        self._mine()
        with self._lock:
            table = self._reads.get(key)
            if table is not None:
                self._reads.move_to_end(key)
                return table
            pf = self._open(name)
            have = set(pf.schema_arrow.names)
            # one thread: a loader's workers already use every core
            table = pf.read_row_groups(list(range(first, last)), columns=[c for c in self.columns if c in have],
                                       use_threads=False)
            self._reads[key] = table
            if len(self._reads) > KEEP_READS:
                self._reads.popitem(last=False)
            return table

    def forget(self, name: str) -> None:
        """Close file `name` and drop what was read from it (after a failed read)."""
        self._mine()
        with self._lock:
            opened = self._files.pop(name, None)
            self._bounds.pop(name, None)
            for key in [k for k in self._reads if k[0] == name]:
                del self._reads[key]
        if opened is not None:
            opened[0].close()

    def _open(self, name: str) -> Any:
        import pyarrow.parquet as pq

        opened = self._files.get(name)
        if opened is None:
            fs, root = self.filesystem()
            fh = fs.open(f"{root}/{name}", "rb")
            try:
                if self.tags is not None:
                    check_handle(fh, name, self.tags.get(name))
                opened = self._files[name] = (fh, pq.ParquetFile(fh))
            except BaseException:
                fh.close()
                raise
            if len(self._files) > KEEP_FILES:
                old, (old_fh, _) = self._files.popitem(last=False)
                old_fh.close()
                self._bounds.pop(old, None)
        else:
            self._files.move_to_end(name)
        return opened[1]

    def _bounds_of(self, name: str) -> np.ndarray:
        bounds = self._bounds.get(name)
        if bounds is None:
            meta = self._open(name).metadata
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            bounds = self._bounds[name] = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        return bounds
