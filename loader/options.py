"""The options every loader takes, declared once.

`LoaderOptions` names, types and documents them for users (each loader's constructor takes
`**options: Unpack[LoaderOptions]`, so type checkers check them and the API reference lists them on every
loader's page). `Options` holds them as small frozen groups, each checked once, here, in its `__post_init__`
(Grain's `ReadOptions`/`MultiprocessingOptions`/`ShardOptions` are the model): `ShuffleOptions` decide the
epoch order, `ShardOptions` each rank's share, `WorkerOptions` how batches are made, `CacheOptions` where
decoded chunks are kept, `ReadOptions` what is opened, `OutputOptions` what a batch is handed out as. Remote
loaders take the first two as they are (`zarrfeed.flight.remote_options`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, TypedDict

import numpy as np

from ..core.keywords import choice, count, flag, folder, mapping, seconds, taken
from .ordering.order import ORDERS, VERSION as ORDER, integer

Transform = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
DEFAULT_SHUFFLE_BYTES = 1 << 30  # a loader's default window: the whole table up to 1 GiB of decoded chunks
# WindowLoader's and SequenceLoader's default windows, in groups of samples (one per chunk), unless
# `shuffle_bytes` is given: the widest that cost them under a tenth of their speed (`bench/bench_sample_windows.py`
# measures it; docs/figures.json holds the figures). The other loaders take the whole-table default.
WINDOW_GROUPS = 8
SEQUENCE_GROUPS = 16


class LoaderOptions(TypedDict, total=False):
    """Options every loader takes, keyword-only, besides its own."""

    shuffle: bool
    """Shuffle (default); False reads the selected rows or samples in table order."""
    seed: int
    """The integer that, with the epoch, decides the shuffled order (default 0; the same on every machine)."""
    shuffle_window: int | None
    """Chunks (for sample loaders: groups of samples, one per chunk) shuffled together, in a random order;
    batches hold every chunk of their window in proportion (the loading guide says exactly what the order is).
    Default (None): for `Loader`, `AgentSampleLoader` and `EgoSampleLoader`, the whole table when the decoded
    chunks an epoch reads fit `shuffle_bytes`, else windows as large as fit, never fewer than 8 chunks; for
    `WindowLoader` 8 groups and `SequenceLoader` 16, or what `shuffle_bytes` holds when it is given; with
    `shuffle=False` or `order=1`, 8."""
    shuffle_bytes: int
    """Decoded bytes of chunks the default window holds (default 1 GiB; `WindowLoader` and `SequenceLoader` use
    it only when it is given): more mixes rows from further apart, at the cost of memory and of decoding a
    window before its first batch. The window it gives depends on the dataset and the options only, never on
    this machine; one this machine cannot hold is refused, naming it."""
    order: int
    """The epoch order's algorithm (default 2, stratified blocks; 1 is one Fisher-Yates shuffle per window, in
    which a state saved in it resumes without asking)."""
    drop_last: bool
    """Drop what does not fill a last batch and, with several ranks, the tail that does not divide equally
    among them. Default False: the last batch is short, and ranks' shares are made equal by repeating rows
    from the start of the epoch."""
    rank: int
    """This process's rank, in [0, world_size) (default 0): it reads the rank-th of `world_size` equal parts
    of each epoch, the same order on every rank."""
    world_size: int
    """The number of ranks sharing each epoch (default 1). `use_ranks` (or `to_torch`) can set both from
    `torch.distributed` instead."""
    num_workers: int
    """Reader processes that decode chunks and make batches (default 2; 0: in this process). The batches and
    their order do not depend on it."""
    prefetch: int
    """Batches made ahead of the one being used, at least (default 4); more smooths out slow chunks, at the
    cost of shared memory."""
    transform: Transform | None
    """A function run in the workers on each batch, taking and returning a dict of numpy arrays whose first
    axis is the batch's rows; its output shapes per row must not change. It runs once first, in a process of
    its own, to size the batch slots. Default: none."""
    copy: bool
    """Yield batches that own their arrays (one copy each). Default False: views into shared memory, valid
    until the next batch is requested."""
    start_method: str | None
    """How worker processes start ("fork", "spawn" or "forkserver"); default "forkserver" where the platform
    has it. "fork" starts faster, but a child of a process with threads may deadlock."""
    restart_workers: bool
    """Start a new worker in place of one that dies, and have it make that worker's batches again. Default
    False: raise `LoaderError`."""
    stall_timeout: float | None
    """Seconds a batch may wait on a process that is stopped (SIGSTOP, a debugger, a frozen cgroup): this
    loader's worker, or another process holding the host cache it needs; then it raises `LoaderStalledError`
    naming the pids. Default (None): it waits as long as they are stopped, and after 10 s the log says which
    process it waits for and what to do. A running process, however slow, is never timed out."""
    storage_options: dict[str, Any] | None
    """fsspec options for a URL (credentials, `endpoint_url`, ...); default none."""
    commit: int | None
    """The commit number to read (default: the latest when opened); pin one so that every rank reads the same
    rows while a writer appends."""
    cache_dir: str | os.PathLike | None
    """A local folder keeping fetched chunk objects of a dataset on an object store across epochs and runs
    (nothing is kept for a local dataset); default: none."""
    cache_dir_bytes: int
    """The bound of `cache_dir`, in bytes (default 8 GiB); least recently used go first."""
    check_views: bool | None
    """Make a view used after the next batch fault loudly (a debug mode; no effect with `copy=True`). Default
    (None): the environment variable ZARRFEED_CHECK_VIEWS decides."""
    cache_bytes: int | None
    """Bytes of decoded chunks kept across epochs (default: a quarter of the memory available; 0: none, every
    epoch decodes again); the chunks the batches in flight need in memory at once are kept whatever it says
    (the log says so). With `cache="host"` it sizes the host's cache if this loader makes it."""
    cache: str
    """Where decoded chunks are kept: "host" (default), one cache shared by every loader of this dataset commit
    on this machine; "process", this loader's own; "off", none."""
    verify_chunks: bool
    """Check every chunk read against the size and digest its commit recorded, before it is decoded (default
    True; about 10 us per chunk against ~400 us to decode it). False reads unchecked (also when the `Dataset`
    given was opened with `verify_chunks=False`): a chunk changed on disk, or another dataset put in this one's
    place, is then read as this dataset's rows, with no error."""


@dataclass(frozen=True)
class ShuffleOptions:
    """What decides the epoch order (with the table and the batch size): the same on every rank and machine."""

    shuffle: bool = True
    seed: int = 0
    shuffle_window: int | None = None
    shuffle_bytes: int = DEFAULT_SHUFFLE_BYTES
    order: int = ORDER

    def __post_init__(self) -> None:
        # plain Python ints: a state saved with numpy integers would not be JSON, and True is not an order
        put = object.__setattr__
        put(self, "shuffle", flag(self.shuffle, "shuffle"))
        put(self, "seed", integer(self.seed, "seed"))
        put(self, "shuffle_window", count(self.shuffle_window, "shuffle_window", 1, "the default window"))
        put(self, "shuffle_bytes", count(self.shuffle_bytes, "shuffle_bytes", 1))
        order = count(self.order, "order", 0)
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(str, ORDERS))} (the epoch order's algorithm), "
                             f"got {self.order!r}")
        put(self, "order", order)


@dataclass(frozen=True)
class ShardOptions:
    """Which share of each epoch this rank reads: the `rank`-th of `world_size` equal parts."""

    drop_last: bool = False
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "drop_last", flag(self.drop_last, "drop_last"))
        object.__setattr__(self, "rank", count(self.rank, "rank", 0))
        object.__setattr__(self, "world_size", count(self.world_size, "world_size", 1))
        if not self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")


@dataclass(frozen=True)
class WorkerOptions:
    """How batches are made: by `num_workers` processes (0: this one), `prefetch` ahead, running `transform`."""

    num_workers: int = 2
    prefetch: int = 4
    transform: Transform | None = None
    start_method: str | None = None
    restart_workers: bool = False
    stall_timeout: float | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "num_workers", count(self.num_workers, "num_workers", 0))
        put(self, "prefetch", count(self.prefetch, "prefetch", 1))
        put(self, "restart_workers", flag(self.restart_workers, "restart_workers"))
        put(self, "stall_timeout", seconds(self.stall_timeout, "stall_timeout", none="as long as it is stopped"))
        choice(self.start_method, "start_method", (None, "fork", "spawn", "forkserver"))
        if self.transform is not None and not callable(self.transform):
            raise ValueError(f"transform must be a function of a batch (or None), got {self.transform!r}")


@dataclass(frozen=True)
class OutputOptions:
    """What a batch is handed out as: views into shared memory (checked, with `check_views`) or copies."""

    copy: bool = False
    check_views: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "copy", flag(self.copy, "copy"))
        object.__setattr__(self, "check_views", flag(self.check_views, "check_views", none=True))


@dataclass(frozen=True)
class ReadOptions:
    """What is opened: the store's options, the commit, whether chunks are checked against their digests."""

    storage_options: dict[str, Any] | None = None
    commit: int | None = None
    verify_chunks: bool = True

    def __post_init__(self) -> None:
        mapping(self.storage_options, "storage_options")
        object.__setattr__(self, "commit", count(self.commit, "commit", 0, "the latest"))
        object.__setattr__(self, "verify_chunks", flag(self.verify_chunks, "verify_chunks"))


@dataclass(frozen=True)
class CacheOptions:
    """Where decoded chunks (`cache`, `cache_bytes`) and fetched chunk objects (`cache_dir`) are kept."""

    cache_dir: str | os.PathLike | None = None
    cache_dir_bytes: int = 8 << 30
    cache_bytes: int | None = None
    cache: str = "host"

    def __post_init__(self) -> None:
        folder(self.cache_dir, "cache_dir")
        object.__setattr__(self, "cache_dir_bytes", count(self.cache_dir_bytes, "cache_dir_bytes", 0))
        object.__setattr__(self, "cache_bytes",
                           count(self.cache_bytes, "cache_bytes", 0, "a quarter of the memory available"))
        choice(self.cache, "cache", ("host", "process", "off"))

    @property
    def kept_bytes(self) -> int | None:
        """`cache_bytes`, 0 with `cache="off"` (None: the default, a quarter of the memory available)."""
        return 0 if self.cache == "off" else self.cache_bytes


@dataclass(frozen=True)
class Options:
    """`LoaderOptions` as a loader holds them: its groups, and which options the user gave (a test holds the
    names equal to `LoaderOptions`')."""

    GROUPS: ClassVar[dict[str, type]] = {"shuffling": ShuffleOptions, "shard": ShardOptions,
                                         "workers": WorkerOptions, "output": OutputOptions, "read": ReadOptions,
                                         "caching": CacheOptions}
    # left out, they are not what their defaults say when given: a given order holds a saved state to it (one
    # left out takes the state's), a given shuffle_bytes widens WindowLoader's and SequenceLoader's windows
    NOT_GIVEN: ClassVar[tuple[str, ...]] = ("shuffle_bytes", "order")

    shuffling: ShuffleOptions = field(default_factory=ShuffleOptions)
    shard: ShardOptions = field(default_factory=ShardOptions)
    workers: WorkerOptions = field(default_factory=WorkerOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    read: ReadOptions = field(default_factory=ReadOptions)
    caching: CacheOptions = field(default_factory=CacheOptions)
    given: frozenset[str] = frozenset()

    @classmethod
    def of(cls, given: Mapping[str, Any], who: str) -> "Options":
        """The options `who` (a loader's name) was given; an unknown one refused in one line, naming the
        close one."""
        return taken(cls, given, f"{who}.__init__")
