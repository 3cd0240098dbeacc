"""What `zarrfeed serve` is doing, for its operator: the open streams and uploads, what they have moved, the
server's processes and memory. The `status` action and `zarrfeed status URL` report it, the optional
Prometheus endpoint exports it (`metrics.py`), and each stream and upload leaves one access-log line when it
ends (logger "zarrfeed.access": client, what it asked for, rows, seconds, outcome).
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

access_log = logging.getLogger("zarrfeed.access")


@dataclass
class StreamRecord:
    """One do_get stream: who, what, and what it has sent so far."""

    id: int
    client: str
    dataset: str
    table: str
    kind: str
    rank: int
    world_size: int
    epoch: int
    started: float = field(default_factory=time.monotonic)
    batches: int = 0
    rows: int = 0
    bytes: int = 0

    def report(self, now: float) -> dict[str, Any]:
        seconds = max(now - self.started, 1e-9)
        return {"id": self.id, "client": self.client, "dataset": self.dataset, "table": self.table,
                "kind": self.kind, "rank": self.rank,
                "world_size": self.world_size, "epoch": self.epoch, "batches": self.batches, "rows": self.rows,
                "seconds": round(seconds, 3), "rows_per_s": round(self.rows / seconds, 1)}


@dataclass
class UploadRecord:
    """One do_put call of a producer."""

    id: int
    client: str
    dataset: str
    started: float = field(default_factory=time.monotonic)
    accepted: int = 0
    passed_over: int = 0
    bytes: int = 0

    def report(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "client": self.client, "dataset": self.dataset, "accepted": self.accepted,
                "passed_over": self.passed_over,
                "bytes": self.bytes, "seconds": round(now - self.started, 3)}


class Activity:
    """The server's open streams and uploads and its totals since it started; thread-safe (gRPC calls each
    run on a thread of their own)."""

    def __init__(self) -> None:
        self.started, self._wall = time.monotonic(), time.time()
        self.streams: dict[int, StreamRecord] = {}
        self.uploads: dict[int, UploadRecord] = {}
        self.totals = {"streams": 0, "batches": 0, "rows_sent": 0, "bytes_sent": 0, "chunks_decoded": 0, "uploads": 0,
                       "episodes_accepted": 0, "episodes_passed_over": 0, "bytes_received": 0, "refused": 0,
                       "streams_given_up": 0}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ streams
    def stream_started(self, client: str, dataset: str, table: str, kind: str, rank: int, world_size: int,
                       epoch: int) -> StreamRecord:
        with self._lock:
            record = StreamRecord(next(self._ids), client, dataset, table, kind, rank, world_size, epoch)
            self.streams[record.id] = record
            self.totals["streams"] += 1
        return record

    def sent(self, record: StreamRecord, rows: int, nbytes: int) -> None:
        with self._lock:
            record.batches += 1
            record.rows += rows
            record.bytes += nbytes
            self.totals["batches"] += 1
            self.totals["rows_sent"] += rows
            self.totals["bytes_sent"] += nbytes

    def stream_ended(self, record: StreamRecord, outcome: str, decoded: int = 0) -> None:
        """A stream ended with `outcome`, its loader having decoded `decoded` chunks (0 when every chunk was in
        the host cache already: what shows that streams share it)."""
        with self._lock:
            self.streams.pop(record.id, None)
            self.totals["chunks_decoded"] += decoded
            self.totals["streams_given_up"] += outcome == "idle"
        access_log.info("stream %d client=%s kind=%s table=%s%s rank=%d/%d epoch=%d batches=%d rows=%d decoded=%d "
                        "seconds=%.3f outcome=%s", record.id, record.client, record.kind,
                        f"{record.dataset}/" if record.dataset else "", record.table, record.rank, record.world_size,
                        record.epoch, record.batches, record.rows, decoded, time.monotonic() - record.started,
                        outcome)

    # ------------------------------------------------------------ uploads
    def upload_started(self, client: str, dataset: str) -> UploadRecord:
        with self._lock:
            record = UploadRecord(next(self._ids), client, dataset)
            self.uploads[record.id] = record
            self.totals["uploads"] += 1
        return record

    def received(self, record: UploadRecord, accepted: bool, nbytes: int) -> None:
        with self._lock:
            if accepted:
                record.accepted += 1
                self.totals["episodes_accepted"] += 1
            else:
                record.passed_over += 1
                self.totals["episodes_passed_over"] += 1
            record.bytes += nbytes
            self.totals["bytes_received"] += nbytes

    def upload_ended(self, record: UploadRecord, outcome: str) -> None:
        with self._lock:
            self.uploads.pop(record.id, None)
        access_log.info("upload %d client=%s%s accepted=%d passed_over=%d bytes=%d seconds=%.3f outcome=%s",
                        record.id, record.client, f" dataset={record.dataset}" if record.dataset else "",
                        record.accepted, record.passed_over, record.bytes,
                        time.monotonic() - record.started, outcome)

    def refused(self) -> None:
        with self._lock:
            self.totals["refused"] += 1

    # ------------------------------------------------------------ report
    def report(self) -> dict[str, Any]:
        """Streams, uploads, totals, the server's processes and memory, its uptime."""
        now = time.monotonic()
        with self._lock:
            streams = [r.report(now) for r in self.streams.values()]
            uploads = [r.report(now) for r in self.uploads.values()]
            totals = dict(self.totals)
        workers = descendants(os.getpid())
        return {"uptime_s": round(now - self.started, 3), "started_at": self._wall, "streams": streams,
                "uploads": uploads, "totals": totals,
                "processes": {"server": os.getpid(), "workers": len(workers)},
                "memory": {"server_rss": rss(os.getpid()), "workers_rss": sum(rss(p) for p in workers)}}


def outcome_of(exc: BaseException | None) -> str:
    """An access-log outcome: "ok", or the error's first line."""
    if exc is None:
        return "ok"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return "error: " + text.split(". Detail:")[0]


def descendants(pid: int) -> list[int]:
    """The running processes below `pid` (Linux /proc; empty elsewhere): the loaders' and writer's workers and
    the fork server."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if stat[0] != "Z":
            parents[int(entry.name)] = int(stat[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, p in parents.items() if p == parent]
        found += kids
        todo += kids
    return found


def rss(pid: int) -> int:
    """Resident memory of `pid` in bytes (shared memory a worker maps counts in each process); 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0
