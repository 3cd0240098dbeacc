"""The messages between a loader and its reader workers, and their replies: small frozen records (the records
themselves stay in shared memory), dispatched by type. Each message and its reply share a `key`, by which
the scheduler tracks what a worker has not answered yet (to send it again to a restarted worker)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ...core._proc.pool import RemoteError


@dataclass(frozen=True, slots=True)
class DecodeItem:
    """Chunk `chunk` of `table`, to decode into cache slot `slot` under claim `token`."""

    table: str
    chunk: int
    slot: int
    token: int = 0


@dataclass(frozen=True, slots=True)
class Decode:
    """Fetch these chunks (together: concurrently from an object store) and decode each into its cache slot,
    if the slot's claim is still `token` (a host cache's slot whose claimer died may be claimed anew)."""

    items: tuple[DecodeItem, ...]

    @property
    def key(self) -> tuple:
        return ("decode", tuple(item.slot for item in self.items))


@dataclass(frozen=True, slots=True)
class FillIndex:
    """Write window `window`'s shuffled rows for `epoch`, as cache rows, into index region `region`; `slots`
    holds the cache slot of each chunk of the window, in the window's order. `part`: the blocks to write
    (`EpochPlan.index_parts`; (0, 0): the whole window)."""

    epoch: int
    window: int
    region: int
    slots: tuple[int, ...]
    part: tuple[int, int] = (0, 0)

    @property
    def key(self) -> tuple:
        return ("index", self.window, self.part)


@dataclass(frozen=True, slots=True)
class GatherRows:
    """Make batches [first, first + count) of `epoch` from the index: `regions` maps each window they read to
    its index region. `spans`: the rank's positions of the epoch when it was resumed on another number of
    ranks (`EpochPlan.spans`), else None."""

    epoch: int
    first: int
    count: int
    regions: dict[int, int]
    spans: tuple[tuple[int, int], ...] | None = None

    @property
    def key(self) -> tuple:
        return ("gather", self.first)


@dataclass(frozen=True, slots=True)
class GatherWindows:
    """Make window-sample batches [first, first + count) of `epoch` from the cache: `slots` maps each table's
    chunks they read to cache slots; `spans` as in `GatherRows`."""

    epoch: int
    first: int
    count: int
    slots: dict[str, dict[int, int]]
    spans: tuple[tuple[int, int], ...] | None = None

    @property
    def key(self) -> tuple:
        return ("gather", self.first)


Message = Union[Decode, FillIndex, GatherRows, GatherWindows]


@dataclass(frozen=True, slots=True)
class Decoded:
    worker: int
    slots: tuple[int, ...]

    @property
    def key(self) -> tuple:
        return ("decode", self.slots)


@dataclass(frozen=True, slots=True)
class IndexFilled:
    worker: int
    window: int
    part: tuple[int, int] = (0, 0)

    @property
    def key(self) -> tuple:
        return ("index", self.window, self.part)


@dataclass(frozen=True, slots=True)
class Gathered:
    """Batches [first, first + count) are in their ring slots; `counts`, for batches with ragged columns,
    the rows of each ragged column per batch."""

    worker: int
    first: int
    count: int
    counts: list[dict[str, int] | None] | None = None

    @property
    def key(self) -> tuple:
        return ("gather", self.first)


@dataclass(frozen=True, slots=True)
class TransformFailed:
    """The user's transform raised on batch `batch` of the group that starts at `first`; the worker goes on."""

    worker: int
    first: int
    batch: int
    error: RemoteError

    @property
    def key(self) -> tuple:
        return ("gather", self.first)


Reply = Union[Decoded, IndexFilled, Gathered, TransformFailed]
