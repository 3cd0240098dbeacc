"""Every exception zarrfeed raises of its own, in one family: `Error` is the base of them all, so `except
zarrfeed.Error` catches whatever zarrfeed refuses or reports, from either side. Each also keeps the built-in base
that says what kind of failure it is (`FormatError` is a `ValueError`, `StoreUnreachable` an `OSError`, ...), so
code that catches those catches them too.

They are importable from `zarrfeed` (`zarrfeed.FormatError`), and named there (`__module__`): a traceback says
`zarrfeed.FormatError`, and pickle finds them there. Nothing heavy is imported here: `zarrfeed --version`
imports no numpy.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._proc.pool import RemoteError


class Error(Exception):
    """The base of every exception zarrfeed raises of its own; the message is one line saying what and where."""


# ------------------------------------------------------------------ datasets and their format
class FormatError(Error, ValueError):
    """A dataset cannot be read or written as asked; the message is one line saying what and where. Where it
    says what to do instead, `str()` says it in Python's words (`mode='a'`) and `cli`, when set, in the command
    line's (`--append`): the command line prints `cli`.

    Args:
        message: The line.
        cli: The line in the command line's words, where they differ.
    """

    def __init__(self, message: str, cli: str | None = None) -> None:
        super().__init__(message)
        self.cli = cli


class MetaError(Error, ValueError):
    """A zarr v2 document that zarrfeed cannot read or will not write; one line naming the document."""


class FieldError(MetaError):
    """One field of a document is not what zarrfeed reads: `field` names it and `why` says what it is; the
    parser that catches it names the document (see `core.v3_codecs`).

    Args:
        field: The field.
        why: What it is, in a few words ("is 7, not one of ...").
    """

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"field '{field}' {why}")
        self.field, self.why = field, why

    def __reduce__(self) -> Any:
        return type(self), (self.field, self.why)


class ChunkError(Error, ValueError):
    """A chunk cannot be read; the message names the table and the chunk key."""


class ChunkChanged(ChunkError):
    """A chunk's stored bytes are not those its commit recorded (changed, swapped, or another dataset's)."""


# ------------------------------------------------------------------ stores
class StoreUnreachable(Error, OSError):
    """A store cannot be reached (a connection refused, a host that does not resolve, no network, no answer in
    time); the message is one line naming the store and what the client said. Nothing was read or written."""


class StoreTimeout(StoreUnreachable):
    """A store did not answer within the time allowed; the message is one line naming the store and the call."""


class WriteRefused(Error, OSError, RuntimeError):
    """A write the operating system refused, in one line: what could not be written where, and why, in the
    user's words (`str()`; `cli`, when set, in the command line's); `errno` and `strerror` are the system's.
    A `RuntimeError` too, as every error that stops a writer is (`WorkerError`, `LeaseLost`), so that code that
    catches a stopped writer catches this one. Made from the system's error by `refusals.write_refused`.

    Args:
        message: The line.
        code: The system's error number (`errno.ENOSPC`, ...).
        cli: The line in the command line's words, where they differ.
    """

    def __init__(self, message: str, code: int | None, cli: str | None = None) -> None:
        super().__init__(message)
        self.message, self.cli = message, cli
        self.errno, self.strerror = code, os.strerror(code) if code else None

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.message, self.errno, self.cli)


# ------------------------------------------------------------------ writing
class LeaseHeld(FormatError):
    """Another writer holds the dataset's lease; the message names it."""


class LeaseLost(Error, RuntimeError):
    """This writer's lease was taken over (its heartbeat stopped for longer than the timeout)."""


class IngestError(Error, ValueError):
    """The source where an ingest ended (the message, one line, names source, episode and what is wrong);
    every episode before it is committed. `failures` holds it (`zarrfeed.writer.dask.SourceFailure`); fix it
    and resume."""

    def __init__(self, message: str, failures: list[Any]) -> None:
        super().__init__(message)
        self.failures = failures

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.failures)


# ------------------------------------------------------------------ worker processes and shared memory
class WorkerError(Error, RuntimeError):
    """A worker died or failed; the message (one line) says which and what was lost. When it raised,
    `remote` is the worker's exception (`remote.exc`, `remote.traceback`), also chained as `__cause__`.

    Args:
        message: The line.
        remote: The worker's exception, when it raised.
        cli: The line in the command line's words, where they differ.
    """

    def __init__(self, message: str, remote: RemoteError | None = None, cli: str | None = None) -> None:
        super().__init__(message)
        self.remote = remote
        self.cli = cli  # the message in the command line's words, where they differ

    @property
    def remote_traceback(self) -> str | None:
        """The worker's traceback as text when it raised; None when it died or stalled without raising."""
        return self.remote.traceback if self.remote else None


class RendezvousError(Error, OSError):
    """The shared memory file could not be found or made (the message says why)."""


class ShmSpaceError(MemoryError, Error):
    """Not enough memory for the shared buffers asked for. (MemoryError first: its own `__new__` must be the
    one a copy is made with, as tblib unpickles a worker's exception.)"""


# ------------------------------------------------------------------ loading
class LoaderError(Error, RuntimeError):
    """A worker died, a chunk could not be read, or a transform failed; the message says which. When code
    raised, in a worker or here, `remote` holds that exception (`remote.exc`: the object itself when it could
    be carried, `remote.traceback`), also chained as `__cause__`.

    Args:
        message: What happened.
        remote: The exception raised, in a worker or here.
        advice: What the loader's user can do, after "; " in the line (`what` is the line without it: a server
            running the loader says what its own client can do instead).
    """

    def __init__(self, message: str, remote: RemoteError | None = None, advice: str = "") -> None:
        super().__init__(f"{message}; {advice}" if advice else message)
        self.what, self.advice, self.remote = message, advice, remote


class LoaderStalledError(LoaderError):
    """A batch waited `stall_timeout` seconds on a process that is stopped (the loader's own worker, or
    another process holding the host cache); `pids` are those processes. Raised only with a `stall_timeout`.

    Args:
        waiting: What waited (a batch, a window).
        seconds: The stall_timeout it waited.
        stopped: The stopped processes, said (each "... (pid N) (stopped)").
        pids: The stopped processes.
    """

    def __init__(self, waiting: str, seconds: float, stopped: str, pids: list[int]) -> None:
        them = "it" if len(pids) == 1 else "them"
        super().__init__(f"{waiting} waited over stall_timeout={seconds:g} s on {stopped}",
                         advice=f"`kill -CONT {' '.join(map(str, pids))}` resumes {them}, or pass stall_timeout=None "
                                "to wait")
        self.waiting, self.seconds, self.stopped, self.pids = waiting, seconds, stopped, pids

    def __reduce__(self) -> tuple:  # (pickled across processes, e.g. by a torch DataLoader worker)
        return type(self), (self.waiting, self.seconds, self.stopped, self.pids)


class TransformOutputError(Error, TypeError):
    """A transform's output does not fit the batch slots (not a dict of arrays, other keys, another dtype or
    shape than the first batch's): zarrfeed's own check, whose message says all there is, so it reaches the
    user as one line naming the transform, without a traceback through zarrfeed's worker."""


class CacheInvariantError(Error, RuntimeError):
    """The host cache's slot table contradicts itself (a bug, never bad input); the message names the slot and
    the chunk. Raised instead of handing out a slot that may hold another chunk's rows."""


__all__ = ["Error", "FormatError", "MetaError", "FieldError", "ChunkError", "ChunkChanged", "StoreUnreachable",
           "StoreTimeout", "WriteRefused", "LeaseHeld", "LeaseLost", "IngestError", "WorkerError", "RendezvousError",
           "ShmSpaceError", "LoaderError", "LoaderStalledError", "TransformOutputError", "CacheInvariantError"]
for _name in __all__:  # named where users import them (see the module's docstring)
    globals()[_name].__module__ = "zarrfeed"
del _name
