"""The reader workers' loop, one for every loader (`BatchWorker`: decode chunks, build batches, run the user's
transform). Each kind of batch supplies only how it builds one (`BatchBuilder`: `rows.RowBuilder`,
`windows.WindowBuilder`, ...; see `loader.kinds.base`), as PyTorch keeps one worker loop and varies the fetcher.

Messages (`loader.engine.messages`; all small, the worker computes the plan itself from the settings it was
started with): `Decode` -> `Decoded` (the chunks, fetched together, concurrently from an object store, into
the cache); `FillIndex` -> `IndexFilled` (the window's shuffled rows, as cache rows, into the index);
`GatherRows` -> `Gathered`, or `TransformFailed` if the user's transform raises. Every chunk's stored bytes
are checked against the records its parent took when it opened the dataset (`core.chunk_check`) before they
are decoded into shared memory: a chunk that is not the committed one fails the `Decode` with `ChunkError`,
which the loader raises as `LoaderError` in the training loop. A gather copies, for each
batch row, the cache row the index names into the batch's ring slot, one column per field, in one pass
(`_gather.gather`). With a transform, rows are gathered into a private buffer, the transform runs on views
of it, and only its outputs are copied into the slot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ...core import dataset_format
from ...core._proc.pool import RemoteError, preload_in_workers
from ...core._proc.shm import SharedBlock, check_room
from ...core.chunk_check import ChunkCheck
from ...core.chunks import decode_chunk_into
from ...core.external_table import ExternalTable
from ...core.schema import Table
from ...core.location import Location
from ..caches.chunk_cache import ChunkMemory
from .fetch import ChunkFetcher, ChunkRef, FetchOptions
from .layout import Layout
from .messages import Decode, Decoded, DecodeItem, Gathered, GatherRows, GatherWindows, TransformFailed
from .ring import RingMemory

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool


class Shared:
    """The shared memory of one loader: its decoded chunks (`chunks`: this loader's own, `ProcessCacheMemory`, or
    the host's, `HostSegment`), an index of cache rows (`index_regions` regions of `region_rows`), and a ring
    of `n_slots` batch slots (`ring`, see `loader.engine.ring`)."""

    def __init__(self, chunks: ChunkMemory, region_rows: int, index_regions: int,
                 batch_bytes: int, n_slots: int) -> None:
        self.chunks, self.slot_bytes = chunks, chunks.slot_bytes
        self.region_rows = region_rows
        check_room(8 * region_rows * index_regions + batch_bytes * n_slots,
                   f"the loader's index and ring ({n_slots} batch slots)")
        self.index = SharedBlock(8 * region_rows * index_regions)
        self.ring = RingMemory(batch_bytes, n_slots)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.chunks.array(), np.frombuffer(self.index.buf, np.int64)

    def slot(self, k: int) -> memoryview:
        """The ring slot of batch k."""
        return self.ring.slot(k)

    def close(self) -> None:
        """Free the index and ring (the chunks belong to the cache that made them)."""
        self.index.close()
        self.ring.close()


@dataclass(frozen=True)
class DatasetOpener:
    """What a reader worker needs to open the dataset its parent opened and fetch from it: the location with
    its storage options, the committed rows the parent read (its pinned commit), how to fetch, with a disk
    cache the size and digest recorded for each sealed chunk (what cached chunks are named by and checked
    against), and what every chunk read is checked against (`check`: the parent's records; None: unchecked,
    `verify_chunks=False`)."""

    location: Location
    rows: dict[str, int]
    fetch: FetchOptions
    digests: dict[str, dict[int, tuple[int, str]]] | None = None
    check: ChunkCheck | None = None
    tables: dict[str, Table] | None = None  # the schema's, for tables whose arrays are not at their names
    external: dict[str, ExternalTable] | None = None  # tables not stored as zarr arrays: handed over themselves

    @classmethod
    def of(cls, ds, fetch: FetchOptions) -> "DatasetOpener":
        cached = fetch.cache_dir is not None and ds.location.settings.remote
        at_paths = {n: t for n, t in ds.schema.tables.items() if t.path}
        external = {n: a for n, a in ds.tables.items() if isinstance(a, ExternalTable)}
        return cls(ds.location, dict(ds.rows), fetch, ds.digests(tail=False) if cached else None, ds.check,
                   at_paths or None, external or None)

    def open_table(self, store: Any, name: str) -> Any:
        """The array of table `name` in `store` (where the schema puts it); an external table is itself (it
        opens its files when it reads)."""
        if name in (self.external or {}):
            return (self.external or {})[name]
        table = (self.tables or {}).get(name)
        if table is None:
            return dataset_format.open_table(store, name)
        array = dataset_format.open_table(store, name, dtype=table.dtype, path=table.path)
        array.missing_is_fill = table.missing_is_fill
        return array


class ChunkDecoder:
    """Handles `Decode` for the `tables` that `source` opens: fetches the message's chunks (concurrently from an object
    store), checks them, decodes each into its cache slot; returns the slots. `waiting` is told of the messages
    waiting behind the current one, so that their chunks are fetched meanwhile."""

    def __init__(self, source: DatasetOpener, tables: list[str], shared: Shared) -> None:
        store = source.location.store("r")  # the parent checked the group: open only the arrays read (on an
        self.arrays = {t: source.open_table(store, t) for t in tables}  # object store each is a request)
        self.fetcher = ChunkFetcher(source.location, store, source.fetch)
        self.shared, self.cache = shared, shared.arrays()[0]
        self.digests, self.check = source.digests or {}, source.check

    def _refs(self, items: Sequence[DecodeItem]) -> tuple[list[ChunkRef], list[tuple[int, str] | None]]:
        """The chunks, and the size and digest recorded for each (None: not recorded, or not needed)."""
        return ([ChunkRef(self.arrays[i.table], i.chunk) for i in items],
                [self.digests.get(i.table, {}).get(i.chunk) for i in items])

    def __call__(self, msg: Decode) -> tuple[int, ...]:
        """Decode each chunk whose slot is still claimed for it (one that is not was decoded already, by a
        worker that died before it answered, or is claimed anew); the message's slots."""
        refs, complete = self._refs(msg.items)
        for item, ref, raw, record in zip(msg.items, refs, self.fetcher.fetch(refs, complete), complete,
                                          strict=True):
            array, key = ref.array, ref.key
            start = item.slot * self.shared.slot_bytes
            with self.shared.chunks.writing(item.slot, item.token) as ours:  # a raise marks the slot failed
                if ours:
                    if self.check is not None and (record is None or raw is None):  # with a record, the
                        raw = self.check.check(array, item.chunk, key, raw)  # fetcher checked what it found
                    decode_chunk_into(array, key, raw,
                                      self.cache[start:start + array.chunks[0] * array.dtype.itemsize])
        return tuple(item.slot for item in msg.items)

    def waiting(self, msgs: list) -> None:
        """Decode messages waiting behind the current one: start fetching their chunks now."""
        items = [item for m in msgs if isinstance(m, Decode) for item in m.items]
        if items:
            self.fetcher.prefetch(*self._refs(items))


class BatchBuilder(Protocol):
    """How one kind of batch is built; the loop around it, the same for every loader, is `BatchWorker`'s."""

    def start(self, msg: Any) -> Any:
        """What the batches of the gather message `msg` are built from (its epoch's plan, ...)."""

    def build(self, dst: Any, msg: Any, k: int, started: Any) -> dict[str, int] | None:
        """Write batch `k` into `dst` (its ring slot, or the transform's scratch buffer); the rows of each
        ragged column, for batches that have them."""

    def views(self, scratch: np.ndarray, started: Any, k: int, counts: dict[str, int] | None) -> Any:
        """Batch `k` as built in `scratch`: the columns the user's transform is given."""

    def rows(self, started: Any, k: int) -> int:
        """The rows of batch `k` (what the transform's outputs must have)."""


class BatchWorker:
    """A reader worker's message handler, for every loader: `Decode` fills cache slots (read-ahead, which any
    other message goes before: a batch may be waiting on it); a gather message (`GatherRows`,
    `GatherWindows`) builds its batches with `builder`, straight into their ring slots, or, with a
    `transform`, into a private buffer whose columns the transform is given and whose outputs, checked against
    `outputs`, go to the slots (`TransformFailed` names the batch if the user's code raises; the worker goes
    on); any other message is `others`'."""

    def __init__(self, wid: int, decode: ChunkDecoder, shared: Shared, builder: BatchBuilder,
                 transform: Callable | None, outputs: Layout | None, scratch_bytes: int,
                 others: Callable[[Any], Any] | None = None) -> None:
        self.wid, self.decode, self.shared, self.builder = wid, decode, shared, builder
        self.transform, self.outputs, self.others = transform, outputs, others
        self.scratch = np.empty(scratch_bytes, np.uint8) if transform else None

    def __call__(self, msg: Any) -> Any:
        if isinstance(msg, Decode):
            return Decoded(self.wid, self.decode(msg))
        if not isinstance(msg, (GatherRows, GatherWindows)):
            assert self.others is not None, f"no handler for {type(msg).__name__}"
            return self.others(msg)
        started = self.builder.start(msg)
        if self.transform is None:  # straight into the ring (the common case: one call per batch)
            build, slot = self.builder.build, self.shared.slot
            counts = [build(slot(k), msg, k, started) for k in range(msg.first, msg.first + msg.count)]
            return Gathered(self.wid, msg.first, msg.count, counts if any(c is not None for c in counts) else None)
        counts = []
        for k in range(msg.first, msg.first + msg.count):
            assert self.outputs is not None and self.scratch is not None  # made with the transform
            built = self.builder.build(self.scratch, msg, k, started)
            try:
                rows = self.builder.rows(started, k)
                out = self.transform(self.builder.views(self.scratch, started, k, built))
                self.outputs.check(out, k, rows)
            except Exception as exc:  # the user's code: report which batch, keep serving
                return TransformFailed(self.wid, msg.first, k, RemoteError.capture(exc))
            for name, view in self.outputs.views(self.shared.slot(k), rows).items():
                view[...] = out[name]
            counts.append(None)
        return Gathered(self.wid, msg.first, msg.count, counts if any(c is not None for c in counts) else None)

    def urgent(self, msg: object) -> bool:
        """Everything but fetching and decoding chunks (read-ahead) goes first (see `WorkerPool`)."""
        return not isinstance(msg, Decode)

    def waiting(self, msgs: list) -> None:
        """Messages waiting in the pipe (see `WorkerPool`): fetch their chunks meanwhile."""
        self.decode.waiting(msgs)
