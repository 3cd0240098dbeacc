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

import os
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ChunkError, FormatError
from .external_table import ExternalTable
from .file_tags import Tag, check_unchanged
from .location import Location
from .video_frames import VideoReader

CHUNK_ROWS = 32
TOLERANCE = 1e-4  # seconds: LeRobot's `tolerance_s` between a frame's time and the one asked for


class VideoTable(ExternalTable):
    """Camera `camera`'s frames (`shape` (H, W, 3)) as the table `table` of one-field records. `episode[i]` is
    row i's episode, `timestamps[i]` its time in that episode's video (`from_timestamp + timestamp`);
    `episode_file[e]` indexes `files` (paths below `location`). `unreadable`: why the timestamps could not be
    read when the dataset was opened (each read then raises `ChunkError` saying so). With `tags` (file -> its
    `core.file_tags` tag when the dataset was opened), frames of a file that no longer has its tag are refused
    (`ChunkError`), never mixed with frames read before."""

    def __init__(self, location: Location, table: str, camera: str, shape: tuple[int, ...],
                 files: Sequence[str], episode_file: np.ndarray, episode: np.ndarray, timestamps: np.ndarray,
                 chunk_rows: int = CHUNK_ROWS, unreadable: str | None = None,
                 tags: Mapping[str, Tag | None] | None = None) -> None:
        dtype = np.dtype([(table, np.uint8, tuple(shape))])
        super().__init__(table, dtype, len(episode), chunk_rows, f"videos/{camera}")
        self.location, self.camera, self.frame_shape = location, camera, tuple(shape)
        self.files, self.episode_file = list(files), np.asarray(episode_file, np.int64)
        self.episode, self.timestamps = np.asarray(episode, np.int64), np.asarray(timestamps, np.float64)
        self.unreadable = unreadable
        self.tags = dict(tags) if tags is not None else None
        self._readers: dict[str, VideoReader] = {}  # per file, opened on first use (a worker's own)
        self._fs: tuple[Any, str] | None = None
        self._pid = os.getpid()  # whose readers these are

    def read_records(self, start: int, stop: int) -> np.ndarray:
        out = np.zeros(stop - start, self.dtype)
        self.read_records_into(start, stop, out)
        return out

    def read_records_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """The frames of rows [start, stop) decoded straight into `out` (a loader's cache slot)."""
        if self.unreadable:
            raise ChunkError(f"camera '{self.camera}': frame times unknown ({self.unreadable})")
        frames = out[self.table]
        episodes = self.episode[start:stop]
        cuts = np.flatnonzero(np.diff(episodes)) + 1
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(episodes)].tolist(), strict=True):
            e = int(episodes[lo])
            if e < 0:
                raise ChunkError(f"camera '{self.camera}': row {start + lo} is in no episode (meta/episodes' "
                                 "ranges do not cover it)")
            name = self.files[int(self.episode_file[e])]
            where = f"camera '{self.camera}', {name}, episode {e}"
            reader = self._reader(name)
            try:
                reader.decode_at(self.timestamps[start + lo:start + hi], frames[lo:hi], TOLERANCE)
            except (FormatError, ValueError, OSError) as exc:
                self._check_unchanged(name, reader)  # (a file replaced: said so, rather than what it now lacks)
                if isinstance(exc, FileNotFoundError):
                    raise ChunkError(f"{where}: the video file is missing") from None
                said = str(exc).removeprefix(f"{reader.what}: ")  # (the reader names the file; `where` too)
                raise ChunkError(f"{where}: {said}") from None
            self._check_unchanged(name, reader)  # (after decoding: a file replaced while it was decoded too)

    def _reader(self, name: str) -> VideoReader:
        """The reader of video file `name`: FFmpeg reads a local file itself, a remote one through fsspec."""
        if self._pid != os.getpid():  # forked (a worker started with "fork"): never the parent's open files, whose
            self._readers, self._fs, self._pid = {}, None, os.getpid()  # offsets it shares
        reader = self._readers.get(name)
        if reader is None:
            fs, root = self._filesystem()
            path = f"{root}/{name}"
            opener = None if not self.location.settings.remote else (lambda p, fs=fs: fs.open(p, "rb"))
            reader = self._readers[name] = VideoReader(path, opener, what=f"camera '{self.camera}', {name}")
        return reader

    def _check_unchanged(self, name: str, reader: VideoReader) -> None:
        """`ChunkError` if video file `name` is no longer what it was when the dataset was opened (with `tags`);
        its reader is closed then (it may hold the old file open)."""
        if self.tags is not None:
            fs, root = self._filesystem()
            try:
                check_unchanged(fs, f"{root}/{name}", f"camera '{self.camera}', {name}", self.tags.get(name))
            except ChunkError:
                reader.close()
                raise

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            self._fs = self.location.filesystem()
        return self._fs

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_readers"] = {}  # each process opens its own files
        state["_fs"] = None
        return state
