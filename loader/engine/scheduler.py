"""The scheduler of a loader's batches: shared memory, reader workers, and the order of their messages.

How a batch is made. Before a group of batches can be made, the windows of chunks they read must be
resident in the shared chunk cache. Making a window resident takes cache slots for its chunks (a chunk that
another resident window already holds is shared, not decoded again; slots of windows whose batches are all
made are reused) and, for row batches, an index region; it sends each of the least busy workers one `Decode`
message for its share of the window's chunks (fetched together, concurrently from an object store) and one
`FillIndex` message (write the window's shuffled rows, as cache rows, into the index). When a window is
ready, groups of batches that read it go to the least busy worker as one gather message (a group holds
about 32,768 rows, so a message's cost is paid once per group, not per batch). The next window is made
resident ahead of time, so decoding overlaps gathering. Only these small messages cross processes; the
records stay in shared memory, each chunk is decoded once per epoch, and the batch order depends on the plan
alone, never on workers or timing. The cache is sized from the plan: what the batches in flight can read.

The scheduler talks to a `BatchSource` (what to decode and gather for a kind of batch), to the chunk cache
(`chunk_cache.ChunkCache`: this loader's own or the host's), to the pool of workers (`worker_pools.Pool`:
processes, or this process with num_workers=0) and to the ring of batch slots (`loader.engine.ring`), through their
protocols and public methods, nothing else. How much of each it takes is `resources.Sizing`'s.
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable

import numpy as np

from ...core._proc.rendezvous import RendezvousError
from ...core._proc.pool import Failed, WorkerPool, describe_exit, is_stopped, process_state
from ...core.errors import ChunkError, LoaderError, LoaderStalledError
from ..caches import host_cache
from ..caches.chunk_cache import ChunkCache, ProcessCache
from .layout import Layout, TransformOutputError, transform_name
from .messages import Decode, Decoded, DecodeItem, FillIndex, Gathered, IndexFilled, Message, TransformFailed
from ..ordering.plan import EpochPlan
from .resources import Sizing
from .ring import Ring
from ..kinds.source import BatchSource, ResidentWindow
from .stalls import Holdup, StallWatch
from .worker_pools import InlinePool, Pool

log = logging.getLogger("zarrfeed.loader")
AHEAD_EPOCHS = 4  # a run's cache is sized for its first epoch and the 3 after it
_POLL = 0.05
_POLL_SHARED = 0.005  # while waiting for chunks that other processes decode (no reply will wake us)
_SLOW_DECODE = 10.0  # seconds a chunk another process decodes may take before the wait is said in the log


class Run:
    """Shared memory, its ring of batch slots and the workers: made at a loader's first iteration, kept until
    it closes, across epochs (the cache keeps decoded chunks)."""

    def __init__(self, source: BatchSource, sizing: Sizing, outputs: Layout | None, plan: EpochPlan) -> None:
        self.source, self.sizing, self.workers = source, sizing, sizing.workers
        self.layout = outputs or source.layout
        self.group = sizing.group()
        n_slots = sizing.ring_slots()
        # sized for this epoch and the next few: an epoch's need varies with its order by a few slots, and a
        # run sized for one epoch alone would be made again (workers and all) at almost every second epoch
        needs = [sizing.cache_size(plan)] + [sizing.cache_size(EpochPlan(plan.config, e, plan.selection))
                                              for e in range(plan.epoch + 1, plan.epoch + AHEAD_EPOCHS)]
        self.chunk_slots, self.regions = max(n[0] for n in needs), max(n[1] for n in needs)
        sizing.say_cache(plan, self.chunk_slots)
        self.watch: Callable[[float], None] | None = None  # the current or last epoch's stall watch (`Epoch._watch`)
        self.cache = self._cache(plan, max(min(sizing.cache_need(plan)[0], self.chunk_slots), 1))
        try:  # (a ring too large for this machine's shared memory left the host cache held until exit)
            self.shared = source.shared(self.cache.memory, self.layout.slot_bytes, n_slots, self.regions)
            self.ring = Ring(self.shared.ring, self.layout, source.config.batch_size)
            self.pool = self._pool(*source.worker(self.shared, outputs, self.workers.transform))
        except BaseException:
            self.free()
            raise
        self.n_workers = max(self.workers.num_workers, 1)
        self.chunks_decoded = 0  # by the current or last epoch

    def _cache(self, plan: EpochPlan, need: int) -> ChunkCache:
        """The host's cache of this dataset commit (found or made), or one of this loader's own: with
        cache="process", or when the host's has fewer slots than this loader needs at once."""
        sizing, source = self.sizing, self.source
        if sizing.host and sizing.cache_bytes:
            key = host_cache.CacheKey.of(source.dataset, source.chunk_bytes)
            # room for every chunk of the tables read (every rank's), within cache_bytes
            tables = {table for w in plan.window_batches() for table, _ in source.chunks_of(plan, w)}
            want = min(sum(key.chunks_per_table[key.tables.index(t)] for t in tables),
                       sizing.cache_bytes // max(source.chunk_bytes, 1))
            try:
                segment = host_cache.attach(key, sizing.cache_bytes, max(want, self.chunk_slots), need)
            except RendezvousError as exc:  # slower, never wrong: say why once and go on alone
                log.warning("zarrfeed: cannot use the host cache (%s); this loader keeps a cache of its own", exc)
                segment = None
            else:
                if segment is None:
                    log.info("zarrfeed: the host cache of this dataset has fewer than the %d chunk slots this loader "
                             "needs at once; using a cache of its own", need)
            if segment is not None:
                self.chunk_slots = segment.n_slots
                return host_cache.HostCache(segment, key)
        return ProcessCache(self.chunk_slots, source.chunk_bytes)

    def _pool(self, setup: Callable[..., Callable[[Any], Any]], args: tuple) -> Pool:
        """The workers, each made by `setup(wid, *args)`: processes, or this process with num_workers=0."""
        if self.workers.num_workers == 0:
            return InlinePool(setup(0, *args))
        return WorkerPool(self.workers.num_workers, setup, args, "loader worker", self.workers.start_method)

    def fits(self, plan: EpochPlan) -> bool:
        """Whether this run's cache and index are large enough for `plan`."""
        kept, regions = self.sizing.cache_size(plan)
        return self.cache.slots_needed(kept, self.sizing.cache_need(plan)[0]) <= self.chunk_slots \
            and regions <= self.regions

    def free(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.stop()
        ring = getattr(self, "ring", None)
        if ring is not None:
            ring.close()
        shared = getattr(self, "shared", None)
        if shared is not None:
            shared.close()
        watch, self.watch = self.watch, None  # (it holds the epoch, which holds this run)
        # a wait for the host cache's lock is never silent, here neither
        with self.cache.watching(watch) if watch is not None else contextlib.nullcontext():
            self.cache.close()  # and the memory of its chunks (a host cache's, once no loader here uses it)


class Epoch:
    """The scheduler of one epoch's batches (see the module docstring).

    A window is resident while its chunks are in cache slots (shared with other resident windows that need
    the same chunk) and, for row batches, its shuffled order is in an index region: where, a `ResidentWindow`
    tells the source that makes the gather messages of the batches that read it."""

    def __init__(self, run: Run, plan: EpochPlan, first: int, keep_cache: bool) -> None:
        self.run, self.plan, self.source = run, plan, run.source
        self.windows = plan.window_batches()  # window -> (first batch, last batch), in order of first use
        self.order = [w for w, (_, last) in self.windows.items() if last >= first]
        self.resident: dict[int, ResidentWindow] = {}  # window -> its chunks' slots and its index region
        self.cache = run.cache
        run.chunks_decoded = 0
        self.free_regions = list(range(run.regions))[::-1]
        self.pending: dict[int, int] = {}  # window -> decodes not yet answered
        self.unfilled: dict[int, dict[tuple[int, int], tuple[int, int]]] = {}  # window -> part -> its positions
        self.waiting: dict[int, list[int]] = {}  # cache slot -> windows waiting for its decode
        self.foreign: dict[int, float] = {}  # slot another process decodes -> when this epoch began to wait
        self.k_next = self.k_issue = self.oldest = first
        self.done = np.zeros(plan.num_batches + 1, bool)
        self.load = [0] * run.n_workers
        self.sent: list[dict[tuple, Message]] = [{} for _ in range(run.n_workers)]  # unanswered, for restarts
        self.counts: dict[int, dict[str, int]] = {}
        self.checked = 0.0
        self.stall = StallWatch(run.workers.stall_timeout)
        self.no_room = False  # the last window that was to be made resident found no room in the cache
        run.watch = self._watch  # (the run's close waits for the cache's lock too)
        with self.cache.watching(self._watch):
            self.cache.new_epoch(keep=keep_cache)

    # ------------------------------------------------------------ windows
    def _evict(self) -> None:
        while self.oldest < self.k_issue and self.done[self.oldest]:
            self.oldest += 1
        for w in [w for w in self.resident if self.windows[w][1] < self.oldest]:
            where = self.resident.pop(w)
            self.cache.unpin_window(w, [(table, chunk) for table, chunk, _ in where.chunks])
            if where.region is not None:
                self.free_regions.append(where.region)

    def _make_resident(self, w: int) -> bool:
        if w in self.resident:
            return True
        # pins and unpins wait for the host cache's lock, and so do decodes in this process (num_workers=0):
        # never silently
        with self.cache.watching(self._watch):
            return self._admit(w)

    def _admit(self, w: int) -> bool:
        """Make window `w` resident (see `_make_resident`); False if there is no room for it yet."""
        needs = self.source.chunks_of(self.plan, w)
        wants_region = self.run.regions > 0

        if wants_region and not self.free_regions:
            self._evict()
            if not self.free_regions:
                return False
        pins = self.cache.pin_window(w, needs)
        if pins is None:
            self._evict()
            pins = self.cache.pin_window(w, needs)
            if pins is None:
                self.no_room = True
                return False
        self.no_room = False
        self._moved()
        self.pending[w] = 0
        new = []
        for (table, chunk), pin in zip(needs, pins, strict=True):
            if pin.decode:
                new.append(DecodeItem(table, int(chunk), pin.slot, pin.token))
            if not pin.ready:
                self.pending[w] += 1
                self.waiting.setdefault(pin.slot, []).append(w)
        slots = [pin.slot for pin in pins]
        region = self.free_regions.pop() if wants_region else None
        self.resident[w] = ResidentWindow(region, tuple((table, chunk, slot)
                                                        for (table, chunk), slot in zip(needs, slots, strict=True)))
        self._decode(new)
        if region is not None:  # the window's order, in parts that the workers make at once
            self.unfilled[w] = {}
            for part in self.plan.index_parts(w):
                self.unfilled[w][part] = self.plan.part_positions(w, part)
                self._send(FillIndex(self.plan.epoch, w, region, tuple(slots), part))
        return True

    def _decode(self, items: list[DecodeItem]) -> None:
        """Ask the least busy workers to decode `items`, split between them."""
        self.run.chunks_decoded += len(items)
        parts = min(len(items), len(self.load))
        for part in (items[i::parts] for i in range(parts)):
            self._send(Decode(tuple(part)))

    def _ready(self, slot: int) -> None:
        for w in self.waiting.pop(slot, []):
            self.pending[w] -= 1

    def _poll_others(self) -> None:
        """Chunks this loader waits for that other loaders on the host decode: ready ones release their
        windows; those whose decoder died or failed are decoded here."""
        with self.cache.watching(self._watch):  # (polls wait for the host cache's lock, and decodes here too)
            self._poll_slots(time.monotonic())

    def _poll_slots(self, now: float) -> None:
        mine = {item.slot for sent in self.sent for msg in sent.values() if isinstance(msg, Decode)
                for item in msg.items}
        claims = []
        for slot in [s for s in self.waiting if s not in mine]:
            pin = self.cache.poll(slot)
            if pin.ready:
                self._ready(slot)
                self.foreign.pop(slot, None)
                self._moved()
            elif pin.decode:
                table, chunk = self.cache.key_of(slot)
                claims.append(DecodeItem(table, chunk, slot, pin.token))
                self.foreign.pop(slot, None)
            elif now - self.foreign.setdefault(slot, now) > _SLOW_DECODE:  # a stopped process: never silent
                self.foreign[slot] = float("inf")  # said once
                table, chunk = self.cache.key_of(slot)
                pid = self.cache.decoder_of(slot)
                how = (f"it is stopped: `kill -CONT {pid}` resumes it" if is_stopped(pid) else "stopped or busy?")
                log.warning("zarrfeed: waiting for chunk %d of table '%s', which process %s is decoding into the "
                            "host cache for over %.0f s (%s; once it exits, this loader decodes it itself)",
                            chunk, table, pid, _SLOW_DECODE, how)
        self._decode(claims)

    # ------------------------------------------------------------ messages
    def _send(self, msg: Message) -> None:
        wid = min(range(len(self.load)), key=self.load.__getitem__)
        self.load[wid] += 1
        self.sent[wid][msg.key] = msg
        since = time.monotonic()
        self.run.pool.send(wid, msg, waiting=lambda: self._watch(since))

    def _issue(self) -> None:
        g = self.run.group
        limit = min(self.plan.num_batches, self.run.ring.end(self.k_next))
        while self.k_issue < limit:
            count = min(g, limit - self.k_issue)
            if count < g and self.k_issue + count < self.plan.num_batches and self.k_issue > self.k_next:
                break  # wait for room for a whole group, unless the consumer is waiting for this one
            windows = self.plan.group_windows(self.k_issue, count)
            admitted = all(self._make_resident(w) for w in windows)
            if self.k_issue == self.k_next and count > 1:  # the consumer waits for this very batch: the
                count = self._ready_batches(self.k_issue, count)  # batches ready now go, not a group held back by
                windows = self.plan.group_windows(self.k_issue, count)  # windows still decoding (a group of
                admitted = all(w in self.resident for w in windows)  # batches of frames spans several windows)
            if not admitted or any(self.pending[w] for w in windows) or not self._filled(self.k_issue, count):
                break
            self._send(self.source.gather_message(self.plan, self.k_issue, count,
                                                  {w: self.resident[w] for w in windows}))
            self.k_issue += count
        ahead = self.run.sizing.read_ahead()
        for w in self.order:  # read ahead: the next windows not yet resident
            if ahead and w not in self.resident and self.windows[w][0] >= self.k_issue:
                if not self._make_resident(w):
                    break
                ahead -= 1

    def _ready_batches(self, first: int, count: int) -> int:
        """How many of batches [first, first + count) can be gathered now, from the first on (at least 1): their
        windows resident, decoded and their index filled."""
        n = 0
        while n < count and self._filled(first + n, 1) and all(
                w in self.resident and not self.pending[w] for w in self.plan.batch_windows(first + n)):
            n += 1
        return max(n, 1)

    def _filled(self, first: int, count: int) -> bool:
        """Whether the index holds the positions that batches [first, first + count) read (a window's parts
        are filled by several workers at once; batches go as soon as theirs are there)."""
        if not any(self.unfilled.get(w) for w in self.plan.group_windows(first, count)):
            return True
        return not any(lo < p.position + p.rows and p.position < hi
                       for p in self.plan.group_pieces(first, count)
                       for lo, hi in self.unfilled.get(p.window, {}).values())

    def _moved(self) -> None:
        self.stall.moved(self._waiting_for)

    def _waiting_for(self) -> str:
        return f"batch {self.k_next} of epoch {self.plan.epoch} (table '{self.source.table}')"

    def _holdups(self) -> list[Holdup]:
        """Who a stalled wait waits on: this loader's workers that are stopped with messages unanswered; the
        processes pinning the host cache's slots, when no window found room there; the processes decoding the
        chunks it waits for, and the one holding the host cache's table lock (which this loader or its workers
        wait for), when they are stopped."""
        ended = ("it is restarted" if self.run.workers.restart_workers else
                 "the loader raises LoaderError, as for any worker that dies")
        out = [Holdup(pid, f"loader worker {wid} (pid {pid})", True, ended=ended)
               for wid, pid in self.run.pool.stopped() if self.sent[wid]]
        if self.no_room:
            for pid, n in sorted(self.cache.holders().items()):
                state = process_state(pid)
                out.append(Holdup(pid, f"process {pid}, which pins {n} of the {self.run.chunk_slots} slots of the "
                                       "host cache this loader waits for room in,", state in ("T", "t"),
                                  f"is not stopped (state {state}): a loader there holds them until it reads on "
                                  "or closes"))
        for slot in self.foreign:
            pid = self.cache.decoder_of(slot)
            if pid and is_stopped(pid) and all(h.pid != pid for h in out):
                out.append(Holdup(pid, f"process {pid}, which decodes a chunk this loader waits for,", True))
        pid = self.cache.lock_holder()
        if pid and is_stopped(pid) and all(h.pid != pid for h in out):
            out.append(Holdup(pid, f"process {pid}, which holds the lock of the host cache's slot table,", True))
        return out

    def _watch(self, since: float) -> None:
        """Say a wait begun at `since` in the log once nothing moved for a while (see `loader.engine.stalls`); raise
        `LoaderStalledError` once it passed `stall_timeout` on a stopped process."""
        stopped = self.stall.check(since, self._waiting_for(), self._holdups)
        if stopped:
            assert self.stall.timeout is not None  # (raised only with one)
            raise LoaderStalledError(self._waiting_for(), self.stall.timeout,
                                     " and ".join(f"{h.what} (stopped)" for h in stopped), [h.pid for h in stopped])

    def _receive(self, timeout: float) -> None:
        replies = self.run.pool.poll(timeout)
        if replies:
            self._moved()
        for reply in replies:
            if isinstance(reply, Failed):
                raise LoaderError(self._describe_error(reply), reply.error) from reply.error.exc
            if isinstance(reply, TransformFailed):
                raise LoaderError(self._describe_failure(reply), reply.error) from reply.error.exc
            self.load[reply.worker] -= 1
            self.sent[reply.worker].pop(reply.key, None)
            if isinstance(reply, Decoded):
                for slot in reply.slots:
                    if self.cache.decoded(slot):
                        self._ready(slot)
            elif isinstance(reply, IndexFilled):
                self.unfilled[reply.window].pop(reply.part, None)
            elif isinstance(reply, Gathered):
                self.done[reply.first:reply.first + reply.count] = True
                for i, counts in enumerate(reply.counts or ()):  # rows of the ragged columns of each batch
                    if counts:
                        self.counts[reply.first + i] = counts
            else:
                raise TypeError(f"unexpected reply from a loader worker: {reply!r}")
        if self.cache.shared and self.waiting:
            self._poll_others()
        now = time.monotonic()
        if now - self.checked < 0.2:  # dead workers are noticed within 0.2 s (the pool's poll also wakes up)
            return
        self.checked = now
        for wid, pid, code in self.run.pool.dead():
            what = describe_exit("loader worker", wid, pid, code)
            if not self.run.workers.restart_workers:
                raise LoaderError(f"{what} during epoch {self.plan.epoch} (batch {self.k_next})",
                                  advice="pass restart_workers=True to restart it and produce its batches again")
            self.run.pool.restart(wid)
            for msg in self.sent[wid].values():
                self.run.pool.send(wid, msg)

    def _describe_error(self, reply: Failed) -> str:
        err = reply.error
        if reply.message is None:
            return f"loader worker {reply.worker} failed to start: {err}\nworker traceback:\n{err.traceback}"
        if isinstance(err.exc, ChunkError):  # says table, chunk and store: the one line a user needs
            return str(err.exc)
        return (f"loader worker {reply.worker} failed on {reply.message} of table '{self.source.table}': {err}\n"
                f"worker traceback:\n{err.traceback}")

    def _describe_failure(self, reply: TransformFailed) -> str:
        err, k = reply.error, reply.batch
        if isinstance(err.exc, TransformOutputError):  # zarrfeed's check of the output: its one line says it all
            return (f"transform {transform_name(self.run.workers.transform)!r}: {err.message} (epoch "
                    f"{self.plan.epoch}, table '{self.source.table}')")
        chunks = sorted({int(c) for w in self.plan.batch_windows(k) for c in self.plan.windows[w]})
        return (f"transform failed on batch {k} of epoch {self.plan.epoch} (table '{self.source.table}', "
                f"chunks {chunks}) in loader worker {reply.worker}: {err}\nworker traceback:\n{err.traceback}")

    # ------------------------------------------------------------ the consumer's side
    def get(self, k: int) -> dict[str, np.ndarray]:
        """Batch k as views into its ring slot (the previous batch's slot is free again)."""
        self.k_next = k
        if not self.done[k] or self.run.ring.has_room(self.k_issue, self.run.group, k):  # a group's room is free
            self._receive(0)
            self._issue()
        since = time.monotonic()
        while not self.done[k]:
            self._receive(_POLL_SHARED if self.cache.shared and self.waiting else _POLL)
            self._issue()
            self._watch(since)
        return self.run.ring.batch(k, self.plan.batch_rows(k), self.counts.pop(k, None))

    def drain(self) -> None:
        """Wait for every message sent (so no worker writes into memory the next epoch reuses)."""
        since = time.monotonic()
        while any(self.load):
            self._receive(_POLL)
            self._watch(since)
