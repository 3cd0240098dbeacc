"""L5Kit's motion-prediction samples, computed as L5Kit 1.5.0 computes them, vectorised over many samples.

One sample is an agent row (or, for the ego, a frame) at its frame t: its pose at t, and its poses at the
`history` frames before and `future` frames after, in its own frame of reference, with availabilities (0 where
the frame is outside the scene or, for an agent, where its track is absent from that frame). The numerics
follow `l5kit.sampling.agent_sampling.generate_agent_sample` step by step (`get_relative_poses`,
`compute_agent_velocity`, `compute_agent_pose`, `angular_distance`, `rotation33_as_yaw`), in the same dtypes,
so the fields equal L5Kit's (tests hold them to what L5Kit returns on the real scene). Only the order of the
work differs: each step runs on arrays of shape (samples, frames) instead of a Python loop per frame.

`Context` holds the columns of a span of frames and of their agents, with an index of (frame, track id) ->
first agent row, which is how L5Kit finds a track in a frame (`filter_agents_by_track_id(...)[0]`).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

EGO_EXTENT = (4.87, 1.85, 1.8)  # l5kit.rasterization.rasterizer: EGO_EXTENT_LENGTH, _WIDTH, _HEIGHT
_EPS4 = np.finfo(float).eps * 4.0  # transforms3d.euler.mat2euler's threshold for a degenerate rotation
FRAME_FIELDS = ("timestamp", "agent_index_interval", "ego_translation", "ego_rotation")
AGENT_FIELDS = ("centroid", "yaw", "extent", "track_id")


@dataclass(frozen=True)
class Steps:
    """How many frames of history and future a sample holds, and the seconds between two frames (L5Kit's
    `history_num_frames`, `future_num_frames`, `step_time`)."""

    history: int = 10
    future: int = 50
    step_time: float = 0.1

    def __post_init__(self) -> None:
        if self.history < 0 or self.future < 0:
            raise ValueError(f"history and future must be >= 0, got {self.history} and {self.future}")
        if not self.step_time > np.finfo(float).eps:
            raise ValueError(f"step_time must be > 0, got {self.step_time}")

    @property
    def T(self) -> int:
        return self.history + 1 + self.future


class Context:
    """Frames [f0, f0 + len) and agents [a0, a0 + len) of a dataset as columns (global rows minus f0 / a0),
    and the sorted (frame, track id) keys of those agents. The agents must be exactly those of the frames."""

    def __init__(self, f0: int, frames: dict[str, np.ndarray], a0: int, agents: dict[str, np.ndarray]) -> None:
        self.f0, self.a0 = f0, a0
        self.frames, self.agents = frames, agents
        iv = frames["agent_index_interval"]
        n = len(agents["track_id"])
        if len(iv) and (iv[0, 0] != a0 or iv[-1, 1] != a0 + n):
            raise ValueError(f"context: frames {f0}.. own agents [{iv[0, 0]}, {iv[-1, 1]}), given [{a0}, {a0 + n})")
        frame_of = np.searchsorted(iv[:, 1], np.arange(a0, a0 + n), side="right")  # each agent's frame (local)
        self.tracks, code = np.unique(agents["track_id"], return_inverse=True)
        self.keys = frame_of.astype(np.int64) * max(len(self.tracks), 1) + code.reshape(-1)
        self.order = np.argsort(self.keys, kind="stable")  # equal keys keep row order: the first row first
        self.sorted = self.keys[self.order]
        # the same index over the rows that pass the label threshold (`agents["passing"]`, if given)
        passing = agents.get("passing")
        if passing is None:
            self.passing_order, self.passing_sorted = self.order, self.sorted
        else:
            rows = np.flatnonzero(passing)
            self.passing_order = rows[np.argsort(self.keys[rows], kind="stable")]
            self.passing_sorted = self.keys[self.passing_order]

    def find(self, frames: np.ndarray, track_ids: np.ndarray, passing: bool = False) -> np.ndarray:
        """For global frames (B, T) and track ids (B,): the first agent row (local) of that track in each frame
        (among the rows passing the label threshold, with `passing`), or -1 where it is absent (or the frame is
        outside the context)."""
        order, ordered = (self.passing_order, self.passing_sorted) if passing else (self.order, self.sorted)
        code = np.searchsorted(self.tracks, track_ids)
        code = np.minimum(code, max(len(self.tracks) - 1, 0))
        known = (self.tracks[code] == track_ids) if len(self.tracks) else np.zeros(len(track_ids), bool)
        local = frames - self.f0
        inside = (local >= 0) & (local < len(self.frames["timestamp"]))
        keys = local * max(len(self.tracks), 1) + code[:, None]
        at = np.minimum(np.searchsorted(ordered, keys), max(len(ordered) - 1, 0))
        found = inside & known[:, None] & (ordered[at] == keys) if len(ordered) else inside & False
        return np.where(found, order[at] if len(order) else 0, -1)


def _window(t: np.ndarray, scene_lo: np.ndarray, scene_hi: np.ndarray, steps: Steps) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's T frames t - history .. t + future (B, T), and whether each lies in the sample's scene."""
    frames = t[:, None] + np.arange(-steps.history, steps.future + 1)
    return frames, (frames >= scene_lo[:, None]) & (frames < scene_hi[:, None])


def _yaw_of_rotation(rot: np.ndarray) -> np.ndarray:
    """transforms3d's mat2euler(rot)[2] (axes 'sxyz'), which is L5Kit's `rotation33_as_yaw`."""
    cy = np.sqrt(rot[..., 0, 0] * rot[..., 0, 0] + rot[..., 1, 0] * rot[..., 1, 0])
    return np.where(cy > _EPS4, np.arctan2(rot[..., 1, 0], rot[..., 0, 0]), 0.0)


def _relative(steps: Steps, pos: np.ndarray, yaw: np.ndarray, ext: np.ndarray, avail: np.ndarray,
              centroid: np.ndarray, cur_yaw: np.ndarray) -> dict[str, np.ndarray]:
    """L5Kit's `get_relative_poses` for history and future, `compute_agent_pose` and `compute_agent_velocity`,
    from each sample's window (B, T) of world poses: pos float64 (B, T, 2), yaw float32 (B, T), ext float32
    (B, T, 2), avail bool (B, T); its pose at t: centroid float64 (B, 2), cur_yaw float64 (B,)."""
    h = steps.history
    c, s = np.cos(cur_yaw), np.sin(cur_yaw)
    world_from_agent = np.zeros((len(cur_yaw), 3, 3))
    world_from_agent[:, 0, 0], world_from_agent[:, 0, 1], world_from_agent[:, 0, 2] = c, -s, centroid[:, 0]
    world_from_agent[:, 1, 0], world_from_agent[:, 1, 1], world_from_agent[:, 1, 2] = s, c, centroid[:, 1]
    world_from_agent[:, 2, 2] = 1
    agent_from_world = np.linalg.inv(world_from_agent) if len(cur_yaw) else world_from_agent.copy()
    a = np.where(avail, np.float32(1), np.float32(0))  # L5Kit's availabilities: float32 0/1
    pos = np.where(avail[..., None], pos, 0.0)  # absent frames are 0 before the transform, as in L5Kit
    m = np.transpose(agent_from_world, (0, 2, 1))
    local = (pos @ m[:, :2, :2] + m[:, -1:, :2]) * a[..., None]  # transform_points, then * availabilities
    local = local.astype(np.float32)
    y32 = np.where(avail, yaw, np.float32(0)).astype(np.float32)
    rel = ((y32 - cur_yaw.astype(np.float32)[:, None] + np.float32(np.pi)) % np.float32(2 * np.pi)
           - np.float32(np.pi)) * a  # angular_distance in float32, * availabilities
    ext = np.where(avail[..., None], ext, np.float32(0)).astype(np.float32)
    hist, fut = slice(h, None, -1) if h else slice(h, h + 1), slice(h + 1, None)  # history: t, t-1, .., t-h
    hist_pos = local[:, hist]
    fut_pos = local[:, fut]
    dt = np.float32(steps.step_time)
    out = {
        "target_positions": fut_pos,
        "target_yaws": rel[:, fut, None],
        "target_velocities": np.concatenate((fut_pos[:, :1], np.diff(fut_pos, axis=1)), axis=1) / dt,
        "target_availabilities": a[:, fut],
        "history_positions": hist_pos,
        "history_yaws": rel[:, hist, None],
        "history_velocities": -np.diff(hist_pos, axis=1) / dt,
        "history_availabilities": a[:, hist],
        "agent_from_world": agent_from_world,
        "world_from_agent": world_from_agent,
        "centroid": centroid,
        "yaw": cur_yaw,
        "history_extents": ext[:, hist],
        "future_extents": ext[:, fut],
    }
    if h:  # L5Kit has no curr_speed without history
        v = out["history_velocities"][:, 0]
        out["curr_speed"] = np.sqrt(v[:, 0] * v[:, 0] + v[:, 1] * v[:, 1])
    return out


def _about(ctx: Context, t: np.ndarray, scene: np.ndarray, scene_lo: np.ndarray) -> dict[str, np.ndarray]:
    return {"frame_index": t - scene_lo, "scene_index": scene.astype(np.int64), "frame_row": t.astype(np.int64),
            "timestamp": ctx.frames["timestamp"][t - ctx.f0].astype(np.int64)}


def ego_samples(ctx: Context, t: np.ndarray, scene: np.ndarray, scene_lo: np.ndarray, scene_hi: np.ndarray,
                steps: Steps) -> dict[str, np.ndarray]:
    """The ego's samples at frames t (B,) of scenes `scene` spanning frames [scene_lo, scene_hi): L5Kit's
    `generate_agent_sample` with `selected_track_id=None` (EgoDataset), without the raster."""
    frames, avail = _window(t, scene_lo, scene_hi, steps)
    local = np.clip(frames - ctx.f0, 0, max(len(ctx.frames["timestamp"]) - 1, 0))
    pos = ctx.frames["ego_translation"][local][..., :2]
    yaw = _yaw_of_rotation(ctx.frames["ego_rotation"][local]).astype(np.float32)
    ext = np.broadcast_to(np.array(EGO_EXTENT[:2], np.float32), (*frames.shape, 2))
    now = t - ctx.f0
    cur_yaw = _yaw_of_rotation(ctx.frames["ego_rotation"][now])
    out = _relative(steps, pos, yaw, ext, avail, ctx.frames["ego_translation"][now][:, :2].copy(), cur_yaw)
    out["extent"] = np.broadcast_to(np.array(EGO_EXTENT, np.float64), (len(t), 3)).copy()
    return {**out, **_about(ctx, t, scene, scene_lo), "track_id": np.full(len(t), -1, np.int64),
            "agent_row": np.full(len(t), -1, np.int64)}


def agent_samples(ctx: Context, rows: np.ndarray, t: np.ndarray, scene: np.ndarray, scene_lo: np.ndarray,
                  scene_hi: np.ndarray, steps: Steps) -> dict[str, np.ndarray]:
    """The samples of agent rows `rows` (B,, global) at their frames t (B,) of scenes `scene` spanning frames
    [scene_lo, scene_hi): L5Kit's `generate_agent_sample` with the row's track id (AgentDataset), without the
    raster. As in L5Kit, the pose at t is the first row of the track in frame t that passes the label threshold
    (the row itself unless its frame holds the track twice; the row itself if none passes, where L5Kit raises);
    each frame of the window holds the first row of its track."""
    track = ctx.agents["track_id"][rows - ctx.a0]
    centre = ctx.find(t[:, None], track, passing=True)[:, 0]
    me = np.where(centre >= 0, centre, rows - ctx.a0)
    frames, avail = _window(t, scene_lo, scene_hi, steps)
    found = ctx.find(frames, track)
    avail &= found >= 0
    at = np.maximum(found, 0)
    pos = ctx.agents["centroid"][at]
    yaw = ctx.agents["yaw"][at]
    ext = ctx.agents["extent"][at][..., :2]
    cur_yaw = ctx.agents["yaw"][me].astype(np.float64)  # float(agent["yaw"])
    out = _relative(steps, pos, yaw, ext, avail, ctx.agents["centroid"][me].copy(), cur_yaw)
    out["extent"] = ctx.agents["extent"][me].copy()
    return {**out, **_about(ctx, t, scene, scene_lo), "track_id": track.astype(np.int64),
            "agent_row": rows.astype(np.int64)}


class AgentPool:
    """The agents of many groups of samples (one group per agents chunk) in one set of arrays, so that a batch
    of agent samples drawn from any number of groups is computed in one vectorised pass (`samples`).

    Why: the stratified order puts every group of a window in proportion into each batch, and computing a batch group
    by group costs a call per group: with the whole table as the window, several times slower than with windows of 4
    groups (bench/bench_windows.py measures the sample loaders). Each group's (frame, track) index is one sorted run
    of a single key array: its keys (local frame x tracks + track code, below 2**40) prefixed by the group's insertion
    number, so runs appended in insertion order keep the array sorted and one `searchsorted` finds every sample's
    track in every frame of its window. Per sample, what does not change (its track, its track's code, its row at t,
    its frame's timestamp) is computed once, when its group is added. Groups are dropped least recently used beyond
    `capacity` agent rows (48 bytes each)."""

    SHIFT = 40
    ROW_BYTES = 48  # a key, its row in its run, centroid (2 x f8), yaw (f4), extent (3 x f4)

    def __init__(self, n_groups: int, n_samples: int, capacity: int) -> None:
        self.capacity = max(int(capacity), 1)
        self.size, self.next_seq = 0, 0
        self.keys: np.ndarray  # the groups' runs of sorted (frame, track) keys, and each key's agent row in its run
        self.order: np.ndarray
        self.centroid: np.ndarray  # the agents' columns, each group's run in row order
        self.yaw: np.ndarray
        self.extent: np.ndarray
        self._columns(self.capacity)
        self.start = np.full(n_groups, -1, np.int64)  # the group's run, -1 while not held
        self.count = np.zeros(n_groups, np.int64)
        self.seq = np.zeros(n_groups, np.int64)
        self.tracks = np.ones(n_groups, np.int64)
        self.f0 = np.zeros(n_groups, np.int64)
        self.frames = np.zeros(n_groups, np.int64)
        self.code = np.zeros(n_samples, np.int64)  # per sample: its track's code in its group
        self.me = np.zeros(n_samples, np.int64)  # its agent row at t, in its group's run
        self.track = np.zeros(n_samples, np.int64)
        self.timestamp = np.zeros(n_samples, np.int64)
        self.used: OrderedDict[int, None] = OrderedDict()  # held groups, least recently used first

    def _columns(self, n: int) -> None:
        """The pooled arrays with room for `n` rows, the rows held so far kept."""
        m = self.size
        for name, shape, dtype in (("keys", (), np.int64), ("order", (), np.int64), ("centroid", (2,), np.float64),
                                   ("yaw", (), np.float32), ("extent", (3,), np.float32)):
            grown = np.zeros((n, *shape), dtype)
            if m:
                grown[:m] = getattr(self, name)[:m]
            setattr(self, name, grown)

    def holds(self, g: int) -> bool:
        if self.start[g] < 0:
            return False
        self.used.move_to_end(g)
        return True

    def add(self, g: int, ctx: Context, ids: np.ndarray, rows: np.ndarray, t: np.ndarray,
            keep: set[int]) -> None:
        """Hold group `g` from its context; `ids`: its samples, at agent `rows` (global) and frames `t`. Groups
        in `keep` (the batch's) are not dropped to make room."""
        n, n_frames, n_tracks = len(ctx.keys), len(ctx.frames["timestamp"]), max(len(ctx.tracks), 1)
        if n_frames * n_tracks >= 1 << self.SHIFT:
            raise ValueError(f"agent samples: a group of {n_frames} frames and {n_tracks} tracks is too large")
        if self.next_seq >= 1 << (62 - self.SHIFT):  # insertion numbers run out: the held runs renumbered
            self._renumber()
        self._room(n, keep)
        track = ctx.agents["track_id"][rows - ctx.a0]
        centre = ctx.find(t[:, None], track, passing=True)[:, 0]
        self.code[ids] = np.searchsorted(ctx.tracks, track)
        self.me[ids] = np.where(centre >= 0, centre, rows - ctx.a0)
        self.track[ids] = track.astype(np.int64)
        self.timestamp[ids] = ctx.frames["timestamp"][t - ctx.f0]
        a, b = self.size, self.size + n
        self.keys[a:b] = (self.next_seq << self.SHIFT) | ctx.sorted
        self.order[a:b] = ctx.order
        self.centroid[a:b], self.yaw[a:b] = ctx.agents["centroid"], ctx.agents["yaw"]
        self.extent[a:b] = ctx.agents["extent"]
        self.start[g], self.count[g], self.seq[g] = a, n, self.next_seq
        self.tracks[g], self.f0[g], self.frames[g] = n_tracks, ctx.f0, n_frames
        self.size, self.next_seq = b, self.next_seq + 1
        self.used[g] = None

    def _renumber(self) -> None:
        """The held groups' insertion numbers made 0, 1, ... in the order of their runs (which is the order of
        their numbers), their keys' prefixes with them: the key array stays sorted."""
        low = (1 << self.SHIFT) - 1
        held = sorted(self.used, key=lambda g: int(self.start[g]))
        for new, g in enumerate(held):
            a, b = int(self.start[g]), int(self.start[g] + self.count[g])
            self.keys[a:b] = (new << self.SHIFT) | (self.keys[a:b] & low)
            self.seq[g] = new
        self.next_seq = len(held)

    def _room(self, n: int, keep: set[int]) -> None:
        """Room for `n` more rows: groups dropped (least recently used first, not those in `keep`) down to
        three quarters of the capacity, the rest moved together in order; the arrays grown if that is not
        enough (a batch's groups are all held however many rows they have)."""
        if self.size + n <= self.capacity:
            return
        dropped = []
        for g in list(self.used):
            if self.size + n <= self.capacity * 3 // 4:
                break
            if g not in keep:
                dropped.append(g)
                self.size -= int(self.count[g])
                del self.used[g]
        if dropped:
            self.start[dropped] = -1
            held = sorted(self.used, key=lambda g: int(self.start[g]))
            runs = [np.arange(self.start[g], self.start[g] + self.count[g]) for g in held]
            at = np.concatenate(runs) if runs else np.zeros(0, np.int64)
            m = len(at)
            self.keys[:m], self.order[:m], self.centroid[:m] = self.keys[at], self.order[at], self.centroid[at]
            self.yaw[:m], self.extent[:m] = self.yaw[at], self.extent[at]
            start = 0
            for g in held:
                self.start[g], start = start, start + int(self.count[g])
        if self.size + n > len(self.keys):
            self._columns(max(2 * len(self.keys), self.size + n))

    def samples(self, ids: np.ndarray, groups: np.ndarray, rows: np.ndarray, t: np.ndarray, scene: np.ndarray,
                scene_lo: np.ndarray, scene_hi: np.ndarray, steps: Steps) -> dict[str, np.ndarray]:
        """`agent_samples` of samples `ids` (each of `groups`, held) at agent `rows` and frames `t`, in one pass:
        the same fields and numbers."""
        base, n_tracks = self.start[groups], self.tracks[groups]
        frames, avail = _window(t, scene_lo, scene_hi, steps)
        local = frames - self.f0[groups][:, None]
        inside = (local >= 0) & (local < self.frames[groups][:, None])
        keys = (self.seq[groups][:, None] << self.SHIFT) | (local * n_tracks[:, None] + self.code[ids][:, None])
        at = np.minimum(np.searchsorted(self.keys[:self.size], keys), self.size - 1)
        found = inside & (self.keys[at] == keys)
        avail &= found
        where = np.where(found, base[:, None] + self.order[at], 0)
        me = base + self.me[ids]
        out = _relative(steps, self.centroid[where], self.yaw[where], self.extent[where][..., :2], avail,
                        self.centroid[me].copy(), self.yaw[me].astype(np.float64))
        out["extent"] = self.extent[me].copy()
        return {**out, "frame_index": t - scene_lo, "scene_index": scene.astype(np.int64),
                "frame_row": t.astype(np.int64), "timestamp": self.timestamp[ids].copy(),
                "track_id": self.track[ids].copy(), "agent_row": rows.astype(np.int64)}


def sample_fields(ego: bool, steps: Steps) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Each field of a sample: (dtype, shape per sample), as `ego_samples` / `agent_samples` return them."""
    h, f = steps.history, steps.future
    f32, f64, i64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)
    out: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
        "target_positions": (f32, (f, 2)), "target_yaws": (f32, (f, 1)), "target_velocities": (f32, (f, 2)),
        "target_availabilities": (f32, (f,)), "history_positions": (f32, (h + 1, 2)),
        "history_yaws": (f32, (h + 1, 1)), "history_velocities": (f32, (h, 2)),
        "history_availabilities": (f32, (h + 1,)), "agent_from_world": (f64, (3, 3)),
        "world_from_agent": (f64, (3, 3)), "centroid": (f64, (2,)), "yaw": (f64, ()),
        "history_extents": (f32, (h + 1, 2)), "future_extents": (f32, (f, 2)),
    }
    if h:
        out["curr_speed"] = (f32, ())
    out["extent"] = (f64 if ego else f32, (3,))
    out.update({"frame_index": (i64, ()), "scene_index": (i64, ()), "frame_row": (i64, ()),
                "timestamp": (i64, ()), "track_id": (i64, ()), "agent_row": (i64, ())})
    return out
