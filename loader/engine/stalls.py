"""Never a silent wait: a loader that waits on another process says so.

A stopped process (SIGSTOP, Ctrl+Z, a debugger or profiler attached, a frozen cgroup) is not dead: it keeps its
pipe, its pins in the host cache and its claims, and goes on when it gets SIGCONT, so a loader waiting for it is
right to wait, but not silently. When a batch has waited `STALL` seconds with nothing moving (no reply from a
worker, no window made resident, no chunk decoded by another process), the loader asks who holds it up (its own
workers that are stopped with messages unanswered, the processes pinning the host cache's slots while it waits
for room, the process holding the host cache's lock) and says in the log, once per stall, which processes they
are, whether they are stopped, and what to do; when it goes on, it says so. With a `stall_timeout` it raises
instead once it has waited that long on a stopped process. A wait on another process is never one that nothing
looks at: a full pipe (`WorkerPool.send`) and a lock of the host cache (`host_cache.watching`) are waited for in
short steps that call the loader's watch.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from ...core._proc.pool import SAY_STALL_AFTER

log = logging.getLogger("zarrfeed.loader")
STALL = SAY_STALL_AFTER  # seconds with nothing moving before the wait is said in the log
_RECHECK = 1.0  # seconds between looks at who holds the wait up, once it is long


@dataclass(frozen=True)
class Holdup:
    """A process the wait depends on: `what` names it (with its pid), `stopped` whether it is stopped, `other`
    what to say of it when it is not, `ended` what ending it does."""

    pid: int
    what: str
    stopped: bool
    other: str = "is not answering"
    ended: str = "the loader goes on without it"  # what ending it does

    def said(self) -> str:
        if self.stopped:
            return f"{self.what} is stopped (`kill -CONT {self.pid}` resumes it; or end it: {self.ended})"
        return f"{self.what} {self.other}"


class StallWatch:
    """When a loader last moved, and whether the stall since then was said (see the module docstring)."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.moved_at = time.monotonic()
        self.said: float | None = None  # when the stall said in the log began
        self.looked = 0.0

    def moved(self, what: Callable[[], str]) -> None:
        """Something moved on (`what()`: the batch being waited for): a stall said in the log is over."""
        now = time.monotonic()
        if self.said is not None:
            log.warning("zarrfeed: %s goes on after waiting %.0f s", what(), now - self.said)
            self.said = None
        self.moved_at = now

    def check(self, since: float, what: str, find: Callable[[], list[Holdup]]) -> list[Holdup]:
        """Look at a wait that began at `since` (monotonic) for `what`: once nothing moved for `STALL` seconds,
        say in the log who holds it up (`find()`), once per stall. Returns the stopped holdups once the wait on
        them passed `timeout` (the caller raises), else []."""
        now = time.monotonic()
        began = max(since, self.moved_at)
        waited = now - began
        limit = STALL if self.timeout is None else min(STALL, self.timeout)
        if waited < limit or now - self.looked < _RECHECK:
            return []
        self.looked = now
        holdups = find()
        if self.said is None and waited >= STALL and holdups:
            self.said = began
            log.warning("zarrfeed: %s has waited %.0f s with nothing moving: %s", what, waited,
                        "; ".join(h.said() for h in holdups))
        stopped = [h for h in holdups if h.stopped]
        if self.timeout is not None and waited >= self.timeout and stopped:
            return stopped
        return []
