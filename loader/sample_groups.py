"""Samples grouped by the chunk they read, as the epoch plan sees them.

A loader of samples (L5Kit windows, Diffusion Policy sequences) hands the plan its samples as groups, each of
which reads a few chunks: group g is a plan "chunk" of `group_rows` rows whose first `sizes[g]` are samples.
The plan shuffles groups as it shuffles chunks (windows of `shuffle_window` groups) and the samples within
each window, so the chunks a window reads are decoded once into the shared cache and every sample of the
window is gathered from there.
"""
from __future__ import annotations

import numpy as np

from .plan import EpochPlan


class GroupedSamples:
    """Samples 0..n-1 cut into groups of consecutive samples with the same `key` (the chunk they start in);
    `reads[g]`: the (table, chunk) group g reads, filled in by the loader that groups them."""

    def __init__(self, key: np.ndarray) -> None:
        key = np.asarray(key, np.int64)
        cuts = np.flatnonzero(np.diff(key)) + 1
        self.group_start = np.concatenate([[0], cuts]).astype(np.int64) if len(key) else np.zeros(0, np.int64)
        self.group_end = np.concatenate([cuts, [len(key)]]).astype(np.int64) if len(key) else self.group_start
        self.sizes = self.group_end - self.group_start
        self.group_rows = int(self.sizes.max(initial=1))
        self.reads: list[list[tuple[str, int]]] = []

    def selection(self) -> list[np.ndarray]:
        """The plan's view: group g is a 'chunk' of `group_rows` rows whose first `sizes[g]` are samples."""
        return [np.arange(n) for n in self.sizes.tolist()]

    def sample_ids(self, plan: EpochPlan, pieces: list[tuple[int, int, int]],
                   orders: dict[int, np.ndarray]) -> np.ndarray:
        """Sample indices of plan pieces (window, first, count), in batch order (`orders` caches each window's
        shuffled order)."""
        return self.sample_groups(plan, pieces, orders)[0]

    def sample_groups(self, plan: EpochPlan, pieces: list[tuple[int, int, int]],
                      orders: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """`sample_ids`, and the group of each."""
        ids, groups = [], []
        for w, pos, n in pieces:
            if w not in orders:
                orders[w] = plan.window_order(w)
            local = orders[w][pos:pos + n]
            g = plan.windows[w][local // self.group_rows]
            ids.append(self.group_start[g] + local % self.group_rows)
            groups.append(g)
        if not ids:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(ids), np.concatenate(groups)
