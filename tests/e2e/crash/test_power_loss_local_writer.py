"""A commit survives a power loss. The writer (in this process, so that every file operation goes
through the simulated disk of tests/support/power_loss.py) writes episodes by key and acknowledges them with `sync()`;
the power fails at one of its file operations, chosen at random among all of them (seeded: a failure prints the
seed and the operation, which replay it); the disk as it would be after a restart is recovered, and the same
episodes are sent again. Always: every acknowledged episode was committed before the episodes were sent again,
the dataset then holds every episode exactly once, in order (equal to one written in one go), and
`validate` and `verify` pass (`zarrfeed validate --deep`), before the episodes are sent again too; nothing that
was never written appears, and no file is written over in place. In zarr v3 (small shards, each written in parts
as episodes arrive) the same holds for every inner chunk of a shard that a commit names."""
import os
import random
import shutil
import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from power_loss import PowerLoss, SimulatedDisk

from zarrfeed import Dataset, DatasetWriter
from zarrfeed.core.manifest_io import read_manifest
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.writer import replay_buffer_schema, synthetic

CHUNKS = {"agents": 700, "frames": 40, "scenes": 3, "traffic_light_faces": 90}  # chunks shared, tails rewritten
EPISODES = [synthetic.episode(i, seed=37, frames=12, agents_per_frame=20) for i in range(10)]
ACK_EVERY = 3  # sync() after every third episode
CRASH_POINTS = int(os.environ.get("ZARRFEED_CRASH_POINTS", "120"))  # per seed; the run chooses among all ops


@dataclass(frozen=True)
class Kind:
    """What is written: its episodes, its schema (None: L5Kit's) and chunk rows."""

    name: str
    episodes: list
    schema: Any = None
    chunks: Any = None
    layout: dict = dataclasses.field(default_factory=dict)  # zarr_format, shard_bytes of a new dataset


def _robot(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    t = int(rng.integers(1, 30))
    return {"img": rng.integers(0, 256, (t, 6, 6, 3), dtype=np.uint8), "action": rng.normal(size=(t, 2)).astype(
        np.float32)}


L5KIT = Kind("l5kit", EPISODES, chunks=CHUNKS)
# a replay buffer's arrays are also set to each commit's lengths, just before its manifest
# zarr v3: inner chunks small against their shards (agents 3 a shard, frames 25): every shard is written in
# parts, shared by episodes, its last inner chunk rewritten as rows are appended
V3_CHUNKS = {"agents": 100, "frames": 10, "scenes": 2, "traffic_light_faces": 40}
L5KIT_V3 = Kind("l5kit v3", EPISODES, chunks=V3_CHUNKS, layout={"zarr_format": 3, "shard_bytes": 35_000})
ROBOT = Kind("replay buffer", [_robot(i) for i in range(10)],
             replay_buffer_schema({"img": (np.uint8, (6, 6, 3)), "action": (np.float32, (2,))}, chunk_rows=16))
ROBOT_V3 = dataclasses.replace(ROBOT, name="replay buffer v3", layout={"zarr_format": 3, "shard_bytes": 4 * 16 * 108})


def write(path, disk: SimulatedDisk | None, acked: list[str], durable: bool = True, kind: Kind = L5KIT) -> None:
    """Send the episodes of `kind` to a new dataset at `path` by key, acknowledging every ACK_EVERY with
    `sync()` (the keys acknowledged so far are appended to `acked` when `sync()` returns)."""
    with DatasetWriter(path, kind.schema, workers=0, chunks=kind.chunks, commit_interval=3600,
                       durable=durable, **kind.layout) as w:
        for i, ep in enumerate(kind.episodes):
            w.submit(ep, key=f"e{i}")
            if i % ACK_EVERY == ACK_EVERY - 1:
                w.sync()
                acked[:] = [f"e{j}" for j in range(i + 1)]
    acked[:] = [f"e{j}" for j in range(len(kind.episodes))]  # close() returned: all of them


def tables(path) -> dict[str, np.ndarray]:
    ds = Dataset.open(path)
    return {t: ds.read_rows(t, 0, ds.rows[t]) for t in ds.tables}


_REFERENCES: dict[str, tuple] = {}


def reference(tmp_path_factory, kind: Kind = L5KIT) -> tuple[dict[str, np.ndarray], int]:
    """The dataset of `kind` written in one go, without a power loss; and how many file operations that took
    (made once per session)."""
    if kind.name not in _REFERENCES:
        path = tmp_path_factory.mktemp("reference") / "d.zarr"
        disk = SimulatedDisk(path)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(DirectoryStore, "files", disk)
            write(path, disk, [], kind=kind)
        _REFERENCES[kind.name] = (tables(path), disk.ops)
    return _REFERENCES[kind.name]


def crash_and_recover(tmp_path, crash_at: int, tear: bool, seed: int, expected: dict[str, np.ndarray],
                      kind: Kind = L5KIT) -> None:
    path, recovered = tmp_path / f"d{crash_at}.zarr", tmp_path / f"r{crash_at}.zarr"
    disk = SimulatedDisk(path, crash_at=crash_at, tear=tear, seed=seed)
    acked: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DirectoryStore, "files", disk)
        try:
            write(path, disk, acked, kind=kind)
        except PowerLoss:
            pass
    assert disk.dead, "the power never failed"
    assert not disk.in_place, f"files written over in place (a v3 shard holds committed chunks): {disk.in_place}"
    if not disk.recover(recovered):
        assert acked == [], f"the dataset's folder did not survive, yet {acked} were acknowledged"
        return
    # after a restart the writer's process is gone; here it is this test's own, still alive: its lease goes
    for name in ("zarrfeed.lease", ".zarrfeed.lock"):
        if (recovered / name).exists():
            (recovered / name).unlink()
    if not (recovered / "zarrfeed.json").exists():  # no commit survived: nothing was acknowledged either
        assert acked == [], f"no manifest survived, yet {acked} were acknowledged"
        shutil.rmtree(recovered)
        write(recovered, None, [], kind=kind)  # the place is free for a new dataset, or refused in one line
    else:
        if any(read_manifest(DirectoryStore(recovered))["committed"].values()):  # (else maybe a create stopped)
            ds = Dataset.open(recovered)  # before anything is sent again: every committed chunk reads as written
            for t, rows in expected.items():
                assert ds.read_rows(t, 0, ds.rows[t]).tobytes() == rows[:ds.rows[t]].tobytes(), t
            # (a replay buffer's arrays may be longer than its last commit until a writer opens it: said by
            # validate, see `Dataset.steps_past_the_episodes`; its links are checked after the append, below)
            report, verified = ds.validate(), ds.verify()
            assert verified.ok and (report.ok or ds.schema.step_tables()), (report, verified)
        with DatasetWriter(recovered, workers=0, chunks=kind.chunks, mode="a") as w:
            lost = [k for k in acked if not w.is_committed(k)]
            assert not lost, f"acknowledged episodes lost by the power loss: {lost}"
            for i, ep in enumerate(kind.episodes):  # the same episodes again: committed ones are passed over
                w.submit(ep, key=f"e{i}")
    got = tables(recovered)
    for t, rows in expected.items():
        assert got[t].tobytes() == rows.tobytes(), f"table {t}: not the episodes once each, in order"
    ds = Dataset.open(recovered)
    report, verified = ds.validate(), ds.verify()  # `zarrfeed validate --deep`
    assert report.ok and verified.ok, (report, verified)
    for t in ds.schema.step_tables():  # a replay buffer: what Diffusion Policy's reader checks when it opens
        assert ds[t].shape[0] == ds.rows[t] and ds["episodes"].shape[0] == ds.rows["episodes"], t


@pytest.mark.parametrize("kind, seed", [(L5KIT, 1), (L5KIT, 2), (ROBOT, 3), (L5KIT_V3, 4), (ROBOT_V3, 5)],
                         ids=["l5kit-1", "l5kit-2", "robot-3", "l5kit-v3-4", "robot-v3-5"])
def test_every_acknowledged_episode_survives_a_power_loss_at_any_file_operation(tmp_path, tmp_path_factory, kind,
                                                                                seed):
    expected, ops = reference(tmp_path_factory, kind)
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, ops + 1), min(CRASH_POINTS, ops)))
    for crash_at in points:
        tear = rng.random() < 0.5
        try:
            crash_and_recover(tmp_path, crash_at, tear, seed, expected, kind)
        except BaseException as exc:
            raise AssertionError(f"power loss at operation {crash_at} of {ops} (seed {seed}, tear={tear}): "
                                 f"{type(exc).__name__}: {exc}") from exc
        finally:
            for p in tmp_path.iterdir():
                shutil.rmtree(p, ignore_errors=True)


def test_without_durability_a_power_loss_can_lose_acknowledged_episodes(tmp_path, tmp_path_factory):
    """The simulator tells the difference: with `durable=False` some crash point loses what `sync()`
    acknowledged (so the test above could fail)."""
    expected, ops = reference(tmp_path_factory)
    failures = 0
    for crash_at in range(ops // 2, ops + 1, max(1, ops // 40)):
        path, recovered = tmp_path / f"d{crash_at}.zarr", tmp_path / f"r{crash_at}.zarr"
        disk = SimulatedDisk(path, crash_at=crash_at)
        acked: list[str] = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(DirectoryStore, "files", disk)
            try:
                write(path, disk, acked, durable=False)
            except PowerLoss:
                pass
        if acked and not (disk.recover(recovered) and (recovered / "zarrfeed.json").exists()
                          and (recovered / "zarrfeed.json").stat().st_size > 0):
            failures += 1
    assert failures > 0


def test_the_simulator_tells_a_file_written_over_in_place(tmp_path):
    """The check above can fail: a file written over where it stands is listed; an object the store writes (aside,
    then renamed over the old one) is not."""
    path = tmp_path / "d"
    path.mkdir()
    (path / "shard").write_bytes(b"old")
    disk = SimulatedDisk(path)
    store = DirectoryStore(path, files=disk)
    store.put("shard", b"new")
    assert disk.in_place == [] and (path / "shard").read_bytes() == b"new"
    disk.write(str(path / "shard"), b"newer", sync=True)
    assert disk.in_place == ["shard"]
