"""How much of everything a source's batches need (`Sizing`): batches per gather message, ring slots, windows
read ahead, cache slots and index regions, all from the plan and the options, never from timing."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ...core.sizes import binary_size
from ..options import WorkerOptions
from ..ordering.plan import EpochPlan
from ..kinds.source import BatchSource

log = logging.getLogger("zarrfeed.loader")
_GROUP_ROWS = 32768  # rows per gather message (see Sizing.group)
_GROUP_ROWS_TRANSFORM = 4096
_RING_BYTES = 8 << 20
# and at most 8 MiB of batches a message: large batches (camera frames) gain nothing from groups, while the ring
# holds two groups per worker, all of it mapped before the first batch (340 MiB for 64 windows of two 96x96 frames)
_GROUP_BYTES = 8 << 20


@dataclass
class Sizing:
    """How much of everything a source's batches need with these options: batches per gather message, ring
    slots, cache slots and index regions. `cache_bytes` lets the cache keep decoded chunks across epochs."""

    source: BatchSource
    workers: WorkerOptions
    cache_bytes: int
    remote_store: bool  # the dataset is on an object store
    said_cache: bool = False
    cache_is_default: bool = False
    host: bool = True  # decoded chunks shared by every loader of the dataset commit on this machine

    def group(self) -> int:
        """Batches per gather message: about 32,768 rows' worth, or 4,096 with a transform (whose cost is
        unknown: a batch waits for its whole group). Each message costs the consumer's process tens of
        microseconds (send, wake a worker, receive), so larger groups cut its CPU per epoch
        (`bench/bench_loader.py` measures cached epochs); and no more than 8 MiB of batches (see `_GROUP_BYTES`)."""
        rows = _GROUP_ROWS_TRANSFORM if self.workers.transform else _GROUP_ROWS
        by_rows = rows // max(self.source.rows_touched(), 1)
        return max(1, min(by_rows, _GROUP_BYTES // max(self.source.layout.slot_bytes, 1)))

    def ring_slots(self) -> int:
        """Batches in flight: `prefetch`, two groups per worker, and at least 8 MiB of batches (with fewer
        slots, workers wait for their next message)."""
        g = self.group()
        by_bytes = -(-_RING_BYTES // max(self.source.layout.slot_bytes, 1))
        return max(self.workers.prefetch, 2 * max(self.workers.num_workers, 1) * g, by_bytes) + g

    def read_ahead(self) -> int:
        """Windows made resident ahead of the batches being gathered: four on an object store with worker
        processes (requests for later windows overlap gathering this one), else one (decoding is the only
        wait, and with no workers nothing runs alongside)."""
        return 4 if self.workers.num_workers and self.remote_store else 1

    def cache_need(self, plan: EpochPlan) -> tuple[int, int]:
        """Cache slots and index regions that `plan` needs: the most that the windows read by any
        `ring_slots()` consecutive batches hold at once, plus room to read ahead."""
        span = self.ring_slots()
        events: dict[int, list[int]] = {}
        biggest = 1
        for w, (first, last) in plan.window_batches().items():
            n = len(self.source.chunks_of(plan, w))
            biggest = max(biggest, n)
            for at, delta in ((max(0, first - span + 1), (n, 1)), (last + 1, (-n, -1))):
                e = events.setdefault(at, [0, 0])
                e[0] += delta[0]
                e[1] += delta[1]
        chunks = windows = most_chunks = most_windows = 0
        for at in sorted(events):
            chunks, windows = chunks + events[at][0], windows + events[at][1]
            most_chunks, most_windows = max(most_chunks, chunks), max(most_windows, windows)
        # room to read ahead: the next windows can be decoded before the oldest one is freed
        extra = 1 + self.read_ahead()
        # (never more regions than the epoch has windows: a whole-table window needs one)
        regions = min(most_windows + extra, len(plan.windows)) if self.source.uses_index else 0
        return most_chunks + extra * biggest, regions

    def _chunks_read(self, plan: EpochPlan) -> int:
        """The chunks an epoch reads (the same in every epoch)."""
        return len({key for w in plan.window_batches() for key in self.source.chunks_of(plan, w)})

    def cache_size(self, plan: EpochPlan) -> tuple[int, int]:
        """Cache slots and index regions: what the plan needs, or more cache slots to keep decoded chunks
        across epochs, up to `cache_bytes` (all the chunks the plan reads if they fit)."""
        slots, regions = self.cache_need(plan)
        chunks = self._chunks_read(plan)
        keep = min(chunks, self.cache_bytes // max(self.source.chunk_bytes, 1))
        return min(max(slots, keep), max(chunks, 1)), regions  # a slot for each chunk read: none evicted

    def say_cache(self, plan: EpochPlan, slots: int) -> None:
        """Say in the log, once, how many decoded chunks a cache of `slots` keeps across epochs, and why: all
        its slots keep theirs (with any `cache_bytes`), so when the batches in flight need more chunks at once
        than `cache_bytes` holds, that is what is kept, in memory the loader takes anyway."""
        if not self.cache_bytes or self.said_cache:
            return
        self.said_cache = True
        chunk_bytes = max(self.source.chunk_bytes, 1)
        chunks = self._chunks_read(plan)
        kept, budget = min(slots, chunks), min(chunks, self.cache_bytes // chunk_bytes)
        given = f"cache_bytes={binary_size(self.cache_bytes)}" + (
            " (a quarter of the available memory; 0 turns it off)" if self.cache_is_default else "")
        what = (f"{'all' if kept == chunks else f'{kept} (later epochs decode the rest)'} of the {chunks} chunks "
                f"({binary_size(chunks * chunk_bytes)}) that an epoch reads")
        if kept <= budget:
            log.info("zarrfeed: decoded chunks kept across epochs within %s: %s", given, what)
        else:
            log.info("zarrfeed: decoded chunks kept across epochs: %s, more than %s holds (%s of %s): the batches "
                     "in flight need %s in memory at once, and those stay decoded for the next epoch "
                     "(cache_bytes=0 decodes every epoch)", what, given, _chunks(budget), binary_size(chunk_bytes),
                     _chunks(kept))


def _chunks(n: int) -> str:
    return f"{n} chunk" if n == 1 else f"{n} chunks"
