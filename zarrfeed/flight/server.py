"""`zarrfeed serve`: a dataset over Arrow Flight, for trainers and producers on other machines or in other
languages.

The server is two handlers behind one Flight endpoint: feeding (`feeding.py`: discovery and do_get streams of
batches or windows) and ingestion (`ingestion.py`: do_put uploads of episodes, exactly once). Actions are
dispatched by name from the protocol's table (`protocol.ACTIONS`), which `list_actions` reports. With a
token, every call without it is refused before anything is read.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import traceback
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import pyarrow.flight as flight

from ..core.store import Location
from ..transforms import Transforms
from .access import Access, AccessCheck, grants_of
from .activity import Activity
from .feeding import Feeding
from .ingestion import Ingestion
from .limits import Limits
from .protocol import ACTIONS

log = logging.getLogger("zarrfeed.serve")
F = TypeVar("F", bound=Callable[..., Any])


def one_line(method: F) -> F:
    """A Flight call whose unexpected errors reach the client as one line (the server's log has the
    traceback), never as "Python exception: Traceback ..." with the server's file paths."""
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except flight.FlightError:
            raise
        except Exception as exc:
            log.exception("zarrfeed: %s failed", method.__name__)
            raise flight.FlightServerError(internal_error(method.__name__, exc)) from None
    return call  # type: ignore[return-value]


def internal_error(what: str, exc: BaseException) -> str:
    return f"zarrfeed: {what} failed: {type(exc).__name__}: {exc} (the server's log has the traceback)"



@dataclass(frozen=True)
class Stopped:
    """What `FeedServer.stop` did: the committed rows (None: nothing was uploaded) and whether calls were
    still open when it stopped waiting."""

    committed: dict[str, int] | None
    calls_left: bool


class FeedServer(flight.FlightServerBase):
    """Serves the dataset at `location` (a path, URL or Location) on `host:port` (port 0: a free one; the
    address is `url`), with `workers` loader processes per stream and the named transforms of `transforms`
    (a module name or .py file), within `limits` (default: sized from the machine). Reading needs `token`
    if given; uploads are taken with `ingest` or an `ingest_token` (then they need it; see access.py). It
    listens once made; `serve()` blocks until `shutdown()`. As a context manager it stops and commits what
    it accepted on exit."""

    def __init__(self, location: Location | str | os.PathLike, *, host: str = "127.0.0.1", port: int = 8815,
                 token: str | None = None, ingest: bool = False, ingest_token: str | None = None,
                 workers: int = 2, tls: tuple[bytes, bytes] | None = None,
                 transforms: Transforms | str | None = None, limits: Limits | None = None) -> None:
        # everything a call uses is made before the server listens (super().__init__): a producer retrying
        # against a restarted server connects at once
        self.location = location if isinstance(location, Location) else Location.of(location)
        self.access = Access(token, ingest_token, ingest)
        self.workers = workers
        self.transforms = transforms if isinstance(transforms, Transforms) else Transforms(transforms)
        self._scheme, self._host = "grpc+tls" if tls else "grpc", host
        self.limits = limits or Limits.for_machine(workers)
        self.activity = Activity()
        self.feeding = Feeding(self.location, workers, self.transforms, lambda: self.url, self.limits,
                               self.activity)
        self.ingestion = Ingestion(self.location, workers, lambda: self.feeding.latest().rows, self.limits,
                                   self.activity)
        self._actions: dict[str, Callable[[bytes], dict[str, Any]]] = {
            "describe": self.feeding.describe, "plan": self.feeding.plan, "status": self.status,
            "begin_input": self.ingestion.begin_input, "sync": self.ingestion.sync}
        assert self._actions.keys() == ACTIONS.keys(), "every action of the protocol has a handler"
        super().__init__(f"{self._scheme}://{host}:{port}", middleware={"access": AccessCheck(self.access)},
                         tls_certificates=[tls] if tls else None)
        self.ingestion.start(every_second=self.feeding.idle.expire)

    @property
    def url(self) -> str:
        """Where clients connect: grpc://host:port (grpc+tls with a certificate), the port chosen if 0."""
        return f"{self._scheme}://{self._host}:{self.port}"

    def __enter__(self) -> "FeedServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def status(self, body: bytes = b"") -> dict[str, Any]:
        """The action "status": streams (client, table, rank, epoch, rows/s), uploads, totals, ingestion (what
        is committed, the commit lag), limits, worker processes, memory, uptime."""
        return {**self.activity.report(), "ingestion": {"enabled": self.access.ingest, **self.ingestion.status()},
                "limits": dataclasses.asdict(self.limits), "url": self.url, "dataset": str(self.location)}

    def stop(self, grace: float = 1.5) -> Stopped:
        """Stop serving: open streams end with "server shutting down" at their next batch, uploads are
        refused, everything accepted is committed and the lease released, then the server waits up to `grace`
        seconds for calls to end. Calls still open then (a client that stopped reading, a producer that sends
        nothing) are left to the process's exit: `Stopped.calls_left` says so."""
        committed = self.close_writer()
        done = threading.Thread(target=self.shutdown, name="zarrfeed-shutdown", daemon=True)
        done.start()
        done.join(grace)
        return Stopped(committed, calls_left=done.is_alive())

    def close_writer(self) -> dict[str, int] | None:
        """At shutdown: stop the loaders kept for a next epoch, commit everything accepted and release the
        lease. The committed rows (None: nothing was uploaded)."""
        self.feeding.close()
        return self.ingestion.close()

    @one_line
    def do_action(self, context: Any, action: flight.Action) -> list[flight.Result]:
        handler = self._actions.get(action.type)
        if handler is None:
            raise flight.FlightServerError(f"unknown action {action.type!r} (actions: {', '.join(ACTIONS)})")
        if ACTIONS[action.type].ingests:
            self.access.refuse_upload(grants_of(context))
        return [flight.Result(json.dumps(handler(action.body.to_pybytes())).encode())]

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [(a.name, a.description) for a in ACTIONS.values()]

    @one_line
    def list_flights(self, context: Any, criteria: bytes) -> list[flight.FlightInfo]:
        return list(self.feeding.flights())

    @one_line
    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        return self.feeding.flight_info(descriptor)

    @one_line
    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        # pyarrow (through 26) sends get_schema's errors to the client as "Python exception: Traceback ...",
        # formatted by Python's traceback module, where every other call sends a FlightError's message alone:
        # `zarrfeed serve` sets sys.tracebacklimit to 0 (see hide_frames), so the client reads the message only
        return flight.SchemaResult(self.feeding.flight_info(descriptor).schema)

    @one_line
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        return self.feeding.stream(ticket.ticket, context)

    @one_line
    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        self.access.refuse_upload(grants_of(context))
        self.ingestion.put(descriptor, reader, writer, context.peer())

    @one_line
    def do_exchange(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        raise flight.FlightServerError("zarrfeed: do_exchange is not served: do_get reads batches, do_put "
                                       "uploads episodes")


def hide_frames() -> None:
    """For a server process: exceptions pyarrow formats for a client (get_schema's) carry no frames or file
    paths (sys.tracebacklimit = 0), while the server's own log, on stderr, keeps full tracebacks."""
    sys.tracebacklimit = 0
    handler = logging.StreamHandler()
    handler.setFormatter(_FullTracebacks("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("zarrfeed")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


class _FullTracebacks(logging.Formatter):
    def formatException(self, ei: Any) -> str:  # an explicit limit: not sys.tracebacklimit
        return "".join(traceback.format_exception(*ei, limit=1000)).rstrip("\n")


def read_token(path: str | os.PathLike) -> str:
    """A token file's first line; refused if the file is readable by others (a token is a password)."""
    mode = os.stat(path).st_mode
    if mode & 0o077:
        raise ValueError(f"{path}: a token file must be readable by its owner only (chmod 600 {path})")
    with open(path) as f:
        token = f.readline().strip()
    if not token:
        raise ValueError(f"{path}: empty token file")
    return token
