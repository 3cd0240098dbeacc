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
import time
import traceback
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

import pyarrow.flight as flight

from ..core.location import Location
from ..transforms import Transforms
from .access import PYTHON, Access, AccessCheck, grants_of
from .serving import Serving
from .feeding import Feeding
from .ingestion import Ingestion
from .limits import Limits
from .protocol import ACTIONS, DATASET_NAME, dataset_of

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


def address(scheme: str, host: str, port: int) -> str:
    """scheme://host:port, an IPv6 literal in brackets (grpc://[::1]:8815): bare, its colons would run into the
    port's and the URL would not parse."""
    return f"{scheme}://[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{scheme}://{host}:{port}"


def internal_error(what: str, exc: BaseException) -> str:
    return f"zarrfeed: {what} failed: {type(exc).__name__}: {exc} (the server's log has the traceback)"



@dataclass(frozen=True)
class Stopped:
    """What `FeedServer.stop` did: the committed rows of each dataset that took uploads and whether calls
    were still open when it stopped waiting."""

    committed: dict[str, dict[str, int]]  # per dataset that took uploads, by name ("": the only one)
    calls_left: bool
    failed: dict[str, str] = field(default_factory=dict)  # per dataset whose last commit failed: why, one line


@dataclass
class Served:
    """One dataset a server serves: its name ("" for a server's only, unnamed one) and its two handlers."""

    name: str
    location: Location
    feeding: Feeding
    ingestion: Ingestion


class FeedServer(flight.FlightServerBase):
    """Serves the dataset at `location` (a path, URL or Location), or several by name (a mapping: name ->
    location; tickets, descriptors and actions then name one), on `host:port` (port 0: a free one; the address
    is `url`), with `workers` loader processes per stream and the named transforms of `transforms` (a module
    name or .py file), within `limits` (default: sized from the machine; shared by all datasets). Reading
    needs `token` if given; uploads are taken with `ingest` or an `ingest_token` (then they need it; see
    access.py); each dataset has its own commit pin and writer lease. It listens once made; `serve()` blocks
    until `shutdown()`. As a context manager it stops and commits what it accepted on exit.

    Args:
        location: The dataset (a path, fsspec URL or `Location`), or several, as a mapping of name (letters,
            digits, "_", "." and "-", starting with a letter) to location; clients then name one (`dataset=`).
        host: The address to listen on (default 127.0.0.1: this machine only). Another address (0.0.0.0, a
            network interface's) is refused before anything listens unless reading needs `token` and, when
            the server ingests, uploads need `ingest_token` (or `insecure`), as `zarrfeed serve` refuses it.
        port: The port to listen on (default 8815); 0: a free one, read from `url`.
        token: The read token every call must carry (`authorization: Bearer <token>`); default: anyone who
            reaches the port reads.
        ingest: Take uploads of episodes (default: the server only feeds). Without `ingest_token`, anyone who
            may read may upload.
        ingest_token: The token uploads need (it also reads); implies `ingest`. Must differ from `token`.
        workers: Loader processes per stream (default 2); also sizes the default `limits`.
        tls: (certificate chain, private key) PEM bytes to serve `grpc+tls`; default: plain gRPC.
        transforms: The transforms clients may ask for by name: a module name, a `.py` file, or `Transforms`;
            default none.
        verify_chunks: Check every chunk a stream reads against the size and digest its commit recorded
            (default; see `Loader`); False streams chunks unchecked.
        limits: Caps on streams, uploads, message, batch and transform-argument sizes (`Limits`); default
            `Limits.for_machine(workers)`, sized from this machine.
        insecure: Serve beyond loopback without those tokens (`zarrfeed serve --insecure`): for a network that
            its operator keeps private by other means (a firewall, a private network, a proxy that checks).
    """

    def __init__(self, location: Location | str | os.PathLike | Mapping[str, Location | str | os.PathLike], *,
                 host: str = "127.0.0.1", port: int = 8815, token: str | None = None, ingest: bool = False,
                 ingest_token: str | None = None, workers: int = 2, tls: tuple[bytes, bytes] | None = None,
                 transforms: Transforms | str | None = None, limits: Limits | None = None,
                 insecure: bool = False, verify_chunks: bool = True) -> None:
        self.access = Access(token, ingest_token, ingest)
        self.access.check_exposure(host, insecure, PYTHON)  # before anything is opened or listens
        # everything a call uses is made before the server listens (super().__init__): a producer retrying
        # against a restarted server connects at once
        named = dict(location) if isinstance(location, Mapping) else {"": location}
        if not named:
            raise ValueError("no dataset to serve")
        for name in named:
            if name and not DATASET_NAME.fullmatch(name):
                raise ValueError(f"dataset name {name!r}: letters, digits, '_', '.' and '-', starting with a letter")
        self.workers = workers
        self.transforms = transforms if isinstance(transforms, Transforms) else Transforms(transforms)
        self._scheme, self._host = "grpc+tls" if tls else "grpc", host
        self.limits = limits or Limits.for_machine(workers)
        self.serving = Serving(workers, self.transforms, self.limits, lambda: self.url, verify_chunks=verify_chunks)
        self.activity = self.serving.activity
        self.datasets: dict[str, Served] = {}
        for name, where in named.items():
            loc = where if isinstance(where, Location) else Location.of(where)
            twice = [n for n, s in self.datasets.items() if s.location.same_place(loc)]
            if twice:  # two writers of one dataset would fight over its lease
                raise ValueError(f"datasets {twice[0]!r} and {name!r} are the same dataset ({loc})")
            feeding = Feeding(loc, name, self.serving)
            self.datasets[name] = Served(name, loc, feeding,
                                         Ingestion(loc, name, self.serving, functools.partial(_latest_rows, feeding)))
        self._actions: dict[str, Callable[[bytes], dict[str, Any]]] = {
            "describe": lambda body: self.served(dataset_of(body)).feeding.describe(body),
            "plan": lambda body: self.served(dataset_of(body)).feeding.plan(body),
            "status": self.status,
            "begin_input": lambda body: self.served(dataset_of(body)).ingestion.begin_input(body),
            "sync": lambda body: self.served(dataset_of(body)).ingestion.sync(body)}
        if self._actions.keys() != ACTIONS.keys():  # a protocol change without its handler: never serve half of it
            raise RuntimeError(f"actions without a handler: {sorted(ACTIONS.keys() ^ self._actions.keys())}")
        super().__init__(address(self._scheme, host, port), middleware={"access": AccessCheck(self.access)},
                         tls_certificates=[tls] if tls else None)
        for served in self.datasets.values():
            served.ingestion.start(every_second=served.feeding.tick)

    def served(self, name: str | None) -> Served:
        """The dataset `name` names (None: the server's only one), or a one-line refusal."""
        if name is None and len(self.datasets) == 1:
            return next(iter(self.datasets.values()))
        if name is None:
            raise flight.FlightServerError(f"zarrfeed: this server serves several datasets ({', '.join(self.datasets)})"
                                           ": name one (dataset=...)")
        if name not in self.datasets:
            raise flight.FlightServerError(f"zarrfeed: no dataset {name!r} here (datasets: "
                                           f"{', '.join(n or '(unnamed)' for n in self.datasets)})")
        return self.datasets[name]

    @property
    def feeding(self) -> Feeding:
        """The feeding handler of the server's only dataset."""
        return self.served(None).feeding

    @property
    def ingestion(self) -> Ingestion:
        """The ingestion handler of the server's only dataset."""
        return self.served(None).ingestion

    @property
    def url(self) -> str:
        """Where clients connect: grpc://host:port (grpc+tls with a certificate), the port chosen if 0."""
        return address(self._scheme, self._host, self.port)

    def __enter__(self) -> "FeedServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def status(self, body: bytes = b"") -> dict[str, Any]:
        """The action "status": streams (client, dataset, table, rank, epoch, rows/s), uploads, totals, per
        dataset its location and ingestion (what is committed, the commit lag), the loaders kept for a next
        epoch and their worker processes, limits, worker processes, memory, uptime."""
        kept = [s.feeding.idle for s in self.datasets.values()]
        return {**self.activity.report(), "ingesting": self.access.ingest,
                "kept_loaders": {"loaders": sum(len(k) for k in kept),
                                 "worker_processes": sum(k.worker_processes() for k in kept)},
                "datasets": {name: {"location": str(s.location), "ingestion": s.ingestion.status()}
                             for name, s in self.datasets.items()},
                "limits": dataclasses.asdict(self.limits), "url": self.url}

    def stop(self, grace: float = 1.5) -> Stopped:
        """Stop serving: open streams end with "server shutting down" at their next batch, uploads are
        refused, everything accepted is committed and the leases released, then the server waits for calls to
        end until `grace` seconds after the stop began. Calls still open then (a client that stopped reading,
        a producer that sends nothing) are left to the process's exit: `Stopped.calls_left` says so."""
        began = time.monotonic()
        committed, failed = self.close_writer()
        done = threading.Thread(target=self.shutdown, name="zarrfeed-shutdown", daemon=True)
        done.start()
        done.join(max(0.1, grace - (time.monotonic() - began)))
        return Stopped(committed, calls_left=done.is_alive(), failed=failed)

    def close_writer(self) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
        """At shutdown: stop the loaders kept for a next epoch, commit everything accepted and release the
        leases. The committed rows of each dataset that took uploads, by name; and why the last commit of
        each that failed did (a writer worker killed, the store gone): the stop goes on whatever fails."""
        for served in self.datasets.values():
            served.feeding.close()
        committed, failed = {}, {}
        for name, served in self.datasets.items():
            try:
                rows = served.ingestion.close()
            except Exception as exc:  # said by the caller in one line; the server stops all the same
                failed[name] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                continue
            if rows is not None:
                committed[name] = rows
        return committed, failed

    @one_line
    def do_action(self, context: Any, action: flight.Action) -> list[flight.Result]:
        """Flight: run the action `action.type` (describe, plan, status, begin_input, sync) on its JSON body;
        one JSON result. The ingesting ones need the right to upload."""
        handler = self._actions.get(action.type)
        if handler is None:
            raise flight.FlightServerError(f"unknown action {action.type!r} (actions: {', '.join(ACTIONS)})")
        if ACTIONS[action.type].ingests:
            self.access.refuse_upload(grants_of(context))
        try:
            answer = handler(action.body.to_pybytes())
        except ValueError as exc:  # a body naming its dataset wrongly
            raise flight.FlightServerError(f"zarrfeed: {action.type}: {exc}") from None
        return [flight.Result(json.dumps(answer).encode())]

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        """Flight: the actions served, as (name, description)."""
        return [(a.name, a.description) for a in ACTIONS.values()]

    @one_line
    def list_flights(self, context: Any, criteria: bytes) -> list[flight.FlightInfo]:
        """Flight: one flight per table of each dataset served (`criteria` is not used)."""
        return [info for served in self.datasets.values() for info in served.feeding.flights()]

    def _flight(self, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        """The flight a descriptor names: [table] (the only dataset) or [dataset, table]."""
        path = [p.decode(errors="replace") for p in descriptor.path or []]
        if len(path) not in (1, 2):
            raise flight.FlightServerError("zarrfeed: a descriptor is the path [table] or [dataset, table]")
        return self.served(path[0] if len(path) == 2 else None).feeding.flight_info(path[-1])

    @one_line
    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        """Flight: the flight of the table a descriptor path names: [table] or [dataset, table]."""
        return self._flight(descriptor)

    @one_line
    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        """Flight: the Arrow schema of the table a descriptor path names, as `get_flight_info`."""
        # pyarrow (through 26) sends get_schema's errors to the client as "Python exception: Traceback ...",
        # formatted by Python's traceback module, where every other call sends a FlightError's message alone:
        # `zarrfeed serve` sets sys.tracebacklimit to 0 (see hide_frames), so the client reads the message only
        return flight.SchemaResult(self._flight(descriptor).schema)

    @one_line
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        """Flight: the stream of batches a ticket (JSON, see `protocol.Ticket`) asks for."""
        try:
            name = dataset_of(ticket.ticket)
        except ValueError as exc:
            raise flight.FlightServerError(f"zarrfeed: ticket: {exc}") from None
        return self.served(name).feeding.stream(ticket.ticket, context)

    @one_line
    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        """Flight: an upload of episodes (descriptor path ['episodes'] or [dataset, 'episodes']), each acked on
        `writer`; needs the right to upload."""
        self.access.refuse_upload(grants_of(context))
        path = [p.decode(errors="replace") for p in descriptor.path or []]
        if path[-1:] != ["episodes"] or len(path) > 2:
            raise flight.FlightServerError("zarrfeed: upload episodes with the descriptor path ['episodes'] (or "
                                           "[dataset, 'episodes'])")
        self.served(path[0] if len(path) == 2 else None).ingestion.put(reader, writer, context.peer())

    @one_line
    def do_exchange(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        """Flight: not served (refused in one line)."""
        raise flight.FlightServerError("zarrfeed: do_exchange is not served: do_get reads batches, do_put "
                                       "uploads episodes")


def _latest_rows(feeding: Feeding) -> dict[str, int]:
    return feeding.latest().rows


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
