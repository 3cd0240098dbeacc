"""`Loader`: shuffled, sharded, resumable batches of one table, decoded by worker processes.

The front of a loader: its options, its resume state and the loop the user iterates. What is decoded and
gathered, and in which order, is the scheduler's (`loader.engine.scheduler`), told by a batch source what a batch is
(`loader.kinds.rows.RowSource` here; `loader.kinds.windows.WindowSource` for `WindowLoader`: see `loader.kinds.base`).
"""
from __future__ import annotations

import copy as copy_module
import dataclasses
import logging
import os
import sys
import weakref
from typing import Any, Callable, Iterator, Unpack, cast

import numpy as np

from ..core.keywords import spelled_out
from ..core._proc.pool import start_fork_server
from ..core._proc.shm import ShmSpaceError, available_memory
from .engine import probe, read_worker, view_check
from .dataset import Dataset
from .engine.fetch import FetchOptions
from .kinds.base import start_worker
from .engine.layout import Layout
from .options import CacheOptions, LoaderOptions, Options, ReadOptions, WorkerOptions
from .ordering.plan import MIN_WINDOW, EpochPlan, PlanConfig, selected_rows_per_chunk, window_chunks
from .ordering.resume import Cursor, adopt_order, reshard
from .engine.resources import Sizing
from .engine.ring import Handout
from .kinds.rows import RowSource
from .engine.scheduler import Epoch, LoaderError, LoaderStalledError, Run
from .kinds.source import BatchSource
from .ordering.state import LOADED_WHILE_ITERATING, LoaderState, selection_digest

__all__ = ["Loader", "LoaderError", "LoaderStalledError"]
ROW_ID = "_row"  # the column of `row_ids=True`

log = logging.getLogger("zarrfeed.loader")


def fetch_options(ds: Dataset, caching: CacheOptions) -> FetchOptions:
    """How workers fetch chunks: the local cache, and as many tries as the store's timeout budget allows
    (`Location.fetch_tries`: on S3, s3fs retries each try itself)."""
    tries = ds.location.fetch_tries
    return FetchOptions(cache_dir=os.fspath(caching.cache_dir) if caching.cache_dir else None,
                        cache_bytes=caching.cache_dir_bytes, **({} if tries is None else {"tries": tries}))


def default_cache_bytes() -> int:
    """A quarter of the memory available now: what decoded chunks may keep across epochs by default."""
    return available_memory() // 4


def open_dataset(dataset_or_path: Dataset | str | os.PathLike, read: ReadOptions) -> Dataset:
    """The dataset a loader reads; with `verify_chunks=False` one that reads its chunks unchecked (a `Dataset`
    given is not changed: the loader reads through a copy of it)."""
    if not isinstance(dataset_or_path, Dataset):
        return Dataset.open(dataset_or_path, storage_options=read.storage_options, commit=read.commit,
                            verify_chunks=read.verify_chunks)
    if read.verify_chunks or not dataset_or_path.verify_chunks:
        return dataset_or_path
    unchecked = copy_module.copy(dataset_or_path)
    unchecked.verify_chunks = False
    return unchecked


def default_window(source: BatchSource, shuffle_bytes: int) -> int:
    """The window `shuffle_bytes` gives this source (see `plan.window_chunks`): what an epoch reads, from the
    dataset and the options alone."""
    c = source.config
    in_row_order = dataclasses.replace(c.shuffling, shuffle=False, shuffle_window=max(1, -(-c.n_rows // c.chunk_rows)))
    everything = EpochPlan(dataclasses.replace(c, shuffling=in_row_order), 0, source.selection)
    if not everything.windows:
        return window_chunks(shuffle_bytes, 0, 0)
    reads = {key for key in source.chunks_of(everything, 0)}
    return window_chunks(shuffle_bytes, len(everything.windows[0]), len(reads) * source.chunk_bytes)


@spelled_out(LoaderOptions, Options)
class Loader:
    """Batches of `table`'s committed rows as dicts of columns (field -> array of shape (rows, *subshape)).

    The order depends on the dataset, the options and the epoch only (docs/architecture.md#order). With
    `copy=False` (default) a batch's arrays are views into shared memory, VALID ONLY UNTIL THE NEXT BATCH IS
    REQUESTED (docs/architecture.md#views); `output="arrow"` shares that memory. Every chunk read is checked
    against its commit's digest (docs/architecture.md#chunk-checks). A loop reads the rest of the current
    epoch from where the previous loop stopped, then the epoch advances. Every argument after `table` is
    keyword-only.

    Every loader takes the options of [`LoaderOptions`][zarrfeed.loader.LoaderOptions] (listed below),
    keyword-only.

    Args:
        dataset_or_path: An open `Dataset`, or a directory, `.zip` file or fsspec URL to open (with
            `storage_options` and `commit`, which are ignored when a `Dataset` is given).
        table: The table whose rows are batched (default "agents").
        batch_size: Rows per batch (default 256); the last batch of an epoch may be shorter (see `drop_last`).
        fields: The fields to load, in this order (default all; one name loads one field); fewer fields mean
            less to gather and copy. An unknown or repeated field is refused.
        rows: The committed rows to read, as an index array (no repeats; read in plan order, not the given
            order) or a boolean mask with one entry per committed row. Default: all of them.
        output: "numpy" (default): dicts of arrays; "arrow": pyarrow RecordBatches over the same memory.
        dtypes: Fields converted in the workers (`{"centroid": "float32"}`, before `transform`); only fields of
            the batches.
        casting: Which `dtypes` conversions are allowed: numpy's rule ("no", "equiv", "safe", "same_kind",
            "unsafe"). Default (None): "safe" casts, and a float to a narrower float.
        row_ids: Add a column `_row` (int64): each row's index in the table, to join batches with labels kept
            elsewhere or to check that every row was read once.
    """

    def __init__(self, dataset_or_path: Dataset | str | os.PathLike, table: str = "agents", *,
                 batch_size: int = 256, fields: list[str] | str | None = None, rows: np.ndarray | None = None,
                 output: str = "numpy", dtypes: dict[str, Any] | None = None, casting: str | None = None,
                 row_ids: bool = False, **options: Unpack[LoaderOptions]) -> None:
        o = Options.of(options, "Loader")
        ds = open_dataset(dataset_or_path, o.read)
        if output not in ("numpy", "arrow"):
            raise ValueError(f"output must be 'numpy' or 'arrow', got {output!r}")
        if table not in ds.tables:
            raise ValueError(f"table {table!r} is not in the dataset (tables: {', '.join(ds.tables)})")
        array = ds[table]
        selection = selected_rows_per_chunk(ds.rows[table], array.chunks[0], rows)
        config = PlanConfig.of(ds.rows[table], array.chunks[0], batch_size, o.shuffling, o.shard)
        records = Layout.of_records(array.dtype, fields, batch_size)
        unknown = sorted(set(dtypes or ()) - {c.name for c in records.columns})
        if unknown:
            raise ValueError(f"dtypes: no field {unknown[0]!r} in this loader's batches "
                             f"(fields: {', '.join(c.name for c in records.columns)})")
        _Cast.check({c.name: c.dtype for c in records.columns}, dtypes or {}, casting)
        fetch = fetch_options(ds, o.caching)
        reader = read_worker.DatasetOpener.of(ds, fetch)
        source = RowSource(ds, table, config, selection, records, reader)
        transform = _Cast.around(o.workers.transform, dtypes)
        self._start(source, o, dataclasses.replace(o.workers, transform=transform), fetch=fetch, output=output)
        if row_ids and ROW_ID in {c.name for c in records.columns}:
            raise ValueError(f"row_ids: the table has a field named {ROW_ID!r} already")
        self.row_ids = bool(row_ids)

    def _start(self, source: BatchSource, o: Options, workers: WorkerOptions, *, fetch: FetchOptions,
               output: str = "numpy", groups: int | None = None) -> None:
        """What every loader keeps: its batch source, with the window resolved once (a window left to
        `shuffle_bytes` from what an epoch reads; a sample loader's: `groups` groups of samples, unless
        `shuffle_bytes` is given), its options and its cursor."""
        shuffling = o.shuffling
        if shuffling.shuffle_window is None:
            # in row order the window changes no order, only what is held and decoded before the first batch;
            # order 1's windows are of 8 chunks
            if not shuffling.shuffle or shuffling.order == 1:
                window = MIN_WINDOW
            elif groups is not None and "shuffle_bytes" not in o.given:
                window = groups
            else:
                window = default_window(source, shuffling.shuffle_bytes)
            source = source.with_config(source.config.with_window(window))
        self.options = o
        self.cache = o.caching.cache
        self.row_ids = False  # see Loader
        self.source, self.workers, self.fetch = source, workers, fetch
        self.dataset = source.dataset
        self.table = source.table
        self.fields = [c.name for c in source.layout.columns]
        self.batch_size = source.config.batch_size
        self.num_workers, self.prefetch, self.transform = workers.num_workers, workers.prefetch, workers.transform
        self.start_method, self.restart_workers = workers.start_method, workers.restart_workers
        self.copy, self.output = o.output.copy, output
        kept = o.caching.kept_bytes
        self.cache_bytes = default_cache_bytes() if kept is None else kept
        self.sizing = Sizing(source, workers, self.cache_bytes, self.dataset.location.settings.remote,
                              cache_is_default=kept is None, host=self.cache == "host")
        # owned copies need no check
        self.check_views = view_check.requested(o.output.check_views) and not self.copy
        self._digest: str | None = None
        self._cursor = Cursor()
        if workers.num_workers:
            start_fork_server(workers.start_method, start_worker)  # ready by the time the loop starts
        self._active = False
        self._plan: EpochPlan | None = None
        self._loaded: Any = None  # the state(s) given to load_state_dict, applied again by use_ranks
        self._run: Run | None = None
        self._finalizer = weakref.finalize(self, lambda: None)

    def _configure(self, config: PlanConfig) -> None:
        """Make batches with `config` from now on (ranks from torch.distributed, an order taken from a state):
        the one place a loader's plan configuration changes, before its first batch."""
        if config != self.source.config:
            self.source = self.source.with_config(config)
            self.sizing = dataclasses.replace(self.sizing, source=self.source)
            self._plan = None
            if self._run is not None:
                self.close()  # workers made for the configuration before

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._cursor.epoch

    # ------------------------------------------------------------ plan and state
    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of `epoch` (default: the current one): which rows form which batch."""
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = EpochPlan(self.source.config, epoch, self.source.selection, self._cursor.spans_of(epoch))
        return self._plan

    @property
    def worker_pids(self) -> list[int]:
        """The reader processes' pids while they run (from the first batch until `close()`); else empty."""
        return self._run.pool.pids() if self._run is not None else []

    @property
    def chunks_decoded(self) -> int:
        """Chunks decoded by the current or last epoch: 0 when every chunk was kept from before."""
        return self._run.chunks_decoded if self._run is not None else 0

    @property
    def cache_chunks(self) -> int | None:
        """Chunks the decoded-chunk cache holds (sized at the first batch; None before)."""
        return self._run.chunk_slots if self._run is not None else None

    def __len__(self) -> int:
        """Batches in the current epoch for this rank."""
        return len(self.plan())

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its first batch at the next iteration."""
        self._cursor, self._plan, self._loaded = Cursor(int(epoch)), None, None

    def use_ranks(self, rank: int, world_size: int) -> None:
        """Read rank `rank`'s part of every epoch (how `to_torch` follows `torch.distributed`). A loader made
        for other ranks than the default 0 of 1 is refused, as is one already iterating."""
        c = self.source.config
        if (c.shard.rank, c.shard.world_size) == (rank, world_size):
            return
        if c.shard.world_size != 1:
            raise ValueError(f"this Loader was made for rank {c.shard.rank} of {c.shard.world_size}, but the "
                             f"process group says rank {rank} of {world_size}")
        if self._run is not None:
            raise RuntimeError("use_ranks() must come before the first batch")
        self._configure(dataclasses.replace(c, shard=dataclasses.replace(c.shard, rank=rank, world_size=world_size)))
        if self._loaded is not None:  # states loaded before: shared out again, among these ranks
            self.load_state_dict(self._loaded)

    def to_torch(self) -> Any:
        """This loader as a `torch.utils.data.IterableDataset` of dicts of tensors, for
        `DataLoader(ds, batch_size=None)` (see `loader.torch_dataset`)."""
        from .torch_dataset import TorchBatches

        return TorchBatches(self)

    def state(self) -> LoaderState:
        """Where iteration stands, with what decides the batch order (see `loader.ordering.state`)."""
        if self._digest is None:  # hashed once: a selection can hold millions of rows
            self._digest = selection_digest(self.source.selection_parts())
        at = self._cursor
        return LoaderState(kind=self.source.kind, dataset_id=self.dataset.dataset_id, commit=self.dataset.commit,
                           settings=self.source.settings(), selection=self._digest, epoch=at.epoch,
                           batch=at.batch, commit_tag=self.dataset.commit_tag,
                           order=self.source.config.shuffling.order,
                           spans=[list(sp) for sp in at.spans] if at.spans is not None else None)

    def state_dict(self) -> dict[str, Any]:
        """`state()` as a plain dict, to save with a checkpoint; `load_state_dict` on a new loader made with the
        same arguments continues from here, without reading the batches before."""
        return self.state().to_dict()

    def load_state_dict(self, state: dict[str, Any] | LoaderState | list) -> None:
        """Continue from `state`; a state made for other data, another commit or other arguments raises one
        line naming what differs (and changes nothing). With the states of every rank of a run on another
        number of ranks (a list, one per old rank), the rows those ranks had not read in their epoch are shared
        out among this run's ranks, each read exactly once (the last batch of a rank may be short), then epochs
        go on as usual."""
        if self._active:  # the loop would go on from its own place, or with workers made for another order
            raise RuntimeError(LOADED_WHILE_ITERATING)
        was = self.source.config
        config, cursor = self._resumed(state)  # a refused state changes nothing
        self._configure(config)
        self._cursor, self._loaded = cursor, state
        if config != was:  # said once the state is taken
            now = config.shuffling
            taken = ([f"epoch order {now.order}"] if now.order != was.shuffling.order else []) + (
                [f"shuffle_window={now.shuffle_window}"] if now.shuffle_window != was.shuffling.shuffle_window else [])
            log.info("zarrfeed: resuming a run saved with %s: its order is kept", ", ".join(taken))

    def _resumed(self, state: dict[str, Any] | LoaderState | list) -> tuple[PlanConfig, Cursor]:
        """The plan configuration and the cursor that `state` resumes (see `loader.ordering.resume`), checked to
        resume this loader."""
        states = state if isinstance(state, (list, tuple)) else [state]
        if not states:
            raise ValueError("load_state_dict([]): no loader states given (the states of every rank of the "
                             "run, or one state)")
        saved = [LoaderState.from_dict(s) for s in states]
        c = self.source.config
        config = dataclasses.replace(c, shuffling=adopt_order(saved[0], c.shuffling, self.options.given))
        here = self._state_with(config, Cursor())
        if isinstance(state, (list, tuple)) or saved[0].settings.get("world_size") != c.shard.world_size:
            for s in saved:  # a run on another number of ranks: its rest shared out among these
                s.check_resumes(here, ranks=False)
            return config, reshard(saved, config, self.source.selection)
        one = saved[0]
        one.check_resumes(here)
        cursor = Cursor.of(one)
        plan = EpochPlan(config, cursor.epoch, self.source.selection, cursor.spans_of(cursor.epoch)) \
            if one.epoch >= 0 else None
        one.check_position(len(plan) if plan is not None else 0)
        return config, cursor

    def _state_with(self, config: PlanConfig, cursor: Cursor) -> LoaderState:
        """The state this loader would have with `config` at `cursor`."""
        source = self.source.with_config(config)
        state = dataclasses.replace(self.state(), settings=source.settings(), order=config.shuffling.order)
        return dataclasses.replace(state, epoch=cursor.epoch, batch=cursor.batch, spans=None)

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """The rest of the current epoch, then the epoch advances: a loop reads nothing when its epoch was read
        to its end (a loop left after its last batch, a state saved there) or this rank has no share of it (an
        epoch's rest resumed on more ranks than rows), so that every rank of a run stays in the same epoch."""
        return self._iterate(self.plan(), self._cursor.batch)

    def _iterate(self, plan: EpochPlan, first: int) -> Iterator[dict[str, np.ndarray]]:
        if first >= len(plan):
            self._cursor = self._cursor.next_epoch()
            return
        if self._active:  # two loops over one Loader would write into the same ring slots
            raise RuntimeError("this Loader is already being iterated; finish or leave that loop first "
                               "(or make a second Loader)")
        if self._run is not None and not self._run.fits(plan):
            self.close()  # this epoch's windows need a larger cache than the last one's: start anew
        if self._run is None:
            self._check_window_room(plan)
            outputs = probe.output_layout(self.source, plan, first, self.workers) if self.transform else None
            self._run = Run(self.source, self.sizing, outputs, plan)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, self._run.free)
        sched = Epoch(self._run, plan, first, keep_cache=self.cache_bytes > 0)
        handout = Handout(self.copy, self.check_views)
        if self.output == "arrow":  # (imported here: see `zarrfeed.loader`)
            from .arrow_bridge import to_arrow
        finished = False
        self._active = True
        try:
            for k in range(first, len(plan)):
                batch = handout.give(sched.get(k))
                self._cursor = self._cursor.at(k + 1)
                if self.row_ids:  # from the plan, here: no worker needs to know
                    batch[ROW_ID] = plan.batch_row_ids(k)
                yield to_arrow(batch) if self.output == "arrow" else batch
            sched.drain()
            finished = True
            self._cursor = self._cursor.next_epoch()
        finally:
            self._active = False
            handout.close()
            # broken out of, an exception, or garbage collected: stop the workers now; not once the interpreter
            # is exiting (modules are being torn down: the kernel frees the memory and the workers see their
            # parent gone)
            if not finished and not sys.is_finalizing():
                self.close()

    def _check_window_room(self, plan: EpochPlan) -> None:
        """One line naming the option when this machine cannot hold the decoded chunks of a window at once: the
        window follows from the dataset and the options (so that every machine makes the same order), never
        shrunk to fit, so the user chooses a smaller one."""
        chunks = max((len(self.source.chunks_of(plan, w)) for w in range(len(plan.windows))), default=0)
        own = max(self.num_workers, 1) * self.source.worker_bytes()
        need, free = chunks * self.source.chunk_bytes + own, available_memory()
        if need > free:
            option = (f"shuffle_window={self.source.config.window}" if "shuffle_window" in self.options.given else
                      f"shuffle_bytes={self.options.shuffling.shuffle_bytes}")
            workers = f" and {own / 2**20:.0f} MiB of its workers' own" if own else ""
            raise ShmSpaceError(f"a shuffle window of {chunks} chunks needs {need / 2**20:.0f} MiB of decoded chunks"
                                f"{workers} in memory at once, but this machine has {free / 2**20:.0f} MiB available: "
                                f"pass a smaller {option.split('=')[0]} than {option} (the batch order changes with "
                                "it)")

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
