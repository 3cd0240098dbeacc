"""L5Kit's agents mask: per agent row, how many consecutive valid frames its track has before and after it.

`AgentDataset` samples the agent rows with at least 10 valid past and 1 valid future frames by this mask. It is
`l5kit.dataset.select_agents.get_valid_agents` (its thresholds: label probability, yaw change, extent ratio,
distance to the AV), computed here with arrays over whole scenes instead of a Python loop per agent, by
processes over parts of the dataset, and equal to L5Kit's (a test holds it to L5Kit's mask of the real scene).

It is stored where L5Kit looks for it, `agents_mask/<threshold>` in the dataset (uint32 (agents, 2), chunks of
10,000 rows, as L5Kit's `select_agents` writes it), so L5Kit reads it too. Its attributes record the dataset
commit it was computed from; `load` refuses (None, with the reason) a mask of another commit, another copy or
other thresholds, and one without that record on a dataset that has commits, so a stale mask is never read
as current. The tables and the commit manifest are not touched: the dataset's commit identity stays as it was.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import numcodecs
import xxhash

from ...core import dataset_format
from ...core._proc.pool import Failed, WorkerPool, describe_exit, preload_in_workers
from ...core.errors import WorkerError
from ...core.chunk_check import ChunkCheck
from ...core.refusals import refusal
from ...core.location import Location
from ...core.v3_codecs import CodecChain
from ...core.v3_meta import ArrayMetaV3
from ...core.zarr_array import Array, Meta
from ...core.zarr_meta import ArrayMeta
from ..dataset import Dataset

preload_in_workers(__name__)  # see zarrfeed.core._proc.pool

# l5kit.data.filter.PERCEPTION_LABEL_INDICES_TO_KEEP: car, van, tram, bus, truck, emergency vehicle, other vehicle,
# bicycle, motorcycle, cyclist, motorcyclist, pedestrian, animal (indices into L5Kit's 17 perception labels)
LABELS_KEPT = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
GROUP = "agents_mask"
CHUNK_ROWS = 10_000  # as L5Kit's select_agents writes it
RECORD = "zarrfeed"


@dataclass(frozen=True)
class Thresholds:
    """`get_valid_agents`' thresholds (L5Kit's defaults): an agent row is valid when its label probability
    (summed over the kept labels) is above `label`, it is within `distance_av` m of the AV, and against its
    track's previous valid row, one frame before, its yaw changed by less than `yaw_degrees` and its area by a
    ratio below `extent_ratio`."""

    label: float = 0.5
    yaw_degrees: float = 30.0
    extent_ratio: float = 1.1
    distance_av: float = 50.0

    def __post_init__(self) -> None:
        for name, value, lo, hi in (("threshold", self.label, 0.0, 1.0), ("yaw_degrees", self.yaw_degrees, 0.0, 360.0),
                                    ("extent_ratio", self.extent_ratio, 1.0, math.inf),
                                    ("distance_av", self.distance_av, 0.0, math.inf)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value < hi:
                raise ValueError(f"agents mask: {name} must be a number in [{lo}, {hi}), got {value!r}")

    @property
    def name(self) -> str:
        """The mask's array name under agents_mask/ (L5Kit: `str(threshold)`)."""
        return str(float(self.label))


def of_interest(label_probabilities: np.ndarray, threshold: float) -> np.ndarray:
    """L5Kit's label filter (`filter_agents_by_labels`): the rows whose probability summed over the kept labels
    is above `threshold`."""
    return np.sum(label_probabilities[:, LABELS_KEPT], axis=1) > threshold


def valid_agents(frames: np.ndarray, agents: np.ndarray, scenes: np.ndarray, a0: int,
                 th: Thresholds) -> np.ndarray:
    """The mask (uint32 (agents, 2): past, future) of `agents` (rows [a0, a0 + len)), owned by `frames`, which
    are the frames of `scenes` (their frame_index_interval, global). As `get_valid_agents` per scene: tracks
    are the scene's, a row failing a point-wise test (label, distance) gets (0, 0) and ends its track's run, a
    pair failing a couple-wise test (a hole, yaw, extent) ends the run before the row and starts one at it."""
    n = len(agents)
    mask = np.zeros((n, 2), np.uint32)
    if n == 0:
        return mask
    iv = frames["agent_index_interval"]
    f0 = int(scenes[0, 0])
    frame = np.searchsorted(iv[:, 1], np.arange(a0, a0 + n), side="right")  # local frame of each row
    scene = np.searchsorted(scenes[:, 1] - f0, frame, side="right")
    interesting = of_interest(agents["label_probabilities"], th.label)
    d = frames["ego_translation"][frame, :2] - agents["centroid"]
    near = np.sqrt(d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) < th.distance_av
    point = interesting & near
    _, code = np.unique(agents["track_id"], return_inverse=True)
    order = np.argsort(scene.astype(np.int64) * (int(code.max()) + 1) + code.reshape(-1), kind="stable")
    s_scene, s_code, s_frame, s_point = scene[order], code.reshape(-1)[order], frame[order], point[order]
    yaw, ext = agents["yaw"][order], agents["extent"][order]
    same = np.zeros(n, bool)
    same[1:] = (s_scene[1:] == s_scene[:-1]) & (s_code[1:] == s_code[:-1])
    couple = np.zeros(n, bool)
    # L5Kit compares NumPy float32 scalars with Python floats; under NumPy 1.x (which L5Kit 1.5.0 needs) that
    # promotes to float64: the yaw difference is float32, the wrap and the comparisons are float64
    dyaw = (yaw[1:] - yaw[:-1]).astype(np.float64)
    yaw_ok = np.abs((dyaw + np.pi) % (2 * np.pi) - np.pi) * 180 / np.pi < th.yaw_degrees
    area = (ext[:, 0] * ext[:, 1]).astype(np.float64)
    a1, a2 = area[:-1], area[1:]  # the previous row's, this row's
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(a1 > a2, (ext[:-1, 0] * ext[:-1, 1]) / (ext[1:, 0] * ext[1:, 1]),
                         (ext[1:, 0] * ext[1:, 1]) / (ext[:-1, 0] * ext[:-1, 1])).astype(np.float64)
    extent_ok = (a1 >= 0.01) & (a2 >= 0.01) & (ratio < th.extent_ratio)
    couple[1:] = (s_frame[1:] == s_frame[:-1] + 1) & yaw_ok & extent_ok
    prev_point = np.zeros(n, bool)
    prev_point[1:] = s_point[:-1]
    starts = s_point & ~(same & prev_point & couple)  # a run of valid rows begins here
    run = np.cumsum(starts) - 1
    valid = np.flatnonzero(s_point)
    first = np.flatnonzero(starts)
    length = np.bincount(run[valid], minlength=len(first))
    past = valid - first[run[valid]]
    out = np.zeros((n, 2), np.int64)
    out[valid, 0] = past
    out[valid, 1] = length[run[valid]] - past - 1
    mask[order] = out.astype(np.uint32)
    return mask


def _part(location: Location, commit: int | None, check: ChunkCheck | None, scenes: tuple[int, int],
          th: Thresholds) -> tuple[int, np.ndarray]:
    """The mask of scenes [first, last) of the dataset at `location` (chunks checked by the parent's `check`):
    (its first agent row, the mask)."""
    ds = Dataset.reopen(location, commit, check)
    sc = ds.read_rows("scenes", scenes[0], scenes[1], fields=["frame_index_interval"])["frame_index_interval"]
    f0, f1 = int(sc[0, 0]), int(sc[-1, 1])
    frames = ds.read_rows("frames", f0, f1, fields=["agent_index_interval", "ego_translation"])
    a0, a1 = (int(frames["agent_index_interval"][0, 0]), int(frames["agent_index_interval"][-1, 1])) if f1 > f0 \
        else (0, 0)
    agents = ds.read_rows("agents", a0, a1, fields=["centroid", "extent", "yaw", "track_id", "label_probabilities"])
    return a0, valid_agents(frames, agents, sc, a0, th)


def compute(ds: Dataset, threshold: float = 0.5, *, workers: int | None = None,
            thresholds: Thresholds | None = None, progress: Callable[[int], object] | None = None) -> np.ndarray:
    """L5Kit's agents mask of `ds`'s committed agents (uint32 (agents, 2)), computed by `workers` processes
    (default: the cores this process may use; 0: in this process) over parts of whole scenes. `progress`, if
    given, is called with the number of scenes of each part as it finishes (a progress bar's `update`)."""
    th = thresholds or Thresholds(label=threshold)
    n_scenes, n_agents = ds.rows["scenes"], ds.rows["agents"]
    mask = np.zeros((n_agents, 2), np.uint32)
    if n_scenes == 0 or n_agents == 0:
        return mask
    workers = len(os.sched_getaffinity(0)) if workers is None else workers
    per = max(1, -(-n_scenes // max(4 * workers, 1)))
    parts = [(s, min(s + per, n_scenes)) for s in range(0, n_scenes, per)]
    done = progress or (lambda scenes: None)
    if workers <= 1 or len(parts) == 1:
        results = []
        for p in parts:
            results.append(_part(ds.location, ds.commit, ds.check, p, th))
            done(p[1] - p[0])
    else:
        results = _in_workers(ds, parts, th, min(workers, len(parts)), done)
    for a0, part in results:
        mask[a0:a0 + len(part)] = part
    return mask


def _part_setup(wid: int, location: Location, commit: int | None, check: ChunkCheck | None,
                th: Thresholds) -> Callable:
    """A mask worker's handler: scenes (first, last) -> (worker, first agent row, mask)."""
    return lambda scenes: (wid, *_part(location, commit, check, scenes, th))


def _in_workers(ds: Dataset, parts: list[tuple[int, int]], th: Thresholds, n: int,
                done: Callable[[int], object]) -> list[tuple[int, np.ndarray]]:
    """The parts' masks, computed by `n` worker processes of zarrfeed's pool (a Ctrl+C, a dead worker and a
    worker's exception behave as in every other pool of zarrfeed: the worker's exception is raised here)."""
    todo = list(parts)
    sent: dict[int, tuple[int, int]] = {}  # worker -> the part it computes
    results: list[tuple[int, np.ndarray]] = []
    pool = WorkerPool(n, _part_setup, (ds.location, ds.commit, ds.check, th), "agents mask worker")
    try:
        for wid in range(n):
            sent[wid] = todo.pop()
            pool.send(wid, sent[wid])
        while len(results) < len(parts):
            for reply in pool.poll(1.0):
                if isinstance(reply, Failed):
                    if reply.error.exc is not None:
                        raise reply.error.exc
                    raise WorkerError(f"agents mask worker {reply.worker} failed on scenes {reply.message}: "
                                      f"{reply.error}", reply.error)
                wid, a0, part = reply
                results.append((a0, part))
                done(sent[wid][1] - sent[wid][0])
                if todo:
                    sent[wid] = todo.pop()
                    pool.send(wid, sent[wid])
            if pool.dead():
                raise WorkerError(describe_exit("agents mask worker", *pool.dead()[0]) + " computing the mask")
    finally:
        pool.stop()
    return results


def _record(ds: Dataset, th: Thresholds) -> dict[str, Any]:
    return {"dataset_id": ds.dataset_id, "commit": ds.commit, "commit_tag": ds.commit_tag,
            "agents": ds.rows["agents"], "thresholds": asdict(th)}


def _digest(mask: np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(mask, np.uint32).tobytes())


def save(ds: Dataset, mask: np.ndarray, threshold: float = 0.5, *, thresholds: Thresholds | None = None) -> str:
    """Store `mask` at agents_mask/<threshold> in the dataset (replacing one there), with the commit it belongs
    to and a digest of its values; returns the array's path. The tables and the manifest are left as they are.

    Never read half-written: the old array goes first; the new one is made with a record that says it is not
    finished (written before the array exists, so no moment shows an array without a record, which `load`
    would take for one written by L5Kit), then its values, then its full record."""
    th = thresholds or Thresholds(label=threshold)
    if mask.shape != (ds.rows["agents"], 2):
        raise ValueError(f"agents mask of shape {mask.shape}; the dataset has {ds.rows['agents']} agents")
    check_writable(ds)
    try:
        return _store(ds, mask, th)
    except OSError as exc:
        why = refusal(exc, ds.location) or _reason(exc)
        raise ValueError(f"{ds.location}: the agents mask cannot be stored in it ({why})") from None


def check_writable(ds: Dataset) -> None:
    """Refuse, in one line, a dataset the mask cannot be stored in, before anything is computed or changed: a
    .zip, or a local directory this process may not write (a read-only mount, even for root)."""
    why = ds.location.unwritable(GROUP)
    if why and why == ds.location.settings.read_only:
        raise ValueError(f"{ds.location}: {why}; the mask cannot be stored in it")
    if why:
        raise ValueError(f"{ds.location}: the agents mask cannot be stored in it ({why})")


def _reason(exc: OSError) -> str:
    """What an error of the store that is no refusal (see `refusals`) says: the OSError's own words and the file."""
    return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")


def _store(ds: Dataset, mask: np.ndarray, th: Thresholds) -> str:
    group = dataset_format.open_group(ds.location, "a")
    group.require_group(GROUP)
    path = f"{GROUP}/{th.name}"
    group.store.rmdir(path)
    # zarr 2's defaults for a new array (Blosc lz4, fill 0), as L5Kit's masks are stored; in a v3 dataset a v3
    # array of those codecs (a v2 array in a v3 group is not a member of it for zarr-python 3)
    blosc, dtype = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE), np.dtype(np.uint32)
    meta: Meta = ArrayMetaV3.new(mask.shape, CHUNK_ROWS, dtype, CodecChain.default(
        dtype, (CHUNK_ROWS, *mask.shape[1:]), blosc), fill_value=0) if group.zarr_format == 3 else ArrayMeta.new(
        mask.shape, CHUNK_ROWS, dtype, blosc, fill_value=0, dimension_separator=".")
    arr = group.create_array(path, meta, attrs={RECORD: {"complete": False}})
    arr[:] = mask
    arr.attrs[RECORD] = {**_record(ds, th), "complete": True, "digest": _digest(mask)}
    return path


def load(ds: Dataset, threshold: float = 0.5, *, thresholds: Thresholds | None = None) -> tuple[np.ndarray | None, str]:
    """The stored mask for these thresholds if it belongs to `ds`'s commit and its values are those recorded,
    else None; and why (one line)."""
    th = thresholds or Thresholds(label=threshold)
    where = f"{GROUP}/{th.name}"
    try:
        arr = ds.group[where]
    except KeyError:
        return None, f"no {where} in the dataset"
    if not isinstance(arr, Array) or arr.shape != (ds.rows["agents"], 2):
        return None, (f"{where} has shape {getattr(arr, 'shape', None)}; the dataset has {ds.rows['agents']} agents "
                      "(run `zarrfeed mask` again)")
    record = arr.attrs.get(RECORD)
    if record is None:
        if ds.commit is not None:  # a dataset with commits: a mask with no record may be of any of them
            return None, f"{where} does not say which commit it was computed from (written by another tool)"
        if th != Thresholds(label=th.label):
            return None, f"{where} does not say its thresholds; asked for {asdict(th)}"
        if arr.nchunks_initialized != arr.nchunks:  # zarr would read a missing chunk as zeros
            return None, f"{where} lacks {arr.nchunks - arr.nchunks_initialized} of its {arr.nchunks} chunks"
        values, why = _read(arr, where)
        return values, why or f"{where} (no record; the dataset has no commits and its rows match)"
    if not record.get("complete"):
        return None, f"{where} was not finished (its writer stopped)"
    want = _record(ds, th)
    for key in ("dataset_id", "commit", "commit_tag", "agents", "thresholds"):
        if record.get(key) != want[key]:
            return None, (f"{where} was computed for {key}={record.get(key)!r}; this dataset has {want[key]!r} "
                          "(run `zarrfeed mask` again)")
    values, why = _read(arr, where)
    if values is not None and _digest(values) != record.get("digest"):
        return None, f"{where} does not hold the values recorded with it (a chunk lost or rewritten)"
    return values, why or where


def _read(arr: Array, where: str) -> tuple[np.ndarray | None, str]:
    """The array's values, or None and why (a chunk that cannot be read or decoded)."""
    try:
        return np.asarray(arr[:], np.uint32), ""
    except Exception as exc:  # a truncated or corrupt chunk: blosc, zlib, OSError ...
        return None, f"{where} cannot be read ({type(exc).__name__}: {exc})"


def selected_rows(mask: np.ndarray, min_history: int = 10, min_future: int = 1) -> np.ndarray:
    """The agent rows `AgentDataset` samples: at least `min_history` valid past and `min_future` future frames."""
    return np.flatnonzero((mask[:, 0] >= min_history) & (mask[:, 1] >= min_future))
