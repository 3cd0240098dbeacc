"""One camera of a LeRobot dataset read as a table of frames: record i is the frame of dataset row i, (H, W, 3)
uint8, decoded from the episode's video file with PyAV.

LeRobot keeps many episodes one after another in each video file; episode e's frames start at
`from_timestamp[e]` in its file, and the frame of row i (of episode e) is the one shown at
`from_timestamp[e] + timestamp[i]` (the data files' `timestamp` column, read by the parent when it opens the
dataset and carried in this object). A chunk (`chunk_rows` consecutive rows, 32 by default) is decoded episode
piece by episode piece: seek to the key frame before the first timestamp needed, decode forward, keep each frame
whose presentation time is within 1e-4 s of a timestamp needed (LeRobot's tolerance). Each chunk is decoded once
and kept by the caches as any decoded chunk is, never once per sample.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import ChunkError
from .external_table import ExternalTable
from .location import Location

CHUNK_ROWS = 32
TOLERANCE = 1e-4  # seconds: LeRobot's `tolerance_s` between a frame's time and the one asked for


class VideoTable(ExternalTable):
    """Camera `camera`'s frames (`shape` (H, W, 3)) as the table `table` of one-field records. `episode[i]` is
    row i's episode, `timestamps[i]` its time in that episode's video (`from_timestamp + timestamp`);
    `episode_file[e]` indexes `files` (paths below `location`). `unreadable`: why the timestamps could not be
    read when the dataset was opened (each read then raises `ChunkError` saying so)."""

    def __init__(self, location: Location, table: str, camera: str, shape: tuple[int, ...],
                 files: Sequence[str], episode_file: np.ndarray, episode: np.ndarray, timestamps: np.ndarray,
                 chunk_rows: int = CHUNK_ROWS, unreadable: str | None = None) -> None:
        dtype = np.dtype([(table, np.uint8, tuple(shape))])
        super().__init__(table, dtype, len(episode), chunk_rows, f"videos/{camera}")
        self.location, self.camera, self.frame_shape = location, camera, tuple(shape)
        self.files, self.episode_file = list(files), np.asarray(episode_file, np.int64)
        self.episode, self.timestamps = np.asarray(episode, np.int64), np.asarray(timestamps, np.float64)
        self.unreadable = unreadable

    def read_records(self, start: int, stop: int) -> np.ndarray:
        if self.unreadable:
            raise ChunkError(f"camera '{self.camera}': frame times unknown ({self.unreadable})")
        out = np.zeros(stop - start, self.dtype)
        frames = out[self.table]
        episodes = self.episode[start:stop]
        cuts = np.flatnonzero(np.diff(episodes)) + 1
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(episodes)].tolist(), strict=True):
            e = int(episodes[lo])
            if e < 0:
                raise ChunkError(f"camera '{self.camera}': row {start + lo} is in no episode (meta/episodes' "
                                 "ranges do not cover it)")
            name = self.files[int(self.episode_file[e])]
            wanted = self.timestamps[start + lo:start + hi]
            frames[lo:hi] = _decode_frames(self.location, name, wanted, self.frame_shape,
                                           f"camera '{self.camera}', {name}, episode {e}")
        return out


def _decode_frames(location: Location, name: str, timestamps: np.ndarray, shape: tuple[int, ...],
                   where: str) -> np.ndarray:
    """The frames of video file `name` (below `location`) shown at `timestamps` (seconds, ascending), as
    (n, H, W, 3) uint8 RGB: one seek to the key frame before the first, then decoded forward, each frame matched
    to the timestamps within `TOLERANCE`. `ChunkError` naming `where` and the timestamp of a frame not found, or
    the file if it cannot be read."""
    import av

    out = np.zeros((len(timestamps), *shape), np.uint8)
    found = np.zeros(len(timestamps), bool)
    if not len(timestamps):
        return out
    fs, root = location.filesystem()
    first, last = float(timestamps.min()), float(timestamps.max())
    try:
        with fs.open(f"{root}/{name}", "rb") as fh, av.open(fh) as container:
            stream = container.streams.video[0]
            base = float(stream.time_base)
            container.seek(max(int((first - TOLERANCE) / base), 0), stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                t = frame.pts * base
                if t > last + TOLERANCE:
                    break
                near = np.flatnonzero(np.abs(timestamps - t) <= TOLERANCE)
                if len(near):
                    pixels = frame.to_ndarray(format="rgb24")
                    if pixels.shape != tuple(shape):
                        raise ChunkError(f"{where}: frames of {pixels.shape}, not the {tuple(shape)} info.json says")
                    out[near], found[near] = pixels, True
    except FileNotFoundError:
        raise ChunkError(f"{where}: the video file is missing") from None
    except ChunkError:
        raise
    except Exception as exc:  # PyAV's errors: a truncated or corrupt file
        raise ChunkError(f"{where}: cannot be decoded ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not found.all():
        t = float(timestamps[np.flatnonzero(~found)[0]])
        raise ChunkError(f"{where}: no frame at timestamp {t:.4f} s (within {TOLERANCE} s)")
    return out

