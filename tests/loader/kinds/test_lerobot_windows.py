"""`LeRobotLoader` yields what LeRobot 0.4.4's `LeRobotDataset.__getitem__` returns with `delta_timestamps`:
checked against `lerobot_item` below, its rules written out plainly one item at a time (offsets round(d * fps),
rows clamped to the episode, `<key>_is_pad`, the frame's own value for a key without deltas, a camera's
single-frame window squeezed, float32 frames channels first / 255), on replay buffers (a LeRobot v3 root opens
as one); and equal to what LeRobot itself returned for every frame of the golden dataset, its frames written
into a replay buffer and, where the LeRobot reader is in the tree, read where they lie."""
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from zarrfeed import LeRobotLoader
from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, replay_buffer_schema

from repo_paths import REAL_SCENE

FPS = 10
LENGTHS = [1, 7, 13, 3, 25, 1, 40, 9]  # episodes of one frame among them; chunks of 8 frames cross episodes
DT = {"state": [-0.2, -0.1, 0.0], "action": [0.0, 0.1, 0.2, 0.3], "cam": [-0.1, 0.0]}
SCALARS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
GOLDEN = REAL_SCENE.parent / "lerobot_v3_small"  # what LeRobot wrote and returned (../shared/data/README.md)


@pytest.fixture(scope="module")
def lr_buffer(tmp_path_factory) -> Path:
    """A replay buffer shaped as a LeRobot dataset opens: state, action, a camera and LeRobot's scalar columns,
    8 frames a chunk (the camera 5)."""
    keys = {"state": (np.float32, (6,)), "action": (np.float32, (6,)), "cam": (np.uint8, (6, 8, 3)),
            "timestamp": (np.float32, ()), "frame_index": (np.int64, ()), "episode_index": (np.int64, ()),
            "index": (np.int64, ()), "task_index": (np.int64, ())}
    path = tmp_path_factory.mktemp("lr") / "lr.zarr"
    rng = np.random.default_rng(0)
    start = 0
    with DatasetWriter(path, replay_buffer_schema(keys, chunk_rows={k: 5 if k == "cam" else 8 for k in keys}),
                       workers=0) as writer:
        for e, t in enumerate(LENGTHS):
            writer.submit({"state": rng.normal(size=(t, 6)).astype(np.float32),
                           "action": rng.normal(size=(t, 6)).astype(np.float32),
                           "cam": rng.integers(0, 256, (t, 6, 8, 3), dtype=np.uint8),
                           "timestamp": (np.arange(t) / FPS).astype(np.float32), "frame_index": np.arange(t),
                           "episode_index": np.full(t, e), "index": start + np.arange(t),
                           "task_index": np.full(t, e % 2)}, key=f"e{e}")
            start += t
    return path


def steps_of(path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    ds = Dataset.open(path)
    ends = ds.read_rows("episodes", 0, ds.rows["episodes"])["end"].astype(np.int64)
    return ends, {k: ds.read_rows(k, 0, int(ends[-1]))[k] for k in ds.schema.step_tables()}


def lerobot_item(i: int, ends, steps, deltas, fps, frames="uint8") -> dict[str, np.ndarray]:
    """Item i (a global frame row) as LeRobot 0.4.4 makes it, one key at a time."""
    e = int(np.searchsorted(ends, i, side="right"))
    ep_start, ep_end = (int(ends[e - 1]) if e else 0), int(ends[e])
    item = {"sample": np.int64(i)}
    for key, values in steps.items():
        camera = values.dtype == np.uint8 and values.ndim == 4
        if key in deltas:
            delta_idx = [round(d * fps) for d in deltas[key]]
            query = [max(ep_start, min(ep_end - 1, i + d)) for d in delta_idx]
            value = np.stack([values[q] for q in query])
            if camera and len(query) == 1:
                value = value[0]  # (LeRobot's frames.squeeze(0))
            item[f"{key}_is_pad"] = np.array([(i + d < ep_start) | (i + d >= ep_end) for d in delta_idx])
        else:
            value = values[i]
        if camera and frames == "float32":
            value = np.moveaxis(value, -1, -3).astype(np.float32) / np.float32(255)
        item[key] = value
    return item


def epoch(loader) -> dict[str, np.ndarray]:
    got: dict[str, list] = {}
    for batch in loader:
        for k, v in batch.items():
            got.setdefault(k, []).append(np.array(v))
    return {k: np.concatenate(v) for k, v in got.items()}


def check(got, path, deltas, fps, frames, episodes, shuffled, keys=None):
    """Every sample of the episodes once, each equal to LeRobot's item (of `keys` and LeRobot's scalar columns,
    default every key); in frame order unless shuffled."""
    ends, steps = steps_of(path)
    steps = {k: v for k, v in steps.items() if keys is None or k in keys or k in deltas or k in SCALARS}
    first = np.concatenate([[0], ends[:-1]])
    chosen = np.arange(len(ends)) if episodes is None else np.asarray(episodes)
    chosen = np.flatnonzero(chosen) if chosen.dtype == bool else chosen
    frames_of = np.concatenate([np.arange(first[e], ends[e]) for e in chosen]).astype(np.int64)
    assert sorted(got["sample"].tolist()) == frames_of.tolist()
    assert shuffled == (got["sample"] != frames_of).any()
    want_keys = set(steps) | {"sample"} | {f"{k}_is_pad" for k in deltas}
    assert set(got) == want_keys
    for j, i in enumerate(got["sample"].tolist()):
        want = lerobot_item(i, ends, steps, deltas, fps, frames)
        for k, v in want.items():
            assert got[k][j].dtype == v.dtype and got[k][j].shape == v.shape, (k, i)
            assert (got[k][j] == v).all(), (k, i)


@pytest.mark.parametrize("workers, shuffle, episodes, frames", [
    (0, False, None, "uint8"), (2, True, None, "float32"), (2, False, np.arange(8) % 3 != 1, "uint8"),
    (0, True, [0, 5, 6], "float32")])
def test_items_equal_lerobots_rules(lr_buffer, workers, shuffle, episodes, frames):
    with LeRobotLoader(lr_buffer, DT, fps=FPS, episodes=episodes, frames=frames, shuffle=shuffle, batch_size=7,
                       seed=4, shuffle_window=2, num_workers=workers) as loader:
        got = epoch(loader)
    check(got, lr_buffer, DT, FPS, frames, episodes, shuffle)
    assert got["timestamp"].shape == (len(got["sample"]),) and got["timestamp"].dtype == np.float32
    assert got["cam"].shape[1:] == ((2, 6, 8, 3) if frames == "uint8" else (2, 3, 6, 8))
    one = got["sample"] == 0  # episode 0: one frame, every other step padding
    assert got["action_is_pad"][one].tolist() == [[False, True, True, True]]
    assert got["state_is_pad"][one].tolist() == [[True, True, False]]


def test_diffusion_policys_buffer_a_single_camera_delta_and_keys(dp_buffer):
    """The replay buffer Diffusion Policy wrote (40 episodes, of 1 and 2 steps among them): a camera with one
    delta has no T axis (as LeRobot squeezes it) where another key keeps it, keys= leaves the other keys out, the
    deltas' keys are read."""
    deltas = {"img": [-0.3], "action": [-0.1, 0.0, 0.1, 0.5], "n_contacts": [0.2]}
    with LeRobotLoader(dp_buffer, deltas, keys=["state"], fps=FPS, shuffle=False, batch_size=500,
                       num_workers=0) as loader:
        got = epoch(loader)
    assert set(got) == {"sample", "state", "img", "action", "n_contacts", "img_is_pad", "action_is_pad",
                        "n_contacts_is_pad"}
    assert got["img"].shape == (5913, 12, 12, 3) and got["n_contacts"].shape == (5913, 1, 1)
    ends, steps = steps_of(dp_buffer)
    steps = {k: steps[k] for k in ("state", "img", "action", "n_contacts")}
    for i in range(0, 5913, 7):
        for k, v in lerobot_item(i, ends, steps, deltas, FPS).items():
            assert (got[k][i] == v).all(), (k, i)


def test_deltas_far_outside_every_episode_are_all_padding(lr_buffer):
    deltas = {"action": [-1000.0, 1000.0], "cam": [-50.0, 0.0, 70.0]}
    with LeRobotLoader(lr_buffer, deltas, fps=FPS, keys=["action", "cam"], shuffle=True, batch_size=16,
                       num_workers=0) as loader:
        got = epoch(loader)
    check(got, lr_buffer, deltas, FPS, "uint8", None, True, keys=["action", "cam"])
    assert "state" not in got and "index" in got
    assert got["action_is_pad"].all() and (got["cam_is_pad"] == [True, False, True]).all()


def test_deltas_and_options_refused_in_one_line(lr_buffer, real_scene):
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]: 0.05 s is not a multiple of 1/fps "
                                         r"\(fps 10\) within 0.0001 s"):
        LeRobotLoader(lr_buffer, {"action": [0.0, 0.05]}, fps=FPS)
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]: -0.10011 s is not a multiple"):
        LeRobotLoader(lr_buffer, {"action": [-0.10011]}, fps=FPS)
    with LeRobotLoader(lr_buffer, {"action": [-0.10009]}, fps=FPS, num_workers=0) as loader:  # within 1e-4 s
        assert loader.samples.offsets["action"].tolist() == [-1]
    with pytest.raises(ValueError, match="delta_timestamps: no key 'image' in the dataset's steps"):
        LeRobotLoader(lr_buffer, {"image": [0.0]}, fps=FPS)
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\] must be a list of seconds, got 0.1"):
        LeRobotLoader(lr_buffer, {"action": 0.1}, fps=FPS)
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]: 'a' is not a number of seconds"):
        LeRobotLoader(lr_buffer, {"action": ["a"]}, fps=FPS)
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\] is empty"):
        LeRobotLoader(lr_buffer, {"action": []}, fps=FPS)
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]: 0.25 s is not a multiple"):
        LeRobotLoader(lr_buffer, {"action": np.array([0.25])}, fps=FPS)  # (numpy values named as numbers)
    with pytest.raises(ValueError, match="fps= is needed"):
        LeRobotLoader(lr_buffer, DT)
    with pytest.raises(ValueError, match="fps must be a positive number"):
        LeRobotLoader(lr_buffer, DT, fps=0)
    with pytest.raises(ValueError, match="frames must be 'uint8' or 'float32', got 'rgb'"):
        LeRobotLoader(lr_buffer, DT, fps=FPS, frames="rgb")
    with pytest.raises(ValueError, match="episodes: index 8 is not an episode of the buffer's 8"):
        LeRobotLoader(lr_buffer, DT, fps=FPS, episodes=[8])
    with pytest.raises(Exception, match="LeRobotLoader reads episodes of steps .* this is an L5Kit dataset$"):
        LeRobotLoader(real_scene, fps=FPS)


def test_resumed_mid_epoch_on_two_ranks_every_sample_once(lr_buffer):
    kw = dict(fps=FPS, batch_size=5, seed=9, shuffle_window=3, num_workers=0, keys=["action"])
    with LeRobotLoader(lr_buffer, DT, **kw) as loader:
        it = iter(loader)
        before = Counter(np.concatenate([next(it)["sample"] for _ in range(6)]).tolist())
        state = loader.state_dict()
    after = Counter()
    for rank in range(2):
        with LeRobotLoader(lr_buffer, DT, rank=rank, world_size=2, **kw) as loader:
            loader.load_state_dict(state)
            after.update(epoch(loader)["sample"].tolist())
    assert before + after == Counter(range(sum(LENGTHS)))
    with LeRobotLoader(lr_buffer, {**DT, "action": [0.0, 0.1]}, **kw) as other:  # other deltas: refused
        with pytest.raises(ValueError, match="loader state has delta_indices="):
            other.load_state_dict(state)


def golden_samples() -> tuple[dict, dict[str, np.ndarray]]:
    """LeRobot's `delta_timestamps` and what its `LeRobotDataset(...)[i]` returned for every frame."""
    import json

    if not GOLDEN.is_dir() and not os.environ.get("CI"):
        pytest.skip(f"LeRobot's golden dataset is not at {GOLDEN}")
    with np.load(GOLDEN / "samples.npz") as data:
        want = {k: data[k] for k in data.files}
    return json.loads(str(want.pop("delta_timestamps"))), want


def check_golden(got: dict[str, np.ndarray], want: dict[str, np.ndarray], cam: str, frames: str) -> None:
    """Tabular values exactly; the camera's frames as uint8 equal to LeRobot's decoded bytes, as float32 equal
    to them / 255."""
    assert (got["sample"] == np.arange(153)).all()
    for key, value in want.items():
        if key != cam:
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert (got[key] == value).all(), key
    if frames == "uint8":
        assert (got[cam] == want[cam].transpose(0, 1, 3, 4, 2)).all()
    else:
        assert got[cam].dtype == np.float32 and got[cam].shape == want[cam].shape
        assert np.abs(got[cam] - want[cam] / np.float32(255)).max() <= 1e-7


def test_lerobots_items_from_a_replay_buffer_of_the_golden_frames(tmp_path):
    """The golden dataset's Parquet columns and its video's frames (decoded with PyAV, as LeRobot's pyav backend
    does) written as a replay buffer (keys without dots: table names are folders): the items equal what
    LeRobot returned, with its delta_timestamps and fps."""
    av = pytest.importorskip("av")
    import pyarrow as pa
    import pyarrow.parquet as pq

    deltas, want = golden_samples()
    root = GOLDEN / "dataset"
    table = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")
    with av.open(str(root / "videos" / "observation.images.cam" / "chunk-000" / "file-000.mp4")) as video:
        cam = np.stack([f.to_ndarray(format="rgb24") for f in video.decode(video=0)])
    columns = {}
    for name in table.column_names:  # (fixed-size lists: LeRobot's vectors)
        c = table[name].combine_chunks()
        columns[name.replace(".", "_")] = c.flatten().to_numpy().reshape(len(c), c.type.list_size) \
            if pa.types.is_fixed_size_list(c.type) else c.to_numpy()
    columns["observation_images_cam"] = cam
    ends = np.flatnonzero(np.diff(np.append(columns["episode_index"], -1))) + 1
    schema = replay_buffer_schema({k: (v.dtype, v.shape[1:]) for k, v in columns.items()}, chunk_rows=16)
    with DatasetWriter(tmp_path / "golden.zarr", schema, workers=0) as writer:
        for e, (a, b) in enumerate(zip(np.concatenate([[0], ends[:-1]]), ends, strict=True)):
            writer.submit({k: v[a:b] for k, v in columns.items()}, key=f"e{e}")
    renamed = {k.replace(".", "_"): v for k, v in deltas.items()}
    for frames in ("uint8", "float32"):
        with LeRobotLoader(tmp_path / "golden.zarr", renamed, fps=10, frames=frames, shuffle=False, batch_size=40,
                           num_workers=0) as loader:
            got = epoch(loader)
        named = {short + pad: full + pad for full in ("observation.state", "observation.images.cam")
                 for short in [full.replace(".", "_")] for pad in ("", "_is_pad")}  # LeRobot's names again
        check_golden({named.get(k, k): v for k, v in got.items()}, want, "observation.images.cam", frames)


@pytest.mark.parametrize("frames", ["uint8", "float32"])
def test_the_golden_dataset_equals_what_lerobot_returned(frames):
    """The dataset LeRobot 0.4.4 wrote, read in place with the `delta_timestamps` stored beside what its
    `LeRobotDataset(...)[i]` returned for every frame: tabular values exactly; the camera's frames as uint8
    equal to its decoded bytes, as float32 equal to them / 255."""
    pytest.importorskip("zarrfeed.core.lerobot_meta", reason="the LeRobot v3 reader is not in this tree")
    deltas, want = golden_samples()
    with LeRobotLoader(GOLDEN / "dataset", deltas, frames=frames, shuffle=False, batch_size=40,
                       num_workers=0) as loader:
        check_golden(epoch(loader), want, "observation.images.cam", frames)


def test_an_fps_other_than_a_lerobot_datasets_own_is_refused_in_one_line():
    """LeRobot rounds `delta_timestamps` at the dataset's own fps: another is refused, the same one taken."""
    pytest.importorskip("zarrfeed.core.lerobot_meta", reason="the LeRobot v3 reader is not in this tree")
    deltas, _ = golden_samples()
    with pytest.raises(ValueError, match=r"^\S+: fps=20 differs from the LeRobot dataset's own 10 \(meta/info.json\)"
                                         r", which LeRobot always uses; leave fps= out$"):
        LeRobotLoader(GOLDEN / "dataset", deltas, fps=20, num_workers=0)
    with LeRobotLoader(GOLDEN / "dataset", deltas, fps=10, shuffle=False, batch_size=40, num_workers=0) as loader:
        assert len(loader.plan()) == 4


def test_every_loader_option_with_its_default_and_the_probe_makes_the_loaders_batch(lr_buffer):
    """It takes every `LoaderOptions` option (with its default; an unknown one refused in one line), and the
    probe that sizes a transform's output makes the batch the loader makes, after a round trip through pickle."""
    import pickle

    from zarrfeed.core.keywords import option_names
    from zarrfeed.loader.options import Options

    defaults = option_names(Options) | {"num_workers": 0}
    with LeRobotLoader(lr_buffer, DT, fps=FPS, frames="float32", batch_size=6, **defaults) as loader:
        plan = loader.plan()
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
        for k in (0, 5, len(plan) - 1):
            made = pickle.loads(pickle.dumps(loader.source.probe_batch(plan, k)))()
            assert list(made) == list(batches[k])
            assert all(made[n].tobytes() == batches[k][n].tobytes() for n in made)
    with pytest.raises(TypeError, match=r"^LeRobotLoader.__init__\(\) got an unexpected keyword argument "
                                        r"'num_worker'. Did you mean 'num_workers'\?$"):
        LeRobotLoader(lr_buffer, DT, fps=FPS, num_worker=2)
