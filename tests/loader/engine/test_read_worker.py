"""The reader worker's loop (`read_worker.BatchWorker` with a real `ChunkDecoder`) on its own, in this process,
against a builder of the test's own and a small real dataset: `Decode` writes each chunk's records into its
cache slot, a gather message builds each batch into ring slot k % n_slots (or, with a transform, its outputs),
a transform that raises is reported for its batch and the worker goes on, and other messages go to `others`."""
import numpy as np
import pytest
from zarrfeed.loader import Dataset
from zarrfeed.loader.engine import read_worker
from zarrfeed.loader.caches.chunk_cache import ProcessCacheMemory
from zarrfeed.loader.engine.fetch import FetchOptions
from zarrfeed.loader.engine.layout import Layout
from zarrfeed.loader.engine.messages import (Decode, Decoded, DecodeItem, FillIndex, Gathered, GatherWindows,
                                             IndexFilled, TransformFailed)

CHUNK_ROWS = 30
ROWS = 4  # rows of every batch the fake builder makes
N_SLOTS = 3
BATCH_BYTES = ROWS * 8


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(2, 3, chunks={"agents": CHUNK_ROWS}, frames=20, agents_per_frame=5)


class Builder:
    """Batch k: ROWS int64 values k * 100 + row, in column "x"; odd batches say they hold k rows of a ragged
    column "y"."""

    def __init__(self) -> None:
        self.started: list = []

    def start(self, msg):
        self.started.append(msg.first)
        return msg.epoch

    def build(self, dst, msg, k, started):
        np.frombuffer(dst, np.int64, ROWS)[:] = k * 100 + np.arange(ROWS)
        return {"y": k} if k % 2 else None

    def views(self, scratch, started, k, counts):
        return {"x": np.frombuffer(scratch, np.int64, ROWS)}

    def rows(self, started, k):
        return ROWS


@pytest.fixture
def worker(data):
    ds = Dataset.open(data)
    memory = ProcessCacheMemory(CHUNK_ROWS * ds["agents"].dtype.itemsize, 4)
    shared = read_worker.Shared(memory, 0, 0, BATCH_BYTES, N_SLOTS)
    decoder = read_worker.ChunkDecoder(read_worker.DatasetOpener.of(ds, FetchOptions()), ["agents"], shared)
    others: list = []

    def make(transform=None):
        outputs = Layout([("x", "<i8", (), -1)], ROWS) if transform else None
        return read_worker.BatchWorker(7, decoder, shared, Builder(), transform, outputs, BATCH_BYTES,
                                       others=lambda msg: others.append(msg) or IndexFilled(7, msg.window))

    make.ds, make.shared, make.others = ds, shared, others
    yield make
    shared.close()
    memory.close()


def ring(shared, k) -> np.ndarray:
    return np.frombuffer(shared.slot(k), np.int64, ROWS)


def test_decode_writes_each_chunk_into_its_slot(worker):
    w, ds = worker(), worker.ds
    reply = w(Decode((DecodeItem("agents", 2, 3), DecodeItem("agents", 0, 1))))
    assert reply == Decoded(7, (3, 1))
    cache, slot_bytes = worker.shared.arrays()[0], worker.shared.slot_bytes
    for chunk, slot in ((2, 3), (0, 1)):
        want = ds.read_rows("agents", chunk * CHUNK_ROWS, (chunk + 1) * CHUNK_ROWS).view(np.uint8).reshape(-1)
        np.testing.assert_array_equal(cache[slot * slot_bytes:][:want.size], want)


def test_a_gather_builds_each_batch_into_its_ring_slot(worker):
    w, shared = worker(), worker.shared
    reply = w(GatherWindows(0, 2, 3, {}))
    assert reply == Gathered(7, 2, 3, [None, {"y": 3}, None])
    for k in (2, 3, 4):  # slots 2, 0, 1
        np.testing.assert_array_equal(ring(shared, k), k * 100 + np.arange(ROWS))
    assert shared.slot(5).tobytes() == shared.slot(2).tobytes()  # batch 5 would take batch 2's slot


def test_with_a_transform_its_outputs_go_to_the_ring(worker):
    w, shared = worker(lambda batch: {"x": batch["x"] * 2}), worker.shared
    assert w(GatherWindows(0, 0, 2, {})) == Gathered(7, 0, 2, None)
    for k in (0, 1):
        np.testing.assert_array_equal(ring(shared, k), 2 * (k * 100 + np.arange(ROWS)))


def test_a_transform_that_raises_names_its_batch_and_the_worker_goes_on(worker):
    def transform(batch):
        if batch["x"][0] == 100:
            raise ValueError("no batch 1")
        return batch

    w = worker(transform)
    reply = w(GatherWindows(0, 0, 3, {}))
    assert isinstance(reply, TransformFailed) and (reply.worker, reply.first, reply.batch) == (7, 0, 1)
    assert "no batch 1" in str(reply.error)
    assert w(GatherWindows(0, 3, 1, {})) == Gathered(7, 3, 1, None)


def test_a_transform_output_of_the_wrong_shape_is_reported(worker):
    w = worker(lambda batch: {"x": batch["x"][:1]})
    reply = w(GatherWindows(0, 0, 1, {}))
    assert isinstance(reply, TransformFailed) and reply.batch == 0


def test_other_messages_go_to_others_and_only_decodes_wait(worker):
    w = worker()
    msg = FillIndex(0, 5, 0, (1, 2))
    assert w(msg) == IndexFilled(7, 5)
    assert worker.others == [msg]
    assert not w.urgent(Decode(())) and w.urgent(msg) and w.urgent(GatherWindows(0, 0, 1, {}))


def test_decodes_waiting_behind_are_prefetched(worker, monkeypatch):
    w = worker()
    asked = []
    monkeypatch.setattr(w.decode.fetcher, "prefetch", lambda keys, records: asked.append(keys))
    w.waiting([FillIndex(0, 0, 0, ()), Decode((DecodeItem("agents", 1, 0),)), Decode((DecodeItem("agents", 4, 1),))])
    assert len(asked) == 1 and [ref.key for ref in asked[0]] == ["agents/1", "agents/4"]
