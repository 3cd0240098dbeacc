"""`zarrfeed serve`: a dataset's batches over Arrow Flight, for trainers on other machines or in other languages.

One server process holds the dataset open. Each do_get stream (one per trainer rank and epoch) runs a Loader
with the ticket's arguments (`zarrfeed.flight.protocol.Ticket`) at the ticket's commit: its worker processes decode and
gather, and the server's gRPC thread only wraps each finished batch as an Arrow record batch (numeric columns
without a copy) and hands it to Flight. Batches are made with `copy=True`: Flight may still be sending a
batch's buffers when the ring slot would be reused. Discovery: `list_flights` / `get_flight_info` describe the
tables (schema, committed rows), the action "describe" the dataset (id, commit, dtypes, transforms), and the
action "plan" a ticket's epoch (its loader's length and resume state, so remote and local states are one
kind). With a token, every
call without it is refused before anything is read. Windows (`RemoteWindowLoader`) travel a sample per row,
ragged tables as list columns with their offsets (`zarrfeed.loader.arrow_bridge.window_batch_to_arrow`). A ticket may
name one of the server's transforms (`--transforms MODULE`, `zarrfeed.transforms`) with JSON arguments: the
loader's workers apply it and the stream carries its arrays; no code or pickle from a client is ever run.

Ingestion (do_put, `zarrfeed.flight.RemoteWriter`): the server holds the dataset's writer lease from the first
upload until it stops, and writes every producer's episodes through one DatasetWriter (calls are serialised
by a lock: the writer places episodes in one order). Each episode is acknowledged once accepted; the writer
commits as it goes while uploads arrive, a thread commits what is left once they pause for a second, and
the action "sync" waits until everything accepted is committed. Bad input is refused with the
writer's one line (table, field, row) and nothing of it written; the other producers go on.
"""
from __future__ import annotations

import dataclasses
import hmac
import itertools
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from ..core._proc.pool import WorkerError
from ..core.arrow_records import arrow_schema
from ..core.keys import key_to_json
from ..core.store import Location
from ..loader import Dataset, Loader, LoaderError, WindowLoader
from ..loader.arrow_bridge import to_arrow, window_batch_to_arrow
from ..transforms import Transforms
from ..writer.dataset_writer import DatasetWriter
from .protocol import Ticket, decode_episodes

log = logging.getLogger("zarrfeed.serve")


class _TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses every call whose `authorization` header is not `Bearer <token>` (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self._want = f"Bearer {token}".encode()

    def start_call(self, info: Any, headers: dict[str, list]) -> None:
        got = [h.encode() if isinstance(h, str) else h for h in headers.get("authorization", [])]
        if not any(hmac.compare_digest(g, self._want) for g in got):
            raise flight.FlightUnauthenticatedError("zarrfeed: this server needs a token")
        return None


class _IdleLoaders:
    """Loaders whose stream finished an epoch, kept for the same trainer's next epoch (the same ticket but its
    epoch): their workers are running and their decoded chunks cached, so the next epoch neither starts
    processes nor decodes again. At most `limit` are kept, each for `seconds`; the oldest go first."""

    def __init__(self, limit: int = 8, seconds: float = 120.0) -> None:
        self.limit, self.seconds = limit, seconds
        self._items: list[tuple[float, str, Loader]] = []
        self._lock = threading.Lock()

    def take(self, key: str) -> Loader | None:
        with self._lock:
            for i, (_, k, loader) in enumerate(self._items):
                if k == key:
                    del self._items[i]
                    return loader
        return None

    def put(self, key: str, loader: Loader) -> None:
        with self._lock:
            self._items.append((time.monotonic(), key, loader))
            gone, self._items = self._items[:-self.limit], self._items[-self.limit:]
        for _, _, old in gone:
            old.close()

    def expire(self, everything: bool = False) -> None:
        """Close the loaders kept longer than `seconds` (all of them with `everything`)."""
        cut = float("inf") if everything else time.monotonic() - self.seconds
        with self._lock:
            gone = [item for item in self._items if item[0] <= cut]
            self._items = [item for item in self._items if item[0] > cut]
        for _, _, loader in gone:
            loader.close()


class FeedServer(flight.FlightServerBase):
    """Serves the dataset at `location` (a path, URL or Location) on `host:port` (port 0: a free one; the
    address is `url`), with `workers` loader processes per stream and the named transforms of `transforms`
    (a module name or .py file). It listens once made; `serve()` blocks until `shutdown()`. As a context
    manager it stops and commits what it accepted on exit."""

    def __init__(self, location: Location | str | os.PathLike, host: str = "127.0.0.1", port: int = 8815,
                 token: str | None = None, workers: int = 2, tls: tuple[bytes, bytes] | None = None,
                 transforms: Transforms | str | None = None) -> None:
        # everything a call uses is made before the server listens (super().__init__): a producer retrying
        # against a restarted server connects at once
        self.location = location if isinstance(location, Location) else Location.of(location)
        self.workers = workers
        self.transforms = transforms if isinstance(transforms, Transforms) else Transforms(transforms)
        self._scheme, self._host = "grpc+tls" if tls else "grpc", host
        self._datasets: dict[int | None, Dataset] = {}
        self._lock = threading.Lock()
        self.dataset(None)  # unreadable: one line now, before any client connects
        self._writer: DatasetWriter | None = None
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._last_submit, self._unsynced = 0.0, False
        self._idle = _IdleLoaders()
        middleware = {"token": _TokenCheck(token)} if token else {}
        super().__init__(f"{self._scheme}://{host}:{port}", middleware=middleware,
                         tls_certificates=[tls] if tls else None)
        self._committer = threading.Thread(target=self._commit_loop, name="zarrfeed-commit", daemon=True)
        self._committer.start()

    @property
    def url(self) -> str:
        """Where clients connect: grpc://host:port (grpc+tls with a certificate), the port chosen if 0."""
        return f"{self._scheme}://{self._host}:{self.port}"

    def __enter__(self) -> "FeedServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.close_writer()

    # ------------------------------------------------------------ ingestion
    def _dataset_writer(self) -> DatasetWriter:
        """The writer, opened (taking the dataset's lease) at the first upload; call with the write lock."""
        if self._writer is None:
            self._writer = DatasetWriter(self.location, mode="a", workers=self.workers)
        return self._writer

    def _commit_loop(self) -> None:
        """While uploads arrive, the writer commits as it goes (every second, within submit); once they pause
        for a second, this commits what is left. It never waits on the writer while producers are sending."""
        while not self._stop.wait(1.0):
            self._idle.expire()
            if time.monotonic() - self._last_submit < 1.0 or not self._unsynced:
                continue
            with self._write_lock:
                self._unsynced = False
                if self._writer is not None:
                    try:
                        self._writer.sync()
                    except Exception as exc:  # the writer stopped (a dead worker): the next upload reopens it
                        log.error("zarrfeed: the writer stopped: %s", exc)
                        self._writer = None

    def close_writer(self) -> dict[str, int] | None:
        """At shutdown: stop the loaders kept for a next epoch, commit everything accepted and release the
        lease."""
        self._stop.set()
        self._idle.expire(everything=True)
        with self._write_lock:
            committed = self._writer.close() if self._writer is not None else None
            self._writer = None
        return committed

    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        if list(descriptor.path or []) != [b"episodes"]:
            raise flight.FlightServerError("zarrfeed: upload episodes with the descriptor path 'episodes'")
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            try:
                episodes = decode_episodes(chunk.data)
            except (ValueError, KeyError, pa.ArrowException) as exc:
                raise flight.FlightServerError(f"zarrfeed: {exc}") from None
            for key, episode in episodes:
                with self._write_lock:
                    try:
                        accepted = self._dataset_writer().submit(episode, key=key)
                        self._last_submit, self._unsynced = time.monotonic(), True
                    except ValueError as exc:  # bad input: nothing of it written, the writer goes on
                        raise flight.FlightServerError(f"zarrfeed: {exc}") from None
                    except (WorkerError, RuntimeError) as exc:
                        self._writer = None  # stopped; the next upload reopens (mode "a" resumes)
                        raise flight.FlightServerError(f"zarrfeed: the writer stopped: {exc}") from None
                writer.write(pa.py_buffer(json.dumps({"key": key_to_json(key), "accepted": accepted}).encode()))

    def _begin_input(self, body: bytes) -> dict[str, Any]:
        """Record an input (its first episode's fingerprint) as a local ingest does, so an input ingested
        before by any path is refused unless resumed."""
        try:
            doc = json.loads(body)
            input_id, resume = doc["input"], doc.get("resume", False)
            if not isinstance(input_id, str) or not isinstance(resume, bool):
                raise TypeError("input must be a string and resume a boolean")
        except (ValueError, KeyError, TypeError) as exc:
            raise flight.FlightServerError(f"zarrfeed: begin_input: bad request ({exc})") from None
        with self._write_lock:
            try:
                self._dataset_writer().begin_input(input_id, resume, "its first episode has fingerprint",
                                                   "episodes")
            except ValueError as exc:
                raise flight.FlightServerError(f"zarrfeed: {exc}") from None
            except (WorkerError, RuntimeError) as exc:
                self._writer = None
                raise flight.FlightServerError(f"zarrfeed: the writer stopped: {exc}") from None
        return {"input": input_id}

    def _sync(self) -> dict[str, Any]:
        with self._write_lock:
            if self._writer is None:
                return {"committed": self._latest().rows}
            try:
                self._writer.sync()
                return {"committed": self._writer.committed}
            except (WorkerError, RuntimeError) as exc:
                self._writer = None
                raise flight.FlightServerError(f"zarrfeed: the writer stopped: {exc}") from None

    def dataset(self, commit: int | None) -> Dataset:
        """The dataset at `commit` (None: the latest when first asked), opened once and kept."""
        with self._lock:
            if commit not in self._datasets:
                self._datasets[commit] = Dataset.open(self.location, commit=commit)
            return self._datasets[commit]

    def _latest(self) -> Dataset:
        with self._lock:
            self._datasets.pop(None, None)  # the newest commit each time a client asks
        return self.dataset(None)

    # ------------------------------------------------------------ discovery
    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        if action.type == "sync":
            doc = self._sync()
        elif action.type == "begin_input":
            doc = self._begin_input(action.body.to_pybytes())
        elif action.type == "plan":
            doc = self._plan(action.body.to_pybytes())
        elif action.type == "describe":
            ds = self._latest()
            doc = {"dataset_id": ds.dataset_id, "commit": ds.commit, "schema": ds.schema.name,
                   "tables": {name: {"rows": ds.rows[name], "chunk_rows": arr.chunks[0],
                                     "dtype": [list(f) for f in arr.dtype.descr]}
                              for name, arr in ds.tables.items()},
                   "transforms": self.transforms.describe()}
        else:
            raise flight.FlightServerError(f"unknown action {action.type!r} (actions: describe, plan, sync, "
                                         "begin_input)")
        yield flight.Result(json.dumps(doc).encode())

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("describe", "the dataset: id, commit, per table its rows, chunk rows and numpy dtype; transforms"),
                ("plan", "for a ticket (JSON): its loader's resume state and the batches of its epoch"),
                ("sync", "wait until every accepted episode is committed; the committed rows"),
                ("begin_input", "{input, resume}: start an input of Position-keyed episodes (refused if seen "
                                "before, unless resume)")]

    def _info(self, ds: Dataset, table: str) -> flight.FlightInfo:
        descriptor = flight.FlightDescriptor.for_path(table)
        ticket = Ticket(table, 65_536, shuffle=False, commit=ds.commit).encode()  # the table in row order
        endpoint = flight.FlightEndpoint(ticket, [self.url])
        rows = ds.rows[table]
        return flight.FlightInfo(arrow_schema(ds[table].dtype), descriptor, [endpoint], rows,
                                 rows * ds[table].dtype.itemsize)

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        ds = self._latest()
        for table in ds.tables:
            yield self._info(ds, table)

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        ds = self._latest()
        table = descriptor.path[0].decode() if descriptor.path else ""
        if table not in ds.tables:
            raise flight.FlightServerError(f"no table {table!r} (tables: {', '.join(ds.tables)})")
        return self._info(ds, table)

    # ------------------------------------------------------------ feeding
    def _loader(self, raw: bytes, reuse: bool = False) -> tuple[Ticket, Loader]:
        """The loader a ticket names, at its epoch and batch (workers start when it is iterated); with `reuse`,
        the one kept from this ticket's previous epoch if there is one."""
        try:
            t = Ticket.decode(raw)
            loader = self._idle.take(_reuse_key(t)) if reuse else None
            if loader is None:
                ds = self.dataset(t.commit)
                transform = self.transforms.resolve(t.transform, t.transform_args) if t.transform else None
                options: dict[str, Any] = dict(
                    batch_size=t.batch_size, shuffle=t.shuffle, seed=t.seed, shuffle_window=t.shuffle_window,
                    num_workers=self.workers, drop_last=t.drop_last, rank=t.rank, world_size=t.world_size,
                    transform=transform, copy=True)
                loader = WindowLoader(ds, t.history, t.future, **options) if t.kind == "windows" else \
                    Loader(ds, t.table, fields=t.fields, **options)
            loader.load_state_dict(dataclasses.replace(loader.state(), epoch=t.epoch, batch=t.batch))
        except (ValueError, KeyError, TypeError) as exc:
            raise flight.FlightServerError(f"zarrfeed: {exc}") from None
        return t, loader

    def _plan(self, raw: bytes) -> dict[str, Any]:
        _, loader = self._loader(raw)
        try:
            return {"state": loader.state_dict(), "batches": len(loader)}
        finally:
            loader.close()

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        t, loader = self._loader(ticket.ticket, reuse=True)
        convert = window_batch_to_arrow if t.kind == "windows" and not t.transform else to_arrow
        batches = _batches(loader, context, convert, lambda: self._idle.put(_reuse_key(t), loader))
        try:  # the first batch now: its schema is the stream's, and a transform that fails says so at once
            first = next(batches, None)
        except LoaderError as exc:
            raise flight.FlightServerError(f"zarrfeed: {exc}") from None
        if first is None:
            schema = arrow_schema(loader.dataset[t.table].dtype, t.fields) if t.kind == "batches" and \
                not t.transform else pa.schema([])
            return flight.GeneratorStream(schema, iter(()))
        return flight.GeneratorStream(first.schema, itertools.chain([first], batches))


def _reuse_key(t: Ticket) -> str:
    """What makes two streams the same trainer's: the ticket but where it starts."""
    return json.dumps(dataclasses.asdict(dataclasses.replace(t, epoch=0, batch=0)), sort_keys=True)


def _batches(loader: Loader, context: Any, convert: Callable[[Any], pa.RecordBatch],
             keep: Callable[[], None]) -> Iterator[pa.RecordBatch]:
    """The loader's batches as record batches. When the epoch ends, `keep()` parks the loader for the next
    one; when the client cancels or disconnects, or anything fails, the loader stops (its workers and
    memory are freed)."""
    finished = False
    try:
        for batch in loader:
            if context.is_cancelled():
                return
            yield convert(batch)
        finished = True
    finally:
        if finished:
            keep()
        else:
            loader.close()


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
