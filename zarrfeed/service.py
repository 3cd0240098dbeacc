"""`zarrfeed serve`: a dataset's batches over Arrow Flight, for trainers on other machines or in other languages.

One server process holds the dataset open. Each do_get stream (one per trainer rank and epoch) runs a Loader
with the ticket's arguments (`loader.remote.Ticket`) at the ticket's commit: its worker processes decode and
gather, and the server's gRPC thread only wraps each finished batch as an Arrow record batch (numeric columns
without a copy) and hands it to Flight. Batches are made with `copy=True`: Flight may still be sending a
batch's buffers when the ring slot would be reused. Discovery: `list_flights` / `get_flight_info` describe the
tables (schema, committed rows), the action "describe" the dataset (id, commit, dtypes). With a token, every
call without it is refused before anything is read.

Ingestion (do_put, `writer.remote.RemoteWriter`): the server holds the dataset's writer lease from the first
upload until it stops, and writes every producer's episodes through one DatasetWriter (calls are serialised
by a lock: the writer places episodes in one order). Each episode is acknowledged once accepted; the writer
commits as it goes while uploads arrive, a thread commits what is left once they pause for a second, and
the action "sync" waits until everything accepted is committed. Bad input is refused with the
writer's one line (table, field, row) and nothing of it written; the other producers go on.
"""
from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import os
import threading
import time
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from loader import Dataset, Loader
from loader.arrow_bridge import to_arrow
from loader.remote import Ticket
from writer.arrow_records import arrow_schema
from writer.dataset_writer import DatasetWriter
from writer.pool import WorkerError
from writer.remote import decode_episodes
from writer.store import Location

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


class FeedServer(flight.FlightServerBase):
    """Serves the dataset at `location`; `workers` loader processes per stream."""

    def __init__(self, location: Location, host: str = "127.0.0.1", port: int = 8815, token: str | None = None,
                 workers: int = 2, tls: tuple[bytes, bytes] | None = None) -> None:
        scheme = "grpc+tls" if tls else "grpc"
        middleware = {"token": _TokenCheck(token)} if token else {}
        super().__init__(f"{scheme}://{host}:{port}", middleware=middleware,
                         tls_certificates=[tls] if tls else None)
        self.location, self.workers = location, workers
        self.url = f"{scheme}://{host}:{self.port}"
        self._datasets: dict[int | None, Dataset] = {}
        self._lock = threading.Lock()
        self.dataset(None)  # unreadable: one line now, before any client connects
        self._writer: DatasetWriter | None = None
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._last_submit, self._unsynced = 0.0, False
        self._committer = threading.Thread(target=self._commit_loop, name="zarrfeed-commit", daemon=True)
        self._committer.start()

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
        """Commit everything accepted and release the lease (at shutdown)."""
        self._stop.set()
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
                writer.write(pa.py_buffer(json.dumps({"key": key, "accepted": accepted}).encode()))

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
            yield flight.Result(json.dumps(self._sync()).encode())
            return
        if action.type != "describe":
            raise flight.FlightServerError(f"unknown action {action.type!r} (actions: describe, sync)")
        ds = self._latest()
        doc = {"dataset_id": ds.dataset_id, "commit": ds.commit, "schema": ds.schema.name,
               "tables": {name: {"rows": ds.rows[name], "chunk_rows": arr.chunks[0],
                                 "dtype": [list(f) for f in arr.dtype.descr]}
                          for name, arr in ds.tables.items()}}
        yield flight.Result(json.dumps(doc).encode())

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("describe", "the dataset: id, commit, and per table its rows, chunk rows and numpy dtype"),
                ("sync", "wait until every accepted episode is committed; the committed rows")]

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
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        try:
            t = Ticket.decode(ticket.ticket)
            ds = self.dataset(t.commit)
            loader = Loader(ds, t.table, t.batch_size, t.fields, t.shuffle, t.seed, t.shuffle_window,
                            num_workers=self.workers, drop_last=t.drop_last, rank=t.rank,
                            world_size=t.world_size, copy=True)
            loader.load_state_dict(dataclasses.replace(loader.state(), epoch=t.epoch, batch=t.batch))
        except (ValueError, KeyError) as exc:
            raise flight.FlightServerError(f"zarrfeed: {exc}") from None
        schema = arrow_schema(ds[t.table].dtype, t.fields)
        return flight.GeneratorStream(schema, _batches(loader, context))


def _batches(loader: Loader, context: Any) -> Iterator[pa.RecordBatch]:
    """The loader's batches as record batches; stops (and frees the loader's workers and memory) when the
    epoch ends, the client cancels or disconnects, or anything fails."""
    try:
        for batch in loader:
            if context.is_cancelled():
                return
            yield to_arrow(batch)
    finally:
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
