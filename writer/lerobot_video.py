"""Camera streams as LeRobot 0.4.4 writes them, with PyAV (the `video` extra: FFmpeg's encoders and the AV1
decoder come in its wheels, nothing to install on the system).

One episode's frames are encoded into an MP4 of their own (`encode_episode`: LeRobot's `encode_video_frames`
defaults, libsvtav1 in yuv420p with a key frame every 2 frames, crf 30, preset 12), and the episodes of one
video file are then joined without re-encoding (`concatenate`: FFmpeg's concat demuxer, packets copied, as
LeRobot's `concatenate_video_files`). An episode's place in its file is the duration of the episodes before
it (`duration`, as LeRobot's `get_video_duration_in_s`).

`CODECS` names the settings: "libsvtav1" (LeRobot's default; lossy), "h264" (LeRobot's libx264 choice, crf 30,
lossy) and "lossless" (libx264rgb with qp 0 in RGB: H.264's lossless mode without the RGB-to-YUV conversion,
decoded by LeRobot's pyav backend back to the very bytes).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..core.video_frames import require_av

# name -> (PyAV encoder, pixel format, options, info.json's video.codec is read from the file)
CODECS: dict[str, tuple[str, str, dict[str, str]]] = {
    "libsvtav1": ("libsvtav1", "yuv420p", {"g": "2", "crf": "30", "preset": "12"}),
    "h264": ("libx264", "yuv420p", {"g": "2", "crf": "30"}),
    "lossless": ("libx264rgb", "rgb24", {"g": "2", "qp": "0"}),
}


def check_codec(name: str) -> None:
    """Refuse, in one line, a codec setting this module does not know or an encoder PyAV lacks."""
    if name not in CODECS:
        raise ValueError(f"video codec {name!r}: not one of {', '.join(CODECS)}")
    encoder, pyav = CODECS[name][0], require_av()
    try:
        pyav.codec.Codec(encoder, "w")
    except Exception:  # PyAV raises its own UnknownCodecError, or FFmpeg's
        raise ValueError(f"video codec {name!r}: this PyAV has no {encoder} encoder") from None


def check_size(name: str, height: int, width: int, fps: int, key: str) -> None:
    """Refuse, in one line naming the key, frames of a size the codec setting `name` cannot encode (libx264 in
    yuv420p needs even sizes; SVT-AV1 frames of at least 4x4): its encoder is opened on that size, so that a
    conversion is refused before anything is written rather than failing at its first episode."""
    from fractions import Fraction

    pyav = require_av()
    encoder, pix_fmt, options = CODECS[name]
    context = pyav.CodecContext.create(encoder, "w")
    context.width, context.height, context.pix_fmt = int(width), int(height), pix_fmt
    context.time_base, context.framerate = Fraction(1, int(fps)), Fraction(int(fps), 1)
    context.options = dict(options)
    try:
        context.open()
    except pyav.FFmpegError:
        why = "libx264 in yuv420p needs an even height and width" if encoder == "libx264" else \
            f"{encoder} refuses that size"
        others = ", ".join(c for c in CODECS if c != name)
        raise ValueError(f"key {key!r}: frames of {height}x{width} (height x width) cannot be encoded with video codec "
                         f"{name!r} ({why}); resize them, or choose another codec ({others})") from None


def encode_episode(frames: np.ndarray, path: Path, fps: int, codec: str) -> None:
    """Encode `frames` (T, H, W, 3) uint8 into a new MP4 at `path` (its own stream, `fps` frames a second)."""
    pyav = require_av()
    encoder, pix_fmt, options = CODECS[codec]
    with pyav.open(str(path), "w") as out:
        stream = out.add_stream(encoder, fps, options=dict(options))
        stream.pix_fmt = pix_fmt
        stream.height, stream.width = int(frames.shape[1]), int(frames.shape[2])
        for frame in frames:
            for packet in stream.encode(pyav.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def duration(path: Path) -> float:
    """The video's duration in seconds, as LeRobot measures an episode's (its stream's duration)."""
    pyav = require_av()
    with pyav.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.duration is not None:
            return float(stream.duration * stream.time_base)
        return float(container.duration / pyav.time_base)


def concatenate(pieces: list[Path], out: Path) -> None:
    """Join the MP4s `pieces` (same codec, size and rate) into `out` by copying their packets (FFmpeg's concat
    demuxer), with the index at the front (faststart), as LeRobot's `concatenate_video_files`."""
    pyav = require_av()
    with tempfile.NamedTemporaryFile("w", suffix=".ffconcat", dir=out.parent, delete=False) as listing:
        listing.write("ffconcat version 1.0\n")
        for piece in pieces:
            listing.write(f"file '{piece.resolve()}'\n")
    try:
        with pyav.open(listing.name, "r", format="concat", options={"safe": "0"}) as src, \
                pyav.open(str(out), "w", format="mp4", options={"movflags": "faststart"}) as dst:
            streams = {}
            for stream in src.streams:
                if stream.type == "video":
                    streams[stream.index] = dst.add_stream_from_template(template=stream, opaque=True)
                    streams[stream.index].time_base = stream.time_base
            for packet in src.demux():
                if packet.stream.index not in streams or packet.dts is None:
                    continue
                packet.stream = streams[packet.stream.index]
                dst.mux(packet)
    finally:
        os.unlink(listing.name)


def video_info(path: Path) -> dict[str, Any]:
    """info.json's `info` of a video feature, read from its first file as LeRobot's `get_video_info` reads it."""
    with require_av().open(str(path)) as container:
        stream = container.streams.video[0]
        info: dict[str, Any] = {"video.height": stream.height, "video.width": stream.width,
                                "video.codec": stream.codec.canonical_name, "video.pix_fmt": stream.pix_fmt,
                                "video.is_depth_map": False, "video.fps": int(stream.base_rate),
                                "video.channels": 4 if "rgba" in stream.pix_fmt or "yuva" in stream.pix_fmt else 3}
        info["has_audio"] = bool(container.streams.audio)
    return info
