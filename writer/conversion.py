"""Converting a dataset from one zarr format to the other (or re-sharding it), through the writer.

A conversion is an ingest of the source's episodes (`dataset_episodes.DatasetSource`: every chunk read checked
against its commit's digest) into a new dataset of the other format: the same schema, chunk rows, compressors,
attributes and rows, committed as they are written, with the writer's guarantees (a lease, digests, ordered
fsyncs). Episode i is keyed `Position(source, i)`, `source` the source's identity (`source_identity`), so an
interrupted conversion finishes with `resume=True`, passing over (without reading) the episodes committed, and
never writes an episode twice; resuming with another source, or into another format, is refused.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Iterator, Mapping

import numpy as np

from ..core import dataset_format, manifest_io
from ..core.errors import FormatError
from ..core.keys import Position, fingerprint
from ..core.location import Location
from ..core.storage_layout import DEFAULT_SHARD_BYTES, StorageLayout
from ..core.v3_meta import ArrayMetaV3
from .committer import holds_data
from .dataset_episodes import DatasetSource
from .dataset_writer import DatasetWriter
from .journal import Journal


def convert(source: str | os.PathLike | Location, out: str | os.PathLike | Location, *, zarr_format: int = 3,
            shard_bytes: int | None = None, resume: bool = False, overwrite: bool = False, workers: int = 2,
            progress: bool = False, durable: bool = True,
            storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the dataset at `source` to `out` in `zarr_format` and return the ingest's summary (episodes, rows,
    bytes, seconds written by this call).

    Args:
        source: The dataset to read: a directory, a .zip, an fsspec URL or a `Location`.
        out: Where to write: a new place (or, with `overwrite`, a dataset to replace).
        zarr_format: 3 (sharded, a crc32c checksum on every inner chunk: fewer objects on an object store) or 2
            (what L5Kit's own code and zarr-python read as records).
        shard_bytes: With zarr_format=3, the decoded bytes of a shard at most (default 16 MiB).
        resume: Finish an interrupted conversion of the same source into `out` (same format and shards).
        overwrite: Replace a dataset at `out`.
        workers: Writer processes (0: write in this process).
        progress: A progress bar on stderr.
        durable: fsync every commit (False: scratch data; see `DatasetWriter`).
        storage_options: fsspec options for URLs, of both.

    Example:
        ```python
        import zarrfeed
        from zarrfeed.writer import synthetic

        zarrfeed.write_dataset("scenes.zarr", synthetic.episodes(3), workers=0)
        zarrfeed.convert("scenes.zarr", "scenes-v3.zarr", zarr_format=3, workers=0)  # sharded v3
        zarrfeed.convert("scenes-v3.zarr", "scenes-v2.zarr", zarr_format=2, workers=0)  # and back
        assert zarrfeed.Dataset.open("scenes-v2.zarr").rows == zarrfeed.Dataset.open("scenes.zarr").rows
        ```
    """
    src = Location.of(source, dict(storage_options or {}))
    dst = Location.of(out, dict(storage_options or {}))
    if src.same_place(dst):
        raise ValueError(f"{dst}: the output is also the input; convert to another path")
    if resume and overwrite:
        raise ValueError("resume=True finishes the conversion at out, overwrite=True replaces it: give one")
    if shard_bytes is not None and zarr_format != 3:
        raise FormatError("shard_bytes: applies to zarr_format=3", cli="--shard-bytes: applies to --zarr-format 3")
    layout = StorageLayout(zarr_format, DEFAULT_SHARD_BYTES if shard_bytes is None else shard_bytes)
    episodes = DatasetSource(src)
    identity = source_identity(episodes)
    if resume:
        _check_resumable(dst, identity, layout, shard_bytes is not None)
    elif not overwrite and holds_data(dst):
        said = f"{dst}: already exists and is not empty; "
        raise FormatError(said + "finish an interrupted conversion into it (resume=True), or replace it "
                          "(overwrite=True)", cli=said + "finish an interrupted conversion into it (--resume), "
                          "or replace it (--overwrite)")
    with DatasetWriter(dst, episodes.schema, workers=workers, mode="a" if resume else "w", overwrite=overwrite,
                       progress=progress, durable=durable, zarr_format=zarr_format, shard_bytes=shard_bytes) as w:
        w.begin_input(identity, resume, "the source's identity is", "episodes")
        todo = [i for i in range(len(episodes)) if not w.is_committed(Position(identity, i))]
        return w.ingest(_Remaining(episodes, todo), keys=[Position(identity, i) for i in todo])


def source_identity(episodes: DatasetSource) -> str:
    """What names a source across runs: its dataset id (new with each dataset zarrfeed makes or overwrites; a
    copy keeps it) and the fingerprint of its first episode (a dataset another tool wrote has no id), as 16 hex
    digits. Episodes are only ever appended to a dataset, so episode i of the same source is the same episode."""
    first = next(iter(episodes.between(0, 1)), None)
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{episodes.dataset_id or ''}|{fingerprint(first) if first is not None else ''}".encode())
    return h.hexdigest()


def _check_resumable(dst: Location, identity: str, layout: StorageLayout, shards_given: bool) -> None:
    """Refuse to resume a conversion with another source, or into another format or other shards than `dst`
    has; read only, before a writer opens it (which would take its lease and drop its uncommitted rows). A place
    with no dataset is left to the writer to refuse."""
    if not holds_data(dst):
        return
    group = dataset_format.open_group(dst)
    doc = manifest_io.read_manifest(group.store)
    other = Journal.from_json(doc.get("journal")).other_input(identity) if doc else None
    if other is not None:
        raise ValueError(f"{dst}: was written from another source (its input {other}; this source's identity is "
                         f"{identity}); resume with that source, or convert this one to another path")
    _, arrays, _ = dataset_format.open_tables(group)
    formats = "/".join(f"v{n}" for n in sorted({a.zarr_format for a in arrays.values()}))
    if formats != f"v{layout.zarr_format}":
        said = f"{dst}: is zarr {formats}, not v{layout.zarr_format}; resume with the format it was converted to "
        raise FormatError(said + "(zarr_format=), or replace it (overwrite=True)",
                          cli=said + "(--zarr-format), or replace it (--overwrite)")
    for name, array in arrays.items():
        meta = array.meta
        if not shards_given or not isinstance(meta, ArrayMetaV3):
            continue
        rows = layout.shard_rows(array.chunks[0], array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
        if rows != meta.shard_rows:
            said = f"{dst}: table '{name}' has shards of {meta.shard_rows:,} rows ("
            raise FormatError(said + f"shard_bytes={layout.shard_bytes} makes {rows:,}); resume with the shard_bytes "
                              "it was converted with, or replace it (overwrite=True)",
                              cli=said + f"--shard-bytes {layout.shard_bytes} makes {rows:,}); resume with the "
                              "--shard-bytes it was converted with, or replace it (--overwrite)")


class _Remaining:
    """The source's episodes at positions `todo` (ascending), read run by run: a resumed conversion reads none
    of the episodes it passes over."""

    def __init__(self, episodes: DatasetSource, todo: list[int]) -> None:
        self.episodes, self.todo = episodes, todo

    def __len__(self) -> int:
        return len(self.todo)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        i = 0
        while i < len(self.todo):
            j = i
            while j + 1 < len(self.todo) and self.todo[j + 1] == self.todo[j] + 1:
                j += 1
            yield from self.episodes.between(self.todo[i], self.todo[j] + 1)
            i = j + 1
