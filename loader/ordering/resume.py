"""Where a loader stands in its epochs (`Cursor`), and the rules that turn saved states into that place: which
order a resumed run keeps (`adopt_order`) and how the rest of an epoch saved on N ranks is shared out among M
(`reshard`). The local loaders and the remote ones use these same functions.

The rule every loader follows: a loop reads the rest of the current epoch (nothing when it was read to its end,
or this rank has no share of it), then the epoch advances, so that every rank of a run stays in the same epoch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..options import ShuffleOptions
from .order import ORDERS
from .plan import EpochPlan, PlanConfig
from .state import LoaderState

Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Cursor:
    """Batch `batch` of epoch `epoch` is the next to read. `spans`: the positions of that epoch's sequence this
    rank reads when they are the rest of an epoch resumed on another number of ranks (empty: none of it), else
    None (the rank's usual share)."""

    epoch: int = 0
    batch: int = 0
    spans: Spans | None = None

    def spans_of(self, epoch: int) -> list[tuple[int, int]] | None:
        """The spans of `epoch`'s plan: this cursor's for its own epoch, None (the usual share) for others."""
        return list(self.spans) if self.spans is not None and epoch == self.epoch else None

    @property
    def no_share(self) -> bool:
        """This rank reads nothing of its epoch (the epoch's rest went to other ranks)."""
        return self.spans == ()

    def at(self, batch: int) -> "Cursor":
        return Cursor(self.epoch, batch, self.spans)  # (once a batch: `replace` costs twice as much)

    def next_epoch(self) -> "Cursor":
        return Cursor(self.epoch + 1)

    @classmethod
    def of(cls, saved: LoaderState) -> "Cursor":
        """Where `saved` stands."""
        spans = tuple((int(a), int(z)) for a, z in saved.spans) if saved.spans is not None else None
        return cls(int(saved.epoch), int(saved.batch), spans)


def saved_window(saved: LoaderState) -> int | None:
    """The window a state records, if it is one."""
    window = saved.settings.get("shuffle_window")
    return window if isinstance(window, int) and not isinstance(window, bool) and window >= 1 else None


def adopt_order(saved: LoaderState, shuffling: ShuffleOptions, given: frozenset[str]) -> ShuffleOptions:
    """The order a run resumed from `saved` keeps: the state's order and window unless the loader was given them
    (`given`: the options the user gave). A state of another order this zarrfeed makes (order 1) goes on in it,
    and in its window unless one was given; a state whose window was another default (another `shuffle_bytes`
    default, a sample loader's former default) goes on in its window unless `shuffle_window` or `shuffle_bytes`
    was given. Given ones must match the state: `LoaderState.check_resumes` says so after."""
    window = saved_window(saved)
    if saved.order != shuffling.order and saved.order in ORDERS and "order" not in given:
        if "shuffle_window" not in given and window is not None:
            shuffling = replace(shuffling, shuffle_window=window)
        return replace(shuffling, order=saved.order)
    if saved.order == shuffling.order and window is not None and not given & {"shuffle_window", "shuffle_bytes"}:
        return replace(shuffling, shuffle_window=window)
    return shuffling


def reshard(states: list[LoaderState], config: PlanConfig, selection: list[np.ndarray] | None) -> Cursor:
    """Where this rank (`config.shard`) of a run on M ranks starts, from the states of all N ranks of a run
    (checked to resume this loader by the caller): the rows they had not read in their epoch, shared out in
    order, each read exactly once (the last batch of a rank may be short)."""
    worlds = {s.settings.get("world_size") for s in states}
    if len(worlds) != 1:
        raise ValueError(f"loader states of runs on different numbers of ranks: {sorted(map(str, worlds))}")
    n = int(worlds.pop() or 1)
    ranks = sorted(int(s.settings.get("rank", 0)) for s in states)
    shard = config.shard
    if ranks != list(range(n)):
        hint = (" (this loader is rank 0 of 1: under torch.distributed, call use_ranks(rank, world_size) or "
                "to_torch() before load_state_dict)" if (shard.rank, shard.world_size) == (0, 1) else "")
        raise ValueError(f"loader states of ranks {ranks} of a run on {n}: the states of all {n} ranks are "
                         f"needed to resume on another number of ranks{hint}")
    epoch = min(s.epoch for s in states)
    if all(s.epoch == epoch and s.batch == 0 and s.spans is None for s in states):
        return Cursor(epoch)  # nothing read of it: this run's own epoch (a resharded one still shares out its rest)
    remaining: list[tuple[int, int]] = []
    for s in sorted(states, key=lambda s: int(s.settings.get("rank", 0))):
        if s.epoch != epoch and not (s.epoch == epoch + 1 and s.batch == 0):
            raise ValueError(f"loader states of epochs {epoch} and {s.epoch}: the ranks of a run are in one "
                             "epoch (or at the start of the next)")
        if s.epoch != epoch:
            continue  # that rank had finished the epoch
        old = replace(config, shard=replace(shard, rank=int(s.settings["rank"]), world_size=n))
        plan = EpochPlan(old, epoch, selection, Cursor.of(s).spans_of(epoch))
        s.check_position(len(plan))
        remaining += plan.remaining(s.batch)
    total = sum(z - a for a, z in remaining)
    lo, hi = shard.rank * total // shard.world_size, (shard.rank + 1) * total // shard.world_size
    mine, at = [], 0
    for a, z in remaining:  # this rank's part: rows [lo, hi) of what is left, in order
        take_a, take_z = max(a, a + lo - at), min(z, a + hi - at)
        if take_a < take_z:
            mine.append((take_a, take_z))
        at += z - a
    return Cursor(epoch, 0, tuple(mine))
