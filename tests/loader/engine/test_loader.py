"""The Loader against the arrays read directly (zarrfeed's zarr v2 format layer, not the loader) and plain numpy:
order, contents, ranks, resume, transforms, faults, leaks."""
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from expected import shared_memory_held
from zarrfeed.loader import Dataset, FormatError, Loader, LoaderError
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array

from repo_paths import SUPPORT


def plain(path, table: str = "agents") -> np.ndarray:
    """Every row of `table` as the zarr v2 format layer reads its array (not through the loader)."""
    return Array.open(DirectoryStore(path), table, read_only=True)[:]


@pytest.fixture(scope="module")
def data(small_dataset):
    """A small dataset with small chunks: many chunks and windows, a partial last chunk."""
    return small_dataset(3, 11, chunks={"agents": 700, "frames": 50}, frames=60, agents_per_frame=40)


@pytest.fixture(scope="module")
def big(small_dataset):
    """Enough rows that an epoch is still under way when a worker is killed."""
    return small_dataset(12, 12, chunks={"agents": 5000})


def expected_rows(loader: Loader, epoch: int) -> list[np.ndarray]:
    """Global row indices of each batch, from the plan (itself checked against its contract in test_plan)."""
    plan = loader.plan(epoch)
    c = plan.config.chunk_rows
    out = []
    for k in range(len(plan)):
        rows = []
        for w, first, count in plan.segments(k):
            local = plan.window_order(w)[first:first + count]
            rows.append(plan.windows[w][local // c] * c + local % c)
        out.append(np.concatenate(rows))
    return out


def collect(loader, key="track_id"):
    return [b[key].copy() for b in loader]


def assert_batches_match_zarr(loader: Loader, batches: list[dict], epoch: int):
    table = plain(Path(str(loader.dataset.location)), loader.table)
    for b, rows in zip(batches, expected_rows(loader, epoch), strict=True):
        for name, col in b.items():
            np.testing.assert_array_equal(col, table[name][rows])


@pytest.mark.parametrize("batch_size, window, workers", [(64, 1, 2), (256, 3, 1), (1000, 8, 3), (7, 2, 2)])
def test_every_row_once_and_contents_match_zarr(data, batch_size, window, workers):
    with Loader(data, batch_size=batch_size, shuffle_window=window, num_workers=workers, copy=True) as loader:
        batches = list(loader)
    n = Dataset.open(data).rows["agents"]
    assert len(batches) == -(-n // batch_size) and sum(len(b["yaw"]) for b in batches) == n
    assert_batches_match_zarr(loader, batches, epoch=0)
    ids = np.concatenate(expected_rows(loader, 0))
    assert sorted(ids.tolist()) == list(range(n))


def test_same_batches_for_any_number_of_workers_and_prefetch(data):
    runs = []
    for workers, prefetch in [(0, 1), (1, 4), (2, 2), (3, 8)]:
        with Loader(data, batch_size=100, num_workers=workers, prefetch=prefetch, seed=5) as loader:
            runs.append([b["centroid"].copy() for b in loader])
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for a, b in zip(runs[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_batches_are_columnar_contiguous_views(data):
    with Loader(data, batch_size=128, fields=["centroid", "label_probabilities", "yaw"], num_workers=1) as loader:
        batch = next(iter(loader))
        assert list(batch) == ["centroid", "label_probabilities", "yaw"]
        assert batch["centroid"].shape == (128, 2) and batch["centroid"].dtype == np.float64
        assert batch["label_probabilities"].shape == (128, 17) and batch["yaw"].shape == (128,)
        for col in batch.values():
            assert col.flags.c_contiguous and not col.flags.owndata  # a view into shared memory
            np.from_dlpack(col)  # zero-copy consumers accept it


def test_no_shuffle_reads_in_row_order_and_epochs_differ(data):
    table = plain(data)
    with Loader(data, batch_size=500, shuffle=False, num_workers=2) as loader:
        got = np.concatenate([b["track_id"].copy() for b in loader])
    np.testing.assert_array_equal(got, table["track_id"])
    with Loader(data, batch_size=500, num_workers=2, copy=True) as loader:
        e0, e1 = list(loader), list(loader)  # the second iteration is epoch 1
        assert loader.epoch == 2
        assert_batches_match_zarr(loader, e1, epoch=1)
    assert not np.array_equal(e0[0]["track_id"], e1[0]["track_id"])


def test_ranks_are_disjoint_equal_and_complete(data):
    n = Dataset.open(data).rows["agents"]
    for drop_last in (False, True):
        per_rank = []
        for rank in range(3):
            with Loader(data, batch_size=50, rank=rank, world_size=3, drop_last=drop_last, num_workers=1) as loader:
                rows = np.concatenate(expected_rows(loader, 0))
                got = [b["track_id"].copy() for b in loader]
                assert len(got) == len(loader)
                per_rank.append((rows, len(got)))
        assert len({count for _, count in per_rank}) == 1  # equal batch counts: no rank waits forever
        everything = np.concatenate([rows for rows, _ in per_rank])
        if drop_last:
            assert len(set(everything.tolist())) == len(everything)
        else:
            assert set(everything.tolist()) == set(range(n))
            assert len(everything) - n == 3 * -(-n // 3) - n  # only the padding repeats rows


def test_resume_mid_epoch_equals_the_uninterrupted_run(data):
    with Loader(data, batch_size=90, num_workers=2, seed=3) as loader:
        full = collect(loader)
    with Loader(data, batch_size=90, num_workers=2, seed=3) as loader:
        it = iter(loader)
        head = [next(it)["track_id"].copy() for _ in range(7)]
        state = loader.state_dict()
    assert state["batch"] == 7 and state["epoch"] == 0
    with Loader(data, batch_size=90, num_workers=1, seed=3) as resumed:
        resumed.load_state_dict(state)
        tail = collect(resumed)
    for a, b in zip(head + tail, full, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="loader state has batch_size=90; this loader has batch_size=91"):
        Loader(data, batch_size=91).load_state_dict(state)


def test_resume_does_not_read_skipped_batches(data, tmp_path):
    copy = tmp_path / "d.zarr"
    import shutil
    shutil.copytree(data, copy)
    (copy / "agents" / "0").write_bytes(b"garbage")  # rows 0-699: batches 0-6 with batch 100, no shuffle
    with Loader(copy, batch_size=100, shuffle=False, shuffle_window=1, num_workers=1) as loader:
        with pytest.raises(LoaderError, match="table 'agents': chunk 'agents/0' .*is not the chunk that was committed"):
            next(iter(loader))
    with Loader(copy, batch_size=100, shuffle=False, shuffle_window=1, num_workers=1) as loader:
        loader.load_state_dict({**loader.state_dict(), "batch": 7})
        assert len(collect(loader)) == len(loader) - 7


def test_rows_selection(data):
    table = plain(data)
    mask = table["label_probabilities"][:, 3] == 1  # cars only, as L5Kit's agents mask
    with Loader(data, batch_size=64, rows=mask, num_workers=2) as loader:
        got = np.concatenate([b["label_probabilities"].copy() for b in loader])
    assert len(got) == mask.sum() and (got[:, 3] == 1).all()


def test_transform_runs_in_workers_with_closures(data):
    scale = 2.0

    def features(batch):
        return {"xy": (batch["centroid"] * scale).astype(np.float32), "pid": np.full(len(batch["yaw"]), os.getpid())}

    with Loader(data, batch_size=100, transform=features, num_workers=2, copy=True) as loader:
        out = list(loader)
        raw = Loader(data, batch_size=100, num_workers=0, copy=True)
        for a, b in zip(out, raw, strict=True):
            np.testing.assert_allclose(a["xy"], (b["centroid"] * 2).astype(np.float32))
    assert {int(b["pid"][0]) for b in out} - {os.getpid()}  # ran in other processes
    assert out[-1]["xy"].shape[0] == len(out[-1]["pid"])


def test_transform_errors_name_the_batch_and_carry_the_traceback(data):
    def bad(batch):
        if batch["track_id"].max() > 150:
            raise ZeroDivisionError("boom")
        return {"x": batch["yaw"]}

    with pytest.raises(LoaderError, match=r"transform failed on batch \d+ of epoch 0 \(table 'agents', chunks"
                                          r"(.|\n)*ZeroDivisionError: boom(.|\n)*worker traceback"):
        with Loader(data, batch_size=100, shuffle=False, transform=bad, num_workers=2) as loader:
            list(loader)

    def changing(batch):
        return {"x": batch["yaw"] if batch["track_id"].max() < 150 else batch["yaw"].astype(np.float64)}

    with pytest.raises(LoaderError, match=r"transform output 'x' of batch \d+ is float64"):
        with Loader(data, batch_size=100, shuffle=False, transform=changing, num_workers=1) as loader:
            list(loader)


def alive(pids):
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except (FileNotFoundError, ProcessLookupError):  # (gone, or going while its stat was read)
            continue
        if state != "Z":
            out.append(pid)
    return out


def test_killed_worker_is_reported_within_seconds(big):
    with Loader(big, batch_size=256, num_workers=2) as loader:
        it = iter(loader)
        next(it)
        os.kill(loader.worker_pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(LoaderError, match=r"loader worker 1 \(pid \d+\) killed by SIGKILL"):
            for _ in it:  # batches made before the kill may still arrive; the next epoch needs the worker
                pass
            list(loader)
        assert time.monotonic() - t0 < 5


def test_killed_worker_is_restarted_and_the_epoch_completes(big):
    with Loader(big, batch_size=256, num_workers=2, seed=9, copy=True) as loader:
        want = collect(loader)
    with Loader(big, batch_size=256, num_workers=2, seed=9, restart_workers=True) as loader:
        got = []
        for i, b in enumerate(loader):
            got.append(b["track_id"].copy())
            if i == 3:
                old = loader.worker_pids
                os.kill(old[0], signal.SIGKILL)
        assert loader.worker_pids[0] != old[0]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("how", ["break", "close", "exception", "gc"])
def test_workers_stop_within_two_seconds(data, how):
    loader = Loader(data, batch_size=50, num_workers=2)
    pids = []
    if how == "exception":
        def consume():
            for _ in loader:  # the loop's own iterator, as in a training script
                pids.extend(loader.worker_pids)
                raise KeyError("consumer failed")
        with pytest.raises(KeyError):
            consume()
    else:
        it = iter(loader)
        next(it)
        pids = loader.worker_pids
        if how == "break":
            for _ in it:
                break
            del it
        elif how == "close":
            loader.close()
        else:
            del it, loader
            gc.collect()
    deadline = time.monotonic() + 2
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids and not alive(pids)


def test_no_descriptors_accumulate_over_epochs(data):
    with Loader(data, batch_size=200, num_workers=2) as loader:
        list(loader)
        pids = loader.worker_pids
        before = [len(os.listdir(f"/proc/{p}/fd")) for p in pids], len(os.listdir("/proc/self/fd"))
        for _ in range(4):
            list(loader)
        after = [len(os.listdir(f"/proc/{p}/fd")) for p in pids], len(os.listdir("/proc/self/fd"))
    assert before == after


def test_nothing_left_when_the_consumer_is_killed(data):
    code = ("import sys, time; from zarrfeed.loader import Loader\n"
            f"loader = Loader({str(data)!r}, batch_size=50, num_workers=2)\n"
            "it = iter(loader); next(it)\n"
            "print(*loader.worker_pids, flush=True)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in child.stdout.readline().split()]
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 3
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pids)  # workers notice their consumer is gone
    assert shared_memory_held(pids + [child.pid]) == []


def test_reads_only_committed_rows_while_a_writer_ingests(tmp_path):
    out = tmp_path / "d.zarr"
    child = subprocess.Popen([sys.executable, str(SUPPORT / "writer_child.py"), str(out), "40", "2", "0.04"],
                             stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    want = np.concatenate([e["agents"] for e in synthetic.episodes(40, seed=5, frames=40, agents_per_frame=300)])
    reads = 0
    while child.poll() is None:
        try:
            ds = Dataset.open(out)
        except FormatError:  # the dataset is being created
            continue
        if ds.rows["agents"] == 0:
            continue
        with Loader(ds, batch_size=1000, shuffle=False, num_workers=1) as loader:
            got = np.concatenate([b["centroid"].copy() for b in loader])
        assert len(got) == ds.rows["agents"]
        np.testing.assert_array_equal(got, want["centroid"][: len(got)])
        reads += len(got) < len(want)  # read while the writer was still going
    assert child.returncode == 0 and reads >= 1


def test_too_large_a_ring_is_refused_up_front_saying_how_much(data):
    """...and the host cache it attached first is let go (it was held until the process exited, and a later
    test of the host caches found it)."""
    from zarrfeed.core._proc.shm import ShmSpaceError
    from zarrfeed.loader.caches import host_budget
    before = host_budget.usage()
    with pytest.raises(ShmSpaceError, match=r"needs \d+ MiB of shared memory but only \d+ MiB is available"):
        with Loader(data, batch_size=400_000_000, num_workers=1) as loader:
            next(iter(loader))
    del loader
    assert host_budget.usage() == before


def test_loads_from_a_zip_store_and_a_url(real_scene, real_zip):
    want = plain(real_scene)["track_id"]
    for location in (real_zip, f"file://{real_scene}"):
        with Loader(location, batch_size=1000, shuffle=False, num_workers=2) as loader:
            got = np.concatenate([b["track_id"].copy() for b in loader])
        np.testing.assert_array_equal(got, want)


def test_one_loop_at_a_time(data):
    with Loader(data, batch_size=100, num_workers=1) as loader:
        first = iter(loader)
        next(first)
        with pytest.raises(RuntimeError, match="already being iterated"):
            next(iter(loader))


class Unusual(Exception):
    """A user's own exception type, to be carried from a worker as an object."""


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_the_transform_never_runs_in_the_training_process(data, method):
    """A transform that initialises CUDA (or anything else that breaks in a forked child) must not run in the
    process that starts the workers: the batch-sizing run happens in a process of its own."""
    parent = os.getpid()

    def features(batch):
        if os.getpid() == parent:
            raise AssertionError("the transform ran in the training process")
        return {"xy": batch["centroid"].astype(np.float32)}

    with Loader(data, batch_size=100, transform=features, num_workers=2, start_method=method) as loader:
        assert sum(len(b["xy"]) for b in loader) == Dataset.open(data).rows["agents"]


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_exceptions_arrive_as_objects(data, workers):
    def bad(batch):
        if batch["track_id"].max() > 150:
            raise Unusual("boom", 42)
        return {"x": batch["yaw"]}

    with pytest.raises(LoaderError) as caught:
        with Loader(data, batch_size=100, shuffle=False, transform=bad, num_workers=workers) as loader:
            list(loader)
    err = caught.value
    assert isinstance(err.__cause__, Unusual) and err.__cause__.args == ("boom", 42)
    assert err.remote.exc.args == ("boom", 42) and "raise Unusual" in err.remote.traceback
    assert err.remote.type_name.endswith("Unusual")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_first_output_is_a_loader_error(data, workers):
    """The first batch's output sizes the slots; if it is not batch-shaped, LoaderError (not ValueError)."""
    with pytest.raises(LoaderError, match=r"transform output 'x' of batch 0 is float32\(3,\), expected"):
        with Loader(data, batch_size=100, transform=lambda b: {"x": np.zeros(3, np.float32)},
                    num_workers=workers) as loader:
            next(iter(loader))
    with pytest.raises(LoaderError, match="transform must return a dict of numpy arrays") as caught:
        with Loader(data, batch_size=100, transform=lambda b: [1], num_workers=workers) as loader:
            next(iter(loader))
    assert isinstance(caught.value.__cause__, TypeError)


def test_a_corrupt_chunk_is_one_line_carrying_the_chunk_error(data, tmp_path):
    import shutil

    from zarrfeed.core.chunks import ChunkError
    copy = tmp_path / "d.zarr"
    shutil.copytree(data, copy)
    (copy / "agents" / "0").write_bytes(b"garbage")
    with pytest.raises(LoaderError) as caught:
        with Loader(copy, batch_size=100, shuffle=False, num_workers=1) as loader:
            next(iter(loader))
    assert "\n" not in str(caught.value) and isinstance(caught.value.__cause__, ChunkError)


def test_resume_state_is_named_versioned_and_exact(data, tmp_path):
    """The state names its format and version, the dataset and commit it was made on, and identifies the row
    selection exactly: selections {0, 3} and {1, 2} used to look alike (sum + 7 * len)."""
    import json

    def state(rows=None, path=data, **kw):
        with Loader(path, batch_size=2, rows=rows, num_workers=0, **kw) as loader:
            next(iter(loader))
            return loader.state_dict()

    s03 = state(np.array([0, 3]))
    assert s03["name"] == "zarrfeed.LoaderState" and s03["version"] == 1 and s03["batch"] == 1
    assert json.loads(json.dumps(s03)) == s03  # plain data: JSON, torch.save, any checkpoint format
    with pytest.raises(ValueError, match=r"another selection \(rows=\)"):
        Loader(data, batch_size=2, rows=np.array([1, 2]), num_workers=0).load_state_dict(s03)
    Loader(data, batch_size=2, rows=np.array([0, 3]), num_workers=0).load_state_dict(s03)
    mask = np.zeros(Dataset.open(data).rows["agents"], bool)
    mask[[0, 3]] = True  # the same selection, as a mask: the same state
    Loader(data, batch_size=2, rows=mask, num_workers=0).load_state_dict(s03)

    with pytest.raises(ValueError, match="version 2 is not the version this zarrfeed reads"):
        Loader(data, batch_size=2, num_workers=0).load_state_dict({**state(), "version": 2})
    with pytest.raises(ValueError, match="not a zarrfeed loader state"):
        Loader(data, batch_size=2, num_workers=0).load_state_dict({"epoch": 0, "batch": 3, "config": []})
    with pytest.raises(ValueError, match="loader state has seed=1; this loader has seed=0"):
        Loader(data, batch_size=2, num_workers=0).load_state_dict(state(seed=1))

    other = tmp_path / "other.zarr"  # same rows, same settings, another dataset
    write_dataset(other, synthetic.episodes(3, seed=11, frames=60, agents_per_frame=40),
                  chunks={"agents": 700, "frames": 50})
    with pytest.raises(ValueError, match="made on another dataset"):
        Loader(other, batch_size=2, num_workers=0).load_state_dict(state())

    from zarrfeed.writer import DatasetWriter
    with DatasetWriter(other, mode="a", workers=0) as w:  # a later commit: other rows, another plan
        w.ingest(synthetic.episodes(1, seed=99, frames=20, agents_per_frame=10))
    old = Dataset.open(other).commit - 1
    saved = state(path=Dataset.open(other, commit=old))
    with pytest.raises(ValueError, match=f"made on commit {old} of this dataset; this loader reads commit "
                                         f"{old + 1} \\(open it with commit={old}"):
        Loader(other, batch_size=2, num_workers=0).load_state_dict(saved)
    Loader(other, batch_size=2, num_workers=0, commit=old).load_state_dict(saved)


def test_a_state_past_the_end_of_its_epoch_is_refused(data):
    """A resume state whose batch is past its epoch's end was accepted silently (and the
    loader went on with the next epoch). The end itself (every batch of the epoch read) is a valid state."""
    with Loader(data, batch_size=100, num_workers=0, seed=3) as loader:
        n = len(loader)
        batches = iter(loader)
        for _ in range(n):
            next(batches)
        at_end = loader.state_dict()  # every batch read, the epoch not yet advanced
    assert at_end["batch"] == n
    resumed = Loader(data, batch_size=100, num_workers=2, seed=3)
    resumed.load_state_dict(at_end)
    # the rest of epoch 0 is nothing: that loop reads none of it (it read all of epoch 1, putting a rank that
    # saved here an epoch ahead of ranks with batches left), then epoch 1 is read whole
    assert collect(resumed) == [] and resumed.epoch == 1
    assert len(collect(resumed)) == n and resumed.epoch == 2
    resumed.close()
    for bad in ({"batch": n + 1}, {"batch": -1}, {"epoch": -1}):
        with pytest.raises(ValueError, match=r"^loader state is at batch -?\d+ of epoch -?\d+, outside that "
                                             r"epoch \(it has \d+ batches for this loader\)$"):
            Loader(data, batch_size=100, num_workers=0, seed=3).load_state_dict({**at_end, **bad})


@pytest.mark.parametrize("workers", [0, 2])
def test_an_empty_row_list_is_an_empty_epoch(data, workers):
    """`rows=[]` (a Python list, which numpy makes float64) was refused as float64."""
    with Loader(data, batch_size=100, rows=[], num_workers=workers) as loader:
        assert len(loader) == 0 and list(loader) == [] and loader.worker_pids == []
        state = loader.state_dict()
    Loader(data, batch_size=100, rows=np.array([], np.int64), num_workers=0).load_state_dict(state)
    with pytest.raises(ValueError, match=r"rows: expected a 1-D integer index array or a boolean mask, got float64"):
        Loader(data, rows=[1.0, 2.0], num_workers=0)


def test_lossy_dtypes_are_refused_unless_asked_for(data):
    """`dtypes={"centroid": "int8"}` wrapped values silently (300.0 became 44)."""
    table = plain(data)
    with pytest.raises(ValueError, match=r"^dtypes: casting field 'centroid' from float64 to int8 can change its "
                                         r"values \(refused by default\); pass casting='unsafe' to allow it$"):
        Loader(data, dtypes={"centroid": "int8"}, num_workers=0)
    with pytest.raises(ValueError, match=r"field 'track_id' from uint64 to int32 can change its values "
                                         r"\(casting='safe' refuses it\)"):
        Loader(data, dtypes={"track_id": "int32"}, casting="safe", num_workers=0)
    with pytest.raises(ValueError, match="casting must be one of"):
        Loader(data, dtypes={"track_id": "int32"}, casting="wrap", num_workers=0)
    # allowed: rounding a float (what dtypes= is for), widening, and whatever casting= asks for
    with Loader(data, batch_size=100, shuffle=False, num_workers=2, copy=True,
                dtypes={"centroid": "float32", "yaw": "float64", "track_id": "int16"}, casting="unsafe") as loader:
        first = next(iter(loader))
    rows = table[:100]
    np.testing.assert_array_equal(first["centroid"], rows["centroid"].astype(np.float32))
    np.testing.assert_array_equal(first["track_id"], rows["track_id"].astype(np.int16))
    assert first["yaw"].dtype == np.float64
    with Loader(data, batch_size=100, shuffle=False, num_workers=0, dtypes={"centroid": "float32"}) as loader:
        assert next(iter(loader))["centroid"].dtype == np.float32  # the default allows it


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_returning_objects_is_a_loader_error_naming_the_field(data, workers):
    """An object array from a transform gave numpy's raw ValueError ("cannot create an OBJECT
    array from memory buffer")."""
    def objects(batch):
        return {"xy": batch["centroid"], "names": np.array([f"agent {i}" for i in batch["track_id"]], object)}

    with pytest.raises(LoaderError, match=r"^transform output 'names' of batch 0 of epoch 0 \(table 'agents'\) is "
                                          r"an array of Python objects \(dtype object\)"):
        with Loader(data, batch_size=100, transform=objects, num_workers=workers) as loader:
            next(iter(loader))


@pytest.mark.parametrize("field, value, kinds", [
    ("epoch", "3", "int"), ("epoch", True, "int"), ("commit", "7", "int or None"), ("dataset_id", 5, "str or None"),
    ("spans", {}, "list or None"), ("settings", [], "dict"),
])
def test_a_state_field_of_the_wrong_kind_is_named_with_the_kinds_it_takes(field, value, kinds):
    from zarrfeed.loader.ordering.state import LoaderState
    good = LoaderState(kind="Loader", dataset_id="d", commit=1).to_dict()
    assert LoaderState.from_dict(good) == LoaderState(kind="Loader", dataset_id="d", commit=1)
    with pytest.raises(ValueError) as err:
        LoaderState.from_dict({**good, field: value})
    assert str(err.value) == f"loader state field {field!r} is {value!r}, not a {kinds}"


def test_a_state_missing_a_setting_is_refused_naming_it(small_dataset):
    """Comparing only the settings a saved state holds let a state without its
    seed resume another seed's epoch, in another order."""
    path = small_dataset(2, seed=1, frames=30, agents_per_frame=10)
    with Loader(path, table="agents", batch_size=32, seed=3, num_workers=0) as a:
        next(iter(a))
        state = a.state_dict()
    del state["settings"]["seed"]
    with Loader(path, table="agents", batch_size=32, seed=5, num_workers=0) as b:
        with pytest.raises(ValueError, match="seed"):
            b.load_state_dict(state)
