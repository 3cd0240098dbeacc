"""Reading an existing dataset back as episodes: one row of the root table with everything it links to.

For L5Kit, one scene with its frames, their agents and their traffic-light faces, intervals made local
again. This is how `zarrfeed ingest --from` re-chunks or re-compresses a dataset through the writer.
"""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from ..core import chunk_check, dataset_format, manifest_io
from ..core.chunk_check import ChunkCheck
from ..core.chunks import read_rows
from ..core.errors import FormatError
from ..core.schema import ENDS, Schema
from ..core.zarr_array import Array


def root_table(schema: Schema) -> str:
    """The one table no link points into; episodes are its rows."""
    children = {link.child for link in schema.links}
    roots = [t for t in schema.tables if t not in children]
    if len(roots) != 1:
        raise FormatError(f"schema '{schema.name}' has {len(roots)} root tables ({', '.join(roots)}); "
                          "splitting into episodes needs exactly one")
    return roots[0]


class Episodes:
    """The episodes of linked tables (zarr or numpy arrays, anything sliceable), in row order."""

    def __init__(self, schema: Schema, tables: dict, rows: dict[str, int], check: ChunkCheck | None = None) -> None:
        self.schema, self.tables, self.rows, self.check = schema, tables, rows, check
        self.root = root_table(schema)

    def __len__(self) -> int:
        return self.rows[self.root]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self.between(0, len(self))

    def between(self, start: int, stop: int) -> Iterator[dict[str, np.ndarray]]:
        """Episodes `start` to `stop` (excluded)."""
        # Read the root rows once; children are sliced per episode.
        root = self._rows(self.root, start, min(stop, len(self)))
        ends = {link.field for link in self.schema.links_from(self.root) if link.kind == ENDS}
        before = self._rows(self.root, start - 1, start) if start > 0 and ends else None
        previous = {f: int(before[f][0]) if before is not None else 0 for f in ends}  # where row `start` begins
        for i in range(len(root)):
            yield self._episode(root[i:i + 1], dict(previous))
            previous = {f: int(root[i][f]) for f in ends}

    def _rows(self, table: str, start: int, stop: int) -> np.ndarray:
        array = self.tables[table]
        if isinstance(array, Array):  # a corrupt chunk is named, not "error during blosc decompression"
            return read_rows(array, start, stop, check=self.check.check if self.check else None)
        return array[start:stop] if stop > start else np.zeros(0, self.schema.tables[table].dtype)

    def _episode(self, root_rows: np.ndarray, previous: dict[str, int]) -> dict[str, np.ndarray]:
        """The episode of `root_rows`, its links made local; `previous`: for each "ends" field of the root, the
        end before its row (where its rows begin)."""
        out = {self.root: root_rows.copy()}
        todo = [self.root]
        while todo:
            parent = todo.pop(0)
            shifted: dict[str, int] = {}
            for link in self.schema.links_from(parent):
                values = out[parent][link.field]
                if link.kind == ENDS:  # cumulative ends: this row's steps begin where the row before ended
                    if parent != self.root:
                        raise FormatError(f"link {link}: splitting into episodes follows an ends "
                                          "link from the root table only")
                    start, end = previous[link.field], int(values[-1])
                else:
                    start, end = (int(values[0, 0]), int(values[-1, 1])) if len(values) else (0, 0)
                out[link.child] = self._rows(link.child, start, end)
                shifted[link.field] = start  # an ends field names several children: shifted once
                todo.append(link.child)
            for name, start in shifted.items():
                out[parent][name] -= start
        return {t: out[t] for t in self.schema.tables}


class DatasetSource(Episodes):
    """The episodes of the dataset at `location` (any store `dataset_format.open_group` reads), in row order."""

    def __init__(self, location: "str | os.PathLike | dataset_format.Location",
                 storage_options: dict | None = None) -> None:
        group = dataset_format.open_group(location, storage_options=storage_options)
        schema, arrays, _ = dataset_format.open_tables(group)  # other arrays are not episodes' (not copied)
        tables = {n: arrays[n] if n in arrays else dataset_format.empty_table(t) for n, t in schema.tables.items()}
        doc = manifest_io.read_manifest(group.store)
        self.dataset_id: str | None = doc.get("dataset_id") if doc else None  # None: another tool wrote it
        rows = dataset_format.readable_rows(schema, tables, doc)
        # every chunk read is checked as every reader checks it (a copy must not carry on a changed chunk as
        # valid data), each table's last chunk by its committed rows while a writer appending meanwhile rewrites it
        check = chunk_check.read(group.store, str(location), doc, rows, {n: a.chunks[0] for n, a in tables.items()})
        super().__init__(schema, tables, rows, check)


def dataset_episodes(source: tuple) -> Iterator[dict[str, np.ndarray]]:
    """Episodes `start` to `stop` of a dataset, for a source `(url, storage_options, start, stop)`: how
    `zarrfeed ingest --from ... --scheduler` splits a dataset into sources for a Dask cluster."""
    url, options, start, stop = source
    return DatasetSource(url, storage_options=options).between(start, stop)
