"""A client's check that its server still answers, for the calls that have no deadline (a stream of batches, an
upload): a server that stops answering while its connection stays open (a stopped process, a machine that froze,
a network that drops packets silently) would otherwise hold a trainer or a producer for as long as it lasts.

gRPC keepalive pings cannot do it: pyarrow's server keeps gRPC's default ping policy (no more than one ping per 5
minutes while it sends nothing) and answers faster pings by closing the connection ("too many pings"). So the
client asks: a blocking read or write that has not returned after `stall_timeout` seconds is followed by a cheap
call (`list_actions`) with a deadline of `stall_timeout`. A server that answers is slow, not gone: the wait goes
on. One that does not has stopped answering: the wait ends with `Stalled` at most 2 x `stall_timeout` seconds
after the last progress, and the caller treats the server as gone.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, TypeVar

import pyarrow.flight as flight

from ..core.errors import Error

T = TypeVar("T")
STALL_TIMEOUT = 10.0  # seconds; the clients' default


class Stalled(Error):
    """The server did not answer a probe within its deadline while a call waited (the clients say it as a
    `ConnectionError`; it never reaches their callers)."""


def probe(client: flight.FlightClient, options: flight.FlightCallOptions) -> None:
    """One cheap call the server answers at once (no dataset is read); raises `Stalled` when it is not answered
    in time or not at all. Any answer, a refusal included, says the server is there."""
    try:
        list(client.list_actions(options))
    except (flight.FlightTimedOutError, flight.FlightUnavailableError, flight.FlightInternalError, OSError) as exc:
        raise Stalled(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from None
    except flight.FlightError:
        pass


def check_stall_timeout(stall_timeout: float) -> float:
    if not stall_timeout > 0:
        raise ValueError(f"stall_timeout must be > 0 seconds, got {stall_timeout}")
    return float(stall_timeout)


class Watch:
    """Runs blocking calls of one client on a thread of its own while the caller waits and probes (see the
    module's docstring). A call abandoned to a stalled server keeps that thread until the call ends (the server
    answers, or its connection closes), and the thread keeps what `keep()` gives then (the client: closing a
    client waits for its calls, so the caller drops it for a new one, and it is closed once its call ends); the
    next call gets a new thread."""

    def __init__(self, stall_timeout: float, probe: Callable[[float], None],
                 keep: Callable[[], Any] | None = None) -> None:
        self.stall_timeout, self._probe, self._keep = check_stall_timeout(stall_timeout), probe, keep
        self._jobs: queue.SimpleQueue[Any] | None = None

    def run(self, fn: Callable[[], T], cancel: Callable[[], None] | None = None) -> T:
        """`fn()`'s result (or its exception); `Stalled` (after `cancel()`, if given) when the server stops
        answering while it waits."""
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=_work, args=(self._jobs,), name="zarrfeed-client-call", daemon=True).start()
        done: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._jobs.put((fn, done))
        while True:
            try:
                ok, value = done.get(timeout=self.stall_timeout)
                break
            except queue.Empty:
                pass
            try:
                self._probe(self.stall_timeout)
            except Stalled:
                if cancel is not None:
                    cancel()
                if self._keep is not None:
                    self._jobs.put(_Kept(self._keep()))
                self._jobs.put(None)  # that thread ends once the call does; the next call gets another
                self._jobs = None
                raise
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None


class _Kept:
    def __init__(self, thing: Any) -> None:
        self.thing = thing


def _work(jobs: queue.SimpleQueue[Any]) -> None:
    kept = []
    while True:
        job = jobs.get()
        if job is None:
            return
        if isinstance(job, _Kept):
            kept.append(job.thing)
            continue
        fn, done = job
        try:
            done.put((True, fn()))
        except BaseException as exc:  # handed to the caller's thread
            done.put((False, exc))
        del job, fn, done
