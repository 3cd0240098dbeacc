"""LeRobot's feature statistics, computed as LeRobot 0.4.4 computes them (`lerobot/datasets/compute_stats.py`,
Apache-2.0, ported with its arithmetic unchanged), so that `meta/stats.json` and the per-episode `stats/...`
columns of a dataset zarrfeed writes hold the values LeRobot's own writer would.

Per episode (`episode_stats`): min, max, mean, std, count and the quantiles q01, q10, q50, q90, q99 of each
feature over its frames, the quantiles read off a histogram of 5000 bins. Camera frames are sampled (at most 100
per episode, evenly spaced; frames larger than 300 pixels a side taken every few pixels), reduced per channel as
uint8 and divided by 255 (shape (3, 1, 1)); the mean of squares is taken of the uint8 values as LeRobot takes
it (wrapping at 256, so its per-episode std of a camera is mostly 0: kept, it is what LeRobot writes). Over
the dataset (`aggregate`): episode by episode, each step the weighted combination of the statistics so far and
the next episode's, as `LeRobotDatasetMetadata.save_episode` does.
"""
from __future__ import annotations

from typing import Any

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
STAT_KEYS = ("min", "max", "mean", "std", "count") + QUANTILE_KEYS
_BINS = 5000

Stats = dict[str, np.ndarray]


class RunningQuantileStats:
    """LeRobot's `RunningQuantileStats` (one batch is all this module gives it): mean, mean of squares, min, max
    and a histogram per vector component."""

    def __init__(self) -> None:
        self.count = 0

    def update(self, batch: np.ndarray) -> None:
        batch = batch.reshape(-1, batch.shape[-1])
        n, width = batch.shape
        if self.count == 0:
            self.mean = np.mean(batch, axis=0)
            self.mean_of_squares = np.mean(batch ** 2, axis=0)
            self.min, self.max = np.min(batch, axis=0), np.max(batch, axis=0)
            self.histograms = [np.zeros(_BINS) for _ in range(width)]
            self.edges = [np.linspace(self.min[i] - 1e-10, self.max[i] + 1e-10, _BINS + 1) for i in range(width)]
        else:  # pragma: no cover - one batch per feature here
            raise NotImplementedError("one batch per statistics object")
        self.count += n
        self.mean += (np.mean(batch, axis=0) - self.mean) * (n / self.count)
        self.mean_of_squares += (np.mean(batch ** 2, axis=0) - self.mean_of_squares) * (n / self.count)
        for i in range(width):
            self.histograms[i] += np.histogram(batch[:, i], bins=self.edges[i])[0]

    def statistics(self) -> Stats:
        variance = self.mean_of_squares - self.mean ** 2
        stats = {"min": self.min.copy(), "max": self.max.copy(), "mean": self.mean.copy(),
                 "std": np.sqrt(np.maximum(0, variance)), "count": np.array([self.count])}
        for q, key in zip(QUANTILES, QUANTILE_KEYS, strict=True):
            stats[key] = np.array([_quantile(h, e, q * self.count)
                                   for h, e in zip(self.histograms, self.edges, strict=True)])
        return stats


def _quantile(hist: np.ndarray, edges: np.ndarray, target: float) -> float:
    cumsum = np.cumsum(hist)
    idx = np.searchsorted(cumsum, target)
    if idx == 0:
        return edges[0]
    if idx >= len(cumsum):
        return edges[-1]
    before = cumsum[idx - 1]
    inside = cumsum[idx] - before
    if inside == 0:
        return edges[idx]
    return edges[idx] + (target - before) / inside * (edges[idx + 1] - edges[idx])


def feature_stats(array: np.ndarray, image: bool) -> Stats:
    """LeRobot's `get_feature_stats` for a camera's sampled frames (N, C, H, W) (`image`: axis (0, 2, 3),
    keepdims) or a column's values (N,) or (N, D) (axis 0, keepdims for 1-D)."""
    if image:
        reshaped, count = array.transpose(0, 2, 3, 1).reshape(-1, array.shape[1]), array.shape[0]
    else:
        reshaped, count = (array.reshape(-1, 1) if array.ndim == 1 else array), array.shape[0]
    if reshaped.shape[0] < 2:
        stats = {"min": np.min(reshaped, axis=0), "max": np.max(reshaped, axis=0),
                 "mean": np.mean(reshaped, axis=0), "std": np.std(reshaped, axis=0), "count": np.array([count])}
        for key in QUANTILE_KEYS:
            stats[key] = stats["mean"].copy()
    else:
        running = RunningQuantileStats()
        running.update(reshaped)
        stats = running.statistics()
        stats["count"] = np.array([count])
    if image:
        return {k: v if k == "count" else v.reshape(1, -1, 1, 1) for k, v in stats.items()}
    if array.ndim == 1:
        return {k: v if k == "count" else (v.reshape(1) if v.ndim > 0 else v) for k, v in stats.items()}
    return stats


def sample_indices(length: int) -> list[int]:
    """LeRobot's `sample_indices`: evenly spaced frames, 100 (or all, if fewer) up to 10,000."""
    n = length if length < 100 else max(100, min(int(length ** 0.75), 10_000))
    return np.round(np.linspace(0, length - 1, n)).astype(int).tolist()


def sampled_frames(frames: np.ndarray) -> np.ndarray:
    """The frames (T, H, W, C) uint8 LeRobot's `sample_images` reads for a camera's statistics, (N, C, H, W)."""
    picked = frames[sample_indices(len(frames))].transpose(0, 3, 1, 2)
    _, height, width = picked.shape[1:]
    if max(width, height) >= 300:
        step = int(width / 150) if width > height else int(height / 150)
        picked = picked[:, :, ::step, ::step]
    return np.ascontiguousarray(picked, dtype=np.uint8)


def episode_stats(columns: dict[str, np.ndarray], cameras: dict[str, np.ndarray]) -> dict[str, Stats]:
    """LeRobot's `compute_episode_stats`, in the order of `columns` then `cameras` as given (callers pass the
    features' order): each column's values as LeRobot holds them in its episode buffer, each camera's frames
    (T, H, W, 3) uint8."""
    out: dict[str, Stats] = {}
    for key, values in {**columns, **cameras}.items():
        if key in cameras:
            stats = feature_stats(sampled_frames(values), image=True)
            out[key] = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in stats.items()}
        else:
            out[key] = feature_stats(values, image=False)
    return out


def aggregate_feature(stats: list[Stats]) -> Stats:
    """LeRobot's `aggregate_feature_stats`: counts add, means and variances combine weighted by counts,
    quantiles as the count-weighted mean of the episodes'."""
    means = np.stack([s["mean"] for s in stats])
    variances = np.stack([s["std"] ** 2 for s in stats])
    counts = np.stack([s["count"] for s in stats])
    total = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    mean = (means * counts).sum(axis=0) / total
    variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
    out = {"min": np.min(np.stack([s["min"] for s in stats]), axis=0),
           "max": np.max(np.stack([s["max"] for s in stats]), axis=0),
           "mean": mean, "std": np.sqrt(variance), "count": total}
    for key in QUANTILE_KEYS:
        out[key] = (np.stack([s[key] for s in stats]) * counts).sum(axis=0) / total
    return out


def aggregate(total: dict[str, Stats] | None, episode: dict[str, Stats]) -> dict[str, Stats]:
    """The dataset's statistics after one more episode, as LeRobot accumulates them."""
    if total is None:
        return episode
    keys = list(total) + [k for k in episode if k not in total]
    return {k: aggregate_feature([s[k] for s in (total, episode) if k in s]) for k in keys}


def as_json(stats: dict[str, Stats]) -> dict[str, dict[str, Any]]:
    """The statistics as `meta/stats.json` holds them (arrays as nested lists)."""
    return {key: {k: np.asarray(v).tolist() for k, v in s.items()} for key, s in stats.items()}


def from_json(doc: dict[str, dict[str, Any]], dtypes: dict[str, dict[str, str]]) -> dict[str, Stats]:
    """Statistics read back from `as_json` with their dtypes (`dtypes[key][stat]`), exact: a resumed
    conversion aggregates on from them as if it had never stopped."""
    return {key: {k: np.asarray(v, dtype=dtypes[key][k]) for k, v in s.items()} for key, s in doc.items()}


def dtypes_of(stats: dict[str, Stats]) -> dict[str, dict[str, str]]:
    """The dtype of each statistic, for `from_json`."""
    return {key: {k: np.asarray(v).dtype.str for k, v in s.items()} for key, s in stats.items()}
