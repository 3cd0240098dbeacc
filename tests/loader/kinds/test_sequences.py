"""`SequenceLoader` yields exactly the samples Diffusion Policy's `SequenceSampler` gives
(the goldens in ../shared/data were made by its own code, PushT settings: sequence_length 16, pad_before 1,
pad_after 7), in its order unshuffled, plus a padding mask; shuffled, sharded, resumable like every loader."""
import subprocess
import sys

import numpy as np
import pytest
from zarrfeed import SequenceLoader
from zarrfeed.loader import Dataset

KEYS = ["action", "img", "keypoint", "n_contacts", "state"]


def _epoch(loader) -> dict[str, np.ndarray]:
    got: dict[str, list] = {}
    for batch in loader:
        for k, v in batch.items():
            got.setdefault(k, []).append(np.array(v))
    return {k: np.concatenate(v) for k, v in got.items()}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("which", ["all", "train"])
def test_samples_equal_diffusion_policys(dp_buffer, dp_samples, which, workers):
    episodes = None if which == "all" else ~dp_samples["val_mask"]
    with SequenceLoader(dp_buffer, 16, 1, 7, episodes=episodes, shuffle=False, batch_size=100,
                        num_workers=workers) as loader:
        indices = dp_samples[f"{which}/indices"]
        assert (loader.indices() == indices).all()
        got = _epoch(loader)
    n = len(indices)
    assert (got["sample"] == np.arange(n)).all()  # DP's order
    for key in KEYS:
        want = dp_samples[f"{which}/{key}"]
        assert got[key].dtype == want.dtype and got[key].shape == want.shape, key
        assert (got[key] == want).all(), key
    # the padding mask: the positions outside [sample_start, sample_end) repeat the first or last step
    j = np.arange(16)
    assert (got["is_pad"] == ((j < indices[:, 2:3]) | (j >= indices[:, 3:4]))).all()
    assert got["is_pad"].any()
    ends = dp_samples["episode_ends"]
    assert (indices[:, 0] >= np.concatenate([[0], ends])[got["episode"]]).all()
    assert (indices[:, 1] <= ends[got["episode"]]).all()


def test_keys_and_pads_as_asked(dp_buffer, dp_samples):
    """Fewer keys, no padding (windows wholly inside episodes), and DP's clamping of large pads."""
    with SequenceLoader(dp_buffer, 16, keys=["action"], shuffle=False, batch_size=4096, num_workers=0) as loader:
        got = _epoch(loader)
    assert set(got) == {"sample", "episode", "is_pad", "action"} and not got["is_pad"].any()
    ends = dp_samples["episode_ends"]
    lengths = np.diff(np.concatenate([[0], ends]))
    assert len(got["sample"]) == int(np.maximum(lengths - 15, 0).sum())
    with SequenceLoader(dp_buffer, 4, 99, 99, keys="state", shuffle=False, num_workers=0) as loader:
        per_episode = np.bincount(loader.samples.episode, minlength=40)
    assert (per_episode == lengths + 3 + 3 - 4 + 1).all()  # pads clamped to sequence_length - 1, as DP does


def test_shuffled_epochs_hold_every_sample_once_and_ranks_split_them(dp_buffer):
    epochs = []  # per rank: its two epochs
    for rank in range(2):
        with SequenceLoader(dp_buffer, 16, 1, 7, keys=["state"], batch_size=64, seed=3, rank=rank, world_size=2,
                            num_workers=1, shuffle_window=4) as loader:
            epochs.append([_epoch(loader)["sample"], _epoch(loader)["sample"]])
    for e in range(2):
        ours, theirs = epochs[0][e], epochs[1][e]
        assert (ours != np.sort(ours)).any()  # shuffled
        assert len(ours) == len(theirs) == 2824  # as torch's DistributedSampler: equal shares, 5,647 samples
        assert len(set(ours.tolist()) & set(theirs.tolist())) == 1  # padded with one repeat (drop_last drops it)
        assert set(np.concatenate([ours, theirs]).tolist()) == set(range(5647))
    assert (epochs[0][0][:100] != epochs[0][1][:100]).any()  # anew each epoch


def test_resume_mid_epoch_gives_the_rest(dp_buffer):
    options = dict(keys=["action", "img"], batch_size=50, seed=5, num_workers=1)
    with SequenceLoader(dp_buffer, 16, 1, 7, **options) as loader:
        full = [b["sample"].copy() for b in loader]
    with SequenceLoader(dp_buffer, 16, 1, 7, **options) as loader:
        it = iter(loader)
        head = [next(it)["sample"].copy() for _ in range(7)]
        state = loader.state_dict()
    with SequenceLoader(dp_buffer, 16, 1, 7, **options) as loader:
        loader.load_state_dict(state)
        rest = [b["sample"].copy() for b in loader]
    assert all((a == b).all() for a, b in zip(head + rest, full, strict=True))
    with SequenceLoader(dp_buffer, 8, 1, 7, **options) as other:  # another sampling refuses the state
        with pytest.raises(ValueError, match="sequence_length"):
            other.load_state_dict(state)


def test_bad_options_are_one_line(dp_buffer, real_scene):
    with pytest.raises(ValueError, match="sequence_length must be >= 1, got 0"):
        SequenceLoader(dp_buffer, 0)
    with pytest.raises(ValueError, match="keys: no field 'image'"):
        SequenceLoader(dp_buffer, 4, keys=["image"])
    with pytest.raises(ValueError, match="episodes: a mask of 3 values, but the buffer has 40 episodes"):
        SequenceLoader(dp_buffer, 4, episodes=np.ones(3, bool))
    with pytest.raises(ValueError, match="episodes: index 40 is not an episode of the buffer's 40"):
        SequenceLoader(dp_buffer, 4, episodes=[0, 40])
    with pytest.raises(Exception, match="SequenceLoader reads a replay buffer .* this is an L5Kit dataset$"):
        SequenceLoader(real_scene, 4)


def test_an_episode_mask_with_no_episodes_is_an_empty_epoch(dp_buffer):
    with SequenceLoader(dp_buffer, 16, 1, 7, episodes=np.zeros(40, bool), num_workers=0) as loader:
        assert len(loader.indices()) == 0 and list(loader) == []


UNGUARDED = """
from zarrfeed import SequenceLoader
for batch in SequenceLoader({path!r}, 16, 1, 7, num_workers=2):
    pass
"""


def test_a_script_without_a_main_guard_is_told_in_one_line(dp_buffer, tmp_path):
    """The workers of a SequenceLoader are started with more than a pipe holds (its samples): a worker that
    ran the unguarded script again and exited broke the pipe mid-start, a BrokenPipeError traceback."""
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED.format(path=str(dp_buffer)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "BrokenPipeError" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("zarrfeed.WorkerError: loader worker 0 ")
    assert 'put its top-level code under `if __name__ == "__main__":`' in out.stderr


def test_a_dataset_in_hand_and_its_steps(dp_buffer):
    ds = Dataset.open(dp_buffer)
    with SequenceLoader(ds, 2, keys=["state"], shuffle=False, batch_size=3, num_workers=0) as loader:
        batch = next(iter(loader))
    steps = ds.read_rows("steps", 0, 4)
    assert (batch["state"] == np.stack([steps["state"][0:2], steps["state"][1:3], steps["state"][2:4]])).all()


def test_options_that_are_not_what_they_look_like_are_refused(dp_buffer, tmp_path):
    """sequence_length=4.5 ran as 4, a float pad raised numpy's TypeError, a 0/1 mask given
    as integers sampled episodes 0 and 1 (indices, repeated), a data key named as a column the loader adds
    replaced that column, and a state of another mask was refused naming chunk_rows."""
    with pytest.raises(ValueError, match="sequence_length must be a whole number, got 4.5"):
        SequenceLoader(dp_buffer, 4.5)
    with pytest.raises(ValueError, match="pad_before must be a whole number, got 1.0"):
        SequenceLoader(dp_buffer, 4, 1.0)
    with pytest.raises(ValueError, match="episodes: episode 0 is named 20 times; give each episode once, or a "
                                         "boolean mask"):
        SequenceLoader(dp_buffer, 4, episodes=np.arange(40) % 2)
    with SequenceLoader(dp_buffer, 4, episodes=np.arange(40) >= 3, num_workers=0) as loader:
        state = loader.state_dict()
    with SequenceLoader(dp_buffer, 4, episodes=np.arange(40) >= 2, num_workers=0) as other:
        with pytest.raises(ValueError, match=r"another selection \(episodes=\); pass the same episodes"):
            other.load_state_dict(state)
    import zarr

    path = tmp_path / "b.zarr"
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    for key in ("action", "is_pad"):
        root.create_array(f"data/{key}", shape=(6, 2), chunks=(6, 2), dtype="f4")[:] = 1
    root.create_array("meta/episode_ends", shape=(1,), chunks=(1,), dtype="i8")[:] = [6]
    with pytest.raises(ValueError, match="keys: data key 'is_pad' has the name of a column SequenceLoader adds"):
        SequenceLoader(path, 2)
    with SequenceLoader(path, 2, keys=["action"], num_workers=0) as loader:  # left out: read
        assert len(loader.indices()) == 5
