"""L5Kit samples at their edges: resume on other ranks, masks half-written or missing a chunk, scenes without
traffic lights, a track id twice in a frame."""
import numpy as np
import pytest
from zarrfeed.loader import AgentSampleLoader, EgoSampleLoader
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group
from zarrfeed.core.zarr_meta import ArrayMeta


@pytest.mark.parametrize("cls,key", [(AgentSampleLoader, "agent_row"), (EgoSampleLoader, "frame_row")])
def test_resume_on_another_number_of_ranks_yields_every_sample_once(real_scene, cls, key):
    """3 ranks stop after 1, 3 and 2 batches; the job resumes on 2 ranks with all three states. Expected: every
    sample of the epoch exactly once (plus at most the world_size - 1 padding rows of the 3-rank epoch), as the
    Loader and WindowLoader do. Today the workers build the rank's usual plan, not the resumed spans
    (MotionSource.gather_message sends no `spans`): ~95 agent samples repeated and ~95 never seen."""
    kw = dict(batch_size=16, seed=1, num_workers=0, copy=True)
    states, seen = [], []
    for r, stop in zip(range(3), (1, 3, 2), strict=True):
        with cls(real_scene, 10, 50, rank=r, world_size=3, **kw) as loader:
            it = iter(loader)
            seen += [next(it)[key] for _ in range(stop)]
            states.append(loader.state_dict())
    for r in range(2):
        with cls(real_scene, 10, 50, rank=r, world_size=2, **kw) as loader:
            loader.load_state_dict(states)
            seen += [b[key] for b in loader]
    with cls(real_scene, 10, 50, **kw) as loader:
        n = len(loader.samples)
    got = np.concatenate(seen)
    assert set(got.tolist()) == set(np.unique(got).tolist())
    missing = n - len(np.unique(got))
    assert missing == 0, f"{missing} samples never yielded after resuming 3 ranks on 2"
    assert len(got) - n <= 2, f"{len(got) - n} samples yielded twice"


# ------------------------------------------------------------------ the stored agents mask

def test_a_half_written_mask_is_not_taken_on_an_l5kit_dataset(real_copy):
    """What `zarrfeed mask` leaves when killed while `agents_mask.save` writes the array (the array created, its
    first chunk written, the record not yet): on a dataset written by L5Kit (no commits) `load` takes it, because
    a mask without a record is taken there, and the loader silently has 528 samples instead of L5Kit's 1,127.
    Expected: a half-written mask is never read as valid (refused and recomputed, or an error)."""
    from zarrfeed.core import dataset_format
    from zarrfeed.loader import Dataset
    from zarrfeed.loader.kinds import agents_mask

    ds = Dataset.open(real_copy)
    full = agents_mask.compute(ds, 0.5, workers=0)
    group = dataset_format.open_group(ds.location, "a")
    arr = group.require_group("agents_mask").create_array("0.5", ArrayMeta.new(full.shape, 10_000, np.dtype(np.uint32),
                                                                                fill_value=0))  # as save() does
    arr[:10_000] = full[:10_000]  # killed here: chunks 1 and 2 and the record never written
    with AgentSampleLoader(real_copy, 10, 50, num_workers=0) as loader:
        assert len(loader.samples) == len(agents_mask.selected_rows(full)) == 1127


def test_a_stored_mask_with_a_missing_chunk_is_not_taken(small_dataset, tmp_path):
    """A mask stored by zarrfeed (with its record) whose second chunk is lost (an interrupted rsync / upload):
    zarr fills the missing chunk with zeros and `load` returns it as current, so every agent row in it is
    silently dropped from AgentSampleLoader. Expected: refused (recomputed) or an error naming the chunk, as
    zarrfeed does for a missing chunk of a table."""
    import shutil

    from zarrfeed.loader import Dataset

    from zarrfeed.loader.kinds import agents_mask

    path = tmp_path / "d.zarr"
    shutil.copytree(small_dataset(6, 21, frames=80, agents_per_frame=60), path)
    ds = Dataset.open(path)
    full = agents_mask.compute(ds, 0.5, workers=0)
    agents_mask.save(ds, full, 0.5)
    (path / "agents_mask" / "0.5" / "1.0").unlink()
    try:
        got, _ = agents_mask.load(Dataset.open(path), 0.5)
    except (OSError, ValueError, KeyError):
        return  # an error is fine
    assert got is None or np.array_equal(got, full), \
        f"rows {np.flatnonzero((got != full).any(1))[:3]}.. of the mask read as zeros"


# ------------------------------------------------------------------ WindowLoader

@pytest.mark.parametrize("whole", [False, True])
def test_window_loader_on_scenes_without_traffic_lights(real_copy, whole):
    """A dataset whose windows hold no traffic-light face (scenes without traffic lights: an empty
    traffic_light_faces table). Expected: batches with empty face columns and all-zero face offsets. Today
    WindowLoader sizes the ragged face columns for 1 row (max(1, 0 * batch_size)) but the scheduler views every
    column of a slot with batch_size rows: `ValueError: buffer is smaller than requested size` before the first
    batch (batch_size 32; also whole_windows=True)."""
    from zarrfeed.loader import WindowLoader

    g = Group.open(DirectoryStore(real_copy))
    frames = g["frames"][:]
    frames["traffic_light_faces_index_interval"] = 0
    g["frames"][:] = frames
    g["traffic_light_faces"].resize(0)
    with WindowLoader(real_copy, 1, 0, batch_size=32, whole_windows=whole, num_workers=0) as loader:
        batches = list(loader)
    assert sum(len(b["frame_row"]) for b in batches) == (248 if not whole else 247)
    assert all((b["traffic_light_faces_offsets"] == 0).all() for b in batches)


# ------------------------------------------------------------------ exactness vs L5Kit

def test_track_id_twice_in_a_frame_is_sampled_as_l5kit_does(real_copy):
    """Frame 100 holds track id k twice (rows a and r = a + 1, both above the label threshold); the sample of
    row r (rows=[r], or min_history=0). L5Kit's generate_agent_sample takes the agent at t as the first row of
    track k passing the label filter (row a): centroid = a's, and history_positions[0] = (0, 0). zarrfeed takes
    row r's own pose but, like L5Kit, row a for frame t of the history: its history_positions[0] is row a's
    offset from row r (not 0 with availability 1), a sample that is neither L5Kit's nor self-consistent.
    Expected: L5Kit's sample (or at least the agent at the origin of its own frame at t)."""
    g = Group.open(DirectoryStore(real_copy))
    a = int(g["frames"][100]["agent_index_interval"][0])
    agents = g["agents"][a:a + 2]
    agents["track_id"][0] = agents["track_id"][1]
    agents["label_probabilities"][:, 3] = 1.0
    g["agents"][a:a + 2] = agents
    with AgentSampleLoader(real_copy, 2, 2, rows=np.array([a + 1]), batch_size=1, num_workers=0,
                           copy=True) as loader:
        (s,) = list(loader)
    assert s["history_availabilities"][0, 0] == 1
    np.testing.assert_allclose(s["history_positions"][0, 0], [0, 0], atol=1e-6)  # L5Kit's inverse: ~1e-13 off
    np.testing.assert_array_equal(s["centroid"][0], agents["centroid"][0])  # L5Kit's: the first row of track k


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -0.1, True])
def test_a_threshold_outside_zero_one_is_refused_in_one_line(bad, tmp_path):
    from zarrfeed.loader.kinds.agents_mask import Thresholds
    with pytest.raises(ValueError, match=r"agents mask: threshold must be a number in \[0.0, 1.0\)"):
        Thresholds(label=bad)
