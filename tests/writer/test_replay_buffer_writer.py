"""Replay buffers written crash-safely in Diffusion Policy's own layout: the same commit protocol
as every dataset (lease, keys, exactly once, resume), and Diffusion Policy's reader conventions after every
commit (every data array as long as `episode_ends[-1]`, chunks along time only)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarrfeed import SequenceLoader
from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, replay_buffer_schema

HERE = Path(__file__).parent
KEYS = {"img": (np.uint8, (12, 12, 3)), "state": (np.float32, (5,)), "action": (np.float32, (2,))}


def dp_episodes(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Episodes as Diffusion Policy's `add_episode` takes them: key -> (T, ...) array, T from 1 to 40."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t = int(rng.integers(1, 41))
        out.append({"img": rng.integers(0, 256, (t, 12, 12, 3), dtype=np.uint8),
                    "state": rng.normal(size=(t, 5)).astype(np.float32),
                    "action": rng.normal(size=(t, 2)).astype(np.float32)})
    return out


def dp_open(path) -> dict[str, np.ndarray]:
    """What Diffusion Policy's `ReplayBuffer` checks when it opens a buffer (every data array as long as the
    last episode end; chunks along time only), then its `copy_from_path`: every array read into memory."""
    root = zarr.open_group(str(path), mode="r")
    ends = root["meta/episode_ends"][:]
    out = {"episode_ends": ends}
    for key, arr in root["data"].arrays():
        assert arr.shape[0] == (ends[-1] if len(ends) else 0), (key, arr.shape, ends[-1:])
        assert arr.chunks[1:] == arr.shape[1:], (key, arr.chunks)
        out[key] = arr[:]
    return out


def assert_buffer_holds(path, episodes) -> None:
    got = dp_open(path)
    assert (got["episode_ends"] == np.cumsum([len(e["img"]) for e in episodes])).all()
    for key in KEYS:
        assert (got[key] == np.concatenate([e[key] for e in episodes])).all(), key
    assert Dataset.open(path).validate().ok


@pytest.mark.parametrize("workers", [0, 2])
def test_a_new_replay_buffer_in_diffusion_policys_layout(tmp_path, workers):
    path = tmp_path / "buffer.zarr"
    eps = dp_episodes(30, seed=1)
    with DatasetWriter(path, replay_buffer_schema(KEYS, chunk_rows=50), workers=workers) as w:
        w.ingest(eps[:20])
    assert_buffer_holds(path, eps[:20])
    root = zarr.open_group(str(path), mode="r")
    assert root["data/img"].chunks == (50, 12, 12, 3) and root["data/img"].dtype == np.uint8
    with DatasetWriter(path, mode="a", workers=workers) as w:  # appended with the buffer's own schema
        w.ingest(eps[20:])
    assert_buffer_holds(path, eps)
    ds = Dataset.open(path)
    assert ds.verify().ok and ds.verify().verified > 0  # every chunk's digest recorded by its commit
    with SequenceLoader(ds, 4, 1, 2, shuffle=False, batch_size=1000, num_workers=0) as loader:
        batch = next(iter(loader))
    first = eps[0]
    lo, hi, s0, s1 = loader.indices()[0]
    want = np.concatenate([np.repeat(first["state"][:1], s0, axis=0), first["state"][lo:hi]])
    assert (batch["state"][0] == want).all()


def test_the_default_chunks_are_diffusion_policys_two_megabytes():
    schema = replay_buffer_schema({"img": (np.uint8, (96, 96, 3)), "action": (np.float32, (2,))})
    assert schema.tables["img"].chunk_rows == 73 and schema.tables["action"].chunk_rows == 250_000
    assert schema.tables["img"].path == "data/img" and schema.tables["episodes"].path == "meta/episode_ends"


def test_appending_to_a_buffer_diffusion_policy_wrote(dp_copy):
    before = dp_open(dp_copy)
    rng = np.random.default_rng(3)
    more = [{"img": rng.integers(0, 256, (n, 12, 12, 3), dtype=np.uint8),
             **{k: rng.normal(size=(n, *before[k].shape[1:])).astype(np.float32)
                for k in ("state", "keypoint", "action", "n_contacts")}} for n in (3, 17)]
    with DatasetWriter(dp_copy, mode="a", workers=2) as w:
        w.ingest(more)
    after = dp_open(dp_copy)
    assert (after["episode_ends"] == np.concatenate([before["episode_ends"], 5913 + np.cumsum([3, 17])])).all()
    for key in ("img", "state", "keypoint", "action", "n_contacts"):
        assert (after[key] == np.concatenate([before[key], *(m[key] for m in more)])).all(), key
    meta = zarr.open_group(str(dp_copy), mode="r")["meta/episode_ends"]
    assert meta.metadata.compressor is None  # kept as Diffusion Policy made it: uncompressed
    assert Dataset.open(dp_copy).validate().ok


def test_steps_past_the_last_end_are_dropped_by_the_next_writer(dp_copy):
    """A buffer Diffusion Policy's writer left mid-episode (data resized and written, episode_ends not): the
    steps of no episode are not kept; the next episode goes where the last one ended."""
    root = zarr.open_group(str(dp_copy), mode="r+")
    for key in ("img", "state", "keypoint", "action", "n_contacts"):
        a = root[f"data/{key}"]
        a.resize((a.shape[0] + 9, *a.shape[1:]))
    ep = {"img": np.full((2, 12, 12, 3), 7, np.uint8),
          **{k: np.ones((2, *root[f"data/{k}"].shape[1:]), np.float32) for k in ("state", "keypoint", "action",
                                                                                  "n_contacts")}}
    with DatasetWriter(dp_copy, mode="a", workers=0) as w:
        w.submit(ep)
    got = dp_open(dp_copy)
    assert got["episode_ends"][-1] == 5915 and (got["img"][5913:] == 7).all()


@pytest.mark.parametrize("bad, message", [
    ({"img": np.zeros((3, 12, 12, 3), np.uint8), "state": np.zeros((3, 5), np.float32)},
     "key 'action': missing from the episode"),
    ({**dp_episodes(1, 0)[0], "depth": np.zeros((1, 2), np.float32)}, "key 'depth': not a key of this replay buffer"),
    ({"img": np.zeros((3, 12, 12), np.uint8), "state": np.zeros((3, 5), np.float32),
      "action": np.zeros((3, 2), np.float32)}, r"key 'img': steps of shape \(12, 12\), expected \(12, 12, 3\)"),
    ({"img": np.zeros((3, 12, 12, 3), np.uint8), "state": np.zeros((3, 5), np.float64),
      "action": np.zeros((3, 2), np.float32)}, "key 'state': dtype float64, expected float32"),
    ({"img": np.zeros((3, 12, 12, 3), np.uint8), "state": np.zeros((4, 5), np.float32),
      "action": np.zeros((3, 2), np.float32)}, "key 'state': 4 steps, but 'img' has 3"),
])
def test_a_bad_episode_is_one_line_and_changes_nothing(tmp_path, bad, message):
    path = tmp_path / "buffer.zarr"
    good = dp_episodes(2, seed=4)
    with DatasetWriter(path, replay_buffer_schema(KEYS), workers=0) as w:
        w.submit(good[0])
        with pytest.raises(ValueError, match=message):
            w.submit(bad)
        w.submit(good[1])
    assert_buffer_holds(path, good)


WRITER = """
import sys, time
import numpy as np
sys.path.insert(0, {tests!r})
from test_replay_buffer_writer import KEYS, dp_episodes
from zarrfeed.writer import DatasetWriter, replay_buffer_schema

def main():
    eps = dp_episodes(60, seed=9)
    resume = len(sys.argv) > 2
    w = DatasetWriter(sys.argv[1], replay_buffer_schema(KEYS, chunk_rows=64), workers=2,
                      mode="a" if resume else "w", commit_interval=0.05)
    w.begin_input("episodes-seed-9", resume=resume)
    for i, ep in enumerate(eps):
        if resume and w.is_committed(i):
            continue
        w.submit(ep, key=i)
        if not resume and i % 5 == 4:
            w.sync()
            print(i + 1, flush=True)  # acknowledged: committed
            time.sleep(0.05)
    w.close()

if __name__ == "__main__":
    main()
"""


def test_a_killed_writer_leaves_a_buffer_with_every_acknowledged_episode_and_resume_finishes_it(tmp_path):
    path = tmp_path / "buffer.zarr"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(tests=str(HERE)))
    child = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    acknowledged = 0
    deadline = time.monotonic() + 60
    while acknowledged < 25 and time.monotonic() < deadline:
        line = child.stdout.readline()
        assert line, "the writer stopped before it was killed"
        acknowledged = int(line)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    eps = dp_episodes(60, seed=9)
    ds = Dataset.open(path)
    n = ds.rows["episodes"]
    assert n >= acknowledged and ds.validate().ok  # every acknowledged episode, none torn
    ends = ds.read_rows("episodes", 0, n)["end"]
    assert (ends == np.cumsum([len(e["img"]) for e in eps[:n]])).all()
    assert (ds.read_rows("img", 0, int(ends[-1]))["img"] == np.concatenate([e["img"] for e in eps[:n]])).all()
    for _ in range(2):  # resume, then resume again: nothing more
        r = subprocess.run([sys.executable, str(script), str(path), "--resume"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
    assert_buffer_holds(path, eps)  # every episode exactly once, and Diffusion Policy's reader opens it


def test_the_arrays_are_as_long_as_the_episodes_after_every_commit(tmp_path):
    """While a writer appends, what Diffusion Policy's reader checks holds after each acknowledged commit."""
    path = tmp_path / "buffer.zarr"
    eps = dp_episodes(12, seed=2)
    with DatasetWriter(path, replay_buffer_schema(KEYS, chunk_rows=16), workers=2) as w:
        for i, ep in enumerate(eps):
            w.submit(ep)
            if i % 3 == 2:
                w.sync()
                assert_buffer_holds(path, eps[:i + 1])
    assert_buffer_holds(path, eps)


KILLED_BEFORE_ITS_MANIFEST = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_replay_buffer_writer import KEYS, dp_episodes
from zarrfeed.core import manifest_io as commits
from zarrfeed.writer import DatasetWriter, replay_buffer_schema

eps = dp_episodes(8, seed=11)
w = DatasetWriter(sys.argv[1], replay_buffer_schema(KEYS, chunk_rows=16), workers=0, commit_interval=3600)
for i in range(4):
    w.submit(eps[i], key=i)
w.sync()
commits.write_manifest = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # dies as it publishes commit 2
for i in range(4, 8):
    w.submit(eps[i], key=i)
w.sync()
"""


def test_a_writer_killed_as_it_publishes_leaves_both_readers_a_whole_buffer(tmp_path):
    """The arrays are made as long as a commit before its manifest: zarrfeed reads the last published commit
    (never more rows committed than an array holds), Diffusion Policy the arrays as they are, each whole; the
    next writer drops what was not published and resume writes it again, once."""
    path = tmp_path / "buffer.zarr"
    r = subprocess.run([sys.executable, "-c", KILLED_BEFORE_ITS_MANIFEST.format(tests=str(HERE)), str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    eps = dp_episodes(8, seed=11)
    ds = Dataset.open(path)
    assert ds.rows["episodes"] == 4 and ds.validate().ok
    assert_buffer_holds(path, eps)  # what Diffusion Policy opens: the arrays hold all eight, consistently
    with DatasetWriter(path, mode="a", workers=0) as w:
        assert [k.index for k in w.missing()] == [] and w.committed["episodes"] == 4
        for i, ep in enumerate(eps):
            w.submit(ep, key=i)  # a producer retrying everything: the first four are committed, not again
    assert_buffer_holds(path, eps)
    assert Dataset.open(path).rows["episodes"] == 8


def test_an_episode_of_no_steps_is_kept_and_has_no_samples(tmp_path):
    """Diffusion Policy's `add_episode` takes an episode of no steps (an end equal to the one before); so do
    the writer and `validate`, and the loader gives it no samples (DP's sampler, with pads summing to the
    sequence length or more, would read an empty slice)."""
    path = tmp_path / "buffer.zarr"
    eps = dp_episodes(3, seed=8)
    empty = {k: v[:0] for k, v in eps[0].items()}
    with DatasetWriter(path, replay_buffer_schema(KEYS), workers=0) as w:
        w.ingest([eps[0], empty, eps[1], eps[2]])
    got = dp_open(path)
    lengths = [len(eps[0]["img"]), 0, len(eps[1]["img"]), len(eps[2]["img"])]
    assert (got["episode_ends"] == np.cumsum(lengths)).all()
    assert Dataset.open(path).validate().ok
    with SequenceLoader(path, 4, 3, 3, num_workers=0, shuffle=False) as loader:
        episodes = np.concatenate([b["episode"] for b in loader])
    assert 1 not in episodes and set(episodes) == {0, 2, 3}
