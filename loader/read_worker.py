"""The reader worker of row batches: decodes chunks, writes windows' shuffled rows into the index, gathers.

Messages (`loader.messages`; all small, the worker computes the plan itself from the settings it was
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
from typing import Any, Callable

import numpy as np

from ..core import dataset_format
from ..core._proc.pool import RemoteError, preload_in_workers
from ..core._proc.shm import SharedBlock, check_room
from ..core.chunk_check import ChunkCheck
from ..core.chunks import decode_chunk_into
from ..core.store import Location
from .chunk_cache import ProcessChunks
from .fetch import ChunkFetcher, FetchOptions
from .gather import gather
from .host_cache import HostSegment
from .layout import Layout
from .messages import Decode, Decoded, DecodeItem, FillIndex, Gathered, GatherRows, IndexFilled, TransformFailed
from .plan import PlanConfig, WorkerPlans

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool


class Shared:
    """The shared memory of one loader: its decoded chunks (`chunks`: this loader's own, `ProcessChunks`, or
    the host's, `HostSegment`), an index of cache rows (`index_regions` regions of `region_rows`), and a ring
    of `n_slots` batch slots."""

    def __init__(self, chunks: ProcessChunks | HostSegment, region_rows: int, index_regions: int,
                 batch_bytes: int, n_slots: int) -> None:
        self.chunks, self.slot_bytes = chunks, chunks.slot_bytes
        self.region_rows, self.batch_bytes, self.n_slots = region_rows, batch_bytes, n_slots
        check_room(8 * region_rows * index_regions + batch_bytes * n_slots,
                   f"the loader's index and ring ({n_slots} batch slots)")
        self.index = SharedBlock(8 * region_rows * index_regions)
        self.ring = SharedBlock(batch_bytes * n_slots)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.chunks.array(), np.frombuffer(self.index.buf, np.int64)

    def slot(self, k: int) -> memoryview:
        """The ring slot of batch k."""
        s = k % self.n_slots
        return self.ring.buf[s * self.batch_bytes:(s + 1) * self.batch_bytes]

    def close(self) -> None:
        """Free the index and ring (the chunks belong to the cache that made them)."""
        for block in (self.index, self.ring):
            block.close()


@dataclass(frozen=True)
class Source:
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

    @classmethod
    def of(cls, ds, fetch: FetchOptions) -> "Source":
        cached = fetch.cache_dir is not None and ds.location.settings.remote
        return cls(ds.location, dict(ds.rows), fetch, ds.digests(tail=False) if cached else None, ds.check)


def chunk_decoder(source: Source, tables: list[str], shared: Shared) -> Callable[[Decode], tuple[int, ...]]:
    """Handles `Decode`; returns the cache slots filled."""
    store = source.location.store("r")  # the parent checked the group: open only the arrays read (on an
    arrays = {t: dataset_format.open_table(store, t) for t in tables}  # object store each check is a request)
    fetcher = ChunkFetcher(source.location, store, source.fetch)
    cache, _ = shared.arrays()
    digests, check = source.digests or {}, source.check

    def keys_of(items: tuple[DecodeItem, ...] | list[DecodeItem]) -> tuple[list[str], list[tuple[int, str] | None]]:
        """Chunk keys, and the size and digest recorded for each (None: not recorded, or not needed)."""
        return ([arrays[i.table].chunk_key(i.chunk) for i in items],
                [digests.get(i.table, {}).get(i.chunk) for i in items])

    def decode(msg: Decode) -> tuple[int, ...]:
        """Decode each chunk whose slot is still claimed for it (one that is not was decoded already, by a
        worker that died before it answered, or is claimed anew); the message's slots."""
        keys, complete = keys_of(msg.items)
        for item, key, raw, record in zip(msg.items, keys, fetcher.fetch(keys, complete), complete, strict=True):
            array = arrays[item.table]
            start = item.slot * shared.slot_bytes
            with shared.chunks.writing(item.slot, item.token) as ours:  # a raise marks the slot failed
                if ours:
                    if check is not None and record is None:  # with a record, the fetcher checked it
                        raw = check.check(array, item.chunk, key, raw)
                    decode_chunk_into(array, key, raw, cache[start:start + array.chunks[0] * array.dtype.itemsize])
        return tuple(item.slot for item in msg.items)

    def waiting(msgs: list) -> None:
        """Decode messages waiting behind the current one: start fetching their chunks now."""
        items = [item for m in msgs if isinstance(m, Decode) for item in m.items]
        if items:
            fetcher.prefetch(*keys_of(items))

    decode.waiting = waiting  # type: ignore[attr-defined]  # the pool's optional hooks (see WorkerPool)
    return decode


def setup(wid: int, source: Source, table: str, shared: Shared, config: PlanConfig, itemsize: int,
          selection: list[np.ndarray] | None, records: Layout, outputs: Layout | None,
          transform: Callable | None) -> Callable[[Decode | FillIndex | GatherRows], Any]:
    """Open the dataset in this process (no zarr handle is inherited); return the message handler."""
    decode = chunk_decoder(source, [table], shared)
    cache, index = shared.arrays()
    chunk_rows = config.chunk_rows
    spec = records.gather_spec()
    scratch = np.empty(records.slot_bytes, np.uint8) if transform else None
    plans = WorkerPlans(config, selection)

    def handle(msg: Decode | FillIndex | GatherRows) -> Any:
        if isinstance(msg, Decode):
            return Decoded(wid, decode(msg))
        if isinstance(msg, FillIndex):  # the shuffled rows of the window, as cache rows: slot * chunk_rows + r
            order = plans.get(msg.epoch).plan.window_order(msg.window, np.asarray(msg.slots, np.int64) * chunk_rows)
            start = msg.region * shared.region_rows
            index[start:start + len(order)] = order
            return IndexFilled(wid, msg.window)
        k0, count, regions = msg.first, msg.count, msg.regions
        p = plans.get(msg.epoch, msg.spans).plan
        pieces = p.group_pieces(k0, count)
        for i in range(count):
            k = k0 + i
            dst = scratch if transform else shared.slot(k)
            for _, first, w, pos, n in (piece for piece in pieces if piece.batch == i):
                start = regions[w] * shared.region_rows + pos
                gather(cache, itemsize, index[start:start + n], dst, spec, first, itemsize)
            if transform:
                assert outputs is not None and scratch is not None  # made with the transform
                try:
                    rows = p.batch_rows(k)
                    out = transform(records.views(scratch, rows))
                    outputs.check(out, k, rows)
                except Exception as exc:  # the user's code: report which batch, keep serving
                    return TransformFailed(wid, k0, k, RemoteError.capture(exc))
                for name, view in outputs.views(shared.slot(k), rows).items():
                    view[...] = out[name]
        return Gathered(wid, k0, count)

    handle.urgent, handle.waiting = urgent, decode.waiting  # type: ignore[attr-defined]
    return handle


def urgent(msg: object) -> bool:
    """Everything but fetching and decoding chunks (read-ahead) goes first: a batch may be waiting on it."""
    return not isinstance(msg, Decode)
