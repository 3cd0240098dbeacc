"""`RemoteLoader`, `RemoteWindowLoader`, `RemoteAgentSampleLoader` and `RemoteEgoSampleLoader`: a Loader's,
WindowLoader's or sample loader's batches from a `zarrfeed serve` process, over Arrow Flight.

The batches are exactly those of a local loader with the same arguments, in the same order: the server runs
that loader (its workers do the decoding, gathering and any transform) and ships each batch as one Arrow
record batch; the order is a pure function of the arguments and the dataset's commit, which the first call
pins, so every rank of a job reads the same rows while a writer appends. The server answers each epoch's
length and the resume state with its own loader's, so a state saved remotely resumes a local loader and back;
a resumed epoch asks the server to start at its batch (nothing skipped is sent). Any Flight client can read
the same streams (see `Ticket`). A transform is asked for by name with JSON arguments: the server never
runs code or unpickles objects a client sends.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any, Iterator, Unpack

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from ..core.keywords import spelled_out
from ..core.arrow_records import columns_from_arrow, dtype_from_descr
from ..loader.arrow_bridge import window_batch_from_arrow
from ..loader.loader import ROW_ID, LoaderError
from ..core.schema import field_names
from ..loader.ordering.resume import Cursor, adopt_order
from ..loader.ordering.state import LOADED_WHILE_ITERATING, LoaderState
from .liveness import Stalled, Watch, probe
from .remote_options import Remote, RemoteOptions
from .protocol import Ticket, TicketPlan, _json_args, call_options, connect, describe, server_message, unreachable


class _RemoteFeed:
    """What both remote loaders do: connect, pin the commit, ask the server for each epoch's plan, stream."""

    _ticket: Ticket

    def _connect(self, url: str, o: Remote) -> None:
        self.options = o
        self._iterating = False  # a loop over this loader is running (a state is not loaded under it)
        c = o.connection
        token, output, tls_root_certs, timeout = c.token, o.stream.output, c.tls_root_certs, c.timeout
        reconnect_timeout, dataset, stall_timeout = c.reconnect_timeout, c.dataset, c.stall_timeout
        self.transform = o.stream.transform
        self.url, self.output, self.reconnect_timeout, self.dataset = url, output, reconnect_timeout, dataset
        self._token, self.timeout = token, timeout
        self._options = call_options(token, timeout)
        # a stream has no deadline: a server that stops answering mid-stream is noticed by probing it
        self._watch = Watch(stall_timeout, lambda t: probe(self._client, call_options(token, t)))
        self._stream_options = call_options(token)  # a stream lasts an epoch: no deadline
        self._tls = {"tls_root_certs": tls_root_certs} if tls_root_certs else {}
        self._client = connect(url, **self._tls)
        self.info = self._call(lambda: describe(self._client, self._options, dataset))
        self.dataset_id, self.commit = self.info["dataset_id"], self.info["commit"]
        # the server plans an epoch's usual shares only; a cursor with spans has none of its epoch (a state of an
        # epoch resumed on more ranks than it had rows left): this loader yields nothing for it
        self._cursor = Cursor()
        self.reconnects = 0  # times a stream was lost and taken up again
        self._plans: dict[int, tuple[LoaderState, int]] = {}

    def _ticket_for(self, table: str, batch_size: int, **kind: Any) -> Ticket:
        """The ticket of this loader's streams: the table, the plan, the commit, and what its kind adds."""
        o = self.options
        plan = TicketPlan(batch_size, o.shuffling, o.shard, "shuffle_bytes" in o.given)
        return Ticket(table, plan, commit=self.commit, transform=o.stream.transform,
                      transform_args=_json_args(o.stream.transform_args), dataset=o.connection.dataset,
                      order=o.shuffling.order, **kind)

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._cursor.epoch

    def _call(self, fn: Any) -> Any:
        """`fn()`, with Flight's errors as one line (see `_error`)."""
        try:
            return fn()
        except flight.FlightError as exc:
            raise self._error(exc, ValueError) from None

    def _error(self, exc: flight.FlightError | Stalled, refused: type[Exception]) -> Exception:
        """A Flight error as one line: PermissionError without the right token, ConnectionError when no server
        answers, `refused` with the server's own line otherwise."""
        if isinstance(exc, flight.FlightUnauthenticatedError):
            return PermissionError(f"{self.url}: the server wants a token ({type(self).__name__}(..., token=...))")
        if isinstance(exc, Stalled):
            return ConnectionError(f"{self.url}: the server stopped answering (nothing for "
                                   f"{self._watch.stall_timeout:g} s, then no answer to a call within "
                                   f"{self._watch.stall_timeout:g} s: {exc})")
        if isinstance(exc, flight.FlightTimedOutError):
            return ConnectionError(f"{self.url}: the server did not answer within timeout={self.timeout:g} s "
                                   f"({server_message(exc)})")
        if isinstance(exc, flight.FlightUnavailableError):
            if server_message(exc).startswith("zarrfeed:"):  # the server's own: busy, or shutting down
                return ConnectionError(f"{self.url}: {server_message(exc)}")
            return ConnectionError(unreachable(self.url, exc))
        return refused(f"{self.url}: {server_message(exc)}" if refused is LoaderError else server_message(exc))

    def _plan(self, epoch: int) -> tuple[LoaderState, int]:
        """The server's loader for `epoch`: its state and how many batches the epoch has for this rank."""
        if epoch not in self._plans:
            self._plans = {epoch: self._call(lambda: self._ask_plan(epoch, self._options))}
        return self._plans[epoch]

    def _ask_plan(self, epoch: int, options: flight.FlightCallOptions) -> tuple[LoaderState, int]:
        body = replace(self._ticket, epoch=epoch).to_json()
        doc = json.loads(list(self._client.do_action(flight.Action("plan", body), options))[0].body.to_pybytes())
        return LoaderState.from_dict(doc["state"]), int(doc["batches"])

    def __len__(self) -> int:
        """Batches in the current epoch for this rank (0 in an epoch whose rest this rank has no share of)."""
        return 0 if self._cursor.no_share else self._plan(self.epoch)[1]

    def set_epoch(self, epoch: int) -> None:
        self._cursor = Cursor(int(epoch))

    def _convert(self, rb: pa.RecordBatch) -> Any:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        """As `Loader`'s: the rest of the current epoch (nothing when it was read to its end or this rank has
        no share of it), then the epoch advances."""
        reader, lost_since = None, None
        self._iterating = True
        try:
            while True:
                try:
                    if reader is None:  # from the batch after the last one yielded: nothing twice, nothing skipped
                        if self._cursor.batch >= len(self):
                            break
                        ticket = replace(self._ticket, epoch=self.epoch, batch=self._cursor.batch)
                        reader = self._watch.run(lambda: self._client.do_get(ticket.encode(), self._stream_options))
                    chunk = self._watch.run(reader.read_chunk, cancel=reader.cancel)
                except StopIteration:
                    break
                except (flight.FlightError, OSError, Stalled) as exc:
                    if not _passing(exc):  # the server's loader failed (a transform, a chunk, a worker)
                        raise self._error(exc, LoaderError) from None
                    lost_since = lost_since or time.monotonic()
                    if time.monotonic() - lost_since >= self.reconnect_timeout:
                        raise self._error(exc, LoaderError) from None
                    reader = None
                    if not self._reconnect(lost_since):
                        raise self._error(exc, LoaderError) from None
                    continue
                lost_since = None
                self._cursor = self._cursor.at(self._cursor.batch + 1)
                yield chunk.data if self.output == "arrow" else self._convert(chunk.data)
        finally:
            self._iterating = False
            if reader is not None:
                reader.cancel()  # a loop left early: the server stops making this stream's batches
        if self._cursor.batch >= len(self):
            self._cursor = self._cursor.next_epoch()

    def _reconnect(self, lost_since: float) -> bool:
        """Wait for the server to answer again (a restart, a moment of "busy"), with backoff from 0.1 to 2 s,
        until `reconnect_timeout` seconds after the stream was lost (each try's deadline ends there too);
        whether it answered."""
        delay = 0.1
        while (left := self.reconnect_timeout - (time.monotonic() - lost_since)) > 0:
            time.sleep(min(delay, left))
            delay = min(2 * delay, 2.0)
            left = self.reconnect_timeout - (time.monotonic() - lost_since)
            if left <= 0:
                break
            self._client.close()
            self._client = connect(self.url, **self._tls)
            try:
                options = call_options(self._token, min(self.timeout, max(left, 0.1)))
                info = describe(self._client, options, self.dataset)
                now = self._ask_plan(self.epoch, options) if info["dataset_id"] == self.dataset_id else None
            except (flight.FlightError, OSError) as exc:
                if not _passing(exc):
                    raise self._error(exc, LoaderError) from None
                continue
            self._check_same_epoch(now)
            self.reconnects += 1
            return True
        return False

    def _check_same_epoch(self, now: tuple[LoaderState, int] | None) -> None:
        """After a reconnect, the server must make this epoch's batches from the same rows: what a state load
        checks (the dataset, its commit and which copy's commit it is, the settings), so that a replica with
        other rows under the same commit number never finishes an epoch begun on another copy."""
        (was, batches), e = self._plan(self.epoch), self.epoch
        if now is None:
            raise LoaderError(f"{self.url}: the server came back with another dataset; epoch {e} cannot go on")
        tags = (now[0].commit_tag, was.commit_tag)  # (None: a commit recorded before tags were, not told apart)
        if now[0].commit != was.commit or (None not in tags and tags[0] != tags[1]):
            raise LoaderError(f"{self.url}: the server came back with another copy of this dataset (its commit "
                              f"{now[0].commit} holds other rows than the one epoch {e} began on); epoch {e} cannot "
                              "go on there: reconnect to the copy it began on, or start the epoch again")
        try:
            now[0].check_resumes(was)
            if now[1] != batches:
                raise ValueError(f"epoch {e} has {now[1]} batches for this rank there, not {batches}")
        except ValueError as exc:
            raise LoaderError(f"{self.url}: the server came back planning epoch {e} otherwise ({exc}); it cannot "
                              "go on there") from None

    def state(self) -> LoaderState:
        """The state the server's loader (and so a local one with these arguments) has here. What it holds
        besides the position is the same in every epoch: a plan already asked for serves, so that a checkpoint
        at an epoch's end needs no call to the server."""
        known = next(iter(self._plans.values()), None) or self._plan(self.epoch)
        at = self._cursor
        return replace(known[0], epoch=at.epoch, batch=at.batch, spans=[] if at.no_share else None)

    def state_dict(self) -> dict[str, Any]:
        """The same state a local loader with these arguments saves: either can resume the other's."""
        return self.state().to_dict()

    def load_state_dict(self, state: dict[str, Any] | LoaderState) -> None:
        """As `Loader.load_state_dict` (one state): a state saved in epoch order 1 goes on in it, as a local
        loader's does; a refused state changes nothing."""
        if self._iterating:
            raise RuntimeError(LOADED_WHILE_ITERATING)
        if isinstance(state, (list, tuple)):
            raise ValueError("a remote loader takes one loader state; the states of every rank of a run (a list) "
                             "are resumed on another number of ranks by a local Loader")
        saved = LoaderState.from_dict(state)
        empty = saved.spans == [] and saved.batch == 0  # a share of nothing: the epoch is read without this rank
        if saved.spans is not None and not empty:  # the server plans an epoch's usual shares only
            raise ValueError(f"loader state of epoch {saved.epoch} resharded on another number of ranks: resume it "
                             "with a local Loader, or from the start of the next epoch")
        before = self._ticket, self._plans
        try:
            self._adopt_order(saved)
            saved.check_resumes(self.state())
            saved.check_position(0 if empty else self._plan(saved.epoch)[1] if saved.epoch >= 0 else 0)
        except BaseException:
            self._ticket, self._plans = before
            raise
        self._cursor = Cursor.of(saved)

    def _adopt_order(self, saved: LoaderState) -> None:
        """The order a resumed run keeps (`loader.ordering.resume.adopt_order`, as a local loader's)."""
        plan = self._ticket.plan
        shuffling = adopt_order(saved, plan.shuffling, self.options.given)
        if shuffling != plan.shuffling:
            self._ticket = replace(self._ticket, plan=replace(plan, shuffling=shuffling), order=shuffling.order)
            self._plans = {}

    def close(self) -> None:
        self._watch.close()
        self._client.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _passing(exc: BaseException) -> bool:
    """Whether a stream's error may pass once the server is back: the server gone or restarting (transport
    errors, "server shutting down"), busy or stopped answering; not a failure the server reported about the
    stream itself."""
    if isinstance(exc, (flight.FlightUnavailableError, Stalled)):
        return True
    if isinstance(exc, (flight.FlightServerError, flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError,
                        flight.FlightCancelledError)):
        return False
    return isinstance(exc, (flight.FlightInternalError, flight.FlightTimedOutError, OSError))


@spelled_out(RemoteOptions, Remote)
class RemoteLoader(_RemoteFeed):
    """Batches of `table` from the zarrfeed server at `url` (`grpc://host:port` or `grpc+tls://...`), as a
    local `Loader` with the same arguments would yield them: dicts of numpy columns (views of the received
    Arrow buffers, owned by the batch: they stay valid), or RecordBatches with `output="arrow"`.
    `transform="name"` (with JSON `transform_args`) has the server's workers apply one of its named
    transforms (`zarrfeed serve --transforms MODULE`): the batches are then that transform's arrays.

    If the server goes away mid-epoch (a restart, a shutdown, a moment of "busy"), the loader reconnects with
    backoff for up to `reconnect_timeout` seconds and goes on from the batch after the last one it yielded:
    the epoch's batches are exactly those that would have come. `dataset` names one of a server's several
    datasets (`zarrfeed serve train=... val=...`).

    The server's loader runs with the server's workers and cache; the options that decide the batches are
    `Loader`'s, sent to it. It takes every remote loader's options (`RemoteOptions`, listed below).

    Args:
        url: The server: `grpc://host:port`, or `grpc+tls://host:port` when it serves TLS.
        table: The table whose rows are batched (default "agents").
        batch_size: As `Loader`'s (default 256).
        fields: As `Loader`'s.
        row_ids: As `Loader`'s: a column `_row` with each row's index in the table.
    """

    def __init__(self, url: str, table: str = "agents", *, batch_size: int = 256,
                 fields: list[str] | str | None = None, row_ids: bool = False,
                 **options: Unpack[RemoteOptions]) -> None:
        o = Remote.of(options, "RemoteLoader")
        self._connect(url, o)
        tables = self.info["tables"]
        if table not in tables:
            raise ValueError(f"table {table!r} is not served by {url} (tables: {', '.join(tables)})")
        self.dtype = dtype_from_descr(tables[table]["dtype"])
        if fields is not None:  # the loader's own checks: one name, unknown or repeated fields
            fields = field_names(self.dtype, fields) or None
        if fields:
            self.dtype = np.dtype([(f, self.dtype[f]) for f in fields])
        if row_ids:  # the server's Loader adds it (and refuses a table with a field of that name)
            self.dtype = np.dtype(self.dtype.descr + [(ROW_ID, "<i8")])
        self._ticket = self._ticket_for(table, batch_size, fields=list(fields) if fields else None,
                                        row_ids=bool(row_ids))
        self._plan(0)  # the server checks the arguments (and the transform's name) now

    def _convert(self, rb: pa.RecordBatch) -> dict[str, np.ndarray]:
        return columns_from_arrow(rb, None if self.transform else self.dtype)


@spelled_out(RemoteOptions, Remote)
class RemoteWindowLoader(_RemoteFeed):
    """L5Kit-style samples from the zarrfeed server at `url`, as a local `WindowLoader` with the same
    arguments would yield them (`frame_row`, `frames/<field>`, ragged `agents/<field>` with
    `agents_offsets`, likewise traffic-light faces). Each batch travels as one record batch with a row per
    sample: ragged columns as lists, the offsets as columns (`zarrfeed.loader.arrow_bridge.window_batch_to_arrow`);
    `output="arrow"` gives those. A transform (by name, see RemoteLoader) makes the server send its compact
    arrays instead of raw windows, about 0.6 MB each.

    It takes every remote loader's options (`RemoteOptions`, listed below).

    Args:
        url: As `RemoteLoader`'s: the server.
        history: As `WindowLoader`'s: frames before t in each window (default 10).
        future: As `WindowLoader`'s: frames after t in each window (default 50).
        whole_windows: As `WindowLoader`'s: only frames whose whole window lies inside their scene.
        batch_size: Samples per batch (default 32).
    """

    def __init__(self, url: str, history: int = 10, future: int = 50, *, batch_size: int = 32,
                 whole_windows: bool = False, **options: Unpack[RemoteOptions]) -> None:
        o = Remote.of(options, "RemoteWindowLoader")
        self._connect(url, o)
        self.history, self.future = history, future
        self._ticket = self._ticket_for("frames", batch_size, kind="windows", history=history, future=future,
                                        whole_windows=bool(whole_windows))
        self._plan(0)

    def _convert(self, rb: pa.RecordBatch) -> dict[str, np.ndarray]:
        return columns_from_arrow(rb) if self.transform else window_batch_from_arrow(rb)


class _RemoteSamples(_RemoteFeed):
    """L5Kit samples from the server: what both remote sample loaders share. `selection` holds the agents
    mask's options (`threshold`, `min_history`, `min_future`), which only agent samples take."""

    KIND = ""
    TABLE = ""

    def _start(self, url: str, history: int, future: int, step_time: float, selection: dict[str, Any],
               batch_size: int, o: Remote) -> None:
        self._connect(url, o)
        self.history, self.future = history, future
        self._ticket = self._ticket_for(self.TABLE, batch_size, kind=self.KIND, history=history, future=future,
                                        step_time=step_time, **selection)
        self._plan(0)

    def _convert(self, rb: pa.RecordBatch) -> dict[str, np.ndarray]:
        return columns_from_arrow(rb)


@spelled_out(RemoteOptions, Remote)
class RemoteAgentSampleLoader(_RemoteSamples):
    """`AgentSampleLoader`'s batches from the zarrfeed server at `url`, as a local one with the same arguments
    yields them (fixed-shape columns; the server's agents mask). Reconnects as `RemoteLoader` does.

    It takes every remote loader's options (`RemoteOptions`, listed below).

    Args:
        url: As `RemoteLoader`'s: the server.
        history: As `AgentSampleLoader`'s: past frames of each sample (default 10).
        future: As `AgentSampleLoader`'s: future frames of each sample (default 50).
        step_time: As `AgentSampleLoader`'s: seconds between two frames (default 0.1).
        threshold: As `AgentSampleLoader`'s: the label probability threshold (default 0.5).
        min_history: As `AgentSampleLoader`'s: valid past frames a sampled agent needs (default 10).
        min_future: As `AgentSampleLoader`'s: valid future frames a sampled agent needs (default 1).
        batch_size: Samples per batch (default 32).
    """

    KIND, TABLE = "agents", "agents"

    def __init__(self, url: str, history: int = 10, future: int = 50, *, step_time: float = 0.1,
                 threshold: float = 0.5, min_history: int = 10, min_future: int = 1, batch_size: int = 32,
                 **options: Unpack[RemoteOptions]) -> None:
        self._start(url, history, future, step_time,
                    dict(threshold=threshold, min_history=min_history, min_future=min_future), batch_size,
                    Remote.of(options, "RemoteAgentSampleLoader"))

@spelled_out(RemoteOptions, Remote)
class RemoteEgoSampleLoader(_RemoteSamples):
    """`EgoSampleLoader`'s batches from the zarrfeed server at `url`, as a local one with the same arguments
    yields them. Reconnects as `RemoteLoader` does. As `EgoSampleLoader`, it takes no `threshold`,
    `min_history` or `min_future`: the ego is sampled at every frame, with no agents mask.

    It takes every remote loader's options (`RemoteOptions`, listed below).

    Args:
        url: As `RemoteLoader`'s: the server.
        history: As `EgoSampleLoader`'s: past frames of each sample (default 10).
        future: As `EgoSampleLoader`'s: future frames of each sample (default 50).
        step_time: As `EgoSampleLoader`'s: seconds between two frames (default 0.1).
        batch_size: Samples per batch (default 32).
    """

    KIND, TABLE = "ego", "frames"

    def __init__(self, url: str, history: int = 10, future: int = 50, *, step_time: float = 0.1,
                 batch_size: int = 32, **options: Unpack[RemoteOptions]) -> None:
        self._start(url, history, future, step_time, {}, batch_size, Remote.of(options, "RemoteEgoSampleLoader"))
