"""What one `zarrfeed serve` takes on at once, so that no client can take the server's memory or processes:
open streams (each runs its own loader processes), uploads in progress (each holds one received message), the
size of one uploaded message, the size of one batch a ticket asks for, and the size of a transform's
arguments. Beyond a limit a client gets one line; for streams and uploads it says "busy, retry". A stream whose
client takes no batch for `stream_idle_timeout` seconds gives up its slot and its loader (a trainer paused,
hung or stopped with its connection open would hold them for good, and lock the others out at
`max_streams`): its client, if it reads on, gets the batches already on their way, then "zarrfeed: stream
given up", and a remote loader reconnects and goes on from its position. A stream whose loader waits
`stream_stall_timeout` seconds on a stopped process fails, and its client raises the line naming it.

Defaults are sized from the machine (`Limits.for_machine`); each is an option of `zarrfeed serve`.
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import pyarrow.flight as flight

from ..core._proc.shm import available_memory

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Caps of one server (see the module's docstring)."""

    max_streams: int
    max_uploads: int
    max_message_bytes: int
    max_batch_bytes: int
    max_transform_args_bytes: int = 64 << 10
    stream_idle_timeout: float = 60.0  # seconds a stream may wait for its client to take a batch
    # seconds a stream's loader may wait on a stopped process (its worker under SIGSTOP or a debugger, another
    # process pinning the host cache) before the stream fails, its client told which: the server answers the
    # client's liveness probes all along, so without it a remote trainer would wait for good, unaware
    stream_stall_timeout: float = 30.0
    # loaders whose stream finished an epoch, kept running (their worker processes and decoded chunks) for the
    # same trainer's next epoch (`feeding.IdleLoaders`), and for how long; 0: none kept
    kept_loaders: int = 8
    kept_loader_seconds: float = 120.0

    @classmethod
    def for_machine(cls, workers: int) -> "Limits":
        """Streams: four per core's worth of loader processes (at least 4); one message: 256 MiB or a 16th of
        the memory available; uploads: as many such messages as fit in a quarter of it (2 to 64); one batch:
        512 MiB or a 16th of the memory."""
        cpus, memory = os.cpu_count() or 1, available_memory()
        message = max(MiB, min(256 * MiB, memory // 16))
        return cls(max_streams=max(4, 4 * cpus // max(1, workers)),
                   max_uploads=max(2, min(64, memory // 4 // message)),
                   max_message_bytes=message, max_batch_bytes=max(MiB, min(512 * MiB, memory // 16)))

    def __post_init__(self) -> None:
        for name in ("max_streams", "max_uploads", "max_message_bytes", "max_batch_bytes",
                     "max_transform_args_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("stream_idle_timeout", "stream_stall_timeout"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {getattr(self, name)}")
        if self.kept_loaders < 0:
            raise ValueError(f"kept_loaders must be at least 0, got {self.kept_loaders}")
        if not self.kept_loader_seconds > 0:
            raise ValueError(f"kept_loader_seconds must be > 0 seconds, got {self.kept_loader_seconds}")

    def stream_cache_bytes(self) -> int:
        """The decoded chunks one stream's loader may keep across epochs: its share of a quarter of memory."""
        return available_memory() // 4 // self.max_streams


class Slots:
    """At most `limit` of something at once (streams, uploads); `take()` refuses beyond it, in one line."""

    def __init__(self, limit: int, what: str, option: str) -> None:
        self.limit, self.what, self.option = limit, what, option
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    def take(self) -> None:
        with self._lock:
            if self._used >= self.limit:
                raise flight.FlightUnavailableError(
                    f"zarrfeed: busy: {self._used} {self.what} open (the server's {self.option} is {self.limit}); "
                    "retry later")
            self._used += 1

    def give(self) -> None:
        with self._lock:
            self._used -= 1
