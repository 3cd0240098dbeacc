"""Camera frames decoded by timestamp (`core.video_frames`): equal to what LeRobot's own decoding returned on the
golden dataset (../shared/data/lerobot_v3_small: frame i of its one video is at i/10 s, and samples.npz holds
each item's current frame), seeks to frames that are not key frames, and one-line refusals of timestamps without
a frame, frames of another size and a damaged file."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from repo_paths import REAL_SCENE

from zarrfeed.core import video_frames
from zarrfeed.core.errors import FormatError
from zarrfeed.core.video_frames import VideoReader, decode_at, probe

av = pytest.importorskip("av")

LEROBOT = REAL_SCENE.parent / "lerobot_v3_small"
VIDEO = LEROBOT / "dataset" / "videos" / "observation.images.cam" / "chunk-000" / "file-000.mp4"


@pytest.fixture(scope="module")
def golden() -> np.ndarray:
    """Frame i of the golden video as LeRobot decoded it (the current frame of item i), (153, 48, 64, 3)."""
    if not VIDEO.exists():
        if os.environ.get("CI"):
            pytest.fail(f"the LeRobot golden is missing at {LEROBOT} (required under CI)")
        pytest.skip(f"the LeRobot golden is not at {LEROBOT}")
    with np.load(LEROBOT / "samples.npz") as samples:
        return samples["observation.images.cam"][:, 1].transpose(0, 2, 3, 1)


def at(frames: np.ndarray | range) -> np.ndarray:
    return np.asarray(frames, dtype=np.float64) / 10


def decoded(frames: np.ndarray | range, source: object = VIDEO, size: tuple[int, int] = (48, 64)) -> np.ndarray:
    timestamps = at(frames)
    out = np.zeros((len(timestamps), *size, 3), np.uint8)
    decode_at(source, timestamps, out, what="cam")  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("frames", [range(153), range(33, 65), [77], [0, 1, 50, 99, 100, 152]],
                         ids=["all", "run-from-odd-frame", "one", "across-the-file"])
def test_equal_to_lerobot(golden, frames):
    np.testing.assert_array_equal(decoded(frames), golden[list(frames)])


def test_a_frame_asked_for_twice(golden):
    """Windows clamped at an episode's edge ask for the same frame more than once."""
    np.testing.assert_array_equal(decoded([4, 4, 4, 5]), golden[[4, 4, 4, 5]])


def test_fsspec_file(golden):
    fsspec = pytest.importorskip("fsspec")
    with fsspec.filesystem("file").open(str(VIDEO), "rb") as f:
        np.testing.assert_array_equal(decoded(range(40, 72), source=f), golden[40:72])
        np.testing.assert_array_equal(decoded(range(3, 6), source=f), golden[3:6])  # the same file again
    reader = pickle.loads(pickle.dumps(VideoReader(str(VIDEO), opener=fsspec.filesystem("file").open)))
    out = np.zeros((3, 48, 64, 3), np.uint8)
    reader.decode_at(at(range(100, 103)), out)
    np.testing.assert_array_equal(out, golden[100:103])
    reader.close()


def test_between_frames_refused(golden):
    with pytest.raises(FormatError, match=r"^cam: no frame at 3\.050000 s \(the nearest is at 3\.[01]00000 s\)$"):
        decode_at(VIDEO, np.array([3.0, 3.05]), np.zeros((2, 48, 64, 3), np.uint8), what="cam")


def test_past_the_end_refused(golden):
    with pytest.raises(FormatError, match=r"^cam: no frame at 15\.300000 s: the stream ends first \(its last "
                                          r"frame is at 15\.200000 s\)$"):
        decoded([151, 153])


def test_other_size_refused(golden):
    with pytest.raises(FormatError, match=r"^cam: frames are 64x48 \(width x height\), not the 96x96 asked for$"):
        decoded([1], size=(96, 96))


def test_probe(golden):
    info = probe(VIDEO)
    assert (info.frames, info.width, info.height, info.codec, info.pix_fmt, info.fps) == \
        (153, 64, 48, "libdav1d", "yuv420p", 10.0)
    np.testing.assert_allclose(info.pts, at(range(153)), rtol=0, atol=1e-9)
    assert info.duration == pytest.approx(15.3)


TRUNCATED = """
import sys, numpy as np
from zarrfeed.core.video_frames import decode_at, probe
path = sys.argv[1]
try:
    decode_at(path, np.arange(153) / 10, np.zeros((153, 48, 64, 3), np.uint8), what="cut")
except ValueError as exc:
    print(exc)
"""


@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_truncated_file_refused(golden, tmp_path, keep):
    """A file cut short (in its frames, or in its header) is refused in one line: no crash, no hang."""
    data = VIDEO.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[:int(len(data) * keep)])
    done = subprocess.run([sys.executable, "-c", TRUNCATED, str(cut)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cut: "), done.stdout


# ------------------------------------------------------------------ a video of our own: B-frames, a key frame every 4
@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray]:
    """A 96x96 H.264 video of 40 frames at 10 fps (key frame every 4 frames, B-frames), its frames' times and its
    frames as a plain sequential decode gives them."""
    path = tmp_path_factory.mktemp("video") / "small.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width = stream.height = 96
        stream.pix_fmt = "yuv420p"
        stream.options = {"g": "4", "bf": "2", "preset": "ultrafast"}
        yy, xx = np.mgrid[0:96, 0:96]
        for i in range(40):
            image = np.stack([(xx * 2 + i * 5) % 256, (yy * 2) % 256, np.full_like(xx, i * 6)], -1).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:
        frames = [(f.pts * f.time_base, f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
    return path, np.array([float(t) for t, _ in frames]), np.stack([a for _, a in frames])


def test_small_probe(small):
    path, times, _ = small
    info = probe(path)
    assert (info.frames, info.width, info.height, info.codec) == (40, 96, 96, "h264")
    np.testing.assert_allclose(info.pts, times, rtol=0, atol=1e-9)


@pytest.mark.parametrize("length", [1, 3, 9])
def test_small_every_start(small, length):
    """Runs starting at every frame (key frames or not), each equal to the sequential decode."""
    path, times, frames = small
    with VideoReader(path) as reader:
        for start in [*range(0, 40 - length + 1), 17, 2, 30]:  # and back again, on the same open file
            out = np.zeros((length, 96, 96, 3), np.uint8)
            reader.decode_at(times[start:start + length], out)
            np.testing.assert_array_equal(out, frames[start:start + length], err_msg=f"start {start}")
            out[:] = 0
            decode_at(path, times[start:start + length], out)
            np.testing.assert_array_equal(out, frames[start:start + length], err_msg=f"start {start}")


def test_small_other_size_refused(small):
    path, times, _ = small
    with pytest.raises(FormatError, match=r"^small: frames are 96x96 \(width x height\), not the 64x48 asked for$"):
        decode_at(path, times[5:7], np.zeros((2, 48, 64, 3), np.uint8), what="small")
    with pytest.raises(ValueError, match=r"need out of shape \(n, H, W, 3\) uint8 with n = 2"):
        decode_at(path, times[5:7], np.zeros((3, 96, 96, 3), np.uint8))


def test_reader_pickles_as_its_path(small):
    path, times, frames = small
    reader = VideoReader(path, what="small")
    out = np.zeros((4, 96, 96, 3), np.uint8)
    reader.decode_at(times[10:14], out)  # now open
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._container is None and copy.path == str(path) and copy.what == "small"
    copy.decode_at(times[21:25], out)
    np.testing.assert_array_equal(out, frames[21:25])
    with pytest.raises(FormatError, match=r"^small: no frame at 0\.050000 s"):
        reader.decode_at(np.array([0.05]), out[:1])
    reader.decode_at(times[:4], out)  # usable after a refusal
    np.testing.assert_array_equal(out, frames[:4])
    reader.close()


def test_without_pyav_says_what_to_install():
    code = ("import sys; sys.modules['av'] = None\n"
            "from zarrfeed.core.video_frames import require_av\n"
            "try:\n    require_av()\nexcept ImportError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.stdout == "decoding video needs PyAV: pip install 'zarrfeed[video]'\n", done.stderr


class Watched:
    """A container whose seeks land `late` ticks after the target, counting the frames it decodes."""

    def __init__(self, container, late=0):
        self.container, self.late, self.decoded = container, late, 0

    def seek(self, target, **kwargs):
        self.container.seek(target + self.late if target else 0, **kwargs)

    def decode(self, stream):
        for frame in self.container.decode(stream):
            self.decoded += 1
            yield frame


def test_seek_decodes_from_the_key_frame_asked_for(golden):
    """Frames 2 and 151 are key frames (one every 2 frames of an episode in the golden): decoding one decodes it
    alone; frames 3 and 152 decode 2."""
    with av.open(str(VIDEO)) as container:
        for frame, decoded in [(2, 1), (3, 2), (0, 1), (151, 1), (152, 2)]:
            watched = Watched(container)
            out = np.zeros((1, 48, 64, 3), np.uint8)
            video_frames._decode(watched, container.streams.video[0], at([frame]), out, 1e-4, "cam")
            np.testing.assert_array_equal(out[0], golden[frame])
            assert watched.decoded == decoded, frame


def test_seek_landing_late_starts_over(small):
    """A demuxer that lands after the first frame asked for: decoded from the stream's start instead."""
    path, times, frames = small
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        watched = Watched(container, late=int(1 / float(stream.time_base)))  # a second (10 frames) late
        out = np.zeros((3, 96, 96, 3), np.uint8)
        video_frames._decode(watched, stream, times[13:16], out, 1e-4, "small")
        np.testing.assert_array_equal(out, frames[13:16])


def test_missing_or_not_a_video(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^cam: no such video file$"):
        decode_at(tmp_path / "gone.mp4", at([1]), np.zeros((1, 48, 64, 3), np.uint8), what="cam")
    (tmp_path / "text.mp4").write_text("not a video\n")
    with pytest.raises(FormatError, match=r"^.*text\.mp4: cannot be opened as a video \(.*\)$"):
        probe(tmp_path / "text.mp4")
