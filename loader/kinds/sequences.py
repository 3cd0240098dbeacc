"""`SequenceLoader`: Diffusion Policy's training samples, read from the replay buffer where it lies.

A sample is a window of `sequence_length` consecutive steps of one episode, as Diffusion Policy's
`SequenceSampler` makes them: for an episode of L steps, windows start at every step from `-pad_before` to
`L - sequence_length + pad_after` (both pads clamped to `sequence_length - 1`, as it does), and the steps of a
window that lie before the episode's first step or after its last repeat that first or last step. Samples are
numbered in that order, episode after episode (`sample`, DP's index into `SequenceSampler.indices`), and an
unshuffled loader yields them in it. What DP does not give, LeRobot does: `is_pad`, which steps are padding.

Samples are grouped by the chunk of the first key their first step lies in; the epoch plan shuffles groups
as it shuffles chunks (windows of `shuffle_window` groups) and the samples within each window. The chunks a
window reads, of every key, are decoded once into the shared cache (an image chunk once, not once per
sample), and each batch is gathered from there: one pass per key over the batch's steps.
"""
from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Unpack

import numpy as np

from ...core._proc.pool import preload_in_workers
from ...core.replay_buffer import END, EPISODES
from ...core.schema import field_names
from ...core.location import FormatError
from ..engine import read_worker
from ..loader import Loader, fetch_options, open_dataset
from ..dataset import Dataset
from ..engine.gather import gather
from ..engine.layout import Layout
from ...core.keywords import spelled_out
from ..options import SEQUENCE_GROUPS, LoaderOptions, Options
from ..ordering.plan import EpochPlan, PlanConfig
from .base import CacheView
from .sample_groups import GroupedSamples, GroupSource, SampleBuilder, select_episodes
from .source import plan_settings

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool


def sequence_starts(ends: np.ndarray, episodes: np.ndarray, sequence_length: int, pad_before: int,
                    pad_after: int) -> tuple[np.ndarray, np.ndarray]:
    """Every sample of the `episodes` (indices, in order) as (episode, start step within the episode, which
    is negative for a window padded before), in Diffusion Policy's order. Pads are clamped to
    `sequence_length - 1` as its `create_indices` does; an episode without steps has no samples."""
    S = sequence_length
    before, after = min(max(pad_before, 0), S - 1), min(max(pad_after, 0), S - 1)
    first = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    length = (np.asarray(ends, np.int64) - first)[episodes]
    counts = np.where(length > 0, np.maximum(length - S + after + before + 1, 0), 0)
    episode = np.repeat(np.asarray(episodes, np.int64), counts)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return episode, within - before


class SequenceSamples(GroupedSamples):
    """The samples of a replay buffer (see the module's docstring), grouped by the chunk of `keys[0]` their
    first step lies in, and what each group reads."""

    def __init__(self, ds: Dataset, keys: list[str], sequence_length: int, pad_before: int, pad_after: int,
                 episodes: np.ndarray | None) -> None:
        sequence_length, pad_before, pad_after = (_whole(v, name) for v, name in (
            (sequence_length, "sequence_length"), (pad_before, "pad_before"), (pad_after, "pad_after")))
        if sequence_length < 1:
            raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")
        taken = sorted(set(keys) & set(COLUMNS))
        if taken:
            raise ValueError(f"keys: data key {taken[0]!r} has the name of a column SequenceLoader adds "
                             f"({', '.join(COLUMNS)}); leave it out with keys=, or rename it in the buffer")
        self.keys, self.S = keys, sequence_length
        self.pad_before, self.pad_after = pad_before, pad_after
        n = ds.rows[EPISODES]
        ends = ds.read_rows(EPISODES, 0, n)[END].astype(np.int64)
        ds.require_link(EPISODES, END, ends)  # one line naming the episode, not an IndexError below
        self.first = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        self.length = ends - self.first
        self.episodes = select_episodes(episodes, n)
        self.episode, self.start = sequence_starts(ends, self.episodes, self.S, pad_before, pad_after)
        lo = self.first[self.episode] + np.maximum(self.start, 0)  # the steps each sample reads: [lo, hi)
        hi = self.first[self.episode] + np.minimum(self.start + self.S, self.length[self.episode])
        self.chunk_rows = {k: ds[k].chunks[0] for k in keys}
        super().__init__(lo // self.chunk_rows[keys[0]])
        for a, b in zip(lo[self.group_start].tolist(), (hi[self.group_end - 1] - 1).tolist(), strict=True):
            self.reads.append([(k, c) for k in keys for c in range(a // self.chunk_rows[k],
                                                                   b // self.chunk_rows[k] + 1)])

    def __len__(self) -> int:
        return len(self.episode)

    def steps(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For samples `ids`: the step each of their `S` positions reads, (n, S) global step rows, and whether
        it is padding (a repeat of the episode's first or last step)."""
        at = self.start[ids, None] + np.arange(self.S)  # within the episode
        episode = self.episode[ids]
        last = self.length[episode, None] - 1
        pad = (at < 0) | (at > last)
        return self.first[episode, None] + np.minimum(np.maximum(at, 0), last), pad

    def indices(self) -> np.ndarray:
        """Every sample as Diffusion Policy's `SequenceSampler.indices` holds it: (buffer_start, buffer_end,
        sample_start, sample_end), the steps read and where they go in the window."""
        first, length = self.first[self.episode], self.length[self.episode]
        lo = np.maximum(self.start, 0)
        hi = np.minimum(self.start + self.S, length)
        return np.stack([first + lo, first + hi, lo - self.start, self.S - (self.start + self.S - hi)], axis=1)


COLUMNS = ("sample", "episode", "is_pad")  # what a batch holds besides the keys


def _whole(value: object, name: str) -> int:
    """`value` as an int (a numpy integer too); ValueError naming `name` for anything else (4.5, "4")."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None


def _layout(ds: Dataset, seqs: SequenceSamples, batch_size: int) -> Layout:
    cols: list[tuple] = [("sample", np.dtype(np.int64), (), -1), ("episode", np.dtype(np.int64), (), -1),
                         ("is_pad", np.dtype(bool), (seqs.S,), -1)]
    for key in seqs.keys:
        sub = ds[key].dtype[key]
        cols.append((key, sub.base, (seqs.S, *sub.shape), 0))
    return Layout(cols, batch_size)


class SequenceBuilder(SampleBuilder):
    """Sequence samples (see `SequenceLoader`): `sample`, `episode` and `is_pad` from the samples, then each key
    gathered from the cached chunks, one pass per key over the batch's steps."""

    samples: SequenceSamples

    def __init__(self, cache: CacheView, config: PlanConfig, samples: SequenceSamples, dtypes: dict[str, np.dtype],
                 layout: Layout) -> None:
        super().__init__(cache, config, samples, dtypes, layout)
        self.by_name = {c.name: c for c in layout.columns}
        self.specs = {k: np.array([0, dtypes[k].itemsize, self.by_name[k].base], np.int64) for k in samples.keys}

    def one_batch(self, dst: Any, p: EpochPlan, orders: dict, k: int, slots: dict[str, dict[int, int]]) -> None:
        seqs, by_name, dtypes = self.samples, self.by_name, self.dtypes
        ids = seqs.sample_ids(p, p.segments(k), orders)
        b = len(ids)
        np.frombuffer(dst, np.int64, count=b, offset=by_name["sample"].base)[:] = ids
        np.frombuffer(dst, np.int64, count=b, offset=by_name["episode"].base)[:] = seqs.episode[ids]
        rows, pad = seqs.steps(ids)
        np.frombuffer(dst, bool, count=b * seqs.S, offset=by_name["is_pad"].base)[:] = pad.reshape(-1)
        rows = rows.reshape(-1)
        split: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # chunk rows -> (chunk, row within it)
        for key in seqs.keys:
            c, size = seqs.chunk_rows[key], dtypes[key].itemsize
            if c not in split:
                chunk = rows // c
                split[c] = (chunk, rows - chunk * c)
            chunk, within = split[c]
            first, at = self.chunk_bases(key, slots[key])
            gather(self.cache, size, at[chunk - first] + within * size, dst, self.specs[key], 0, 1)


@dataclass
class SequenceSource(GroupSource):
    """Batches of sequence samples (see `SequenceLoader`), gathered from the cached chunks of their keys: the
    plan's 'chunks' are groups of samples, one per chunk of the first key."""

    builds: ClassVar[type[SampleBuilder]] = SequenceBuilder
    dataset: Dataset
    samples: SequenceSamples
    config: PlanConfig
    selection: list[np.ndarray] | None
    layout: Layout
    reader: read_worker.DatasetOpener
    kind: str = "SequenceLoader"
    table: str = EPISODES
    uses_index: bool = False
    rows_column: str | None = "sample"

    @property
    def tables(self) -> list[str]:
        return list(self.samples.keys)

    def rows_touched(self) -> int:
        return self.config.batch_size * self.samples.S * len(self.tables)

    def settings(self) -> dict[str, Any]:
        s = self.samples
        return {**plan_settings(self.table, self.config), "sequence_length": s.S, "pad_before": s.pad_before,
                "pad_after": s.pad_after, "keys": list(s.keys), "samples": len(s)}

    def selection_parts(self) -> list[np.ndarray]:
        return [self.samples.episodes]  # the episodes sampled, exactly


@spelled_out(LoaderOptions, Options)
class SequenceLoader(Loader):
    """Batches of Diffusion Policy's training samples from a replay buffer (`data/<key>` arrays and
    `meta/episode_ends`), read where it lies: every window of `sequence_length` steps its `SequenceSampler`
    makes with the same `pad_before`, `pad_after`, keys and episode mask, equal to its samples value for value,
    with no `copy_from_path` into memory first.

    A batch holds `sample` (B,) int64 (the sample's index in DP's order: `SequenceSampler.indices[sample]`),
    `episode` (B,) int64, `is_pad` (B, S) bool (True where the step repeats the episode's first or last step
    as padding) and, for each key, `<key>` (B, S, ...) of the key's dtype.

    It takes every loader's options (`LoaderOptions`, listed below); `shuffle_window` counts groups of
    samples, one per chunk of the first key.

    Args:
        dataset_or_path: An open `Dataset`, or a directory, `.zip` file or fsspec URL to open (as `Loader`'s).
        sequence_length: Steps per sample (DP's `horizon`).
        pad_before: Windows may start up to this many steps before an episode's first step (DP:
            `n_obs_steps - 1`); clamped to `sequence_length - 1` as DP does.
        pad_after: Windows may end up to this many steps after its last (DP: `n_action_steps - 1`).
        keys: The data keys to read (default all, in the buffer's order).
        episodes: The episodes to sample: a boolean mask over the episodes (DP's `episode_mask`, e.g.
            `~val_mask`) or an index array (default all).
        batch_size: Samples per batch (default 64, as DP's image configs).
    """

    def __init__(self, dataset_or_path: Dataset | str | os.PathLike, sequence_length: int = 16,
                 pad_before: int = 0, pad_after: int = 0, *, keys: list[str] | str | None = None,
                 episodes: np.ndarray | None = None, batch_size: int = 64,
                 **options: Unpack[LoaderOptions]) -> None:
        o = Options.of(options, "SequenceLoader")
        ds = open_dataset(dataset_or_path, o.read)
        steps = ds.schema.step_tables()
        if EPISODES not in ds.tables or not steps:
            raise FormatError(f"{ds.location}: SequenceLoader reads a replay buffer (data/<key> arrays and "
                              f"meta/episode_ends); this is {ds.schema.described()}")
        names = field_names(np.dtype([(k, np.uint8) for k in steps]), keys, "keys")
        seqs = SequenceSamples(ds, names, sequence_length, pad_before, pad_after, episodes)
        self.samples, self.sequence_length = seqs, seqs.S
        g = seqs.group_rows
        selection = seqs.selection()
        config = PlanConfig.of(len(selection) * g, g, batch_size, o.shuffling, o.shard)
        fetch = fetch_options(ds, o.caching)
        source = SequenceSource(ds, seqs, config, selection, _layout(ds, seqs, batch_size),
                                read_worker.DatasetOpener.of(ds, fetch))
        self._start(source, o, o.workers, fetch=fetch, groups=SEQUENCE_GROUPS)

    def indices(self) -> np.ndarray:
        """Every sample's (buffer_start, buffer_end, sample_start, sample_end), as `SequenceSampler.indices`
        holds them, in sample order."""
        return self.samples.indices()
