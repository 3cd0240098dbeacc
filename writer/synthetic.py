"""Realistic synthetic L5Kit episodes, seeded: for tests, benchmarks and the demo.

Each episode is one scene with its frames, agents and traffic-light faces, intervals local to the episode.
Shapes follow the real scene in ../shared/data: 248 frames 100 ms apart, about 84 agents per frame from
persistent tracks (most short-lived and UNKNOWN, some long-lived cars and pedestrians, three in four parked),
float32-precision positions stored as float64, one-hot labels, and a few traffic lights seen in runs of frames.
The compression ratios with L5Kit's defaults land near the real scene's (checked in tests).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..core.schema import AGENT_DTYPE, FRAME_DTYPE, SCENE_DTYPE, TL_FACE_DTYPE

_DT_NS = 100_000_000
_BASE_NS = 1_571_846_881_502_692_276
_ALPHABET = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"))
# label index -> (extent mean (length, width, height), probability for long-lived, for short-lived tracks)
_LABELS = {
    1: ((1.2, 1.0, 0.9), 0.10, 0.86),   # UNKNOWN
    3: ((4.6, 1.9, 1.7), 0.72, 0.10),   # CAR
    12: ((1.8, 0.6, 1.7), 0.04, 0.01),  # CYCLIST
    14: ((0.7, 0.7, 1.75), 0.14, 0.03),  # PEDESTRIAN
}


def _f32(x: np.ndarray) -> np.ndarray:
    """Sensor values have float32 precision even where stored as float64 (as in L5Kit)."""
    return x.astype(np.float32).astype(np.float64)


def _rotation(yaw: np.ndarray, pitch: np.ndarray, roll: np.ndarray) -> np.ndarray:
    cy, sy, cp, sp, cr, sr = np.cos(yaw), np.sin(yaw), np.cos(pitch), np.sin(pitch), np.cos(roll), np.sin(roll)
    return np.stack([
        np.stack([cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr], -1),
        np.stack([sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr], -1),
        np.stack([-sp, cp * sr, cp * cr], -1),
    ], -2)


def episode(index: int, seed: int = 0, frames: int = 248, agents_per_frame: float = 84.0) -> dict[str, np.ndarray]:
    """Scene `index` of the synthetic stream `seed`; the same whatever else is generated."""
    rng = np.random.default_rng([seed, index])
    t = np.arange(frames)

    # Ego: smooth drive, yaw rate and speed varying slowly; timestamps 100 ms apart with jitter.
    timestamps = _BASE_NS + index * 30_000_000_000 + np.cumsum(_DT_NS + rng.integers(-300_000, 300_000, frames))
    yaw0 = rng.uniform(-np.pi, np.pi)  # drawn before the turns: the order of draws decides a seed's scenes
    yaw = yaw0 + np.cumsum(np.convolve(rng.normal(0, 0.01, frames), np.ones(min(20, frames)) / 20, "same"))
    speed = np.clip(8 + np.cumsum(rng.normal(0, 0.15, frames)), 0, 20)
    xy = rng.uniform(-2000, 2000, 2) + np.cumsum(np.stack([np.cos(yaw), np.sin(yaw)], -1) * speed[:, None] * 0.1, 0)
    z = 271 + 0.4 * np.sin(t / 60 + rng.uniform(0, 6))
    ego_rotation = _rotation(yaw, rng.normal(0, 0.01, frames), rng.normal(0, 0.01, frames))

    # Tracks: lifetimes (long-lived or short), births, labels; track ids in order of birth, from 1.
    life, birth = np.zeros(0, np.int64), np.zeros(0, np.int64)
    while life.sum() < agents_per_frame * frames:
        n = 64
        more = np.where(rng.random(n) < 0.06, rng.integers(min(50, frames), frames + 1, n), 1 + rng.geometric(0.13, n))
        start = rng.integers(0, frames, n)
        life, birth = np.concatenate([life, np.minimum(more, frames - start)]), np.concatenate([birth, start])
    keep = int(np.searchsorted(np.cumsum(life), agents_per_frame * frames)) + 1  # just enough tracks
    life, birth = life[:keep] if agents_per_frame else life[:0], birth[:keep] if agents_per_frame else birth[:0]
    order = np.argsort(birth, kind="stable")
    life, birth = life[order], birth[order]
    long_lived = life >= 50
    codes = np.array(list(_LABELS))
    label = np.where(long_lived, rng.choice(codes, len(life), p=[v[1] for v in _LABELS.values()]),
                     rng.choice(codes, len(life), p=[v[2] for v in _LABELS.values()]))
    extent = np.array([_LABELS[c][0] for c in label]).reshape(-1, 3) * rng.lognormal(0, 0.12, (len(life), 3))
    moving = rng.random(len(life)) < 0.27
    heading = rng.uniform(-np.pi, np.pi, len(life))
    v = np.where(moving, rng.uniform(1, 12, len(life)), 0.0)
    origin = xy[birth] + rng.uniform(-50, 50, (len(life), 2))

    # Agent rows: one per (track, frame alive), ordered by frame then track id.
    track = np.repeat(np.arange(len(life)), life)
    frame = birth[track] + (np.arange(len(track)) - np.repeat(np.cumsum(life) - life, life))
    order = np.lexsort((track, frame))
    track, frame = track[order], frame[order]
    age = (frame - birth[track]) * 0.1
    direction = np.stack([np.cos(heading), np.sin(heading)], -1)[track]
    agents = np.zeros(len(track), AGENT_DTYPE)
    noise = rng.normal(0, 0.02, (len(track), 2))
    agents["centroid"] = _f32(origin[track] + direction * (v[track] * age)[:, None] + noise)
    # Perception re-estimates the extent of moving objects every frame; parked ones keep theirs.
    agents["extent"] = extent[track] * np.where(moving[track, None], rng.normal(1, 0.01, (len(track), 3)), 1)
    agents["yaw"] = heading[track] + rng.normal(0, 0.01, len(track))
    noise = rng.normal(0, 0.05, (len(track), 2))
    agents["velocity"] = np.where(moving[track, None], direction * v[track, None] + noise, 0)
    agents["track_id"] = track + 1
    probs = np.zeros((len(track), 17), np.float32)
    probs[np.arange(len(track)), label[track]] = 1
    unsure = rng.random(len(track)) < 0.002
    probs[unsure, label[track][unsure]] = 0.6
    probs[unsure, 1] += 0.4
    agents["label_probabilities"] = probs

    # Traffic lights: a few lights of three faces each, visible in runs of frames.
    n_lights = int(rng.integers(2, 9))
    face_ids = ["".join(rng.choice(_ALPHABET, 4)) for _ in range(3 * n_lights)]
    light_ids = ["".join(rng.choice(_ALPHABET, 4)) for _ in range(n_lights)]
    first_seen = np.sort(rng.integers(0, frames, n_lights))
    last_seen = np.minimum(first_seen + rng.integers(min(30, frames), frames + 1, n_lights), frames)
    state = rng.random(n_lights) < 0.5
    faces_per_frame = []
    for f in range(frames):
        lit = np.flatnonzero((first_seen <= f) & (f < last_seen))
        faces_per_frame.append([(3 * light + k, light) for light in lit for k in range(3)])
    n_faces = np.array([len(x) for x in faces_per_frame])
    faces = np.zeros(int(n_faces.sum()), TL_FACE_DTYPE)
    rows = [pair for x in faces_per_frame for pair in x]
    if rows:
        face, light = np.array(rows).T
        faces["face_id"] = np.array(face_ids)[face]
        faces["traffic_light_id"] = np.array(light_ids)[light]
        faces["traffic_light_face_status"] = np.where(state[light, None], [1, 0, 0], [0, 0, 1])

    frames_arr = np.zeros(frames, FRAME_DTYPE)
    frames_arr["timestamp"] = timestamps
    agent_bounds = np.searchsorted(frame, np.arange(frames + 1))
    face_bounds = np.concatenate([[0], np.cumsum(n_faces)])
    frames_arr["agent_index_interval"] = np.stack([agent_bounds[:-1], agent_bounds[1:]], -1)
    frames_arr["traffic_light_faces_index_interval"] = np.stack([face_bounds[:-1], face_bounds[1:]], -1)
    frames_arr["ego_translation"] = _f32(np.column_stack([xy, z]))
    frames_arr["ego_rotation"] = _f32(ego_rotation)

    scene = np.zeros(1, SCENE_DTYPE)
    scene["frame_index_interval"] = [0, frames]
    scene["host"] = f"host-a{rng.integers(0, 1000):03d}"
    scene["start_time"] = timestamps[0] - 18_183_330_228
    scene["end_time"] = scene["start_time"] + 25_000_000_000
    return {"scenes": scene, "frames": frames_arr, "agents": agents, "traffic_light_faces": faces}


def episodes(n_scenes: int, seed: int = 0, **kwargs) -> Iterator[dict[str, np.ndarray]]:
    """Yield `n_scenes` synthetic episodes (see `episode`); lazily, so any count fits in memory."""
    for i in range(n_scenes):
        yield episode(i, seed, **kwargs)


def scenes(source: tuple[int, int, int], **kwargs) -> Iterator[dict[str, np.ndarray]]:
    """Scenes `start` to `stop` of seed `seed`, for a source `(seed, start, stop)`: the same episodes as
    `episodes(n, seed)` gives at those positions (how a Dask ingest splits `--synthetic N` into sources)."""
    seed, start, stop = source
    for i in range(start, stop):
        yield episode(i, seed, **kwargs)
