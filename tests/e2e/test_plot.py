"""`zarrfeed plot` and zarrfeed.plot draw what the dataset holds: checked against the rows read with the zarr v2
format layer (not the loader), on the real L5Kit scene and on synthetic scenes; bad input and a missing matplotlib
are one line."""
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.image import imread
from zarrfeed.loader import Dataset

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group
from zarrfeed.plot import scene_figure, summarize, summary_figure


def zarrfeed(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "zarrfeed", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_the_scene_from_above_is_the_scene(real_scene):
    g = Group.open(DirectoryStore(real_scene))
    frames, agents, faces = g["frames"][:], g["agents"][:], g["traffic_light_faces"][:]
    fig = scene_figure(Dataset.open(real_scene), scene=0, frame=60)
    top, bottom = fig.axes[:2]
    # every track once, under the label its rows name most often (counted here with plain Python)
    frame_of = np.repeat(np.arange(len(frames)), np.diff(frames["agent_index_interval"], axis=1).ravel())
    labels_of_track: dict[int, list[int]] = {}
    for row, tid in enumerate(agents["track_id"].tolist()):
        labels_of_track.setdefault(tid, []).append(int(agents["label_probabilities"][row].argmax()))
    expected = Counter(max(sorted(set(ls)), key=ls.count) for ls in labels_of_track.values())
    names = [n.removeprefix("PERCEPTION_LABEL_") for n in g.attrs["labels"]]
    drawn = {c.get_label(): len(c.get_segments()) for c in top.collections if isinstance(c, LineCollection)}
    assert drawn == {f"{names[k]} ({n} tracks)": n for k, n in expected.items()}
    assert sum(drawn.values()) == len(np.unique(agents["track_id"])) == 1653
    # a track's points are its centroids in frame order
    tid = int(agents["track_id"][0])
    mine = np.flatnonzero(agents["track_id"] == tid)
    track = agents["centroid"][mine[np.argsort(frame_of[mine], kind="stable")]]
    assert any(len(seg) == len(track) and np.array_equal(seg, track)
               for c in top.collections if isinstance(c, LineCollection) for seg in c.get_segments())
    ego = {line.get_label(): line.get_xydata() for line in top.lines}
    assert np.array_equal(ego["ego path"], frames["ego_translation"][:, :2])
    assert np.array_equal(ego["ego, frames 50 to 110 (window of frame 60)"], frames["ego_translation"][50:111, :2])
    points = {c.get_label(): c.get_offsets() for c in top.collections if isinstance(c, PathCollection)}
    a, b = frames["agent_index_interval"][60]
    assert np.array_equal(points["agents at frame 60"], agents["centroid"][a:b])
    assert np.array_equal(points["ego at frame 60"], frames["ego_translation"][60:61, :2])
    # the faces: each row of the table once, by its status
    status = Counter(faces["traffic_light_face_status"].argmax(axis=1).tolist())
    drawn_faces = {c.get_label(): len(c.get_offsets()) for c in bottom.collections if isinstance(c, PathCollection)}
    assert drawn_faces == {f"active ({status[0]})": status[0], f"inactive ({status[1]})": status[1],
                           f"unknown ({status[2]})": status[2]}
    assert sum(drawn_faces.values()) == len(faces) == 3216


def test_the_summary_counts_what_the_tables_hold(small_dataset):
    path = small_dataset(3, 5)
    g = Group.open(DirectoryStore(path))
    scenes, frames, agents = g["scenes"][:], g["frames"][:], g["agents"][:]
    s = summarize(Dataset.open(path))
    per_frame = frames["agent_index_interval"][:, 1] - frames["agent_index_interval"][:, 0]
    assert s.agents_per_frame.tolist() == per_frame.tolist()
    for i, (f0, f1) in enumerate(scenes["frame_index_interval"].tolist()):
        assert s.frames_per_scene[i] == f1 - f0
        rows, faces = frames["agent_index_interval"], frames["traffic_light_faces_index_interval"]
        assert s.agents_per_scene[i] == rows[f1 - 1, 1] - rows[f0, 0]
        assert s.faces_per_scene[i] == faces[f1 - 1, 1] - faces[f0, 0]
    assert s.label_rows.tolist() == np.bincount(agents["label_probabilities"].argmax(1), minlength=17).tolist()
    fig = summary_figure(Dataset.open(path))
    shares = fig.axes[2]
    widths = sorted(round(p.get_width(), 9) for p in shares.patches)
    assert widths == sorted(round(n / len(agents), 9) for n in s.label_rows if n)


def test_zarrfeed_plot_writes_pngs(real_scene, tmp_path):
    r = zarrfeed("plot", real_scene, "--scene", "0", "--out", tmp_path / "scene.png", "--dpi", "50")
    assert r.returncode == 0 and r.stdout == f"wrote {tmp_path / 'scene.png'}\n", r.stderr
    assert imread(tmp_path / "scene.png").shape[:2] == (500, 450)  # figsize 9 x 10 inches at 50 dpi
    r = zarrfeed("plot", real_scene, "--summary", "--dpi", "50", cwd=tmp_path)
    assert r.returncode == 0 and imread(tmp_path / "summary.png").shape[:2] == (450, 500), r.stderr


@pytest.mark.parametrize("args, message", [
    (["--scene", "1"], "--scene 1: {path} has 1 scene (0 to 0)"),
    (["--scene", "0", "--frame", "248"], "--frame 248: scene 0 holds frames 0 to 247"),
    ([], "plot: give --scene N (a scene from above) or --summary (the dataset at a glance)"),
    (["--scene", "0", "--summary"],
     "plot: give one of --scene N (a scene from above) or --summary (the dataset at a glance)"),
])
def test_bad_requests_are_one_line(real_scene, tmp_path, args, message):
    r = zarrfeed("plot", real_scene, *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == f"zarrfeed: error: {message.format(path=real_scene)}\n"
    assert not list(tmp_path.iterdir())


def test_a_missing_chunk_is_named_not_drawn_as_zeros(small_dataset, tmp_path):
    path = tmp_path / "d.zarr"
    shutil.copytree(small_dataset(3, 5), path)
    (path / "agents" / "0").unlink()
    r = zarrfeed("plot", path, "--summary", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "chunk 'agents/0' (rows 0-20,000) is missing" in r.stderr
    assert "Traceback" not in r.stderr


def test_without_matplotlib_the_command_says_what_to_install(real_scene, tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"  # as if it were not installed
            "from zarrfeed.cli import main\n"
            f"sys.exit(main(['plot', {str(real_scene)!r}, '--summary']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == "zarrfeed: error: drawing needs matplotlib: pip install 'zarrfeed[plot]'\n"


def test_a_dataset_without_scenes_is_said_not_drawn_empty(tmp_path):
    from zarrfeed.writer import write_dataset
    write_dataset(tmp_path / "e.zarr", [], workers=0)
    r = zarrfeed("plot", tmp_path / "e.zarr", "--summary", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().endswith("has no scenes to draw"), r.stderr
    assert not (tmp_path / "summary.png").exists()
