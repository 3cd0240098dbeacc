"""The pool of reader workers, as the scheduler drives it (`Pool`): `core._proc.pool.WorkerPool` (worker
processes), or `InlinePool` (num_workers=0: each message handled in this process when sent; also what the
scheduler's unit tests drive)."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from ...core._proc.pool import Failed, RemoteError
from .messages import Message


class Pool(Protocol):
    """Workers numbered 0..n-1, each answering the messages sent to it, in the order sent."""

    def send(self, wid: int, msg: Message, waiting: Callable[[], None] | None = None) -> None:
        """Send `msg` to worker `wid`; `waiting()` is called (and may raise) while the send waits for room."""
        ...

    def poll(self, timeout: float) -> list[Any]:
        """The replies that arrived within `timeout` seconds (a `Failed` for a message a worker raised on)."""
        ...

    def dead(self) -> list[tuple[int, int, int | None]]:
        """(worker, pid, exit code) of the workers that have exited."""
        ...

    def stopped(self) -> list[tuple[int, int]]:
        """(worker, pid) of the workers that are stopped (SIGSTOP, a debugger)."""
        ...

    def restart(self, wid: int) -> None:
        """Start a new worker in place of dead worker `wid` (its unanswered messages are sent again)."""
        ...

    def pids(self) -> list[int]:
        """The workers' process ids (none for workers in this process)."""
        ...

    def stop(self) -> None:
        """Stop every worker."""
        ...


class InlinePool(Pool):
    """The worker protocol run in this process: each message is handled by `handle` when sent, its reply
    (or `Failed`, if it raises) kept for the next `poll`. Its one worker never dies nor stops."""

    def __init__(self, handle: Callable[[Any], Any]) -> None:
        self._handle = handle
        self._replies: list[Any] = []

    def send(self, wid: int, msg: Message, waiting: Callable[[], None] | None = None) -> None:
        try:
            self._replies.append(self._handle(msg))
        except Exception as exc:
            self._replies.append(Failed(0, msg, RemoteError.capture(exc)))

    def poll(self, timeout: float) -> list[Any]:
        out, self._replies = self._replies, []
        return out

    def dead(self) -> list[tuple[int, int, int | None]]:
        return []

    def stopped(self) -> list[tuple[int, int]]:
        return []

    def restart(self, wid: int) -> None:
        raise AssertionError("a worker in this process never dies, so it is never restarted")

    def pids(self) -> list[int]:
        return []

    def stop(self) -> None:
        pass
