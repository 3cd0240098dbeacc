"""WindowLoader against a direct numpy computation of L5Kit's windows."""
import numpy as np
import pytest
from zarrfeed.loader import Dataset, WindowLoader
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group


def check_against_numpy(path, batches, history, future):
    """Each sample against the frames of its window that lie in its scene (the others zeros, unavailable, with
    no agents or faces), and the agents and faces of those frames."""
    g = Group.open(DirectoryStore(path))
    frames, agents, faces = g["frames"][:], g["agents"][:], g["traffic_light_faces"][:]
    bounds = g["scenes"][:]["frame_index_interval"]
    T = history + 1 + future
    seen = []
    for b in batches:
        # the global row is `frame_row`, as in EgoSampleLoader, whose `frame_index` is the
        # index within the scene (L5Kit's meaning); the name is never used for both
        assert "frame_index" not in b
        assert b["frames/ego_rotation"].shape == (len(b["frame_row"]), T, 3, 3)
        for i, t in enumerate(b["frame_row"].tolist()):
            s, e = next((s, e) for s, e in bounds.tolist() if s <= t < e)
            lo, hi = max(s, t - history), min(e, t + future + 1)
            first = lo - (t - history)
            present = np.zeros(T, bool)
            present[first:first + hi - lo] = True
            np.testing.assert_array_equal(b["frames_availability"][i], present.astype(np.float32))
            window = frames[lo:hi]
            for name in frames.dtype.names:
                np.testing.assert_array_equal(b[f"frames/{name}"][i][present], window[name])
                assert not b[f"frames/{name}"][i][~present].any()  # absent frames are zeros
            for table, rows, field in (("agents", agents, "agent_index_interval"),
                                       ("traffic_light_faces", faces, "traffic_light_faces_index_interval")):
                off = b[f"{table}_offsets"][i]
                iv = window[field]
                counts = np.zeros(T, np.int64)
                counts[present] = iv[:, 1] - iv[:, 0]
                assert (np.diff(off) == counts).all()
                for name in rows.dtype.names:
                    np.testing.assert_array_equal(b[f"{table}/{name}"][off[0]:off[-1]], rows[name][iv[0, 0]:iv[-1, 1]])
            seen.append(t)
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_real_scene_windows_match_numpy(real_scene, workers):
    with WindowLoader(real_scene, history=10, future=50, batch_size=16, num_workers=workers, copy=True) as loader:
        batches = list(loader)
    seen = check_against_numpy(real_scene, batches, 10, 50)
    assert sorted(seen) == list(range(248))  # every frame of the scene, once, as L5Kit's EgoDataset
    with WindowLoader(real_scene, history=10, future=50, batch_size=16, num_workers=workers, copy=True,
                      whole_windows=True) as loader:
        batches = list(loader)
    seen = check_against_numpy(real_scene, batches, 10, 50)
    assert sorted(seen) == list(range(10, 248 - 50))  # whole windows only: every frame whose window lies inside
    assert all((b["frames_availability"] == 1).all() for b in batches)


@pytest.fixture(scope="module")
def scenes(small_dataset):
    return small_dataset(6, 21, chunks={"agents": 3000, "frames": 100, "traffic_light_faces": 500}, frames=80,
                         agents_per_frame=60)


def test_windows_stay_inside_their_scene(scenes):
    ds = Dataset.open(scenes)
    bounds = ds["scenes"][:]["frame_index_interval"]
    for whole in (False, True):
        with WindowLoader(ds, history=5, future=7, batch_size=20, num_workers=2, copy=True,
                          whole_windows=whole) as loader:
            batches = list(loader)
        seen = check_against_numpy(scenes, batches, 5, 7)
        want = [t for s, e in bounds.tolist() for t in (range(s + 5, e - 7) if whole else range(s, e))]
        assert sorted(seen) == want


def test_same_windows_for_any_workers_and_resume(scenes):
    def run(workers, state=None):
        with WindowLoader(scenes, history=3, future=4, batch_size=25, num_workers=workers, seed=2) as loader:
            if state:
                loader.load_state_dict(state)
            return [b["frame_row"].copy() for b in loader]

    base = run(0)
    for workers in (1, 2):
        assert all((a == b).all() for a, b in zip(run(workers), base, strict=True))
    with WindowLoader(scenes, history=3, future=4, batch_size=25, num_workers=2, seed=2) as loader:
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.state_dict()
    assert all((a == b).all() for a, b in zip(run(2, state), base[5:], strict=True))


def test_window_transform_makes_fixed_size_features(scenes):
    def features(batch):
        n_agents = np.diff(batch["agents_offsets"], axis=1)  # agents per frame: (B, T)
        return {"ego_xy": batch["frames/ego_translation"][:, :, :2].astype(np.float32),
                "agents_per_frame": n_agents.astype(np.int32)}

    with WindowLoader(scenes, history=2, future=3, batch_size=10, transform=features, num_workers=2,
                      copy=True) as loader:
        out = list(loader)
    with WindowLoader(scenes, history=2, future=3, batch_size=10, num_workers=0, copy=True) as raw:
        for a, b in zip(out, raw, strict=True):
            assert a["ego_xy"].shape == (len(b["frame_row"]), 6, 2)
            np.testing.assert_array_equal(a["agents_per_frame"], np.diff(b["agents_offsets"], axis=1))


def test_ranks_split_samples(scenes):
    got = []
    for rank in range(2):
        with WindowLoader(scenes, history=3, future=3, batch_size=16, rank=rank, world_size=2, drop_last=True,
                          num_workers=1) as loader:
            got.append(np.concatenate([b["frame_row"].copy() for b in loader]))
    assert len(got[0]) == len(got[1]) and not set(got[0].tolist()) & set(got[1].tolist())


def test_needs_an_l5kit_dataset(tmp_path):
    import numpy as np
    from zarrfeed.writer import Schema
    schema = Schema({"x": (np.dtype([("a", "<f4")]), 10)})
    write_dataset(tmp_path / "c.zarr", [{"x": np.zeros(3, schema.tables["x"].dtype)}], schema)
    with pytest.raises(ValueError, match="table 'scenes' is missing"):
        WindowLoader(tmp_path / "c.zarr")


def test_empty_tables_and_scenes_shorter_than_a_window(tmp_path):
    from zarrfeed.loader import Loader
    write_dataset(tmp_path / "e.zarr", synthetic.episodes(2, frames=5, agents_per_frame=0))
    with Loader(tmp_path / "e.zarr", "agents", batch_size=10) as loader:
        assert len(loader) == 0 and list(loader) == []
    with WindowLoader(tmp_path / "e.zarr", history=10, future=50, whole_windows=True) as loader:
        assert len(loader) == 0 and list(loader) == []
    with WindowLoader(tmp_path / "e.zarr", history=10, future=50, batch_size=4, copy=True) as loader:
        assert sorted(t for b in loader for t in b["frame_row"].tolist()) == list(range(10))  # partial windows
    with WindowLoader(tmp_path / "e.zarr", history=1, future=1, batch_size=4, copy=True,
                      whole_windows=True) as loader:
        batches = list(loader)
    assert sorted(t for b in batches for t in b["frame_row"].tolist()) == [1, 2, 3, 6, 7, 8]
    assert all(len(b["agents/centroid"]) == 0 and (b["agents_offsets"] == 0).all() for b in batches)


def test_a_scene_exactly_one_window_long_has_one_whole_window(tmp_path):
    """`whole_windows` kept scenes longer than a window (`>` for
    `>=`) and nothing noticed, since no test had a scene exactly T frames long. Such a scene has one whole
    window, its middle frame's, and it must be sampled; a scene one frame shorter has none."""
    write_dataset(tmp_path / "e.zarr", synthetic.episodes(2, frames=5, agents_per_frame=2))
    with WindowLoader(tmp_path / "e.zarr", history=2, future=2, batch_size=4, copy=True, num_workers=0,
                      whole_windows=True) as loader:
        batches = list(loader)
    assert sorted(t for b in batches for t in b["frame_row"].tolist()) == [2, 7]
    check_against_numpy(tmp_path / "e.zarr", batches, 2, 2)
    with WindowLoader(tmp_path / "e.zarr", history=3, future=2, whole_windows=True) as loader:
        assert len(loader) == 0 and list(loader) == []


def test_rows_select_the_sample_frames(scenes):
    n_frames = Dataset.open(scenes).rows["frames"]
    mask = np.zeros(n_frames, bool)
    mask[::3] = True
    with WindowLoader(scenes, history=2, future=2, batch_size=8, rows=mask, num_workers=1, copy=True) as loader:
        got = sorted(t for b in loader for t in b["frame_row"].tolist())
    with WindowLoader(scenes, history=2, future=2, batch_size=8, num_workers=0, copy=True) as loader:
        every = sorted(t for b in loader for t in b["frame_row"].tolist())
    assert got == [t for t in every if t % 3 == 0]
    with WindowLoader(scenes, history=2, future=2, rows=np.array([5, 6, 200]), num_workers=0) as loader:
        assert sorted(t for b in loader for t in b["frame_row"].tolist()) == [5, 6, 200]


@pytest.mark.parametrize("workers", [0, 2])
def test_window_transform_sees_only_the_selected_frames(scenes, workers):
    """rows= holds for the transform's first run too (it sizes the slots), not only for the batches."""
    n = Dataset.open(scenes).rows["frames"]
    keep = np.arange(0, n, 3)

    def features(batch):
        if not np.isin(batch["frame_row"], keep).all():
            raise AssertionError(f"frames {sorted(set(batch['frame_row'].tolist()) - set(keep.tolist()))} "
                                 "are not selected")
        return {"t": batch["frame_row"].astype(np.int64)}

    with WindowLoader(scenes, history=2, future=3, batch_size=10, rows=keep, transform=features,
                      num_workers=workers, copy=True) as loader:
        got = np.concatenate([b["t"] for b in loader])
    with WindowLoader(scenes, history=2, future=3, batch_size=10, rows=keep, num_workers=0) as raw:
        assert sorted(got.tolist()) == sorted(np.concatenate([b["frame_row"].copy() for b in raw]).tolist())


def test_window_state_refuses_other_windows(scenes):
    with WindowLoader(scenes, history=3, future=4, batch_size=25, num_workers=0) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert state["kind"] == "WindowLoader"
    with pytest.raises(ValueError, match="loader state has future=4; this loader has future=5"):
        WindowLoader(scenes, history=3, future=5, batch_size=25, num_workers=0).load_state_dict(state)
    with pytest.raises(ValueError,
                       match=r"loader state (has samples=|has chunk_rows=|was made with another selection)"):
        WindowLoader(scenes, history=3, future=4, batch_size=25, num_workers=0,
                     rows=np.arange(0, 400, 2)).load_state_dict(state)


def test_states_of_whole_windows_resume_only_whole_windows(scenes):
    with WindowLoader(scenes, history=3, future=4, batch_size=25, num_workers=0, whole_windows=True) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        rest = [b["frame_row"].copy() for b in it]
    assert "partial_windows" not in state["settings"]  # as states saved before partial windows: they resume
    with pytest.raises(ValueError, match="whole windows only .* pass whole_windows=True"):
        WindowLoader(scenes, history=3, future=4, batch_size=25, num_workers=0).load_state_dict(state)
    with WindowLoader(scenes, history=3, future=4, batch_size=25, num_workers=0, whole_windows=True) as loader:
        loader.load_state_dict(state)
        assert all((a["frame_row"] == b).all() for a, b in zip(loader, rest, strict=True))


def test_an_empty_row_list_is_an_empty_epoch_of_windows(scenes):
    """`rows=[]` was refused as float64; it selects no frames."""
    with WindowLoader(scenes, history=2, future=2, rows=[], num_workers=2) as loader:
        assert len(loader) == 0 and list(loader) == []


def test_a_window_transform_returning_objects_is_a_loader_error(scenes):
    from zarrfeed.loader import LoaderError

    with pytest.raises(LoaderError, match=r"transform output 'o' of batch 0 of epoch 0 .* Python objects"):
        with WindowLoader(scenes, history=2, future=2, num_workers=0,
                          transform=lambda b: {"o": np.array([None] * len(b["frame_row"]))}) as loader:
            next(iter(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_frames_that_all_hold_the_same_agents_fill_every_batch_exactly(tmp_path, workers):
    """A WindowLoader sized one history frame short was caught only by chance (the C and numpy
    kernels overflowed differently). With exactly 10 agents and 2 faces in every frame, a full batch needs
    every byte the sizing gives it: the windows must still be L5Kit's, every one of them."""
    episodes = []
    for i, ep in enumerate(synthetic.episodes(3, seed=77, frames=50, agents_per_frame=20)):
        frames, n = ep["frames"].copy(), len(ep["frames"])
        frames["agent_index_interval"] = np.stack([np.arange(n) * 10, np.arange(n) * 10 + 10], axis=1)
        frames["traffic_light_faces_index_interval"] = np.stack([np.arange(n) * 2, np.arange(n) * 2 + 2], axis=1)
        assert len(ep["agents"]) >= 10 * n and len(ep["traffic_light_faces"]) >= 2 * n, i
        episodes.append({**ep, "frames": frames, "agents": ep["agents"][:10 * n],
                         "traffic_light_faces": ep["traffic_light_faces"][:2 * n]})
    path = tmp_path / "even.zarr"
    write_dataset(path, episodes, chunks={"agents": 160, "frames": 16, "traffic_light_faces": 32}, workers=0)
    with WindowLoader(path, history=4, future=5, batch_size=8, num_workers=workers, copy=True) as loader:
        batches = list(loader)
    # every batch fills the slot's agents exactly when all its windows are whole: 10 frames x 10 agents
    assert any(len(b["agents/track_id"]) == len(b["frame_row"]) * 10 * 10 for b in batches)
    seen = check_against_numpy(path, batches, 4, 5)
    assert sorted(seen) == list(range(150))
