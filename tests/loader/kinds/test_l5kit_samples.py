"""AgentSampleLoader, EgoSampleLoader and the agents mask against what L5Kit 1.5.0 returns on the real scene
(../shared/data/l5kit_samples_h10_f50.npz), as stored and converted to zarr v3 and back, and against plain
per-sample Python on synthetic data."""
import math
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group
from repo_paths import REAL_SCENE
from zarrfeed.loader import AgentSampleLoader, Dataset, EgoSampleLoader
from zarrfeed.loader.kinds import agents_mask
from zarrfeed.loader.kinds.motion import (AGENT_FIELDS, FRAME_FIELDS, AgentPool, Context, Steps, agent_samples,
                                    ego_samples)
from zarrfeed.writer import DatasetWriter, synthetic

L5KIT = REAL_SCENE.parent / "l5kit_samples_h10_f50.npz"
# "Equal to L5Kit": the goldens were made by L5Kit's own code on one CPU, and numpy's float64 kernels differ
# between CPUs in the last bits (L5Kit itself, run on another machine, differs from them: agents'
# history_positions by up to 1.2e-10, agent_from_world by 4.5e-13; float32 fields by one rounding of the float64
# value). So floats are compared within |got - L5Kit| <= ATOL + RTOL * |L5Kit|: 1e-9 (a nanometre, a nanoradian)
# plus 2.5e-7 relative for float32 fields (two float32 roundings) and 1e-12 for float64 ones. That still fails a
# wrong formula (test_the_tolerance_still_fails_a_wrong_formula: a 1e-6 shift, a swapped sign). Integer fields
# and the availabilities (flags) are compared exactly. On the machine that made the goldens they are equal bit
# for bit (docs/guides/l5kit.md).
ATOL = 1e-9
RTOL = {np.dtype(np.float32): 2.5e-7, np.dtype(np.float64): 1e-12}


@pytest.fixture(scope="module")
def l5kit(real_scene):
    return dict(np.load(L5KIT))


@pytest.fixture(scope="module", params=["stored", "v2-v3-v2"])
def scene(request, real_scene, tmp_path_factory):
    """The real scene as stored, and converted to sharded zarr v3 and back to v2 (`zarrfeed.convert`): L5Kit's
    numbers hold on both."""
    if request.param == "stored":
        return real_scene
    from zarrfeed import convert

    folder = tmp_path_factory.mktemp("round_trip")
    convert(real_scene, folder / "v3.zarr", zarr_format=3, workers=0)
    convert(folder / "v3.zarr", folder / "v2.zarr", zarr_format=2, workers=0)
    return folder / "v2.zarr"


def _equal_to_l5kit(kind, got, ref):
    for key in [k.split("/", 1)[1] for k in ref if k.startswith(kind + "/")]:
        want, have = ref[f"{kind}/{key}"], got[key]
        assert have.dtype == want.dtype and have.shape == want.shape, (kind, key, have.dtype, have.shape)
        if want.dtype.kind == "f" and not key.endswith("availabilities"):
            np.testing.assert_allclose(have, want, rtol=RTOL[want.dtype], atol=ATOL, err_msg=f"{kind}/{key}")
        else:
            np.testing.assert_array_equal(have, want, err_msg=f"{kind}/{key}")


def test_numerics_equal_l5kit(scene, l5kit):
    g = Group.open(DirectoryStore(scene))
    frames, agents = g["frames"][:], g["agents"][:]
    ctx = Context(0, {f: frames[f] for f in FRAME_FIELDS}, 0, {f: agents[f] for f in AGENT_FIELDS})
    steps = Steps(10, 50, 0.1)
    t = l5kit["ego_frames"]
    zero = np.zeros_like(t)
    _equal_to_l5kit("ego", ego_samples(ctx, t, zero, zero, zero + 248, steps), l5kit)
    t = l5kit["agent_frames"]
    zero = np.zeros_like(t)
    got = agent_samples(ctx, l5kit["agent_rows"], t, zero, zero, zero + 248, steps)
    assert (got["track_id"] == l5kit["agent_track_ids"]).all()
    _equal_to_l5kit("agents", got, l5kit)


def test_the_tolerance_still_fails_a_wrong_formula(real_scene, l5kit):
    """The comparison above is not loose: L5Kit's own values pass it, and a shift of 1e-6 (absolute in a float64
    field, relative in a float32 one, each far below anything a model would notice), a swapped sign or a
    sample off by one frame fails it."""
    want = {k.split("/", 1)[1]: v for k, v in l5kit.items() if k.startswith("agents/")}
    _equal_to_l5kit("agents", want, l5kit)
    wrong = {"shifted 1e-6": lambda k, v: v + 1e-6 if v.dtype == np.float64 else v,
             "scaled by 1 + 1e-6": lambda k, v: (v * (1 + 1e-6)).astype(v.dtype) if v.dtype == np.float32 else v,
             "yaw sign swapped": lambda k, v: -v if k in ("yaw", "history_yaws", "target_yaws") else v,
             "one frame late": lambda k, v: np.roll(v, 1, axis=1) if k == "target_positions" else v}
    for name, change in wrong.items():
        for key in want:
            changed = change(key, want[key])
            if changed is want[key]:
                continue
            try:
                _equal_to_l5kit("agents", {**want, key: changed}, l5kit)
            except AssertionError:
                continue
            pytest.fail(f"agents/{key} {name} passed as L5Kit's")


def test_mask_equals_l5kit(scene, l5kit):
    mask = agents_mask.compute(Dataset.open(scene), 0.5, workers=0)
    assert mask.dtype == np.uint32
    np.testing.assert_array_equal(mask, l5kit["agents_mask"])
    np.testing.assert_array_equal(agents_mask.selected_rows(mask), l5kit["agent_rows"])


def _epoch(loader):
    batches = list(loader)
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.mark.parametrize("workers", [0, 2])
def test_loaders_equal_l5kit(scene, l5kit, workers):
    with AgentSampleLoader(scene, 10, 50, batch_size=32, num_workers=workers, copy=True) as loader:
        got = _epoch(loader)
    order = np.argsort(got["agent_row"])
    np.testing.assert_array_equal(got["agent_row"][order], l5kit["agent_rows"])  # every sample of L5Kit's, once
    np.testing.assert_array_equal(got["frame_row"][order], l5kit["agent_frames"])
    np.testing.assert_array_equal(got["track_id"][order], l5kit["agent_track_ids"])
    _equal_to_l5kit("agents", {k: v[order] for k, v in got.items()}, l5kit)
    with EgoSampleLoader(scene, 10, 50, batch_size=32, num_workers=workers, copy=True) as loader:
        got = _epoch(loader)
    order = np.argsort(got["frame_row"])
    np.testing.assert_array_equal(got["frame_row"][order], l5kit["ego_frames"])  # all 248 frames, edges included
    assert (got["frame_index"][order] == np.arange(248)).all() and (got["scene_index"] == 0).all()
    _equal_to_l5kit("ego", {k: v[order] for k, v in got.items()}, l5kit)


# ------------------------------------------------------------------ synthetic data, plain Python per sample

@pytest.fixture(scope="module")
def scenes(small_dataset):
    return small_dataset(6, 21, chunks={"agents": 3000, "frames": 100, "traffic_light_faces": 500}, frames=80,
                         agents_per_frame=60)


def _l5kit_loop_mask(path, th=0.5):
    """L5Kit's get_valid_agents, its loop transcribed (one scene at a time, a dict of tracks)."""
    g = Group.open(DirectoryStore(path))
    scenes, frames, agents = g["scenes"][:], g["frames"][:], g["agents"][:]
    keep = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    mask = np.zeros((len(agents), 2), np.int64)

    def update(lst):
        for i, (_, row, _) in enumerate(lst):
            mask[row] = (i, len(lst) - i - 1)

    for f0, f1 in scenes["frame_index_interval"].tolist():
        tracks = defaultdict(list)
        for fi in range(f0, f1):
            frame = frames[fi]
            for row in range(*frame["agent_index_interval"]):
                a = agents[row]
                lst = tracks[int(a["track_id"])]
                lst.append((fi, row, a))
                if not a["label_probabilities"][keep].sum() > th or \
                        not math.dist(frame["ego_translation"][:2], a["centroid"]) < 50:
                    update(lst[:-1])
                    tracks[int(a["track_id"])] = []
                    continue
                if len(lst) > 1:
                    pf, _, p = lst[-2]
                    d = abs((float(a["yaw"] - p["yaw"]) + math.pi) % (2 * math.pi) - math.pi) * 180 / math.pi
                    a1, a2 = float(p["extent"][0] * p["extent"][1]), float(a["extent"][0] * a["extent"][1])
                    ratio_ok = a1 >= 0.01 and a2 >= 0.01 and max(a1, a2) / min(a1, a2) < 1.1
                    if fi != pf + 1 or not d < 30 or not ratio_ok:
                        update(lst[:-1])
                        tracks[int(a["track_id"])] = lst[-1:]
        for lst in tracks.values():
            update(lst)
    return mask


def test_mask_equals_l5kits_loop_on_many_scenes(scenes):
    ds = Dataset.open(scenes)
    mask = agents_mask.compute(ds, 0.5, workers=2)  # parts of scenes in two processes
    np.testing.assert_array_equal(mask, _l5kit_loop_mask(scenes))
    np.testing.assert_array_equal(mask, agents_mask.compute(ds, 0.5, workers=0))
    assert 0 < len(agents_mask.selected_rows(mask)) < len(mask)


def _plain_sample(frames, agents, scenes, row, t, h, f, dt):
    """One agent sample by per-frame Python: the track's rows in the frames around t, in the row's frame."""
    s0, s1 = next((a, b) for a, b in scenes.tolist() if a <= t < b)
    me = agents[row]
    c, s = math.cos(float(me["yaw"])), math.sin(float(me["yaw"]))
    out = {}
    for name, offsets in (("history", range(0, -h - 1, -1)), ("target", range(1, f + 1))):
        pos, yaw, avail = [], [], []
        for d in offsets:
            fi = t + d
            hit = None
            if s0 <= fi < s1:
                lo, hi = frames[fi]["agent_index_interval"]
                ids = np.flatnonzero(agents["track_id"][lo:hi] == me["track_id"])
                hit = agents[lo + ids[0]] if len(ids) else None
            if hit is None:
                pos.append((0.0, 0.0)), yaw.append(0.0), avail.append(0.0)
                continue
            dx, dy = hit["centroid"] - me["centroid"]
            pos.append((c * dx + s * dy, -s * dx + c * dy))
            yaw.append((float(hit["yaw"]) - float(me["yaw"]) + math.pi) % (2 * math.pi) - math.pi)
            avail.append(1.0)
        out[f"{name}_positions"], out[f"{name}_yaws"] = np.array(pos), np.array(yaw)[:, None]
        out[f"{name}_availabilities"] = np.array(avail)
    fut = out["target_positions"]
    out["target_velocities"] = np.diff(np.vstack([[0, 0], fut]), axis=0) / dt
    out["history_velocities"] = -np.diff(out["history_positions"], axis=0) / dt
    return out


@pytest.mark.parametrize("h,f", [(3, 7), (0, 5), (12, 1)])
def test_agent_samples_follow_their_tracks(scenes, h, f):
    g = Group.open(DirectoryStore(scenes))
    frames, agents = g["frames"][:], g["agents"][:]
    bounds = g["scenes"][:]["frame_index_interval"]
    with AgentSampleLoader(scenes, h, f, step_time=0.2, batch_size=50, num_workers=2, copy=True) as loader:
        got = _epoch(loader)
    mask = agents_mask.compute(Dataset.open(scenes), workers=0)
    assert sorted(got["agent_row"].tolist()) == agents_mask.selected_rows(mask).tolist()
    assert got["target_positions"].shape == (len(got["agent_row"]), f, 2)
    assert got["history_velocities"].shape == (len(got["agent_row"]), h, 2)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(got["agent_row"]), 60, replace=False):
        want = _plain_sample(frames, agents, bounds, int(got["agent_row"][i]), int(got["frame_row"][i]), h, f, 0.2)
        for key, value in want.items():
            np.testing.assert_allclose(got[key][i], value, rtol=1e-5, atol=1e-4, err_msg=key)
    # the edges: frames past the scene's end or before its start are unavailable (such samples exist here)
    end, start = bounds[got["scene_index"], 1], bounds[got["scene_index"], 0]
    past_end = got["frame_row"][:, None] + np.arange(1, f + 1) >= end[:, None]
    before = got["frame_row"][:, None] - np.arange(0, h + 1) < start[:, None]
    assert past_end.any() or before.any()
    assert (got["target_availabilities"][past_end] == 0).all() and (got["history_availabilities"][before] == 0).all()


def test_agent_samples_are_the_same_whatever_a_workers_pool_holds(scenes, monkeypatch):
    """A batch's agent samples are computed over all its groups in one pass (`motion.AgentPool`). Whatever the
    pool holds (a pool of one row: every new group drops the others, moves the batch's together and grows the
    arrays; the whole table as one window), every sample equals `agent_samples` on a context of the whole
    dataset (a float tolerance of 1e-6 relative, the same code on both sides)."""
    from zarrfeed.loader.kinds import l5kit_samples as sample_loaders

    g = Group.open(DirectoryStore(scenes))
    frames, agents = g["frames"][:], g["agents"][:]
    cols = {f: frames[f] for f in FRAME_FIELDS}
    whole = Context(0, cols, 0, {**{f: agents[f] for f in AGENT_FIELDS},
                                 "passing": agents_mask.of_interest(agents["label_probabilities"], 0.5)})
    bounds = g["scenes"][:]["frame_index_interval"]

    def epoch(**options):
        options = {"batch_size": 50, **options}
        with AgentSampleLoader(scenes, 3, 7, num_workers=0, copy=True, **options) as loader:
            got = _epoch(loader)
        order = np.argsort(got["agent_row"])
        return {k: v[order] for k, v in got.items()}

    runs = {"default": epoch(), "whole table": epoch(shuffle_bytes=1 << 30)}
    monkeypatch.setattr(sample_loaders, "_pool_rows", lambda samples, config: 1)
    runs["a pool of one row"] = epoch(shuffle_bytes=1 << 30)
    runs["a pool of one row, shuffle_window=2"] = epoch(shuffle_window=2)  # batches of 2 of the 10 groups
    runs["a pool of one row, in row order"] = epoch(shuffle=False, batch_size=1)  # every group dropped in turn
    monkeypatch.setattr(AgentPool, "SHIFT", 59)  # insertion numbers run out after 8 groups: renumbered
    runs["8 insertion numbers"] = epoch(shuffle_window=2)
    rows, t = runs["default"]["agent_row"], runs["default"]["frame_row"]
    scene = np.searchsorted(bounds[:, 1], t, side="right")
    want = agent_samples(whole, rows, t, scene, bounds[scene, 0], bounds[scene, 1], Steps(3, 7))
    for run, got in runs.items():
        assert set(got) == set(want) and len(got["agent_row"]) == len(rows) > 100, run
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=0, err_msg=f"{run}: {key}")


def test_every_samples_availabilities_are_its_tracks_at_chunk_edges(small_dataset):
    """Small chunks (16 frames, 160 agents), so that groups of samples end at many chunk edges, and every
    sample checked (not a draw): each target and history availability is whether the sample's track has a
    row in that frame of its scene, found by brute force from the raw tables. A group that reads one frame too
    few past its last sample's t + future loses that frame's availability."""
    path = small_dataset(2, 31, chunks={"agents": 160, "frames": 16, "traffic_light_faces": 500}, frames=80,
                         agents_per_frame=10)
    g = Group.open(DirectoryStore(path))
    frames, agents = g["frames"][:], g["agents"][:]
    bounds = g["scenes"][:]["frame_index_interval"]
    h, f = 3, 5
    with AgentSampleLoader(path, h, f, min_history=0, shuffle=False, batch_size=64, num_workers=1,
                           copy=True) as loader:
        got = _epoch(loader)
    assert len(got["agent_row"]) == len(loader.samples) > 0
    for name, offsets in (("target", range(1, f + 1)), ("history", range(0, -h - 1, -1))):
        want = np.zeros((len(got["agent_row"]), len(offsets)), np.float32)
        for i, (row, t) in enumerate(zip(got["agent_row"].tolist(), got["frame_row"].tolist(), strict=True)):
            s0, s1 = next((a, b) for a, b in bounds.tolist() if a <= t < b)
            track = agents["track_id"][row]
            for j, d in enumerate(offsets):
                if s0 <= t + d < s1:
                    lo, hi = frames[t + d]["agent_index_interval"]
                    want[i, j] = float((agents["track_id"][lo:hi] == track).any())
        wrong = np.flatnonzero((got[f"{name}_availabilities"] != want).any(axis=1))
        assert not len(wrong), f"{len(wrong)} samples' {name} availabilities are wrong, e.g. agent rows " \
                               f"{got['agent_row'][wrong[:5]].tolist()}"


def test_ego_samples_every_frame_with_partial_windows(scenes):
    g = Group.open(DirectoryStore(scenes))
    frames = g["frames"][:]
    bounds = g["scenes"][:]["frame_index_interval"]
    with EgoSampleLoader(scenes, 4, 6, batch_size=64, num_workers=2, copy=True) as loader:
        got = _epoch(loader)
    order = np.argsort(got["frame_row"])
    got = {k: v[order] for k, v in got.items()}
    assert (got["frame_row"] == np.arange(len(frames))).all()
    for t in (0, 3, 40, 79, 80, 479):
        s0, s1 = next((a, b) for a, b in bounds.tolist() if a <= t < b)
        want = [1.0 if s0 <= t + d < s1 else 0.0 for d in range(1, 7)]
        assert got["target_availabilities"][t].tolist() == want
        rot = frames["ego_rotation"][t]
        yaw = math.atan2(rot[1, 0], rot[0, 0])
        for j, d in enumerate(range(1, 7)):
            if want[j]:
                dx, dy = frames["ego_translation"][t + d][:2] - frames["ego_translation"][t][:2]
                xy = (math.cos(yaw) * dx + math.sin(yaw) * dy, -math.sin(yaw) * dx + math.cos(yaw) * dy)
                np.testing.assert_allclose(got["target_positions"][t, j], xy, rtol=1e-5, atol=1e-4)
        assert got["frame_index"][t] == t - s0 and got["timestamp"][t] == frames["timestamp"][t]


def test_same_batches_for_any_workers_resume_and_ranks(scenes):
    def run(workers, state=None, **kw):
        with AgentSampleLoader(scenes, 3, 4, batch_size=40, num_workers=workers, seed=3, **kw) as loader:
            if state:
                loader.load_state_dict(state)
            return [b["agent_row"].copy() for b in loader]

    base = run(0)
    assert all((a == b).all() for a, b in zip(run(2), base, strict=True))
    with AgentSampleLoader(scenes, 3, 4, batch_size=40, num_workers=2, seed=3) as loader:
        it = iter(loader)
        for _ in range(7):
            next(it)
        state = loader.state_dict()
    assert all((a == b).all() for a, b in zip(run(2, state), base[7:], strict=True))
    with pytest.raises(ValueError, match="history=3; this loader has history=4"):
        AgentSampleLoader(scenes, 4, 4, batch_size=40, seed=3).load_state_dict(state)
    parts = [np.concatenate(run(1, rank=r, world_size=2, drop_last=True)) for r in range(2)]
    assert len(parts[0]) == len(parts[1]) and not set(parts[0].tolist()) & set(parts[1].tolist())


def test_rows_select_agents_and_to_torch(scenes):
    torch = pytest.importorskip("torch")
    rows = np.array([5, 17, 400, 9000])
    with AgentSampleLoader(scenes, 2, 3, rows=rows, batch_size=3, num_workers=0) as loader:
        batches = list(loader.to_torch())
    assert sorted(int(r) for b in batches for r in b["agent_row"]) == rows.tolist()
    assert batches[0]["target_positions"].dtype == torch.float32 and batches[0]["target_positions"].shape == (3, 3, 2)


def test_mask_is_stored_for_l5kit_and_refused_after_a_commit(scenes, tmp_path):
    import shutil
    path = tmp_path / "m.zarr"
    shutil.copytree(scenes, path)
    out = subprocess.run([sys.executable, "-m", "zarrfeed", "mask", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "agents_mask/0.5" in out.stdout
    stored = Group.open(DirectoryStore(path))["agents_mask"]["0.5"]  # where L5Kit's AgentDataset reads it
    ds = Dataset.open(path)
    np.testing.assert_array_equal(stored[:], agents_mask.compute(ds, workers=0))
    mask, why = agents_mask.load(ds, 0.5)
    assert mask is not None and why == "agents_mask/0.5"
    assert ds.validate().ok and ds.verify().ok  # the tables and their commit are untouched
    with DatasetWriter(path, mode="a", workers=0) as w:
        w.submit(next(synthetic.episodes(1, seed=99, frames=80, agents_per_frame=60)))
    ds = Dataset.open(path)
    mask, why = agents_mask.load(ds, 0.5)
    assert mask is None and "the dataset has 33663 agents (run `zarrfeed mask` again)" in why
    agents_mask.save(ds, agents_mask.compute(ds), 0.5)
    assert agents_mask.load(ds, 0.5)[0] is not None
    attrs = Group.open(DirectoryStore(path))["agents_mask"]["0.5"].attrs  # read and written at each use
    record = dict(attrs["zarrfeed"])
    assert record["commit"] == ds.commit and record["agents"] == 33663
    attrs["zarrfeed"] = dict(record, commit=record["commit"] - 1)
    mask, why = agents_mask.load(ds, 0.5)  # a mask of an earlier commit with as many agents: still refused
    assert mask is None and f"computed for commit={record['commit'] - 1}" in why
    del attrs["zarrfeed"]  # as L5Kit writes it: no record
    assert agents_mask.load(ds, 0.5)[0] is None
    with AgentSampleLoader(path, 3, 4, num_workers=0) as loader:  # computes the current mask instead
        assert len(loader.samples) == len(agents_mask.selected_rows(agents_mask.compute(Dataset.open(path))))


def test_mask_command_errors_are_one_line(tmp_path, real_zip):
    out = subprocess.run([sys.executable, "-m", "zarrfeed", "mask", str(tmp_path / "nope.zarr")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "zarrfeed", "mask", str(real_zip)], capture_output=True, text=True)
    assert out.returncode == 2 and "read-only" in out.stderr and "Traceback" not in out.stderr


def test_mask_on_a_read_only_dataset_is_one_line_and_changes_nothing(scenes, tmp_path):
    """`zarrfeed mask` on a read-only dataset (a read-only bind mount: real EROFS, even for root)
    printed zarr's KeyError traceback, after computing the whole mask. One line, before the work; a mask stored
    earlier is left as it was, and still read."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    shutil.copytree(scenes, src / "d.zarr")
    ds = Dataset.open(src / "d.zarr")
    agents_mask.save(ds, agents_mask.compute(ds, 0.5, workers=0), 0.5)  # a mask stored while it was writable
    before = sorted((str(p.relative_to(src)), p.stat().st_mtime_ns) for p in src.rglob("*"))
    ro.mkdir()
    if subprocess.run(["mount", "--bind", src, ro], capture_output=True).returncode != 0:
        pytest.skip("no permission to mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", ro], capture_output=True).returncode != 0:
            pytest.skip("no permission to remount read-only here")
        for threshold in ("0.5", "0.3"):  # replacing the stored one, or a new one
            out = subprocess.run([sys.executable, "-m", "zarrfeed", "mask", str(ro / "d.zarr"), "--threshold",
                                  threshold, "--workers", "0"], capture_output=True, text=True, timeout=120)
            assert out.returncode == 2 and out.stdout == "", out.stderr
            assert out.stderr == (f"zarrfeed: error: {ro / 'd.zarr'}: the agents mask cannot be stored in it (a "
                                  f"read-only file system: {ro / 'd.zarr'})\n"), out.stderr
        ds = Dataset.open(ro / "d.zarr")
        with pytest.raises(ValueError, match="^" + re.escape(f"{ro / 'd.zarr'}: the agents mask cannot be stored "
                                                             "in it (a read-only file system")):
            agents_mask.save(ds, np.zeros((ds.rows["agents"], 2), np.uint32), 0.5)
        assert agents_mask.load(ds, 0.5)[0] is not None
    finally:
        subprocess.run(["umount", ro], capture_output=True)
    assert sorted((str(p.relative_to(src)), p.stat().st_mtime_ns) for p in src.rglob("*")) == before


def test_a_store_that_fails_while_the_mask_is_stored_is_one_line(scenes, tmp_path, monkeypatch):
    """Past the check (a store that fails later: a full disk, a permission on one folder): one line naming the
    dataset and why, in the words of `zarrfeed.core.refusals`, and what is left is never read as a mask."""
    shutil.copytree(scenes, tmp_path / "d.zarr")
    ds = Dataset.open(tmp_path / "d.zarr")
    mask = agents_mask.compute(ds, 0.5, workers=0)

    def full(self, values):
        for key in values:
            if key.endswith("/0.0"):  # the first chunk of values
                raise OSError(28, "No space left on device", str(tmp_path / "d.zarr" / key))  # as open() says
        return real(self, values)
    real = DirectoryStore.put_many
    monkeypatch.setattr(DirectoryStore, "put_many", full)
    with pytest.raises(ValueError, match="^" + re.escape(f"{tmp_path / 'd.zarr'}: the agents mask cannot be stored "
                                                         f"in it (no space left on the device: {tmp_path / 'd.zarr'})")
                       + "$"):
        agents_mask.save(ds, mask, 0.5)
    monkeypatch.undo()
    assert agents_mask.load(Dataset.open(tmp_path / "d.zarr"), 0.5) == (None, "agents_mask/0.5 was not finished "
                                                                             "(its writer stopped)")


def test_needs_an_l5kit_dataset(tmp_path):
    from zarrfeed.writer import Schema, write_dataset
    schema = Schema({"x": (np.dtype([("a", "<f4")]), 10)})
    write_dataset(tmp_path / "c.zarr", [{"x": np.zeros(3, schema.tables["x"].dtype)}], schema)
    with pytest.raises(ValueError, match="table 'scenes' is missing"):
        EgoSampleLoader(tmp_path / "c.zarr")
    assert Path(tmp_path / "c.zarr").is_dir()


def test_remote_sample_loaders_match_local_ones(scenes):
    from zarrfeed.flight import FeedServer, RemoteAgentSampleLoader, RemoteEgoSampleLoader, RemoteWindowLoader
    from zarrfeed.loader import WindowLoader

    with FeedServer(scenes, port=0, workers=1) as server:
        for remote, local in ((RemoteAgentSampleLoader, AgentSampleLoader), (RemoteEgoSampleLoader, EgoSampleLoader)):
            with remote(server.url, 3, 4, batch_size=64, seed=5) as r, \
                    local(scenes, 3, 4, batch_size=64, seed=5, num_workers=0) as loc:
                got, want = list(r), list(loc)
                assert len(got) == len(want) > 1 and r.state_dict() == loc.state_dict()
                for a, b in zip(got, want, strict=True):
                    assert list(a) == list(b)
                    for k in a:
                        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        kw = dict(min_history=0, min_future=3, threshold=0.3, batch_size=64, seed=2)  # the selection travels too
        with RemoteAgentSampleLoader(server.url, 3, 4, **kw) as r, \
                AgentSampleLoader(scenes, 3, 4, num_workers=0, **kw) as loc:
            got, want = [b["agent_row"].tolist() for b in r], [b["agent_row"].tolist() for b in loc]
            assert got == want and sum(map(len, got)) != len(AgentSampleLoader(scenes, 3, 4).samples)
        for name, value in (("threshold", 0.3), ("min_history", 0), ("min_future", 3)):  # the agents mask's:
            for cls, where in ((EgoSampleLoader, scenes), (RemoteEgoSampleLoader, server.url)):  # not the ego's
                with pytest.raises(TypeError, match=rf"^{cls.__name__}.__init__\(\) got an unexpected keyword "
                                                    rf"argument '{name}'$"):
                    cls(where, 3, 4, **{name: value})
        for whole in (False, True):
            with RemoteWindowLoader(server.url, 2, 2, batch_size=64, whole_windows=whole) as r, \
                    WindowLoader(scenes, 2, 2, batch_size=64, whole_windows=whole, num_workers=0) as loc:
                assert [b["frame_row"].tolist() for b in r] == [b["frame_row"].tolist() for b in loc]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_runs_on_the_samples_in_the_workers(scenes, workers):
    def speed_and_goal(batch):
        return {"goal": batch["target_positions"][:, -1].copy(), "speed": batch["curr_speed"] * 3.6}

    with AgentSampleLoader(scenes, 3, 4, batch_size=64, num_workers=workers, transform=speed_and_goal,
                           copy=True) as loader:
        out = list(loader)
    with AgentSampleLoader(scenes, 3, 4, batch_size=64, num_workers=0, copy=True) as raw:
        for a, b in zip(out, raw, strict=True):
            np.testing.assert_array_equal(a["goal"], b["target_positions"][:, -1])
            np.testing.assert_array_equal(a["speed"], b["curr_speed"] * 3.6)
