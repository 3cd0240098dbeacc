"""The parallel writer: identical output for any worker count, relocation, commits, bad input, crashes."""
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from expected import expected_tables, own_shared_memory, running, shared_memory_held, wait_for_scenes
from zarrfeed.loader import Dataset
from zarrfeed.writer import L5KIT_SCHEMA, synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

from zarrfeed import WorkerError
from zarrfeed.core.manifest import MANIFEST_KEY
from zarrfeed.core.dataset_format import FormatError
from zarrfeed.core.keys import Position, fingerprint
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group

from repo_paths import SUPPORT
SMALL_CHUNKS = {"agents": 3000, "frames": 200, "scenes": 5, "traffic_light_faces": 700}


def mixed_episodes():
    """Many small episodes (one frame, few or no agents) and a few huge ones (larger than a segment)."""
    eps = []
    for i in range(30):
        if i in (7, 21):
            eps.append(synthetic.episode(i, seed=2, frames=60, agents_per_frame=2500))  # ~150k agents
        else:
            eps.append(synthetic.episode(i, seed=2, frames=1 + i % 3, agents_per_frame=i % 4))
    return eps


def decoded_chunks(path: Path) -> dict[str, bytes]:
    """Every chunk file of every table, decoded to raw bytes (padding included)."""
    group = Group.open(DirectoryStore(path))
    out = {}
    for name in L5KIT_SCHEMA.tables:
        arr = group[name]
        for key in sorted(k for k in os.listdir(path / name) if not k.startswith(".")):
            out[f"{name}/{key}"] = bytes(arr.compressor.decode(arr.store[f"{name}/{key}"]))
    return out


def test_ordered_output_is_identical_for_any_worker_count(tmp_path):
    eps = mixed_episodes()
    chunks = {}
    for workers in (0, 1, 2, 3):
        out = tmp_path / f"w{workers}.zarr"
        # commit_interval=0 sends partial segments after every episode: most chunks are shared and locked
        with DatasetWriter(out, workers=workers, chunks=SMALL_CHUNKS, commit_interval=0, segment_bytes=1 << 20) as w:
            summary = w.ingest(eps)
        assert summary["episodes"] == 30
        chunks[workers] = decoded_chunks(out)
    assert w.shared_chunks > 20
    for workers in (1, 2, 3):
        assert chunks[workers].keys() == chunks[0].keys()
        assert chunks[workers] == chunks[0], f"{workers} workers differ from a single-process write"


def test_relocate_all_is_relocate_then_concatenate():
    """What Dask's write tasks use (one copy) equals relocating each episode and concatenating."""
    from zarrfeed.writer.episode import relocate, relocate_all
    eps = mixed_episodes()[:7]
    starts = {"scenes": 3, "frames": 1000, "agents": 123_456, "traffic_light_faces": 77}
    at, want = dict(starts), {t: [] for t in L5KIT_SCHEMA.tables}
    for e in eps:
        for t, arr in relocate(e, L5KIT_SCHEMA, at).items():
            want[t].append(arr)
            at[t] += len(arr)
    got = relocate_all(eps, L5KIT_SCHEMA, starts)
    for t in L5KIT_SCHEMA.tables:
        np.testing.assert_array_equal(got[t], np.concatenate(want[t]))
    assert got["frames"]["agent_index_interval"][0, 0] == 123_456


def test_intervals_are_relocated_globally(tmp_path):
    eps = mixed_episodes()
    want = expected_tables(eps)
    with DatasetWriter(tmp_path / "d.zarr", workers=2, chunks=SMALL_CHUNKS, segment_bytes=1 << 20) as w:
        w.ingest(eps)
    assert w.committed == {n: len(a) for n, a in want.items()}
    ds = Dataset.open(tmp_path / "d.zarr")
    assert ds.validate().ok
    for name, arr in want.items():
        np.testing.assert_array_equal(ds[name][:], arr)
    assert (tmp_path / "d.zarr" / ".zmetadata").exists()
    assert not (tmp_path / "d.zarr" / ".zarrfeed-locks").exists()
    doc = json.loads((tmp_path / "d.zarr" / MANIFEST_KEY).read_text())
    input_id = fingerprint(eps[0])  # keys are positions in the input, which its first episode identifies
    assert doc["journal"]["inputs"] == {input_id: {"committed": [[0, 30]], "skipped": []}}
    assert doc["journal"]["pending"] == []


def test_append_to_a_dataset_written_elsewhere(real_copy):
    eps = list(synthetic.episodes(3, seed=9))
    with DatasetWriter(real_copy, workers=2, mode="a") as w:
        w.ingest(eps)
    ds = Dataset.open(real_copy)
    assert ds.rows["scenes"] == 4 and ds["scenes"][0]["host"] == "host-a101"
    assert ds["scenes"][1]["frame_index_interval"].tolist() == [248, 248 + 248]
    assert ds.validate().ok


def _retype(arr, field, new):
    return arr.astype([(n, new if n == field else arr.dtype.fields[n][0]) for n in arr.dtype.names])


def _reverse_interval(ep):
    iv = ep["frames"]["agent_index_interval"]
    iv[3] = [iv[3, 1] + 1, iv[3, 1]]


BAD_INPUTS = [  # (how to break a good episode, the message)
    (lambda e: e.pop("agents"), "table 'agents': missing"),
    (lambda e: e.update(lidar=e["agents"]), "table 'lidar': not in schema"),
    (lambda e: e.update(agents=_retype(e["agents"], "yaw", "<f8")),
     "table 'agents': wrong dtype, it field 'yaw' is <f8, expected <f4"),
    (lambda e: e.update(agents=np.zeros(3, [("centroid", "<f8", (3,))])), "table 'agents': wrong dtype"),
    (lambda e: e.update(frames=_retype(e["frames"], "ego_translation", ("<f8", (2,)))),
     "field 'ego_translation' has shape (2,), expected (3,)"),
    (lambda e: e["frames"]["agent_index_interval"].__setitem__((2, 1), 10**6),
     "frames.agent_index_interval row 2: interval .* is outside the rows of agents"),
    (lambda e: e["frames"]["agent_index_interval"].__setitem__((0, 0), -1),
     "frames.agent_index_interval row 0: .*-1"),
    (_reverse_interval, "frames.agent_index_interval row 3: .*start > end"),
    (lambda e: e["frames"]["agent_index_interval"].__setitem__((-1, 1), e["frames"]["agent_index_interval"][-1, 1] - 1),
     "frames.agent_index_interval row 4: last interval ends at"),
    (lambda e: e.update(scenes=e["scenes"][:0]), "scenes.frame_index_interval: no scenes rows, but frames has 5"),
    (lambda e: e.update(agents=np.zeros(4)), "table 'agents': expected a structured ndarray, got ndarray of float64"),
    (lambda e: e.update(agents=e["agents"].tolist()), "table 'agents': expected a structured ndarray, got list"),
]


def bad_episodes():
    cases = []
    for breaks, message in BAD_INPUTS:
        episode = synthetic.episode(0, frames=5, agents_per_frame=4)
        breaks(episode)
        cases.append((episode, message))
    cases.append(([synthetic.episode(0, frames=5)], "expected a dict"))
    return cases


@pytest.mark.parametrize("episode, message", bad_episodes(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_input_is_refused_before_anything_is_written(tmp_path, episode, message):
    good = synthetic.episodes(2, seed=1)
    with pytest.raises(ValueError, match=message if ".*" in message else re.escape(message)):
        with DatasetWriter(tmp_path / "d.zarr", workers=1, chunks=SMALL_CHUNKS) as w:
            w.ingest(good)
            w.submit(episode)
    ds = Dataset.open(tmp_path / "d.zarr")  # the good episodes are committed, nothing of the bad one
    assert ds.rows["scenes"] == 2 and ds.validate().ok
    np.testing.assert_array_equal(ds["agents"][: ds.rows["agents"]],
                                  expected_tables(list(synthetic.episodes(2, seed=1)))["agents"])


def test_on_error_skip_logs_and_commits_the_rest(tmp_path, caplog):
    eps = list(synthetic.episodes(4, seed=3))
    bad = {k: v.copy() for k, v in eps[2].items()}
    bad["frames"]["agent_index_interval"][10, 0] += 1
    with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"):
        with DatasetWriter(tmp_path / "d.zarr", workers=2, on_error="skip") as w:
            summary = w.ingest([eps[0], eps[1], bad, eps[3]])
    assert summary["episodes"] == 3
    assert "skipping episode 2: frames.agent_index_interval row 10" in caplog.text
    ds = Dataset.open(tmp_path / "d.zarr")
    np.testing.assert_array_equal(ds["agents"][:], expected_tables([eps[0], eps[1], eps[3]])["agents"])
    doc = json.loads((tmp_path / "d.zarr" / MANIFEST_KEY).read_text())
    assert doc["journal"]["inputs"] == {fingerprint(eps[0]): {"committed": [[0, 2], [3, 4]], "skipped": [[2, 3]]}}


def test_killed_worker_raises_within_seconds_then_resume_completes(tmp_path):
    eps = list(synthetic.episodes(40, seed=4, frames=40, agents_per_frame=300))
    out = tmp_path / "d.zarr"
    held_before = own_shared_memory()
    w = DatasetWriter(out, workers=2, chunks=SMALL_CHUNKS, commit_interval=0.01)
    victim = w.worker_pids[1]
    for ep in eps[:10]:
        w.submit(ep)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as err:
        for ep in eps[10:]:
            w.submit(ep)
        w.close()
    assert time.monotonic() - t0 < 5
    assert f"writer worker 1 (pid {victim}) killed by SIGKILL" in str(err.value)
    assert "mode='a'" in str(err.value)
    assert own_shared_memory() <= held_before  # the writer's blocks are unmapped and closed
    assert shared_memory_held(w.worker_pids) == []
    committed = Dataset.open(out)
    assert committed.validate().ok  # whatever was committed is whole

    with DatasetWriter(out, workers=2, mode="a") as w2:
        missing = w2.missing()
        assert missing and {k.index for k in missing} <= set(range(40))
        w2.ingest(eps, resume=True)
    ds = Dataset.open(out)
    assert ds.validate().ok
    want = expected_tables(eps)
    for name, arr in want.items():
        np.testing.assert_array_equal(ds[name][: ds.rows[name]], arr)  # every episode exactly once, in order


def test_killed_parent_then_resume_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "d.zarr"
    child = subprocess.Popen([sys.executable, str(SUPPORT / "writer_child.py"), str(out), "60", "2", "0.03"],
                             stdout=subprocess.PIPE, text=True)
    workers = [int(x) for x in child.stdout.readline().split()[1:]]
    wait_for_scenes(out, 8)  # a few commits, then kill the parent mid-ingest
    child.send_signal(signal.SIGKILL)
    child.wait()
    time.sleep(1.5)  # workers notice within half a second that their parent is gone
    assert not running(workers)
    assert shared_memory_held(workers + [child.pid]) == []

    ds = Dataset.open(out)
    assert 8 <= ds.rows["scenes"] < 60 and ds.validate().ok
    eps = list(synthetic.episodes(60, seed=5, frames=40, agents_per_frame=300))
    with DatasetWriter(out, workers=0, mode="a") as w:
        missing = w.missing()
    assert missing and missing[0] == Position(fingerprint(eps[0]), ds.rows["scenes"])  # one scene per episode

    resumed = subprocess.run([sys.executable, str(SUPPORT / "writer_child.py"), str(out), "60", "2", "0", "--resume"],
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    ds = Dataset.open(out)
    assert ds.validate().ok
    for name, arr in expected_tables(eps).items():
        np.testing.assert_array_equal(ds[name][: ds.rows[name]], arr)


def test_readers_see_only_committed_rows_during_ingest(tmp_path):
    out = tmp_path / "d.zarr"
    child = subprocess.Popen([sys.executable, str(SUPPORT / "writer_child.py"), str(out), "40", "2", "0.04"],
                             stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    want = expected_tables(list(synthetic.episodes(40, seed=5, frames=40, agents_per_frame=300)))
    partial = 0
    while child.poll() is None:
        try:
            ds = Dataset.open(out)
        except FormatError:  # the dataset is being created: not there yet, or its manifest not yet
            continue
        n = ds.rows
        frames = ds["frames"][: n["frames"]]
        assert frames["agent_index_interval"].max(initial=0) <= n["agents"]
        np.testing.assert_array_equal(ds["agents"][: n["agents"]], want["agents"][: n["agents"]])
        partial += 0 < n["agents"] < len(want["agents"])  # read while the writer was still going
    assert child.returncode == 0 and partial >= 1


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_killed_parent_workers_exit_quietly(tmp_path, method):
    """Each worker printed a ConnectionResetError/BrokenPipeError traceback when its parent was
    SIGKILLed with replies unread (the parent's death is the message). The parent is paused first, so that
    replies wait unread in every worker's pipe when it dies."""
    out = tmp_path / "d.zarr"
    child = subprocess.Popen([sys.executable, str(SUPPORT / "writer_child.py"), str(out), "200", "2", "0",
                              "--start-method", method], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = [int(x) for x in child.stdout.readline().split()[1:]]
    wait_for_scenes(out, 4)
    child.send_signal(signal.SIGSTOP)
    time.sleep(1.0)  # the workers finish what they hold and reply into pipes no one reads
    child.send_signal(signal.SIGKILL)
    _, err = child.communicate(timeout=30)  # complete once every worker (and a fork server) closed stderr
    assert err == ""

    def alive() -> list[int]:
        out = []
        for pid in workers:
            try:
                if "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                    out.append(pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
        return out

    deadline = time.monotonic() + 5  # a worker that closed its files may still be exiting for a moment
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive()


def test_a_folder_holding_only_a_lock_file_is_a_new_dataset(tmp_path):
    """A writer that failed while starting its workers could leave a folder
    holding only `.zarrfeed.lock`, which mode "w", mode "a" and overwrite all refused."""
    from zarrfeed.writer.lease import LOCK_FILE

    out = tmp_path / "d.zarr"
    out.mkdir()
    (out / LOCK_FILE).touch()
    with DatasetWriter(out, workers=0) as w:
        w.ingest(synthetic.episodes(1, seed=3, frames=20, agents_per_frame=10))
    assert Dataset.open(out).rows["scenes"] == 1


def test_every_argument_after_path_and_schema_is_keyword_only(tmp_path):
    """17 arguments could be passed by position (`DatasetWriter(p, s, 2, "a")`), where two
    swapped ones go unnoticed."""
    import inspect

    from zarrfeed.writer import L5KIT_SCHEMA

    params = inspect.signature(DatasetWriter).parameters
    assert [n for n, p in params.items() if p.kind not in (p.KEYWORD_ONLY, p.VAR_KEYWORD)] == ["path", "schema"]
    with pytest.raises(TypeError):
        DatasetWriter(tmp_path / "d.zarr", L5KIT_SCHEMA, 0)
    assert not (tmp_path / "d.zarr").exists()


def test_a_stopped_worker_is_said_then_named_when_the_wait_ends(tmp_path, monkeypatch, caplog):
    """A worker stopped (SIGSTOP) with a segment unwritten is not dead: the writer waits for it, says so in the log
    once the segment has waited a while, and at `stall_timeout` stops with one line naming the stopped worker
    (not the store)."""
    import zarrfeed.writer.dataset_writer as dataset_writer

    monkeypatch.setattr(dataset_writer, "SAY_STALL_AFTER", 0.3)
    episodes = list(synthetic.episodes(40, seed=5, frames=40, agents_per_frame=50))
    w = DatasetWriter(tmp_path / "d.zarr", workers=2, chunks={"agents": 400, "frames": 40}, segment_bytes=1 << 15,
                      stall_timeout=2.0)
    pid = w.worker_pids[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, logger="zarrfeed.writer"):
            with pytest.raises(WorkerError, match=rf"writer worker 0 has not finished writing .* in 2 s: it is "
                                                  rf"stopped \(pid {pid}: SIGSTOP"):
                with w:
                    w.ingest(episodes)
        said = [r.getMessage() for r in caplog.records if "is stopped" in r.getMessage()]
        assert len(said) == 1 and f"writer worker 0 (pid {pid}) is stopped" in said[0], said
        assert f"kill -CONT {pid}" in said[0]
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
