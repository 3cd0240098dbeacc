"""Each kind's worker-side builder, run by hand on a cache of chunks laid out by hand (a numpy array, chunks in
slots of our choosing), makes exactly the batch its loader makes for the same plan and batch; and so does the
probe that sizes a transform's output (`probe_batch`), pickled as it is sent to its own process."""
import pickle

import numpy as np
import pytest

from zarrfeed import SequenceLoader
from zarrfeed.loader import AgentSampleLoader, EgoSampleLoader, Loader, WindowLoader
from zarrfeed.loader.kinds.base import CacheView
from zarrfeed.loader.engine.messages import FillIndex, GatherRows, GatherWindows
from zarrfeed.loader.kinds.rows import RowBuilder
from zarrfeed.loader.kinds.sample_groups import SampleBuilder


@pytest.fixture(scope="module")
def scenes(small_dataset):
    return small_dataset(6, 21, chunks={"agents": 3000, "frames": 100, "traffic_light_faces": 500}, frames=80,
                         agents_per_frame=60)


KINDS = {  # the loader of each kind, and its arguments (each kind's default window, and smaller ones)
    "rows": (Loader, dict(table="agents", batch_size=128, shuffle_window=2)),  # batches across windows
    "rows, selected": (Loader, dict(table="agents", batch_size=64, rows=np.arange(0, 20000, 3), order=1)),
    "rows, one window": (Loader, dict(table="frames", batch_size=33)),
    "windows": (WindowLoader, dict(history=5, future=7, batch_size=20)),
    "whole windows": (WindowLoader, dict(history=5, future=7, batch_size=20, whole_windows=True, shuffle_window=1)),
    "agents": (AgentSampleLoader, dict(history=3, future=4, batch_size=64)),
    "ego": (EgoSampleLoader, dict(history=3, future=4, batch_size=64, shuffle=False)),
    "sequences": (SequenceLoader, dict(sequence_length=16, pad_before=1, pad_after=7, batch_size=100)),
}


def _make(kind, scenes, dp_buffer):
    """The loader of `kind`, in this process, its batches owned copies."""
    cls, args = KINDS[kind]
    return cls(dp_buffer if cls is SequenceLoader else scenes, **args, num_workers=0, copy=True)


def _laid_out(ds, reads, slot_bytes):
    """The chunks `reads`, read with plain zarr, laid out in a cache by hand: the j-th in slot len(reads) - j
    (so slots and chunks are never in the same order), and slot 0 noise that no batch may read."""
    cache = np.random.default_rng(0).integers(0, 256, (len(reads) + 1) * slot_bytes, dtype=np.uint8)
    slots = {}
    for j, (table, chunk) in enumerate(reads):
        n = ds[table].chunks[0]
        records = ds[table][chunk * n:min((chunk + 1) * n, ds.rows[table])]
        slot = len(reads) - j
        cache[slot * slot_bytes:slot * slot_bytes + records.nbytes] = records.view(np.uint8)
        slots[table, chunk] = slot
    return cache, slots


def _built_by_hand(source, plan, k):
    """Batch k of `plan`, made by the source's builder on chunks laid out by hand, with messages made by hand."""
    reads = source.batch_chunks(plan, k)
    cache, slots = _laid_out(source.dataset, reads, source.chunk_bytes)
    make, args = source.builder()
    if make is RowBuilder:  # the windows' orders, over these slots, into index regions 0, 1, ...
        windows = plan.group_windows(k, 1)
        region_rows = max(int(plan.window_starts[w + 1] - plan.window_starts[w]) for w in windows)
        builder = make(CacheView(cache, source.chunk_bytes, np.zeros(region_rows * len(windows), np.int64),
                                   region_rows), *args)
        for region, w in enumerate(windows):
            window_slots = tuple(slots.get((source.table, int(c)), 0) for c in plan.windows[w])
            for part in plan.index_parts(w):
                builder.fill_index(0, FillIndex(plan.epoch, w, region, window_slots, part))
        msg = GatherRows(plan.epoch, k, 1, {w: region for region, w in enumerate(windows)}, plan.resumed_spans)
    else:
        assert issubclass(make, SampleBuilder)
        builder = make(CacheView(cache, source.chunk_bytes, np.zeros(0, np.int64), 0), *args)
        by_table = {t: {} for t in source.tables}
        for (table, chunk), slot in slots.items():
            by_table[table][chunk] = slot
        msg = GatherWindows(plan.epoch, k, 1, by_table, plan.resumed_spans)
    started = builder.start(msg)
    dst = np.zeros(builder.layout.slot_bytes, np.uint8)
    counts = builder.build(dst, msg, k, started)
    return {name: view.copy() for name, view in builder.views(dst, started, k, counts).items()}


def _same(got, want):
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert got[name].tobytes() == want[name].tobytes(), name


@pytest.mark.parametrize("kind", KINDS)
def test_a_builder_on_chunks_laid_out_by_hand_makes_the_loaders_batch(kind, scenes, dp_buffer):
    with _make(kind, scenes, dp_buffer) as loader:
        plan = loader.plan()
        batches = list(loader)
        straddling = [k for k in range(len(plan)) if len(plan.group_windows(k, 1)) > 1][:1]  # reads two windows
        for k in sorted({0, 1, len(plan) // 2, len(plan) - 1, *straddling}):
            _same(_built_by_hand(loader.source, plan, k), batches[k])


@pytest.mark.parametrize("kind", KINDS)
def test_the_probe_makes_the_loaders_batch_from_plain_reads(kind, scenes, dp_buffer):
    """What a transform is first run on, to size its output: the batch the workers make, whole (no nested
    loader), after a round trip through pickle."""
    with _make(kind, scenes, dp_buffer) as loader:
        plan = loader.plan()
        batches = list(loader)
        for k in sorted({0, len(plan) - 1}):
            probe = pickle.loads(pickle.dumps(loader.source.probe_batch(plan, k)))
            _same(probe(), batches[k])


def test_a_probe_reads_only_the_chunks_its_batch_reads(scenes):
    """The sample loaders' default window is the whole table: the probe reads one batch's chunks, not it."""
    with AgentSampleLoader(scenes, 3, 4, batch_size=8, num_workers=0) as loader:
        plan = loader.plan()
        probe = loader.source.probe_batch(plan, 0)
        window = {key for w in plan.group_windows(0, 1) for key in loader.source.chunks_of(plan, w)}
        assert set(probe.reads) <= window and len(probe.reads) < len(window)
