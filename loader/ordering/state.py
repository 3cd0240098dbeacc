"""Resume state: where a loader's iteration stands, and everything that decides its batch order.

A state is loaded only into a loader that yields the same batches: same dataset (its id), same commit (the
same committed rows), same plan settings and the same row selection, identified by an exact digest (a hash
of the selected rows, not a checksum that two selections can share). Anything else is refused with one line
naming what differs, before a batch is read. The state is a plain dict when saved (`to_dict`: JSON and
`torch.save` friendly), with a name and a version, as Grain's data loader keeps one.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np

from .order import ORDERS
from .order import VERSION as ORDER

VERSION = 1
# a state loaded while a loop over the loader runs (the loop would go on from its own place, with its own workers)
LOADED_WHILE_ITERATING = ("load_state_dict while this loader is being iterated: leave the loop first (break), then "
                          "load the state and loop again")
NAME = "zarrfeed.LoaderState"
ORDER_NAMES = {0: "numpy's Generator, zarrfeed before 2026-11", 1: "zarrfeed's Fisher-Yates with SplitMix64",
               2: "stratified blocks, zarrfeed since 2026-11-27"}


def _kind_names(kinds: type | tuple[type, ...]) -> str:
    return " or ".join("None" if k is type(None) else k.__name__ for k in (kinds if isinstance(kinds, tuple) else
                                                                              (kinds,)))


def selection_digest(parts: Iterable[np.ndarray] | None) -> str:
    """An exact digest of a row selection given as arrays (per chunk, or one array); "all" for none."""
    if parts is None:
        return "all"
    h = hashlib.sha256()
    for i, part in enumerate(parts):
        rows = np.ascontiguousarray(part, dtype="<i8")
        h.update(np.array([i, len(rows)], "<i8").tobytes())
        h.update(rows.tobytes())
    return "sha256:" + h.hexdigest()


# settings that follow from the options (and, by default, the window: from shuffle_bytes and what is read)
_DERIVED = frozenset({"table_rows", "chunk_rows", "samples", "shuffle_window"})
# the option that selects what a loader reads (default rows=)
_SELECTED_BY = {"SequenceLoader": "episodes", "LeRobotLoader": "episodes"}
# AgentSampleLoader's minimums of the agents mask, which select its agents without rows=: recorded only then, and
# named when the selection differs (the digest decides, as for rows=: equal minimums select equal agents)
MASK_MINIMUMS = ("min_history", "min_future")
# settings that are not the option the user gives, as that option: partial_windows=True is whole_windows=False
# (a WindowLoader of whole windows records nothing, as states saved before partial windows)
_AS_OPTION = {"partial_windows": ("whole_windows", lambda recorded: recorded is None)}


def _differ(key: str, saved: Any, here: Any) -> str:
    """One line: the state's setting `key` is `saved`, this loader's `here`, said as the option the user gives."""
    if key in _AS_OPTION:
        key, spelled = _AS_OPTION[key]
        saved, here = spelled(saved), spelled(here)
    return f"loader state has {key}={saved!r}; this loader has {key}={here!r}"


@dataclass(frozen=True)
class LoaderState:
    """Batch `batch` of epoch `epoch` is the next one; the rest says which batches those are."""

    kind: str  # "Loader" or "WindowLoader"
    dataset_id: str | None  # None for datasets written by other tools
    commit: int | None
    settings: dict[str, Any] = field(default_factory=dict)
    selection: str = "all"
    epoch: int = 0
    batch: int = 0
    version: int = VERSION
    order: int = ORDER  # the epoch order's algorithm (loader/ordering/order.py); 0: numpy's Generator, before it
    commit_tag: str | None = None  # which copy's commit (see Dataset.commit_tag); None: not recorded
    # positions of the epoch's sequence this rank reads in `epoch` when they are not its usual share (the rest of
    # an epoch resumed on another number of ranks, see Loader.load_state_dict); None: its usual share
    spans: list[list[int]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": NAME, **asdict(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any] | "LoaderState") -> "LoaderState":
        """A state saved with `to_dict` (or `Loader.state_dict`); one-line ValueError for anything else."""
        if isinstance(state, LoaderState):
            return state
        if not isinstance(state, dict) or state.get("name") != NAME:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a zarrfeed loader state (expected a dict with name {NAME!r}; got {keys}); "
                             "states from zarrfeed before 0.1 cannot be loaded, start the epoch again")
        if type(state.get("version")) is not int or state["version"] != VERSION:
            raise ValueError(f"loader state version {state.get('version')!r} is not the version this zarrfeed "
                             f"reads ({VERSION})")
        known = {k: v for k, v in state.items() if k != "name"}
        known.setdefault("order", 0)  # saved before zarrfeed had its own epoch order: numpy's
        try:
            made = cls(**known)
        except TypeError as exc:
            raise ValueError(f"loader state has unexpected fields: {exc}") from None
        for name, kinds in (("kind", str), ("dataset_id", (str, type(None))), ("commit", (int, type(None))),
                            ("settings", dict), ("selection", str), ("epoch", int), ("batch", int), ("order", int),
                            ("commit_tag", (str, type(None))), ("spans", (list, type(None)))):
            value = getattr(made, name)
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise ValueError(f"loader state field {name!r} is {value!r}, not a {_kind_names(kinds)}")
        if made.spans is not None and not all(isinstance(sp, list) and len(sp) == 2 and
                                              all(type(x) is int and x >= 0 for x in sp) and sp[0] <= sp[1]
                                              for sp in made.spans):
            raise ValueError("loader state field 'spans' is not a list of [start, end) positions")
        return made

    def check_resumes(self, here: "LoaderState", ranks: bool = True) -> None:
        """Raise ValueError (one line naming the first difference) unless this state resumes `here`'s loader
        (without `ranks`: on any rank and number of ranks)."""
        if self.kind != here.kind:
            raise ValueError(f"loader state is of a {self.kind}; this is a {here.kind}")
        if self.dataset_id != here.dataset_id:
            raise ValueError(f"loader state was made on another dataset (id {self.dataset_id}; this one is "
                             f"{here.dataset_id})")
        if self.commit != here.commit:
            raise ValueError(f"loader state was made on commit {self.commit} of this dataset; this loader reads "
                             f"commit {here.commit} (open it with commit={self.commit} to resume exactly)")
        if self.commit_tag and here.commit_tag and self.commit_tag != here.commit_tag:
            raise ValueError(f"loader state was made on another copy of this dataset: its commit {self.commit} holds "
                             "other rows than this one's")
        # what follows from the options (rows per plan "chunk", samples) is compared last, after the selection:
        # the option named is the one the user changed
        keys = sorted(set(self.settings) | set(here.settings))
        for key in [k for k in keys if k not in _DERIVED]:
            if not ranks and key in ("rank", "world_size"):
                continue
            if key in MASK_MINIMUMS:  # (with the selection, below)
                continue
            a, b = self.settings.get(key), here.settings.get(key)
            if a != b:
                raise ValueError(_differ(key, a, b))
        if self.selection != here.selection:
            raise ValueError(self._other_selection(here))
        if self.order != here.order and self.batch != 0:  # at an epoch's start no row has been seen: any order
            # before the window, which follows from the order: the option named is the one the user changed
            if self.order in ORDERS:  # one this zarrfeed makes: this loader was given another
                raise ValueError(f"loader state has order={self.order} (saved mid-epoch); this loader has "
                                 f"order={here.order}: pass order={self.order}, or leave order out (a state's "
                                 "order is taken)")
            raise ValueError(f"loader state was saved mid-epoch (batch {self.batch} of epoch {self.epoch}) with "
                             f"epoch order {self.order!r} ({ORDER_NAMES.get(self.order, 'unknown')}); this zarrfeed "
                             f"orders epochs with order {here.order}: finish that epoch with the release that "
                             f"saved the state, or resume from the start of epoch {self.epoch + 1}")
        fresh = self.order != here.order and self.batch == 0 and self.spans is None  # another order, nothing read
        for key in [k for k in keys if k in _DERIVED]:
            a, b = self.settings.get(key), here.settings.get(key)
            if a != b and not (fresh and key == "shuffle_window"):  # (the window goes with the order)
                valid = isinstance(a, int) and not isinstance(a, bool) and a >= 1
                hint = (f" (a default window follows from shuffle_bytes and what an epoch reads: pass "
                        f"shuffle_window={a!r}, or the shuffle_bytes the state was saved with)" if valid else
                        " (not a window: the state was changed)") if key == "shuffle_window" else ""
                raise ValueError(f"loader state has {key}={a!r}; this loader has {key}={b!r}{hint}")

    def _other_selection(self, here: "LoaderState") -> str:
        """One line: this state selected other rows than `here`'s loader, naming the option that did."""
        mask_saved, mask_here = (all(key in st.settings for key in MASK_MINIMUMS) for st in (self, here))
        if mask_saved and mask_here:
            for key in MASK_MINIMUMS:
                if self.settings[key] != here.settings[key]:
                    return _differ(key, self.settings[key], here.settings[key])
        elif mask_saved:
            return (f"loader state was made with the agents mask's agents (min_history="
                    f"{self.settings['min_history']!r}, min_future={self.settings['min_future']!r}); this loader "
                    "was given rows=: leave rows= out to resume it")
        elif mask_here:  # the state's agents were given by rows=, or it does not record the minimums
            return ("loader state was made with other agents selected (by rows=, or by other min_history= or "
                    "min_future= in a state that does not record them); pass the same rows=, min_history= and "
                    "min_future=")
        option = _SELECTED_BY.get(self.kind, "rows")
        return f"loader state was made with another selection ({option}=); pass the same {option}"

    def check_position(self, batches: int) -> None:
        """Raise ValueError (one line) unless batch `batch` can come next in an epoch of `batches` batches: a
        position past the end was never saved by a loader with these settings (edited, or another rank's)."""
        if self.epoch < 0 or not 0 <= self.batch <= batches:
            raise ValueError(f"loader state is at batch {self.batch} of epoch {self.epoch}, outside that epoch "
                             f"(it has {batches} batches for this loader)")
