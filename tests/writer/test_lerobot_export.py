"""A replay buffer written as a LeRobot v3.0 dataset laid out as LeRobot 0.4.4's own writer lays out the golden
dataset (files, Parquet schemas and metadata, info.json, meta/episodes' columns, tasks, statistics), its values
back (tabular exactly, frames within the codec's measured loss, the lossless setting exactly), crash-safe
(SIGKILL mid-way and resume equals an uninterrupted conversion), and the import back to a replay buffer."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from zarrfeed.core import video_frames
from zarrfeed.core.errors import ChunkError, FormatError
from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, lerobot_export, lerobot_stats, lerobot_video, replay_buffer_schema
from zarrfeed.writer.lerobot_export import to_lerobot
from zarrfeed.writer.lerobot_import import lerobot_to_replay_buffer

from repo_paths import REAL_SCENE, SUPPORT

pytest.importorskip("av")
GOLDEN = REAL_SCENE.parent / "lerobot_v3_small" / "dataset"
LEROBOT_PYTHON = os.environ.get("ZARRFEED_LEROBOT_PYTHON")  # a Python with LeRobot 0.4.4 (not a test dependency)
RENAMED = {"observation.state": "state", "action": "action", "observation.images.cam": "image"}
KEYS = {"state": (np.float32, (6,)), "action": (np.float32, (6,)), "image": (np.uint8, (96, 96, 3))}
LENGTHS = (20, 1, 31)
os.environ.setdefault("SVT_LOG", "1")


def scene(t: int, seed: int) -> np.ndarray:
    """Camera frames (t, 96, 96, 3): a moving gradient with a square, as a simulated camera sees."""
    yy, xx = np.mgrid[0:96, 0:96]
    out = np.empty((t, 96, 96, 3), np.uint8)
    for i in range(t):
        out[i, ..., 0] = xx + i * 2 + seed * 10
        out[i, ..., 1] = yy * 2 + i
        out[i, ..., 2] = 128
        out[i, 20 + i % 40:40 + i % 40, 30:50] = (240, 30, 30)
    return out


def episodes(lengths=LENGTHS) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [{"state": rng.normal(size=(t, 6)).astype(np.float32), "action": rng.normal(size=(t, 6)).astype(np.float32),
             "image": scene(t, seed)} for seed, t in enumerate(lengths)]


@pytest.fixture(scope="module")
def buffer(tmp_path_factory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    path = tmp_path_factory.mktemp("rb") / "buffer.zarr"
    eps = episodes()
    with DatasetWriter(path, replay_buffer_schema(KEYS, chunk_rows=16), workers=0) as w:
        w.ingest(eps)
    return path, eps


@pytest.fixture(scope="module")
def exported(buffer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lr") / "lerobot"
    to_lerobot(Dataset.open(buffer[0]), out, fps=10, task="push the block")
    return out


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_the_layout_is_the_golden_datasets(exported):
    assert GOLDEN.exists()
    assert files(exported) == sorted(f.replace("observation.images.cam", "image") for f in files(GOLDEN))
    ours, gold = (pq.read_schema(r / "data/chunk-000/file-000.parquet") for r in (exported, GOLDEN))
    assert [(f.name, f.type) for f in ours] == [(RENAMED.get(f.name, f.name), f.type) for f in gold]
    hf = [json.loads(s.metadata[b"huggingface"]) for s in (ours, gold)]
    assert hf[0]["info"]["features"] == {RENAMED.get(k, k): v for k, v in hf[1]["info"]["features"].items()}
    assert len(hf[0]["fingerprint"]) == len(hf[1]["fingerprint"]) == 16
    assert pq.ParquetFile(exported / "data/chunk-000/file-000.parquet").metadata.num_row_groups == len(LENGTHS)
    ours, gold = (pq.read_schema(r / "meta/episodes/chunk-000/file-000.parquet") for r in (exported, GOLDEN))
    rename = [("observation.images.cam", "image"), ("observation.state", "state")]
    expected = []
    for f in gold:
        name = f.name
        for a, b in rename:
            name = name.replace(a, b)
        expected.append((name, f.type))
    assert [(f.name, f.type) for f in ours] == expected
    ours, gold = (pq.read_schema(r / "meta/tasks.parquet") for r in (exported, GOLDEN))
    assert ours.names == gold.names and ours.types == gold.types
    pandas = [json.loads(s.metadata[b"pandas"]) for s in (ours, gold)]
    for doc in pandas:
        doc.pop("creator"), doc.pop("pandas_version")
    assert pandas[0] == pandas[1]
    assert pq.read_table(exported / "meta/tasks.parquet").to_pylist() == [
        {"task_index": 0, "__index_level_0__": "push the block"}]
    info, golden = (json.loads((r / "meta/info.json").read_text()) for r in (exported, GOLDEN))
    assert list(info) == list(golden)
    assert {k: v for k, v in info.items() if k not in ("features", "total_episodes", "total_frames", "total_tasks",
                                                       "splits")} == \
           {k: v for k, v in golden.items() if k not in ("features", "total_episodes", "total_frames", "total_tasks",
                                                         "splits")}
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"], info["splits"]) == \
           (3, sum(LENGTHS), 1, {"train": "0:3"})
    assert info["features"] == {RENAMED.get(k, k): v for k, v in golden["features"].items()} | {
        "image": golden["features"]["observation.images.cam"] | {
            "shape": [96, 96, 3], "info": golden["features"]["observation.images.cam"]["info"] | {
                "video.height": 96, "video.width": 96}}}
    stats, gold_stats = (json.loads((r / "meta/stats.json").read_text()) for r in (exported, GOLDEN))
    assert {RENAMED.get(k, k): list(v) for k, v in gold_stats.items()} == {k: list(v) for k, v in stats.items()}
    for key, s in stats.items():
        gkey = {v: k for k, v in RENAMED.items()}.get(key, key)
        assert {k: np.shape(v) for k, v in s.items()} == {k: np.shape(v) for k, v in gold_stats[gkey].items()}


def test_episode_rows_place_every_episode(exported):
    rows = pq.read_table(exported / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    ends = np.cumsum(LENGTHS)
    assert [r["dataset_to_index"] for r in rows] == ends.tolist()
    assert [r["dataset_from_index"] for r in rows] == [0, *ends[:-1].tolist()]
    assert [r["tasks"] for r in rows] == [["push the block"]] * 3
    spans = [t for r in rows for t in (r["videos/image/from_timestamp"], r["videos/image/to_timestamp"])]
    assert spans == pytest.approx([0.0, 2.0, 2.0, 2.1, 2.1, 5.2])


def test_tabular_values_round_trip_exactly(buffer, exported):
    _, eps = buffer
    table = pq.read_table(exported / "data/chunk-000/file-000.parquet").to_pydict()
    for key in ("state", "action"):
        assert np.array_equal(np.array(table[key], np.float32), np.concatenate([e[key] for e in eps]))
    frame_index = np.concatenate([np.arange(t) for t in LENGTHS])
    assert np.array_equal(table["frame_index"], frame_index)
    assert np.array_equal(np.array(table["timestamp"], np.float32), (frame_index / 10).astype(np.float32))
    assert np.array_equal(table["episode_index"], np.repeat(np.arange(3), LENGTHS))
    assert np.array_equal(table["index"], np.arange(sum(LENGTHS)))
    assert np.array_equal(table["task_index"], np.zeros(sum(LENGTHS)))


def decoded(root: Path, key: str = "image") -> np.ndarray:
    """Every frame of the dataset at `root` as LeRobot's pyav backend decodes it, found by timestamp."""
    rows = []
    for f in sorted((root / "meta/episodes").rglob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    out = []
    for r in rows:
        chunk, file = r[f"videos/{key}/chunk_index"], r[f"videos/{key}/file_index"]
        path = root / f"videos/{key}/chunk-{chunk:03d}/file-{file:03d}.mp4"
        start = r[f"videos/{key}/from_timestamp"]
        times = start + np.arange(r["length"]) / 10
        info = video_frames.probe(path)  # (each frame there, and only those, at its time)
        within = info.pts[(info.pts > start - 1e-4) & (info.pts < times[-1] + 1e-4)]
        assert within.tolist() == pytest.approx(times.tolist(), abs=1e-4), (path, r["episode_index"])
        frames = np.empty((r["length"], info.height, info.width, 3), np.uint8)
        video_frames.decode_at(path, times, frames)
        out.append(frames)
    return np.concatenate(out)


def test_frames_within_the_codecs_loss(buffer, exported):
    frames = np.concatenate([e["image"] for e in buffer[1]])
    got = decoded(exported)
    diff = np.abs(got.astype(np.int64) - frames)
    psnr = 10 * np.log10(255 ** 2 / np.mean(diff ** 2))
    print(f"libsvtav1 crf 30 yuv420p: PSNR {psnr:.2f} dB, largest pixel difference {diff.max()}")
    # measured: 33.9 dB, largest difference 182, 0.6% of values off by more than 20: at the edges of the red
    # square, from yuv420p's half-resolution colour (H.264 with qp 0 in yuv420p loses as much there: 35.1 dB,
    # largest difference 100); elsewhere within a few levels
    assert psnr > 32 and (diff > 20).mean() < 0.01 and diff.max() < 220


def test_the_lossless_setting_is_exact(buffer, tmp_path):
    out = tmp_path / "lossless"
    to_lerobot(buffer[0], out, fps=10, video_codec="lossless")
    assert np.array_equal(decoded(out), np.concatenate([e["image"] for e in buffer[1]]))
    info = json.loads((out / "meta/info.json").read_text())["features"]["image"]["info"]
    assert (info["video.codec"], info["video.pix_fmt"]) == ("h264", "gbrp")


def test_stats_are_numpys(buffer, exported):
    _, eps = buffer
    rows = pq.read_table(exported / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for e, row in zip(eps, rows, strict=True):
        state = e["state"]
        assert row["stats/state/min"] == state.min(axis=0).tolist()
        assert row["stats/state/max"] == state.max(axis=0).tolist()
        assert row["stats/state/count"] == [len(state)]
        assert np.allclose(row["stats/state/mean"], state.mean(axis=0), rtol=1e-5, atol=1e-6)
        if len(state) > 1:
            assert np.allclose(row["stats/state/std"], state.std(axis=0), rtol=1e-3, atol=1e-5)
            q = np.array([row[f"stats/state/{k}"] for k in lerobot_stats.QUANTILE_KEYS])
            assert (np.diff(q, axis=0) >= 0).all() and (q[0] >= state.min(0) - 1e-6).all()
        image = e["image"]
        assert np.ravel(row["stats/image/min"]).tolist() == (image.min(axis=(0, 1, 2)) / 255).tolist()
        assert np.ravel(row["stats/image/max"]).tolist() == (image.max(axis=(0, 1, 2)) / 255).tolist()
        assert np.allclose(np.ravel(row["stats/image/mean"]), image.mean(axis=(0, 1, 2)) / 255)
    total = json.loads((exported / "meta/stats.json").read_text())
    state = np.concatenate([e["state"] for e in eps]).astype(np.float64)
    assert total["state"]["min"] == state.min(0).tolist() and total["state"]["max"] == state.max(0).tolist()
    assert np.allclose(total["state"]["mean"], state.mean(0), atol=1e-6)
    assert np.allclose(total["state"]["std"], state.std(0), rtol=1e-4)
    assert total["state"]["count"] == [sum(LENGTHS)] and total["index"]["max"] == [sum(LENGTHS) - 1]


def test_stats_equal_lerobots_on_the_golden_dataset():
    """The port computes, from the golden dataset's frames, the very per-episode and dataset statistics LeRobot
    wrote there (the camera's per-episode statistics, made from frames before encoding, taken as written)."""
    data = pq.read_table(GOLDEN / "data/chunk-000/file-000.parquet").to_pydict()
    total = None
    for ep in pq.read_table(GOLDEN / "meta/episodes/chunk-000/file-000.parquet").to_pylist():
        a, b = ep["dataset_from_index"], ep["dataset_to_index"]
        columns = {"observation.state": np.array(data["observation.state"][a:b], np.float32),
                   "action": np.array(data["action"][a:b], np.float32),
                   "timestamp": np.array([n / 10 for n in range(b - a)]), "frame_index": np.arange(b - a),
                   "episode_index": np.full(b - a, ep["episode_index"]), "index": np.arange(a, b),
                   "task_index": np.array(data["task_index"][a:b])}
        stats = lerobot_stats.episode_stats(columns, {})
        for key, s in stats.items():
            for k, v in s.items():
                assert np.asarray(v).tolist() == ep[f"stats/{key}/{k}"], (ep["episode_index"], key, k)
        stats["observation.images.cam"] = {k: np.array(ep[f"stats/observation.images.cam/{k}"])
                                           for k in lerobot_stats.STAT_KEYS}
        total = lerobot_stats.aggregate(total, stats)
    golden = json.loads((GOLDEN / "meta/stats.json").read_text())
    assert lerobot_stats.as_json(total) == {k: golden[k] for k in total}


def test_an_existing_output_is_refused(buffer, exported, tmp_path):
    with pytest.raises(FileExistsError, match="already exists"):
        to_lerobot(buffer[0], exported, fps=10)
    (tmp_path / "x.partial").mkdir()
    with pytest.raises(FormatError, match="an interrupted conversion"):
        to_lerobot(buffer[0], tmp_path / "x", fps=10)
    run = subprocess.run([sys.executable, "-m", "zarrfeed", "convert", str(buffer[0]), str(exported), "--to",
                          "lerobot", "--fps", "10"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "already exists" in run.stderr, run.stderr
    run = subprocess.run([sys.executable, "-m", "zarrfeed", "convert", str(buffer[0]), str(tmp_path / "y"), "--to",
                          "lerobot"], capture_output=True, text=True)
    assert run.returncode == 2 and "--fps" in run.stderr and run.stderr.count("\n") == 1


def test_missing_pyav_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ImportError, match=r"pip install 'zarrfeed\[video\]'"):
        lerobot_video.check_codec("libsvtav1")


KILLED = """
import sys, time
from zarrfeed.writer import lerobot_export
lerobot_export._MB = 1024  # sizes in KiB: several data and video files from a small source
append = lerobot_export._Export._append
def append_then_wait_at_the_fifth(self, entry):  # the kill lands mid-conversion on any machine, however loaded
    append(self, entry)
    if (self.partial / lerobot_export.JOURNAL).read_bytes().count(b"\\n") >= 5:
        time.sleep(120)
lerobot_export._Export._append = append_then_wait_at_the_fifth
lerobot_export.to_lerobot(sys.argv[1], sys.argv[2], fps=10, video_codec=sys.argv[3], data_files_size_in_mb=4,
                          video_files_size_in_mb=int(sys.argv[4]), durable=False)
"""


@pytest.mark.parametrize("codec, video_kib", [("lossless", 60), ("libsvtav1", 8)])
def test_killed_and_resumed_equals_an_uninterrupted_conversion(tmp_path, monkeypatch, codec, video_kib):
    source = tmp_path / "buffer.zarr"
    eps = episodes((12, 7, 30, 1, 16, 22, 9, 25))
    with DatasetWriter(source, replay_buffer_schema(KEYS), workers=0) as w:
        w.ingest(eps)
    monkeypatch.setattr(lerobot_export, "_MB", 1024)
    options = dict(fps=10, video_codec=codec, data_files_size_in_mb=4, video_files_size_in_mb=video_kib,
                   durable=False)
    to_lerobot(source, tmp_path / "whole", **options)
    out = tmp_path / "killed"
    journal = tmp_path / "killed.partial" / "journal.jsonl"
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(source), str(out), codec, str(video_kib)],
                             env=os.environ | {"SVT_LOG": "1"})
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and child.poll() is None:
            if journal.exists() and journal.read_bytes().count(b"\n") >= 5:  # settings and a few records
                break
            time.sleep(0.002)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert not out.exists() and journal.exists()
    with pytest.raises(FormatError, match="interrupted conversion"):
        to_lerobot(source, out, **options)
    summary = to_lerobot(source, out, resume=True, **options)
    assert 0 < summary["episodes"] < len(eps)
    whole = tmp_path / "whole"
    assert files(out) == files(whole) and len([f for f in files(whole) if f.endswith(".mp4")]) > 1
    assert len([f for f in files(whole) if f.startswith("data/")]) > 1
    for name in files(whole):
        if name.endswith(".parquet"):
            assert pq.read_table(out / name).equals(pq.read_table(whole / name)), name
            assert pq.read_schema(out / name).metadata == pq.read_schema(whole / name).metadata, name
        elif name.endswith(".json"):
            assert json.loads((out / name).read_text()) == json.loads((whole / name).read_text()), name
    assert np.array_equal(decoded(out), decoded(whole))  # (SVT-AV1 encodes the same frames to the same bytes)
    if codec == "lossless":
        assert np.array_equal(decoded(out), np.concatenate([e["image"] for e in eps]))


def test_a_file_half_assembled_is_redone(buffer, tmp_path, monkeypatch):
    """A crash while a video file was being joined (the file there but not recorded): resume joins it again."""
    real = lerobot_video.concatenate

    def crash(pieces, out):
        out.write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(lerobot_video, "concatenate", crash)
    with pytest.raises(KeyboardInterrupt):
        to_lerobot(buffer[0], tmp_path / "out", fps=10, video_codec="lossless")
    monkeypatch.setattr(lerobot_video, "concatenate", real)
    to_lerobot(buffer[0], tmp_path / "out", fps=10, video_codec="lossless", resume=True)
    assert not (tmp_path / "out.partial").exists()
    assert np.array_equal(decoded(tmp_path / "out"), np.concatenate([e["image"] for e in buffer[1]]))


def test_imported_back_to_a_replay_buffer(buffer, exported, tmp_path):
    _, eps = buffer
    lerobot_to_replay_buffer(exported, tmp_path / "back.zarr")
    back = Dataset.open(tmp_path / "back.zarr")
    assert back.read_rows("episodes", 0, 3)["end"].tolist() == np.cumsum(LENGTHS).tolist()
    for key in ("state", "action"):
        assert np.array_equal(back.read_rows(key, 0, sum(LENGTHS))[key], np.concatenate([e[key] for e in eps]))
    assert np.array_equal(back.read_rows("image", 0, sum(LENGTHS))["image"], decoded(exported))
    with pytest.raises(FormatError, match="already exists"):
        lerobot_to_replay_buffer(exported, tmp_path / "back.zarr")


def test_the_golden_dataset_imported_as_lerobot_decodes_it(tmp_path):
    run = subprocess.run([sys.executable, "-m", "zarrfeed", "convert", str(GOLDEN), str(tmp_path / "rb.zarr"),
                          "--to", "replay-buffer", "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    ds = Dataset.open(tmp_path / "rb.zarr")
    samples = np.load(GOLDEN.parent / "samples.npz")
    cam = ds.read_rows("observation_images_cam", 0, 153)["observation_images_cam"]
    assert np.array_equal(cam, samples["observation.images.cam"][:, 1].transpose(0, 2, 3, 1))
    data = pq.read_table(GOLDEN / "data/chunk-000/file-000.parquet").to_pydict()
    assert np.array_equal(ds.read_rows("observation_state", 0, 153)["observation_state"],
                          np.array(data["observation.state"], np.float32))
    run = subprocess.run([sys.executable, "-m", "zarrfeed", "convert", str(tmp_path / "rb.zarr"),
                          str(tmp_path / "again"), "--to", "lerobot", "--fps", "10", "--task", "pick", "-q"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert decoded(tmp_path / "again", "observation_images_cam").shape == (153, 48, 64, 3)


def test_an_opened_lerobot_dataset_imports_as_its_location_does(tmp_path):
    """The import reads through the in-place reader: a dataset `Dataset.open` made of the root imports as the
    root itself; replay-buffer keys hold no dots, so the features' are made "_" unless `names=` says."""
    lerobot_to_replay_buffer(GOLDEN, tmp_path / "path.zarr", keys=["observation.state", "observation.images.cam"])
    lerobot_to_replay_buffer(Dataset.open(GOLDEN), tmp_path / "opened.zarr", names={"action": "act"})
    by_path, opened = Dataset.open(tmp_path / "path.zarr"), Dataset.open(tmp_path / "opened.zarr")
    assert set(by_path.schema.tables) == {"episodes", "observation_state", "observation_images_cam"}
    assert set(opened.schema.tables) == {"episodes", "observation_state", "act", "observation_images_cam"}
    for key in ("episodes", "observation_state", "observation_images_cam"):
        assert np.array_equal(by_path.read_rows(key, 0, by_path.rows[key]), opened.read_rows(key, 0, opened.rows[key]))
    with pytest.raises(FormatError, match="not a LeRobot v3 dataset"):
        lerobot_to_replay_buffer(Dataset.open(tmp_path / "path.zarr"), tmp_path / "no.zarr")


def test_a_feature_not_read_is_refused_unless_left_out(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(GOLDEN, root)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.images.png"] = {"dtype": "image", "shape": [4, 4, 3], "names": None}
    (root / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(FormatError, match=r"feature 'observation.images.png' is of dtype 'image'.*keys="):
        lerobot_to_replay_buffer(root, tmp_path / "a.zarr")
    lerobot_to_replay_buffer(root, tmp_path / "b.zarr", keys=["action"])
    assert Dataset.open(tmp_path / "b.zarr").rows["action"] == 153


def test_what_lerobot_cannot_hold_is_refused_in_one_line(tmp_path):
    data = GOLDEN.parents[1]
    with pytest.raises(FormatError, match="episodes of steps"):
        to_lerobot(data / "l5kit_single_scene.zarr", tmp_path / "a", fps=10)
    with pytest.raises(ValueError, match=r"'keypoint': steps of shape \(9, 2\)"):
        to_lerobot(data / "dp_replay_small.zarr", tmp_path / "b", fps=10)
    to_lerobot(data / "dp_replay_small.zarr", tmp_path / "c", fps=10, keys=["state", "n_contacts"])
    info = json.loads((tmp_path / "c/meta/info.json").read_text())
    assert info["features"]["n_contacts"]["shape"] == [1] and info["video_path"] is None
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.partial").exists()


@pytest.mark.skipif(not LEROBOT_PYTHON, reason="ZARRFEED_LEROBOT_PYTHON: no Python with LeRobot given")
@pytest.mark.parametrize("codec", ["libsvtav1", "lossless"])
def test_lerobots_own_reader_opens_it(buffer, tmp_path, monkeypatch, codec):
    """LeRobot's `LeRobotDataset` reads what zarrfeed writes (several data and video files): tabular values
    equal, frames within the codec's loss (lossless: equal)."""
    monkeypatch.setattr(lerobot_export, "_MB", 1024)
    to_lerobot(buffer[0], tmp_path / "out", fps=10, task="push", video_codec=codec, data_files_size_in_mb=4,
               video_files_size_in_mb=30)
    run = subprocess.run([str(LEROBOT_PYTHON), str(SUPPORT / "lerobot_opens.py"), str(tmp_path / "out"),
                          str(tmp_path / "got.npz")], capture_output=True, text=True,
                         env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1",
                                           "HF_HOME": str(tmp_path / "hf")})
    assert run.returncode == 0, run.stderr[-2000:]
    got, eps = np.load(tmp_path / "got.npz"), buffer[1]
    for key in ("state", "action"):
        assert np.array_equal(got[key], np.concatenate([e[key] for e in eps]))
    assert got["tasks"].tolist() == ["push"]
    frames = np.concatenate([e["image"] for e in eps])
    if codec == "lossless":
        assert np.array_equal(got["image"], frames)
    else:
        assert np.array_equal(got["image"], decoded(tmp_path / "out"))  # LeRobot decodes as zarrfeed does


def test_a_journal_cut_short_is_taken_up(buffer, tmp_path):
    """A kill while a journal line was written leaves half a line: resume drops it (and redoes that episode);
    one while its first line (the settings) was written leaves nothing to keep: resume starts over."""
    out = tmp_path / "out"
    to_lerobot(buffer[0], tmp_path / "whole", fps=10, video_codec="lossless")
    (tmp_path / "out.partial").mkdir()
    (tmp_path / "out.partial" / "journal.jsonl").write_bytes(b'{"settings": {"ident')
    to_lerobot(buffer[0], out, fps=10, video_codec="lossless", resume=True)
    journal = []

    def stop_after_two(self, entry):
        journal.append(entry)
        real(self, entry)
        if len(journal) == 3:
            raise KeyboardInterrupt

    real = lerobot_export._Export._append
    with pytest.MonkeyPatch.context() as m:
        m.setattr(lerobot_export._Export, "_append", stop_after_two)
        with pytest.raises(KeyboardInterrupt):
            to_lerobot(buffer[0], tmp_path / "again", fps=10, video_codec="lossless")
    lines = (tmp_path / "again.partial" / "journal.jsonl").read_bytes()
    (tmp_path / "again.partial" / "journal.jsonl").write_bytes(lines[:-40])  # the second record cut short
    summary = to_lerobot(buffer[0], tmp_path / "again", fps=10, video_codec="lossless", resume=True)
    assert summary["episodes"] == 2
    for root in (out, tmp_path / "again"):
        assert files(root) == files(tmp_path / "whole")
        assert pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").equals(
            pq.read_table(tmp_path / "whole/meta/episodes/chunk-000/file-000.parquet"))
        assert np.array_equal(decoded(root), decoded(tmp_path / "whole"))


def test_frames_a_codec_cannot_encode_and_no_keys_are_refused_before_anything_is_written(tmp_path):
    source = tmp_path / "odd.zarr"
    with DatasetWriter(source, replay_buffer_schema({"image": (np.uint8, (95, 97, 3))}), workers=0) as w:
        w.ingest([{"image": np.zeros((3, 95, 97, 3), np.uint8)}])
    with pytest.raises(ValueError, match=r"key 'image': frames of 95x97 .* video codec 'h264' \(libx264 in yuv420p "
                                         "needs an even height and width\\)"):
        to_lerobot(source, tmp_path / "out", fps=10, video_codec="h264")
    with pytest.raises(ValueError, match="keys: none given"):
        to_lerobot(source, tmp_path / "out", fps=10, keys=[])
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    run = subprocess.run([sys.executable, "-m", "zarrfeed", "convert", str(source), str(tmp_path / "out"), "--to",
                          "lerobot", "--fps", "10", "--video-codec", "h264"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "even height and width" in run.stderr, run.stderr
    to_lerobot(source, tmp_path / "out", fps=10, video_codec="lossless")  # (odd sizes are fine in RGB)
    assert Dataset.open(tmp_path / "out").validate().ok


def test_a_conversion_in_progress_is_never_taken_up_by_another(buffer, tmp_path, monkeypatch):
    import fcntl

    real = lerobot_export._Export._episode

    def stop_after_one(self, i):
        if i == 1:
            raise KeyboardInterrupt
        real(self, i)

    monkeypatch.setattr(lerobot_export._Export, "_episode", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        to_lerobot(buffer[0], tmp_path / "out", fps=10, video_codec="lossless")
    monkeypatch.setattr(lerobot_export._Export, "_episode", real)
    held = os.open(tmp_path / "out.partial", os.O_RDONLY)  # another conversion writing into it
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        for resume in (True, False):
            with pytest.raises(FormatError, match="another conversion is writing into out now"):
                to_lerobot(buffer[0], tmp_path / "out", fps=10, video_codec="lossless", resume=resume)
    finally:
        os.close(held)
    assert to_lerobot(buffer[0], tmp_path / "out", fps=10, video_codec="lossless", resume=True)["episodes"] == 2


def test_resuming_a_finished_conversion_finishes_at_once(buffer, exported):
    done = to_lerobot(Dataset.open(buffer[0]), exported, fps=10, task="push the block", resume=True)
    assert done["episodes"] == 0 and done["path"] == str(exported)
    for other in ({"fps": 11, "task": "push the block"}, {"fps": 10, "task": "another"}):
        with pytest.raises(FileExistsError, match="not as this conversion's output"):
            to_lerobot(buffer[0], exported, resume=True, **other)


def test_an_import_of_no_keys_or_from_an_unreadable_url_is_refused_in_one_line(tmp_path):
    """(The import reads through the in-place reader, so a URL is read where it lies: one it cannot read is one
    line, exit 2, nothing written.)"""
    with pytest.raises(ValueError, match="keys: none given"):
        lerobot_to_replay_buffer(GOLDEN, tmp_path / "rb.zarr", keys=[])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    run = subprocess.run([sys.executable, "-m", "zarrfeed", "convert", "s3://bucket/root", str(tmp_path / "rb.zarr"),
                          "--to", "replay-buffer"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "rb.zarr").exists()


def test_a_lerobot_source_is_written_at_its_own_frame_rate(tmp_path):
    keys = ["observation.state", "action"]
    with pytest.raises(ValueError, match="fps=30: the source is a LeRobot dataset of 10 fps"):
        to_lerobot(Dataset.open(GOLDEN), tmp_path / "out", fps=30, keys=keys)
    with pytest.raises(ValueError, match=r"key 'timestamp': a column LeRobot writes itself; .* \(keys=, --keys\)"):
        to_lerobot(Dataset.open(GOLDEN), tmp_path / "out", fps=10)
    to_lerobot(Dataset.open(GOLDEN), tmp_path / "out", fps=10, keys=keys)
    assert Dataset.open(tmp_path / "out").validate().ok


def test_an_import_of_a_truncated_video_names_file_camera_and_episode(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(GOLDEN, root)
    video = root / "videos/observation.images.cam/chunk-000/file-000.mp4"
    video.write_bytes(video.read_bytes()[:video.stat().st_size // 2])
    with pytest.raises(ChunkError, match=r"camera 'observation.images.cam', videos/observation.images.cam/"
                                         r"chunk-000/file-000.mp4, episode 1: cannot be decoded at "):
        lerobot_to_replay_buffer(root, tmp_path / "rb.zarr")
