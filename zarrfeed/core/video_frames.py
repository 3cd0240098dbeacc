"""Frames of a camera stream (an MP4 of LeRobot's, AV1 by default) decoded by timestamp with PyAV, and what a
stream holds read from its packets alone.

`decode_at` decodes exactly the frames at given timestamps (ascending) into a caller's array, as LeRobot's own
`pyav` backend finds them: a frame matches a timestamp when `pts * time_base` is within `tolerance` of it. It seeks
once, to the key frame at or before the first timestamp (again from the stream's start only if the demuxer lands
past it), decodes forward, converts only the frames asked for, straight into the caller's array, and stops at the
last one. `VideoReader` keeps one file's container open across calls, for a caller that decodes many
runs of frames from the same file (a worker decoding chunk after chunk). `probe` reads frame count, per-frame
timestamps, size, codec and rate without decoding.

PyAV (the `video` extra) is imported on first use: zarrfeed without it reads everything but videos. It bundles
FFmpeg (with dav1d for AV1) in its wheels, so no system libraries are needed, and it is the decoder LeRobot's own
`pyav` backend uses: frames come out byte-equal to what LeRobot returns.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import IO, Any, Callable, Union

import numpy as np

from .errors import FormatError

Source = Union[str, "os.PathLike[str]", IO[bytes]]

# Decoder threads per open stream. zarrfeed decodes in worker processes, about one per core, so FFmpeg's own threads
# only contend with the other workers for the same cores, and on small frames a frame is too little work to split:
# on 2 cores, two processes each decoding 96x96 AV1 (dav1d) take about 170 us per frame with 1 thread against
# 250-300 us with FFmpeg's automatic count, and one process alone is no faster with it either (about 140 against
# 165). One thread also keeps a worker's thread count what the caller configured.
DECODER_THREADS = 1


def require_av() -> Any:
    """The `av` module; ImportError saying what to install when PyAV is missing."""
    try:
        import av
    except ImportError:
        raise ImportError("decoding video needs PyAV: pip install 'zarrfeed[video]'") from None
    return av


def _name(source: Source, what: str) -> str:
    """How errors name the video: `what` when given, else the path or the file object's name."""
    if what:
        return what
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return str(getattr(source, "path", None) or getattr(source, "name", None) or "video")


def _open(source: Source, what: str) -> tuple[Any, Any]:
    """The open container and its first video stream, with the decoder's thread count set (see DECODER_THREADS)."""
    av = require_av()
    if not isinstance(source, (str, os.PathLike)):
        source.seek(0)
    try:
        container = av.open(source if not isinstance(source, os.PathLike) else os.fspath(source), "r")
    except FileNotFoundError:  # (PyAV's own is an FFmpegError too)
        raise FileNotFoundError(f"{_name(source, what)}: no such video file") from None
    except av.FFmpegError as exc:  # (a file object's own OSError, a store's, is the caller's to name)
        raise FormatError(f"{_name(source, what)}: cannot be opened as a video ({_first_line(exc)})") from None
    if not container.streams.video:
        container.close()
        raise FormatError(f"{_name(source, what)}: holds no video stream")
    stream = container.streams.video[0]
    stream.thread_count = DECODER_THREADS
    return container, stream


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


@dataclass(frozen=True, eq=False)
class VideoInfo:
    """What a video stream holds, read from its container and packets (no frame decoded).

    Attributes:
        frames: The number of frames (packets with a timestamp).
        pts: Each frame's presentation time in seconds, ascending (float64, `frames` long).
        width: Frame width in pixels.
        height: Frame height in pixels.
        codec: The decoder's name (`libdav1d`, `h264`, ...).
        pix_fmt: The stream's pixel format (`yuv420p`, ...).
        fps: The stream's average frame rate (0.0 when the container states none).
        duration: The stream's duration in seconds (the last frame's end when the container states none).
    """

    frames: int
    pts: np.ndarray
    width: int
    height: int
    codec: str
    pix_fmt: str
    fps: float
    duration: float


def probe(source: Source, what: str = "") -> VideoInfo:
    """What the first video stream of `source` (a path or an open binary file) holds, from its packets.

    Args:
        source: The video: a local path, or a binary file object (an fsspec file for a remote one).
        what: How errors name the video (default: its path).
    """
    av = require_av()
    container, stream = _open(source, what)
    try:
        tb = stream.time_base
        stamps, ends = [], []
        for packet in container.demux(stream):
            if packet.pts is not None:
                stamps.append(packet.pts)
                ends.append(packet.pts + (packet.duration or 0))
        pts = np.sort(np.asarray(stamps, dtype=np.int64)).astype(np.float64) * float(tb)
        if stream.duration is not None:
            duration = float(stream.duration * tb)
        else:
            duration = float(max(ends) * tb) if ends else 0.0
        rate = stream.average_rate
        ctx = stream.codec_context
        return VideoInfo(frames=len(pts), pts=pts, width=ctx.width, height=ctx.height, codec=ctx.name,
                         pix_fmt=str(ctx.pix_fmt or ""), fps=float(rate) if rate else 0.0, duration=duration)
    except av.FFmpegError as exc:
        raise FormatError(f"{_name(source, what)}: cannot be read ({_first_line(exc)})") from None
    finally:
        container.close()


def _check_request(timestamps: np.ndarray, out: np.ndarray, name: str) -> None:
    if timestamps.ndim != 1 or out.ndim != 4 or out.shape[0] != len(timestamps) or out.shape[3] != 3 \
            or out.dtype != np.uint8:
        raise ValueError(f"{name}: {len(timestamps)} timestamps need out of shape (n, H, W, 3) uint8 with n = "
                         f"{len(timestamps)}, not {out.shape} {out.dtype}")
    if len(timestamps) > 1 and np.any(np.diff(timestamps) < 0):
        raise ValueError(f"{name}: timestamps are not ascending")


def _rgb(frame: Any) -> np.ndarray:
    """`frame` converted to RGB (H, W, 3) uint8 as `frame.to_ndarray(format="rgb24")` converts it, to the same
    bytes, faster: that call makes a new `VideoReformatter`, and with it a new swscale context, for every frame
    (on small frames the set-up costs ten times the conversion); one kept per thread keeps its context while
    frames keep their size and format. Since PyAV 16 swscale may split a conversion over threads, which on
    96x96 frames costs four times the conversion itself (234 against 59 us a frame measured here): one thread
    (older PyAV converts on one thread and has no `threads` argument)."""
    convert = getattr(_local, "rgb", None)
    if convert is None:
        from av.video.reformatter import VideoReformatter

        reformat = VideoReformatter().reformat
        try:
            reformat(frame, format="rgb24", threads=1)
            convert = _local.rgb = lambda f: reformat(f, format="rgb24", threads=1).to_ndarray()
        except TypeError:
            convert = _local.rgb = lambda f: reformat(f, format="rgb24").to_ndarray()
    return convert(frame)


_local = threading.local()


def _decode(container: Any, stream: Any, timestamps: np.ndarray, out: np.ndarray, tolerance: float,
            name: str) -> None:
    """Seek `stream` to the key frame at or before the first timestamp and decode forward into `out`, converting
    only the frames asked for and stopping at the last one."""
    if len(timestamps) == 0:
        return
    # the last key frame that may be the first frame asked for (up to `tolerance` after its timestamp)
    target = max(0, int((float(timestamps[0]) + tolerance) / float(stream.time_base)))
    if not _decode_from(container, stream, target, timestamps, out, tolerance, name, may_land_late=target > 0):
        # the demuxer landed after the first frame asked for (a container that seeks by decode time, whose key
        # frames show later than they decode): from the start of the stream
        _decode_from(container, stream, 0, timestamps, out, tolerance, name, may_land_late=False)


def _decode_from(container: Any, stream: Any, target: int, timestamps: np.ndarray, out: np.ndarray,
                 tolerance: float, name: str, may_land_late: bool) -> bool:
    """`_decode` from the key frame at or before `target` (in the stream's time base); False, with nothing
    written, when `may_land_late` and the first frame decoded is already past the first timestamp."""
    av = require_av()
    n, ftb = len(timestamps), float(stream.time_base)
    height, width = out.shape[1], out.shape[2]
    i, seen = 0, None  # the next timestamp to fill; the last frame decoded (seconds)
    try:
        container.seek(target, stream=stream, backward=True)
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            t = frame.pts * ftb
            if t > timestamps[i] + tolerance:  # passed a timestamp without a frame there
                if seen is None and may_land_late:
                    return False
                raise _missed(name, timestamps[i], seen, t)
            if t >= timestamps[i] - tolerance:
                if frame.width != width or frame.height != height:
                    raise FormatError(f"{name}: frames are {frame.width}x{frame.height} (width x height), "
                                      f"not the {width}x{height} asked for")
                out[i] = _rgb(frame)
                i += 1
                while i < n and abs(t - timestamps[i]) <= tolerance:  # the same frame asked for again
                    out[i] = out[i - 1]
                    i += 1
                if i == n:
                    return True
            seen = t
    except av.FFmpegError as exc:
        raise FormatError(f"{name}: cannot be decoded at {float(timestamps[i]):.6f} s "
                          f"({_first_line(exc)})") from None
    raise FormatError(f"{name}: no frame at {float(timestamps[i]):.6f} s: the stream ends first"
                      + (f" (its last frame is at {seen:.6f} s)" if seen is not None else " (no frame decoded)"))


def _missed(name: str, wanted: float, before: float | None, after: float) -> FormatError:
    nearest = after if before is None or abs(after - wanted) <= abs(before - wanted) else before
    return FormatError(f"{name}: no frame at {float(wanted):.6f} s (the nearest is at {nearest:.6f} s)")


def decode_at(source: Source, timestamps: np.ndarray, out: np.ndarray, tolerance: float = 1e-4,
              what: str = "") -> None:
    """Decode the frames of `source` at `timestamps` (seconds, ascending) into `out` (n, H, W, 3) uint8 RGB.

    A frame is the one at a timestamp when its `pts * time_base` is within `tolerance` of it (LeRobot's rule);
    a timestamp with no such frame, a stream that ends before the last one, or frames of another size than
    `out`'s are refused (`FormatError`, a `ValueError`, naming `what`). Opens the file for this call only:
    `VideoReader` keeps it open across calls.

    Args:
        source: The video: a local path, or a binary file object (an fsspec file for a remote one).
        timestamps: float64 seconds, ascending, one per row of `out`.
        out: Where the frames go, written in place (a view into shared memory, say).
        tolerance: How far (seconds) a frame's time may be from the timestamp asked for.
        what: How errors name the video (default: its path).
    """
    name = _name(source, what)
    _check_request(timestamps, out, name)
    container, stream = _open(source, what)
    try:
        _decode(container, stream, timestamps, out, tolerance, name)
    finally:
        container.close()


class VideoReader:
    """One video file kept open across `decode_at` calls: for a caller decoding many runs of frames from the same
    file (chunk after chunk), which then pays the container's opening once rather than per run. Opened on first
    use; pickled as its path (and opener) alone, so a worker process gets one that opens its own.

    Args:
        path: The video's path (local, or what `opener` opens).
        opener: Opens `path` as a binary file (an fsspec filesystem's `open`, say); default: FFmpeg opens the
            local path itself.
        what: How errors name the video (default: `path`).
    """

    def __init__(self, path: str | os.PathLike[str], opener: Callable[[str], IO[bytes]] | None = None,
                 what: str = "") -> None:
        self.path, self.opener, self.what = os.fspath(path), opener, what or os.fspath(path)
        self._file: IO[bytes] | None = None
        self._container: Any = None
        self._stream: Any = None

    def decode_at(self, timestamps: np.ndarray, out: np.ndarray, tolerance: float = 1e-4) -> None:
        """As the module's `decode_at`, on this reader's file (opened now if it is not open yet)."""
        _check_request(timestamps, out, self.what)
        if self._container is None:
            self._file = self.opener(self.path) if self.opener is not None else None
            try:
                self._container, self._stream = _open(self._file if self._file is not None else self.path,
                                                      self.what)
            except BaseException:
                self.close()
                raise
        try:
            _decode(self._container, self._stream, timestamps, out, tolerance, self.what)
        except FormatError:
            self.close()  # the next call starts from a freshly opened file
            raise

    def close(self) -> None:
        """Closes the container (and the file `opener` opened); the next `decode_at` opens them again."""
        container, file = self._container, self._file
        self._container = self._stream = self._file = None
        try:
            if container is not None:
                container.close()
        finally:
            if file is not None:
                file.close()

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "opener": self.opener, "what": self.what}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["opener"], state["what"])  # type: ignore[misc]

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
