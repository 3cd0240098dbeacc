"""`Loader`: shuffled, sharded, resumable batches of one table, decoded by worker processes.

How a batch is made. Before a group of batches can be made, the windows of chunks they read must be
resident in the shared chunk cache. Making a window resident takes cache slots for its chunks (a chunk that
another resident window already holds is shared, not decoded again; slots of windows whose batches are all
made are reused) and, for row batches, an index region; it sends each of the least busy workers one "decode"
message for its share of the window's chunks (fetched together, concurrently from an object store) and one
"window" message (write the window's shuffled rows, as cache rows, into the index). When a
window is ready, groups of batches that read it go to the least busy worker as one "gather" message (a group
holds about 32,768 rows, so a message's cost is paid once per group, not per batch). The next window is made
resident ahead of time, so decoding overlaps gathering. Only these small messages cross processes; the
records stay in shared memory, each chunk is decoded once per epoch, and the batch order depends on the plan
alone, never on workers or timing. The cache is sized from the plan: what the batches in flight can read.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
import weakref
from typing import Any, Callable, Iterator, cast

import numpy as np

from ..core._proc.pool import RemoteError, WorkerPool, describe_exit, start_fork_server
from ..core._proc.shm import available_memory
from ..core.chunks import ChunkError, read_coordinates
from ..core.store import Location
from . import read_worker, view_check
from .arrow_bridge import to_arrow
from .chunk_cache import ChunkSlots
from .dataset import Dataset
from .fetch import FetchOptions
from .layout import Layout
from .plan import EpochPlan, PlanConfig, selected_rows_per_chunk
from .state import LoaderState, selection_digest

log = logging.getLogger("zarrfeed.loader")
_POLL = 0.05
_GROUP_ROWS = 32768  # rows per gather message (see Loader._group)
_GROUP_ROWS_TRANSFORM = 4096
_RING_BYTES = 8 << 20


class LoaderError(RuntimeError):
    """A worker died, a chunk could not be read, or a transform failed; the message says which. When code
    raised, in a worker or here, `remote` holds that exception (`remote.exc`: the object itself when it could
    be carried, `remote.traceback`), also chained as `__cause__`."""

    def __init__(self, message: str, remote: RemoteError | None = None) -> None:
        super().__init__(message)
        self.remote = remote


class _InlinePool:
    """The worker protocol run in this process (num_workers=0): each message is handled when sent."""

    def __init__(self, handle: Callable[[tuple], tuple]) -> None:
        self._handle, self._replies = handle, cast(list[tuple], [])

    def send(self, wid: int, msg: tuple) -> None:
        try:
            self._replies.append(self._handle(msg))
        except Exception as exc:
            self._replies.append(("error", 0, msg, RemoteError.capture(exc)))

    def poll(self, timeout: float) -> list[tuple]:
        out, self._replies = self._replies, []
        return out

    def dead(self) -> list:
        return []

    def stop(self) -> None:
        pass


def fetch_options(ds: Dataset, cache_dir: str | os.PathLike | None, cache_dir_bytes: int) -> FetchOptions:
    """How workers fetch chunks: the local cache, and as many tries as the store's timeout budget allows
    (`Location.fetch_tries`: on S3, s3fs retries each try itself)."""
    tries = ds.location.fetch_tries
    return FetchOptions(os.fspath(cache_dir) if cache_dir else None, cache_dir_bytes,
                        *(() if tries is None else (tries,)))


def default_cache_bytes() -> int:
    """A quarter of the memory available now: what decoded chunks may keep across epochs by default."""
    return available_memory() // 4


class _Run:
    """Shared memory, its views and the workers: made at the first iteration, kept until `close()`."""

    def __init__(self, loader: "Loader", outputs: Layout | None, plan: EpochPlan) -> None:
        cfg = loader._config
        self.layout = outputs or loader._batch_layout()
        self.group = loader._group()
        self.n_slots = loader._ring_slots()
        self.chunk_slots, self.regions = loader._cache_size(plan)
        self.shared = loader._shared(self.layout.slot_bytes, self.n_slots, self.chunk_slots, self.regions)
        self.cache = ChunkSlots(self.chunk_slots)  # kept across epochs: see loader.chunk_cache
        try:
            self.views = [self.layout.views(self.shared.slot(s), cfg.batch_size) for s in range(self.n_slots)]
            setup, args = loader._worker(self.shared, outputs)
            if loader.num_workers == 0:
                self.pool: Any = _InlinePool(setup(0, *args))
            else:
                self.pool = WorkerPool(loader.num_workers, setup, args, "loader worker", loader.start_method)
        except BaseException:
            self.free()
            raise
        self.n_workers = max(loader.num_workers, 1)

    def free(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.stop()
        self.views = []
        self.shared.close()


class _Epoch:
    """The scheduler of one epoch's batches (see the module docstring).

    A window is resident while its chunks are in cache slots (shared with other resident windows that need
    the same chunk) and, for row batches, its shuffled order is in an index region."""

    def __init__(self, loader: "Loader", run: _Run, plan: EpochPlan, first: int) -> None:
        self.loader, self.run, self.plan = loader, run, plan
        self.windows = plan.window_batches()  # window -> (first batch, last batch), in order of first use
        self.order = [w for w, (_, last) in self.windows.items() if last >= first]
        self.resident: dict[int, list[tuple[str, int]]] = {}  # window -> the chunks it holds
        self.cache = run.cache
        self.cache.new_epoch(keep=loader.cache_bytes > 0)
        self.slots, self.decoded = self.cache.slots, self.cache.decoded  # (table, chunk) -> slot; decoded slots
        self.regions: dict[int, int] = {}  # window -> index region
        self.free_regions = list(range(run.regions))[::-1]
        self.pending: dict[int, int] = {}  # window -> messages (decodes, index) not yet answered
        self.waiting: dict[int, list[int]] = {}  # cache slot -> windows waiting for its decode
        self.k_next = self.k_issue = self.oldest = first
        self.done = np.zeros(plan.num_batches + 1, bool)
        self.load = [0] * run.n_workers
        self.sent: list[dict[tuple, tuple]] = [{} for _ in range(run.n_workers)]  # unanswered, for restarts
        self.counts: dict[int, dict[str, int]] = {}
        self.checked = 0.0

    # ------------------------------------------------------------ windows
    def _evict(self) -> None:
        while self.oldest < self.k_issue and self.done[self.oldest]:
            self.oldest += 1
        for w in [w for w in self.resident if self.windows[w][1] < self.oldest]:
            for key in self.resident.pop(w):
                self.cache.unpin(key, w)
            if w in self.regions:
                self.free_regions.append(self.regions.pop(w))

    def _make_resident(self, w: int) -> bool:
        if w in self.resident:
            return True
        needs = self.loader._chunks_of(self.plan, w)
        wants_region = self.run.regions > 0

        def fits() -> bool:
            return self.cache.fits(needs) and (bool(self.free_regions) or not wants_region)

        if not fits():
            self._evict()
            if not fits():
                return False
        self.resident[w] = needs
        self.pending[w] = 0
        new = []
        for key in needs:
            slot, fresh = self.cache.pin(key, w)
            if fresh:
                new.append((key[0], int(key[1]), slot))
            if slot not in self.decoded:
                self.pending[w] += 1
                self.waiting.setdefault(slot, []).append(w)
        self.loader.chunks_decoded += len(new)
        parts = min(len(new), len(self.load))
        for part in (new[i::parts] for i in range(parts)):
            self._send(("decode", part), ("decoded", tuple(slot for _, _, slot in part)))
        if wants_region:
            self.regions[w] = region = self.free_regions.pop()
            self.pending[w] += 1
            self._send(("window", self.plan.epoch, w, region, [self.slots[key] for key in needs]), ("window", w))
        return True

    # ------------------------------------------------------------ messages
    def _send(self, msg: tuple, key: tuple) -> None:
        wid = min(range(len(self.load)), key=self.load.__getitem__)
        self.load[wid] += 1
        self.sent[wid][key] = msg
        self.run.pool.send(wid, msg)

    def _issue(self) -> None:
        g = self.run.group
        limit = min(self.plan.num_batches, self.k_next + self.run.n_slots)
        while self.k_issue < limit:
            count = min(g, limit - self.k_issue)
            if count < g and self.k_issue + count < self.plan.num_batches and self.k_issue > self.k_next:
                break  # wait for room for a whole group, unless the consumer is waiting for this one
            windows = self.plan.group_windows(self.k_issue, count)
            if not all(self._make_resident(w) for w in windows) or any(self.pending[w] for w in windows):
                break
            k = self.k_issue
            self._send(self.loader._gather_msg(self, k, count, windows), ("gathered", k))
            self.k_issue += count
        ahead = self.loader._read_ahead()
        for w in self.order:  # read ahead: the next windows not yet resident
            if ahead and w not in self.resident and self.windows[w][0] >= self.k_issue:
                if not self._make_resident(w):
                    break
                ahead -= 1

    def _receive(self, timeout: float) -> None:
        for reply in self.run.pool.poll(timeout):
            kind, wid = reply[0], reply[1]
            if kind == "error":
                raise LoaderError(self._describe_error(wid, reply[2], reply[3]), reply[3]) from reply[3].exc
            if kind == "failed":
                raise LoaderError(self._describe_failure(wid, reply[3], reply[4]), reply[4]) from reply[4].exc
            self.load[wid] -= 1
            self.sent[wid].pop((kind, reply[2]), None)
            if kind == "decoded":
                for slot in reply[2]:
                    self.decoded.add(slot)
                    for w in self.waiting.pop(slot, []):
                        self.pending[w] -= 1
            elif kind == "window":
                self.pending[reply[2]] -= 1
            else:
                self.done[reply[2]:reply[2] + reply[3]] = True
                if len(reply) > 4:  # rows of the ragged columns of each batch
                    for i, counts in enumerate(reply[4]):
                        if counts:
                            self.counts[reply[2] + i] = counts
        now = time.monotonic()
        if now - self.checked < 0.2:  # dead workers are noticed within 0.2 s (the pool's poll also wakes up)
            return
        self.checked = now
        for wid, pid, code in self.run.pool.dead():
            what = describe_exit("loader worker", wid, pid, code)
            if not self.loader.restart_workers:
                raise LoaderError(f"{what} during epoch {self.plan.epoch} (batch {self.k_next}); "
                                  "pass restart_workers=True to restart it and produce its batches again")
            self.run.pool.restart(wid)
            for msg in self.sent[wid].values():
                self.run.pool.send(wid, msg)

    def _describe_error(self, wid: int, msg: tuple | None, err: RemoteError) -> str:
        if msg is None:
            return f"loader worker {wid} failed to start: {err}\nworker traceback:\n{err.traceback}"
        if isinstance(err.exc, ChunkError):  # says table, chunk and store: the one line a user needs
            return str(err.exc)
        return (f"loader worker {wid} failed on {msg[:3]} of table '{self.loader.table}': {err}\n"
                f"worker traceback:\n{err.traceback}")

    def _describe_failure(self, wid: int, k: int, err: RemoteError) -> str:
        chunks = sorted({int(c) for w in self.plan.batch_windows(k) for c in self.plan.windows[w]})
        return (f"transform failed on batch {k} of epoch {self.plan.epoch} (table '{self.loader.table}', "
                f"chunks {chunks}) in loader worker {wid}: {err}\nworker traceback:\n{err.traceback}")

    # ------------------------------------------------------------ the consumer's side
    def get(self, k: int) -> dict[str, np.ndarray]:
        """Batch k as views into its ring slot (the previous batch's slot is free again)."""
        self.k_next = k
        if not self.done[k] or self.k_issue + self.run.group <= k + self.run.n_slots:  # a group's room is free
            self._receive(0)
            self._issue()
        while not self.done[k]:
            self._receive(_POLL)
            self._issue()
        n = self.plan.batch_rows(k)
        counts = self.counts.pop(k, None)
        if counts:
            return self.run.layout.views(self.run.shared.slot(k), n, counts)
        views = self.run.views[k % self.run.n_slots]
        return dict(views) if n == self.plan.config.batch_size else {f: v[:n] for f, v in views.items()}

    def drain(self) -> None:
        """Wait for every message sent (so no worker writes into memory the next epoch reuses)."""
        while any(self.load):
            self._receive(_POLL)


class Loader:
    """Batches of `table`'s committed rows as dicts of columns (field -> array of shape (rows, *subshape)).

    The order depends only on (seed, epoch, rank, world_size) and the table: the same for any `num_workers`
    (0 runs everything in this process) and `prefetch`. With `copy=False` (default) a batch's arrays are
    views into shared memory, VALID ONLY UNTIL THE NEXT BATCH IS REQUESTED; pass `copy=True` to keep them.
    `output="arrow"` yields RecordBatches sharing the batch's memory (same validity). `check_views=True` (or
    ZARRFEED_CHECK_VIEWS=1) is a debug mode in which a view used after the next batch faults loudly (see
    `loader.view_check`). `dtypes={"centroid": "float32"}` converts fields in the workers; a cast that can
    change values other than by rounding a float (float to int, a narrower int) is refused unless `casting`
    (numpy's rule: "same_kind", "unsafe", ...) allows it. Decoded chunks are
    kept across epochs within `cache_bytes` (default a quarter of the available memory, 0: off).
    Iterating continues where the previous iteration stopped; after a complete epoch the epoch advances.
    """

    def __init__(self, dataset_or_path: Dataset | str | os.PathLike, table: str = "agents", batch_size: int = 256,
                 fields: list[str] | None = None, shuffle: bool = True, seed: int = 0, shuffle_window: int = 8,
                 num_workers: int = 2, prefetch: int = 4, drop_last: bool = False, rank: int = 0,
                 world_size: int = 1, rows: np.ndarray | None = None,
                 transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
                 copy: bool = False, start_method: str | None = None, restart_workers: bool = False,
                 output: str = "numpy", storage_options: dict[str, Any] | None = None, commit: int | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_dir_bytes: int = 8 << 30,
                 dtypes: dict[str, Any] | None = None, check_views: bool | None = None,
                 cache_bytes: int | None = None, casting: str | None = None) -> None:
        ds = dataset_or_path if isinstance(dataset_or_path, Dataset) else \
            Dataset.open(dataset_or_path, storage_options=storage_options, commit=commit)
        if output not in ("numpy", "arrow"):
            raise ValueError(f"output must be 'numpy' or 'arrow', got {output!r}")
        if table not in ds.tables:
            raise ValueError(f"table {table!r} is not in the dataset (tables: {', '.join(ds.tables)})")
        array = ds[table]
        self._itemsize = array.dtype.itemsize
        selection = selected_rows_per_chunk(ds.rows[table], array.chunks[0], rows)
        config = PlanConfig(ds.rows[table], array.chunks[0], batch_size, shuffle, seed, shuffle_window, rank,
                            world_size, drop_last)
        records = Layout.of_records(array.dtype, fields, batch_size)
        unknown = sorted(set(dtypes or ()) - {c.name for c in records.columns})
        if unknown:
            raise ValueError(f"dtypes: no field {unknown[0]!r} in this loader's batches "
                             f"(fields: {', '.join(c.name for c in records.columns)})")
        _Cast.check({c.name: c.dtype for c in records.columns}, dtypes or {}, casting)
        self._start(ds, table, config, selection, records, num_workers, prefetch, _Cast.around(transform, dtypes),
                    copy, start_method, restart_workers, output,
                    fetch_options(ds, cache_dir, cache_dir_bytes), check_views,
                    cache_bytes)

    def _start(self, ds: Dataset, table: str, config: PlanConfig, selection: list[np.ndarray] | None,
               records: Layout, num_workers: int, prefetch: int, transform: Callable | None, copy: bool,
               start_method: str | None, restart_workers: bool, output: str, fetch: FetchOptions,
               check_views: bool | None = None, cache_bytes: int | None = None) -> None:
        """What every loader keeps: the plan's settings, the batch layout, the options, where iteration is."""
        if prefetch < 1 or num_workers < 0:
            raise ValueError(f"prefetch must be >= 1 and num_workers >= 0, got {prefetch} and {num_workers}")
        self.dataset, self.table, self._fetch = ds, table, fetch
        self._source = read_worker.Source.of(ds, fetch)
        self._config, self._selection, self._records = config, selection, records
        self._digest: str | None = None
        self.fields = [c.name for c in records.columns]
        self.batch_size, self.num_workers, self.prefetch = config.batch_size, num_workers, prefetch
        self.transform, self.copy, self.start_method = transform, copy, start_method
        self.restart_workers, self.output = restart_workers, output
        if cache_bytes is not None and cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0 (0: no cache across epochs), got {cache_bytes}")
        self.cache_bytes = default_cache_bytes() if cache_bytes is None else int(cache_bytes)
        self._said_cache, self._cache_default = False, cache_bytes is None
        self.chunks_decoded = 0  # by the current or last iteration: 0 when every chunk was kept from before
        self.check_views = view_check.requested(check_views) and not copy  # owned copies need no check
        self.epoch, self._position = 0, 0
        if num_workers:
            start_fork_server(start_method, read_worker.setup)  # ready by the time the loop starts
        self._active = False
        self._plan: EpochPlan | None = None
        self._run: _Run | None = None
        self._finalizer = weakref.finalize(self, lambda: None)

    # ------------------------------------------------------------ plan and state
    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of `epoch` (default: the current one): which rows form which batch."""
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = EpochPlan(self._config, epoch, self._selection)
        return self._plan

    @property
    def worker_pids(self) -> list[int]:
        """The reader processes' pids while they run (from the first batch until `close()`); else empty."""
        pool = self._run.pool if self._run is not None else None
        return pool.pids() if isinstance(pool, WorkerPool) else []

    def __len__(self) -> int:
        """Batches in the current epoch for this rank."""
        return len(self.plan())

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its first batch at the next iteration."""
        self.epoch, self._position = int(epoch), 0

    def use_ranks(self, rank: int, world_size: int) -> None:
        """Read rank `rank`'s part of every epoch (how `to_torch` follows `torch.distributed`). A loader made
        for other ranks than the default 0 of 1 is refused, as is one already iterating."""
        c = self._config
        if (c.rank, c.world_size) == (rank, world_size):
            return
        if c.world_size != 1:
            raise ValueError(f"this Loader was made for rank {c.rank} of {c.world_size}, but the process group "
                             f"says rank {rank} of {world_size}")
        if self._run is not None:
            raise RuntimeError("use_ranks() must come before the first batch")
        self._config = dataclasses.replace(c, rank=rank, world_size=world_size)
        self._plan = None

    def to_torch(self) -> Any:
        """This loader as a `torch.utils.data.IterableDataset` of dicts of tensors, for
        `DataLoader(ds, batch_size=None)` (see `loader.torch_dataset`)."""
        from .torch_dataset import TorchBatches

        return TorchBatches(self)

    def state(self) -> LoaderState:
        """Where iteration stands, with what decides the batch order (see `loader.state`)."""
        return LoaderState(type(self).__name__, self.dataset.dataset_id, self.dataset.commit, self._settings(),
                           self._selection_digest(), self.epoch, self._position)

    def state_dict(self) -> dict[str, Any]:
        """`state()` as a plain dict, to save with a checkpoint; `load_state_dict` on a new loader made with the
        same arguments continues from here, without reading the batches before."""
        return self.state().to_dict()

    def load_state_dict(self, state: dict[str, Any] | LoaderState) -> None:
        """Continue from `state`; a state made for other data, another commit or other arguments raises one
        line naming what differs."""
        saved = LoaderState.from_dict(state)
        saved.check_resumes(self.state())
        saved.check_position(len(self.plan(saved.epoch)) if saved.epoch >= 0 else 0)
        self.epoch, self._position = int(saved.epoch), int(saved.batch)

    def _settings(self) -> dict[str, Any]:
        c = self._config
        return {"table": self.table, "table_rows": c.n_rows, "chunk_rows": c.chunk_rows, "batch_size": c.batch_size,
                "shuffle": c.shuffle, "seed": c.seed, "shuffle_window": c.shuffle_window, "rank": c.rank,
                "world_size": c.world_size, "drop_last": c.drop_last}

    def _selection_digest(self) -> str:
        if self._digest is None:  # hashed once: a selection can hold millions of rows
            self._digest = selection_digest(self._selection_parts())
        return self._digest

    def _selection_parts(self) -> list[np.ndarray] | None:
        return self._selection

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self._position >= len(self.plan()):  # a finished epoch: go on with the next
            self.epoch, self._position = self.epoch + 1, 0
        return self._iterate(self.plan(), self._position)

    def _iterate(self, plan: EpochPlan, first: int) -> Iterator[dict[str, np.ndarray]]:
        if first >= len(plan):
            return
        if self._active:  # two loops over one Loader would write into the same ring slots
            raise RuntimeError("this Loader is already being iterated; finish or leave that loop first "
                               "(or make a second Loader)")
        need = self._cache_size(plan)
        if self._run is not None and (need[0] > self._run.chunk_slots or need[1] > self._run.regions):
            self.close()  # this epoch's windows need a larger cache than the last one's: start anew
        if self._run is None:
            outputs = self._output_layout(plan, first) if self.transform else None
            self._run = _Run(self, outputs, plan)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, self._run.free)
        self.chunks_decoded = 0
        sched = _Epoch(self, self._run, plan, first)
        checker = view_check.ViewChecker() if self.check_views else None
        finished = False
        self._active = True
        try:
            for k in range(first, len(plan)):
                batch = sched.get(k)
                self._position = k + 1
                if self.copy:
                    batch = {n: a.copy() for n, a in batch.items()}
                elif checker is not None:
                    batch = checker.hand_out(batch)
                yield to_arrow(batch) if self.output == "arrow" else batch
            sched.drain()
            finished = True
            self.epoch, self._position = self.epoch + 1, 0
        finally:
            self._active = False
            if checker is not None:
                checker.seal()
            if not finished:  # broken out of, an exception, or garbage collected: stop the workers now
                self.close()

    def _output_layout(self, plan: EpochPlan, k: int) -> Layout:
        """The ring slots' layout for the transform's output, from one run of it on batch k. It runs in a
        process of its own (here only with num_workers=0), so that whatever the transform initialises (CUDA,
        a thread pool) is never initialised in this process before workers are started from it."""
        make_batch, transform = self._probe_batch(plan, k), self.transform
        assert transform is not None  # sizing is for a transform's output
        if self.num_workers == 0:
            try:
                columns = _probe(make_batch, transform, k)
            except Exception as exc:
                err = RemoteError.capture(exc)
                raise LoaderError(self._probe_failed(k, plan, err), err) from exc
        else:
            columns = _probe_in_process(make_batch, transform, k, self.start_method,
                                        lambda err: self._probe_failed(k, plan, err))
        return self._slot_layout(columns, k, plan)

    def _slot_layout(self, columns: list[tuple[str, str, tuple[int, ...]]], k: int, plan: EpochPlan) -> Layout:
        """The ring slots' layout for a transform's output columns; LoaderError naming a column whose dtype
        holds Python objects, which cannot live in shared memory (numpy would say only "cannot create an
        OBJECT array from memory buffer")."""
        for name, dtype, _ in columns:
            if np.dtype(dtype).hasobject:
                raise LoaderError(f"transform output {name!r} of batch {k} of epoch {plan.epoch} (table "
                                  f"'{self.table}') is an array of Python objects (dtype {np.dtype(dtype)}); "
                                  "batches live in shared memory: return numbers, bools or fixed-width strings")
        return Layout([(name, dtype, shape, -1) for name, dtype, shape in columns], self.batch_size)

    def _probe_failed(self, k: int, plan: EpochPlan, err: RemoteError) -> str:
        return (f"transform failed on batch {k} of epoch {plan.epoch} (table '{self.table}'), run once to size "
                f"the batch slots: {err}\ntraceback:\n{err.traceback}")

    def _probe_batch(self, plan: EpochPlan, k: int) -> Callable[[], dict[str, np.ndarray]]:
        """A picklable call that makes batch k with plain zarr (the sizing probe's input)."""
        rows, c = [], self._config.chunk_rows
        for w, first, count in plan.segments(k):
            local = plan.window_order(w)[first:first + count]
            rows.append(plan.windows[w][local // c] * c + local % c)
        return functools.partial(_read_rows, self.dataset.location, self.dataset.commit, self.table, self.fields,
                                 np.concatenate(rows))

    # ------------------------------------------------------------ what a row loader asks of the scheduler
    def _group(self) -> int:
        """Batches per gather message: about 32,768 rows' worth, or 4,096 with a transform (whose cost is
        unknown: a batch waits for its whole group). Each message costs the consumer's process about 70 us
        to send, wake a worker and receive; measured on a cached epoch of batch 4096, groups of 4,096 rows
        took 68 ms of its CPU per epoch and 32,768 rows 26 ms, and the epoch went from 170 to 126 ms."""
        rows = _GROUP_ROWS_TRANSFORM if self.transform else _GROUP_ROWS
        return max(1, rows // self._group_divisor())

    def _ring_slots(self) -> int:
        """Batches in flight: `prefetch`, two groups per worker, and at least 8 MiB of batches (measured:
        with 5 slots of 4,096 rows, each worker waited for its next message about 40% of a cached epoch)."""
        g = self._group()
        by_bytes = -(-_RING_BYTES // max(self._records.slot_bytes, 1))
        return max(self.prefetch, 2 * max(self.num_workers, 1) * g, by_bytes) + g

    def _cache_need(self, plan: EpochPlan) -> tuple[int, int]:
        """Cache slots and index regions that `plan` needs: the most that the windows read by any
        `_ring_slots()` consecutive batches hold at once, plus room to read ahead."""
        span = self._ring_slots()
        events: dict[int, list[int]] = {}
        biggest = 1
        for w, (first, last) in plan.window_batches().items():
            n = len(self._chunks_of(plan, w))
            biggest = max(biggest, n)
            for at, delta in ((max(0, first - span + 1), (n, 1)), (last + 1, (-n, -1))):
                e = events.setdefault(at, [0, 0])
                e[0] += delta[0]
                e[1] += delta[1]
        chunks = windows = most_chunks = most_windows = 0
        for at in sorted(events):
            chunks, windows = chunks + events[at][0], windows + events[at][1]
            most_chunks, most_windows = max(most_chunks, chunks), max(most_windows, windows)
        # room to read ahead: the next windows can be decoded before the oldest one is freed
        extra = 1 + self._read_ahead()
        regions = most_windows + extra if self._uses_index() else 0
        return most_chunks + extra * biggest, regions

    def _cache_size(self, plan: EpochPlan) -> tuple[int, int]:
        """Cache slots and index regions: what the plan needs, or more cache slots to keep decoded chunks
        across epochs, up to `cache_bytes` (all the chunks the plan reads if they fit)."""
        slots, regions = self._cache_need(plan)
        chunk_bytes = max(self._chunk_slot_bytes(), 1)
        chunks = len({key for w in plan.window_batches() for key in self._chunks_of(plan, w)})
        keep = min(chunks, self.cache_bytes // chunk_bytes)
        if self.cache_bytes and not self._said_cache:
            self._said_cache = True
            fit = "all" if keep == chunks else f"{keep} (later epochs decode the rest)"
            log.info("zarrfeed: decoded chunks kept across epochs within cache_bytes=%d MiB%s: %s of the %d chunks "
                     "(%d MiB) that an epoch reads", self.cache_bytes >> 20,
                     " (a quarter of the available memory; 0 turns it off)" if self._cache_default else "", fit,
                     chunks, chunks * chunk_bytes >> 20)
        return (max(chunks, 1) if keep == chunks else max(slots, keep)), regions  # all of them: no more needed

    def _chunk_slot_bytes(self) -> int:
        return self._config.chunk_rows * self._itemsize

    def _read_ahead(self) -> int:
        """Windows made resident ahead of the batches being gathered: four on an object store with worker
        processes (requests for later windows overlap gathering this one), else one (decoding is the only
        wait, and with no workers nothing runs alongside)."""
        return 4 if self.num_workers and not self.dataset.location.is_local else 1

    def _batch_layout(self) -> Layout:
        return self._records

    def _group_divisor(self) -> int:
        """Rows per batch, for sizing groups of batches (see `_group`)."""
        return self._config.batch_size

    def _uses_index(self) -> bool:
        return True

    def _shared(self, batch_bytes: int, n_slots: int, chunk_slots: int, regions: int) -> read_worker.Shared:
        c = self._config
        return read_worker.Shared(c.chunk_rows * self._itemsize, chunk_slots, c.shuffle_window * c.chunk_rows, regions,
                             batch_bytes, n_slots)

    def _worker(self, shared: read_worker.Shared, outputs: Layout | None) -> tuple[Callable, tuple]:
        return read_worker.setup, (self._source, self.table, shared, self._config, self._itemsize, self._selection,
                              self._records, outputs, self.transform)

    def _chunks_of(self, plan: EpochPlan, w: int) -> list[tuple[str, int]]:
        return [(self.table, int(c)) for c in plan.windows[w]]

    def _gather_msg(self, epoch: "_Epoch", k: int, count: int, windows: list[int]) -> tuple:
        return ("gather", epoch.plan.epoch, k, count, {w: epoch.regions[w] for w in windows})

    def close(self) -> None:
        """Stop the workers (within 2 s) and free the shared memory."""
        run, self._run = self._run, None
        self._finalizer.detach()
        if run is not None:
            run.free()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Cast:
    """`dtypes=`: fields converted in the workers (a float64 centroid becomes the float32 `nn.Linear` takes),
    then the caller's transform, if any. A class, not a closure, so that it pickles by reference."""

    def __init__(self, dtypes: dict[str, np.dtype], then: Callable | None) -> None:
        self.dtypes, self.then = dtypes, then

    @classmethod
    def around(cls, transform: Callable | None, dtypes: dict[str, Any] | None) -> Callable | None:
        return cls({k: np.dtype(v) for k, v in dtypes.items()}, transform) if dtypes else transform

    @staticmethod
    def check(fields: dict[str, np.dtype], dtypes: dict[str, Any], casting: str | None) -> None:
        """Refuse (one line naming the field) a cast that `casting` does not allow. By default (None): numpy's
        "safe" casts, and a float to a narrower float (it rounds, the reason `dtypes=` exists); anything that
        can wrap or truncate values (float64 to int8 wraps 300.0 to 44) only when asked for."""
        rules = ("no", "equiv", "safe", "same_kind", "unsafe")
        if casting is not None and casting not in rules:
            raise ValueError(f"casting must be one of {', '.join(map(repr, rules))} (or None), got {casting!r}")
        for name, want in dtypes.items():
            src, dst = fields[name], np.dtype(want)
            if np.can_cast(src, dst, cast(Any, casting or "safe")):  # a rule checked above
                continue
            if casting is None and src.kind == dst.kind == "f":
                continue
            rule = f"casting={casting!r} refuses it" if casting else "refused by default"
            raise ValueError(f"dtypes: casting field {name!r} from {src} to {dst} can change its values ({rule}); "
                             "pass casting='unsafe' to allow it")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = sorted(set(self.dtypes) - set(batch))
        if missing:
            raise ValueError(f"dtypes: no field {missing[0]!r} in the batch (fields: {', '.join(batch)})")
        batch = {k: v.astype(self.dtypes[k]) if k in self.dtypes else v for k, v in batch.items()}
        return self.then(batch) if self.then is not None else batch


def _read_rows(location: Location, commit: int | None, table: str, fields: list[str],
               rows: np.ndarray) -> dict[str, np.ndarray]:
    records = read_coordinates(Dataset.reopen(location, commit)[table], rows)
    return {n: np.ascontiguousarray(records[n]) for n in fields}


def _probe(make_batch: Callable[[], dict[str, np.ndarray]], transform: Callable, k: int,
           rows_of: str | None = None) -> list[tuple[str, str, tuple[int, ...]]]:
    """Run `transform` on batch k; its output's columns (name, dtype, shape per row), checked as the workers
    check every later batch against them. `rows_of` names the batch column whose length is the batch's rows
    (default: the first)."""
    batch = make_batch()
    rows = len(batch[rows_of] if rows_of else next(iter(batch.values())))
    out = transform(batch)
    if not isinstance(out, dict) or not all(isinstance(a, np.ndarray) and a.ndim >= 1 for a in out.values()):
        raise TypeError("transform must return a dict of numpy arrays whose first axis is the batch's rows")
    Layout.of_arrays(out, rows).check(out, k, rows)
    return [(name, a.dtype.str, a.shape[1:]) for name, a in out.items()]


def _probe_setup(wid: int, make_batch: Callable, transform: Callable, k: int, rows_of: str | None) -> Callable:
    return lambda msg: ("probed", wid, _probe(make_batch, transform, k, rows_of))


def _probe_in_process(make_batch: Callable, transform: Callable, k: int, start_method: str | None,
                      describe: Callable[[RemoteError], str], rows_of: str | None = None) -> list:
    """`_probe` in a worker process of its own, started as the loader's workers are; a failure of the
    transform raises LoaderError carrying the worker's exception, a dead process LoaderError at once."""
    pool = WorkerPool(1, _probe_setup, (make_batch, transform, k, rows_of), "transform probe", start_method)
    try:
        pool.send(0, "probe")
        while True:
            for reply in pool.poll(1.0):
                if reply[0] == "error":
                    raise LoaderError(describe(reply[3]), reply[3]) from reply[3].exc
                return reply[2]
            if pool.dead():
                raise LoaderError(describe_exit("transform probe", *pool.dead()[0]) + " (running the transform "
                                  "once to size the batch slots)")
    finally:
        pool.stop()
