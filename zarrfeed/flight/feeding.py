"""The feeding side of `zarrfeed serve`: discovery (list_flights, get_flight_info, the actions "describe" and
"plan") and do_get streams of batches or windows, each run by a Loader with the ticket's arguments at the
ticket's commit.

Its worker processes decode and gather; the server's gRPC thread only wraps each finished batch as an Arrow
record batch (numeric columns without a copy) and hands it to Flight. Batches are made with `copy=True`:
Flight may still be sending a batch's buffers when the ring slot would be reused. A ticket may name one of
the server's transforms with JSON arguments: the loader's workers apply it and the stream carries its arrays;
no code or pickle from a client is ever run.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
import time
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from ..core.arrow_records import arrow_schema
from ..core.location import Location
from ..loader import AgentSampleLoader, Dataset, EgoSampleLoader, Loader, LoaderError, LoaderStalledError, WindowLoader
from ..loader.arrow_bridge import to_arrow, window_batch_to_arrow
from ..loader.options import ShuffleOptions
from .activity import outcome_of
from .limits import MiB
from .protocol import SAMPLES, TICKET_BYTES, Ticket, TicketPlan
from .serving import Serving

log = logging.getLogger("zarrfeed.serve")
SHUTTING_DOWN = "zarrfeed: server shutting down (a trainer goes on from its resume state once it is back)"
GIVEN_UP = ("zarrfeed: stream given up: its client took no batch for {:g} s (the server's --stream-idle-timeout); "
            "a remote loader reconnects and goes on from its position")


class IdleLoaders:
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

    def __len__(self) -> int:
        return len(self._items)

    def worker_processes(self) -> int:
        """The worker processes the kept loaders hold (running, waiting for a next epoch)."""
        with self._lock:
            return sum(loader.num_workers for _, _, loader in self._items)

    def put(self, key: str, loader: Loader) -> None:
        with self._lock:
            self._items.append((time.monotonic(), key, loader))
            keep = len(self._items) - self.limit
            gone, self._items = self._items[:keep], self._items[keep:]
        _close_all([loader for _, _, loader in gone])

    def drop_others(self, dataset_id: str | None) -> None:
        """Close the loaders kept of another dataset than `dataset_id` (one put in its place since)."""
        with self._lock:
            gone = [item for item in self._items if item[2].dataset.dataset_id != dataset_id]
            self._items = [item for item in self._items if item[2].dataset.dataset_id == dataset_id]
        _close_all([loader for _, _, loader in gone])

    def expire(self, everything: bool = False) -> None:
        """Close the loaders kept longer than `seconds` (all of them with `everything`)."""
        cut = float("inf") if everything else time.monotonic() - self.seconds
        with self._lock:
            gone = [item for item in self._items if item[0] <= cut]
            self._items = [item for item in self._items if item[0] > cut]
        _close_all([loader for _, _, loader in gone])


def _close_all(loaders: list[Loader]) -> None:
    """Close `loaders` at once, each in a thread of its own: each waits for its workers to exit (a tenth of a
    second and more under load), and a server that stops closes all it kept (8 by default), within its 2 s."""
    if len(loaders) < 2:
        for loader in loaders:
            loader.close()
        return
    threads = [threading.Thread(target=loader.close, name="zarrfeed: closing a kept loader", daemon=True)
               for loader in loaders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class Feeding:
    """Feeds the dataset at `location`, served as `name` ("": the server's only one, unnamed), to trainers,
    with what the server's datasets share (`serving`: processes per stream, transforms, limits, activity)."""

    def __init__(self, location: Location, name: str, serving: Serving) -> None:
        self.location, self.name = location, name
        self.workers, self.transforms, self._url = serving.workers, serving.transforms, serving.url
        self.limits, self.activity, self.streams = serving.limits, serving.activity, serving.streams
        self.verify_chunks = serving.verify_chunks
        self._datasets: dict[int | None, Dataset] = {}
        self._lock = threading.Lock()
        self.idle = IdleLoaders(self.limits.kept_loaders, self.limits.kept_loader_seconds)
        self._gates: set[_Gate] = set()  # the open streams, for `give_up_idle`
        self.closing = threading.Event()  # set at shutdown: open streams end, new ones are refused
        self.dataset(None)  # unreadable: one line now, before any client connects

    def dataset(self, commit: int | None) -> Dataset:
        """The dataset at `commit` (None: the latest when first asked), opened once and kept."""
        with self._lock:
            if commit not in self._datasets:
                self._datasets[commit] = Dataset.open(self.location, commit=commit, verify_chunks=self.verify_chunks)
            return self._datasets[commit]

    def latest(self) -> Dataset:
        """The dataset at its newest commit, looked up again on each call. When another dataset was put in
        its place, the commits kept open of the one before and the loaders kept for their next epochs are
        dropped (streams still reading it fail on their chunks, one line; the next tickets read the new one)."""
        with self._lock:
            self._datasets.pop(None, None)
        ds = self.dataset(None)
        with self._lock:
            for commit, old in list(self._datasets.items()):
                if old.dataset_id != ds.dataset_id:
                    del self._datasets[commit]
        self.idle.drop_others(ds.dataset_id)
        return ds

    def close(self) -> None:
        """At shutdown: open streams end at their next batch with "server shutting down", new ones are
        refused, the loaders kept for a next epoch stop."""
        self.closing.set()
        self.idle.expire(everything=True)

    # ------------------------------------------------------------ discovery
    def describe(self, body: bytes) -> dict[str, Any]:
        """The action "describe": the dataset's id, commit, schema (its name, and as `Schema.to_json`), per table
        its rows, chunk rows and dtype."""
        ds = self.latest()
        return {"dataset_id": ds.dataset_id, "commit": ds.commit, "schema": ds.schema.name,
                "schema_doc": ds.schema.to_json(),
                "tables": {name: {"rows": ds.rows[name], "chunk_rows": arr.chunks[0],
                                  "dtype": [list(f) for f in arr.dtype.descr]}
                           for name, arr in ds.tables.items()},
                "transforms": self.transforms.describe()}

    def plan(self, body: bytes) -> dict[str, Any]:
        """The action "plan": a ticket's loader's resume state and the number of batches of its epoch."""
        _, loader = self._loader(body)
        try:
            return {"state": loader.state_dict(), "batches": len(loader)}
        finally:
            loader.close()

    def _info(self, ds: Dataset, table: str) -> flight.FlightInfo:
        descriptor = flight.FlightDescriptor.for_path(*([self.name] if self.name else []), table)
        ticket = Ticket(table, TicketPlan(65_536, ShuffleOptions(shuffle=False)), commit=ds.commit,  # in row order
                        dataset=self.name or None).encode()
        endpoint = flight.FlightEndpoint(ticket, [self._url()])
        rows = ds.rows[table]
        return flight.FlightInfo(arrow_schema(ds[table].dtype), descriptor, [endpoint], rows,
                                 rows * ds[table].dtype.itemsize)

    def flights(self) -> Iterator[flight.FlightInfo]:
        """One flight per table: its schema, committed rows and a ticket that reads it in row order."""
        ds = self.latest()
        for table in ds.tables:
            yield self._info(ds, table)

    def flight_info(self, table: str) -> flight.FlightInfo:
        """The flight of `table`: its schema, committed rows and a ticket that reads it in row order."""
        ds = self.latest()
        if table not in ds.tables:
            raise flight.FlightServerError(f"no table {table!r} (tables: {', '.join(ds.tables)})")
        return self._info(ds, table)

    # ------------------------------------------------------------ streams
    def _loader(self, raw: bytes, reuse: bool = False) -> tuple[Ticket, Loader]:
        """The loader a ticket names, at its epoch and batch (workers start when it is iterated); with `reuse`,
        the one kept from this ticket's previous epoch if there is one."""
        most = self.limits.max_transform_args_bytes + TICKET_BYTES
        if len(raw) > most:  # refused before it is parsed: a huge ticket costs memory and time to read
            raise flight.FlightServerError(f"zarrfeed: ticket: {len(raw)} bytes, over the {most} a ticket may "
                                           "take (its settings and --max-transform-args-bytes)")
        try:
            t = Ticket.decode(raw)
            loader = self.idle.take(_reuse_key(t)) if reuse else None
            if loader is None:
                ds = self.dataset(t.commit)
                self._check_limits(t, ds)
                transform = self.transforms.resolve(t.transform, t.transform_args) if t.transform else None
                options: dict[str, Any] = dict(**t.plan.as_options(), num_workers=self.workers,
                                               transform=transform, copy=True,
                                               cache_bytes=self.limits.stream_cache_bytes(),
                                               stall_timeout=self.limits.stream_stall_timeout)
                loader = _make_loader(ds, t, options)
                self._check_batch(t, loader)
            loader.load_state_dict(dataclasses.replace(loader.state(), epoch=t.epoch, batch=t.batch))
        except (ValueError, KeyError, TypeError) as exc:
            raise flight.FlightServerError(f"zarrfeed: {str(exc).splitlines()[0]}") from None
        return t, loader

    def _check_limits(self, t: Ticket, ds: Dataset) -> None:
        """Refuse a ticket whose batches or transform arguments are over the server's limits, in one line."""
        if t.table not in ds.tables:
            return  # the loader names the unknown table
        rows = t.plan.batch_size * (t.history + t.future + 1 if t.kind in SAMPLES else 1)  # at least
        size = rows * ds[t.table].dtype.itemsize
        if size > self.limits.max_batch_bytes:
            raise ValueError(f"ticket: a batch of {t.plan.batch_size} is at least {size / MiB:.0f} MiB of "
                             f"{t.table}, over the server's --max-batch-bytes of "
                             f"{self.limits.max_batch_bytes / MiB:.0f} MiB")
        args = len(json.dumps(t.transform_args)) if t.transform_args is not None else 0
        if args > self.limits.max_transform_args_bytes:
            raise ValueError(f"ticket: transform_args are {args} bytes of JSON, over the server's "
                             f"--max-transform-args-bytes of {self.limits.max_transform_args_bytes}")

    def _check_batch(self, t: Ticket, loader: Loader) -> None:
        """Refuse a loader whose batch, exactly as its ring slots hold it (a window's agents and faces
        included), is over `--max-batch-bytes`; no worker has started yet."""
        size = loader.source.layout.slot_bytes
        if size > self.limits.max_batch_bytes:
            loader.close()
            raise ValueError(f"ticket: a batch of {t.plan.batch_size} takes up to {size / MiB:.0f} MiB, over the "
                             f"server's --max-batch-bytes of {self.limits.max_batch_bytes / MiB:.0f} MiB")

    def stream(self, raw: bytes, context: Any) -> flight.FlightDataStream:
        """do_get: the ticket's batches as a stream of record batches; at most `limits.max_streams` at once."""
        if self.closing.is_set():
            raise flight.FlightUnavailableError(SHUTTING_DOWN)
        self.streams.take()
        try:
            t, loader = self._loader(raw, reuse=True)
        except BaseException:
            self.streams.give()
            raise
        convert = window_batch_to_arrow if t.kind == "windows" and not t.transform else to_arrow
        record = self.activity.stream_started(context.peer(), self.name, t.table, t.kind, t.plan.rank,
                                              t.plan.world_size, t.epoch)

        def done(outcome: str) -> None:
            self.streams.give()
            self.activity.stream_ended(record, outcome, loader.chunks_decoded)

        gate = _Gate(GIVEN_UP.format(self.limits.stream_idle_timeout))
        batches = _batches(loader, context, convert, lambda: self.idle.put(_reuse_key(t), loader), self.closing,
                           lambda rb: self.activity.sent(record, rb.num_rows, rb.nbytes), done, gate)
        with self._lock:
            self._gates.add(gate)
        gate.on_end = lambda: self._forget(gate)
        first = next(batches, None)  # now: its schema is the stream's, and a transform that fails says so at once
        if first is None:
            schema = arrow_schema(loader.dataset[t.table].dtype, t.fields) if t.kind == "batches" and \
                not t.transform else pa.schema([])
            return flight.GeneratorStream(schema, iter(()))
        return flight.GeneratorStream(first.schema, itertools.chain([first], batches))


    def _forget(self, gate: "_Gate") -> None:
        with self._lock:
            self._gates.discard(gate)

    def give_up_idle(self) -> None:
        """Every second: each stream whose client has taken no batch for `limits.stream_idle_timeout` seconds
        gives up its slot and its loader (see limits.py)."""
        with self._lock:
            gates = list(self._gates)
        for gate in gates:
            gate.give_up_if_idle(self.limits.stream_idle_timeout)

    def tick(self) -> None:
        """Every second: loaders parked too long stop; idle streams give up their slots."""
        self.idle.expire()
        self.give_up_idle()


class _Gate:
    """A stream's hold on its slot and loader, taken back by `give_up_if_idle` while the stream's generator waits
    for gRPC to take its last batch (the client is not reading) longer than the idle limit. The generator holds
    `lock` while it runs, so the two never touch the loader at once."""

    def __init__(self, message: str) -> None:
        self.lock = threading.Lock()
        self.message = message
        self.waiting_since: float | None = None  # set while the generator is suspended at a yield
        self.ended = False
        self.end: Callable[[str], None] = lambda outcome: None  # set by _batches: its loader's and slot's end
        self.on_end: Callable[[], None] = lambda: None

    def finish(self, outcome: str) -> None:
        """End the stream's hold once (with the lock held)."""
        if not self.ended:
            self.ended = True
            self.end(outcome)
            self.on_end()

    def give_up_if_idle(self, limit: float) -> None:
        if not self.lock.acquire(blocking=False):  # making a batch: not idle
            return
        try:
            since = self.waiting_since
            if not self.ended and since is not None and time.monotonic() - since > limit:
                log.warning("zarrfeed: %s", self.message)
                self.finish("idle")
        finally:
            self.lock.release()


def _make_loader(ds: Dataset, t: Ticket, options: dict[str, Any]) -> Loader:
    """The local loader a ticket asks for."""
    if t.kind == "windows":
        return WindowLoader(ds, t.history, t.future, whole_windows=t.whole_windows, **options)
    if t.kind == "agents":
        return AgentSampleLoader(ds, t.history, t.future, step_time=t.step_time, threshold=t.threshold,
                                 min_history=t.min_history, min_future=t.min_future, **options)
    if t.kind == "ego":
        return EgoSampleLoader(ds, t.history, t.future, step_time=t.step_time, **options)
    return Loader(ds, t.table, fields=t.fields, row_ids=t.row_ids, **options)


def _for_the_client(exc: LoaderError) -> str:
    """The stream's loader's error, as its remote client reads it: the server's options in place of the
    loader's advice (a remote loader refuses `restart_workers` and `stall_timeout`: they are the server's)."""
    if isinstance(exc, LoaderStalledError):
        return (f"{exc.waiting} waited over the server's --stream-stall-timeout of {exc.seconds:g} s on "
                f"{exc.stopped}, on the server (`kill -CONT {' '.join(map(str, exc.pids))}` there resumes "
                f"{'it' if len(exc.pids) == 1 else 'them'})")
    return exc.what.splitlines()[0]


def _reuse_key(t: Ticket) -> str:
    """What makes two streams the same trainer's: the ticket but where it starts."""
    return json.dumps(dataclasses.asdict(dataclasses.replace(t, epoch=0, batch=0)), sort_keys=True)


def _batches(loader: Loader, context: Any, convert: Callable[[Any], pa.RecordBatch], keep: Callable[[], None],
             closing: threading.Event, sent: Callable[[pa.RecordBatch], None],
             done: Callable[[str], None], gate: _Gate) -> Iterator[pa.RecordBatch]:
    """The loader's batches as record batches, each passed to `sent`. When the epoch ends, `keep()` parks the
    loader for the next one; when the client cancels or disconnects, the server shuts down (`closing`), the
    stream is given up for idleness (`gate`) or anything fails, the loader stops (its workers and memory are
    freed). `done(outcome)` is called once, when the stream ends or is given up."""
    state: dict[str, Any] = {"finished": False, "outcome": "cancelled"}  # unless it ends otherwise: the client left

    def end(outcome: str) -> None:
        done(outcome)
        if state["finished"]:
            keep()
        else:
            loader.close()
    gate.end = end
    batches = iter(loader)
    try:
        while True:
            with gate.lock:
                gate.waiting_since = None
                if gate.ended:  # given up while gRPC waited for the client to take the last batch
                    raise flight.FlightUnavailableError(gate.message)
                batch = next(batches, None)
                if batch is None:
                    state["finished"], state["outcome"] = True, "ok"
                    return
                if context.is_cancelled():
                    return
                if closing.is_set():
                    raise flight.FlightUnavailableError(SHUTTING_DOWN)
                rb = convert(batch)
                sent(rb)
                gate.waiting_since = time.monotonic()
            yield rb
    except flight.FlightError as exc:
        state["outcome"] = outcome_of(exc) if not gate.ended else "idle"
        raise
    except LoaderError as exc:  # a chunk that cannot be read, a transform that raised: its one line
        said = _for_the_client(exc)  # (the server's log too: its operator's options, not a local loader's)
        log.warning("zarrfeed: a stream failed: %s", said)
        state["outcome"] = outcome_of(RuntimeError(said))
        raise flight.FlightServerError(f"zarrfeed: {said}") from None
    except Exception as exc:
        log.exception("zarrfeed: a stream failed")
        state["outcome"] = outcome_of(exc)
        raise flight.FlightServerError(f"zarrfeed: the stream failed: {type(exc).__name__}: {exc} (the "
                                       "server's log has the traceback)") from None
    finally:
        with gate.lock:
            gate.waiting_since = None
            gate.finish(state["outcome"])
