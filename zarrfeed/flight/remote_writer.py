"""`RemoteWriter`: submit episodes to a `zarrfeed serve` process over Arrow Flight, exactly once.

An episode travels as one row of a record batch: a `key` column (the episode's key, as JSON) and, per table,
a column holding that table's records, each table's numpy dtype in the schema metadata; many episodes
stream in one do_put call and the server checks, relocates and writes each through its DatasetWriter.
RemoteWriter sends each table's records as their bytes (a binary value in the dtype's layout): converting to Arrow
columns and back would cost the two sides more CPU than the server's own work (bench/bench_serve.py measures the
server's CPU per GB ingested). Producers in other languages may send list<struct> columns as the Arrow bridge writes
them (`episode_schema(..., records=False)`); the server reads both.

`submit` returns once the server has accepted the episode (its ack comes back on the same call); `sync()`
and `close()` return once every accepted episode is committed. Keys make retries safe: the server's writer
passes over a key that is committed or in flight, and commits record keys with the rows, so a producer that
re-sends after a lost reply or a server restart never duplicates an episode. Without keys, episodes get the
keys a local `DatasetWriter` gives them, `Position(input, index)` with the input's first episode's
fingerprint, and the server refuses an input it has seen before (from any producer, a local ingest or Dask)
unless `ingest(..., resume=True)`. Those are exactly once too: a key-less episode takes its position only once
the server has answered for it, so a `submit` that raised ConnectionError leaves its position to the same
episode submitted again (passed over if the server had committed it before its answer was lost), and another
episode in that place is refused in one line (had the server committed the first, the other would be passed
over as if it were it). A refused episode (bad input) takes no position either: fixed and submitted again, it
is the same episode of the input. Two identical episodes submitted on purpose are two positions, both written. An
`ingest` that raised ConnectionError is finished by the same call again: the writer resumes its own input.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow.flight as flight
import xxhash

from ..core.errors import Error
from ..core.keys import Key, Position, check_key, fingerprint
from ..core.schema import Schema, dtype_from_descr
from ..writer.episode import as_tables, check_episode
from .liveness import STALL_TIMEOUT, Stalled, Watch, probe
from .protocol import (Answered, call_options, connect, encode_episode, episode_schema, episodes_descriptor,
    server_message, unreachable)


class RemoteWriter:
    """Episodes to the zarrfeed server at `url`, with DatasetWriter's `submit`, `ingest`, `sync`, `close`.

    Until `sync()` confirms them committed, the writer keeps (references to) the episodes it sent, at most
    `max_unsynced_bytes` of them (then it syncs by itself). If the server goes away, the call that notices
    raises ConnectionError; the next call on this writer reconnects and sends those episodes again, so
    whatever the server had accepted but not committed when it died is written, and what it had committed
    is passed over by key: every episode exactly once. A sync answered by another server instance than the
    one that accepted the episodes (the server restarted, and gRPC reconnected by itself) sends them again too.

    Args:
        url: The server: `grpc://host:port`, or `grpc+tls://host:port` when it serves TLS.
        token: The server's ingest token, if it has one (else its read token, if it needs one); sent as a
            bearer token. Uploads with a read-only token are refused with `PermissionError`.
        tls_root_certs: PEM bytes of the certificate authority to trust for a `grpc+tls` server (for example
            a self-signed certificate); default: the system's.
        timeout: Seconds each call other than the upload stream may take (default 120), `sync` included, which
            waits for the server's commit. The upload stream has no deadline.
        max_unsynced_bytes: Bytes of sent episodes kept for re-sending until a sync confirms them (default
            256 MiB); beyond it, `submit` syncs by itself. Lower holds less memory, at more waits for commits.
        dataset: The name of the dataset to write to, of a server that serves several (then required).
        stall_timeout: Seconds a call may wait for the server (an upload, an answer, a sync) before the writer
            asks the server whether it still answers (a call with this deadline; default 10): a server that
            does not (a stopped process, a frozen machine) is treated as gone, within 2 x `stall_timeout`
            seconds: the call raises ConnectionError and the next one reconnects and re-sends, as above.
    """

    def __init__(self, url: str, token: str | None = None, tls_root_certs: bytes | None = None,
                 timeout: float = 120.0, max_unsynced_bytes: int = 256 << 20, *, dataset: str | None = None,
                 stall_timeout: float = STALL_TIMEOUT) -> None:
        self.url, self.max_unsynced_bytes, self.dataset = url, max_unsynced_bytes, dataset
        self._options = call_options(token, timeout)
        self._stream_options = call_options(token)  # an upload call lasts as long as the producer: no deadline
        self._tls = {"tls_root_certs": tls_root_certs} if tls_root_certs else {}
        # the upload call has no deadline: a server that stops answering is noticed by probing it
        self._watch = Watch(stall_timeout, lambda t: probe(self._client, call_options(token, t)),
                            keep=lambda: (self._client, self._put))
        self._client = connect(url, **self._tls)
        self._put: Any = None
        self._answers = Answered()  # the answers read on the upload call
        self._unsynced: list[tuple[Key, Mapping[str, np.ndarray]]] = []
        self._unsynced_bytes = 0
        self._accepted_by: set[str] = set()  # the server instances that accepted the unsynced episodes
        self._broken = False
        self._input: str | None = None  # the input that keyless submits continue (as DatasetWriter's)
        self._position = 0  # its next position: taken by an episode once the server answered for it
        self._in_doubt: tuple[str, str] | None = None  # (fingerprint, content) of one sent there, unanswered
        self._interrupted: set[str] = set()  # inputs whose ingest did not finish: called again, resumed
        self._unanswered: str | None = None  # an input whose begin_input went unanswered (maybe recorded)
        self._closed: dict[str, int] | None = None  # what close() answered
        info = self._action("describe", first=True)
        self.schema = episode_schema({t: dtype_from_descr(d["dtype"]) for t, d in info["tables"].items()})
        # the dataset's schema, to refuse a bad first episode before its input is recorded (a server before
        # 0.3 does not say it: the server's own check then refuses it, after the input was begun)
        self._dataset_schema = Schema.from_json(info["schema_doc"]) if "schema_doc" in info else None

    def _gone(self, exc: BaseException) -> ConnectionError:
        if isinstance(exc, Stalled):  # the call and its client are left to the watch's thread (closing or
            self._put = None          # dropping either here would wait for the server too)
            self._client = connect(self.url, **self._tls)
            self._broken = True
            return ConnectionError(f"{self.url}: the server stopped answering (nothing for "
                                   f"{self._watch.stall_timeout:g} s, then no answer to a call within "
                                   f"{self._watch.stall_timeout:g} s: {exc}); call again: this writer reconnects "
                                   "and re-sends what is not committed")
        self._drop_put()
        self._broken = True
        if "handshake" in str(exc).lower():  # not gone: never reached (a certificate it does not trust)
            return ConnectionError(unreachable(self.url, exc))
        return ConnectionError(f"{self.url}: the server went away ({str(exc).strip().splitlines()[0]}); call "
                               "again: this writer reconnects and re-sends what is not committed")

    def _recover(self) -> None:
        """Reconnect and send again every episode not confirmed committed (the server passes over the
        committed ones by key)."""
        self._drop_put()
        self._client.close()
        self._client = connect(self.url, **self._tls)
        self._broken = False
        self._accepted_by.clear()
        for key, episode in list(self._unsynced):
            self._write(encode_episode(episode, key, self.schema))
            self._ack(key)

    def _unreached(self, exc: BaseException) -> ConnectionError:
        """No server answered this writer's first call: there is no writer yet to call again."""
        if isinstance(exc, Stalled):  # (its client is left to the watch's thread, as in `_gone`)
            return ConnectionError(f"{self.url}: the server does not answer (nothing for "
                                   f"{self._watch.stall_timeout:g} s, then no answer to a call within "
                                   f"{self._watch.stall_timeout:g} s: {exc})")
        if isinstance(exc, flight.FlightUnavailableError) and server_message(exc).startswith("zarrfeed:"):
            message = f"{self.url}: {server_message(exc)}"  # the server's own: busy, or shutting down
        else:
            message = unreachable(self.url, exc)
        self._watch.close()
        self._client.close()
        return ConnectionError(message)

    def _action(self, name: str, body: dict[str, Any] | None = None, first: bool = False) -> dict[str, Any]:
        """The server's answer to action `name`; `first`: the constructor's call (a server that does not
        answer it is not there, not gone)."""
        if self.dataset is not None:
            body = {**(body or {}), "dataset": self.dataset}
        try:
            payload = json.dumps(body).encode() if body is not None else b""
            results = self._watch.run(lambda: list(self._client.do_action(flight.Action(name, payload),
                                                                          self._options)))
        except flight.FlightUnauthenticatedError:
            raise PermissionError(f"{self.url}: the server wants a token (RemoteWriter(..., token=...))") from None
        except flight.FlightUnauthorizedError as exc:  # a read-only token, or a server that does not ingest
            raise PermissionError(f"{self.url}: {server_message(exc)}") from None
        except flight.FlightServerError as exc:
            raise ValueError(server_message(exc)) from None
        except (flight.FlightError, OSError, Stalled) as exc:
            raise (self._unreached(exc) if first else self._gone(exc)) from None
        return json.loads(results[0].body.to_pybytes())

    def submit(self, episode: Mapping[str, np.ndarray], key: Key | None = None) -> bool:
        """Send one episode; returns once the server accepted it (True) or passed it over because its key is
        committed or in flight (False). Without a key, the episode is the next of the current input, as with
        `DatasetWriter.submit`: it takes its position once the server answers, so after a ConnectionError the
        same episode submitted again lands there once (another is refused until it is). Bad input raises
        ValueError naming table, field and row; the writer stays usable."""
        episode = self._as_tables(episode)
        if key is None:
            return self._submit_next(episode)
        key = check_key(key)
        accepted = self._send(episode, key)
        self._kept(key, episode)
        return accepted

    def _submit_next(self, episode: Mapping[str, np.ndarray]) -> bool:
        """A key-less submit: the episode at the current input's next position, taken only once the server
        answered (accepted or passed over). A submit that raised ConnectionError leaves the position in doubt
        (the server may have committed the episode before its answer was lost): only the same episode, byte for
        byte, may take it, and the server passes it over if it had it."""
        if self._input is None:
            self._begin_input(episode, resume=False)
        assert self._input is not None  # set by _begin_input
        key = Position(self._input, self._position)
        if self._in_doubt is not None and _content(episode) != self._in_doubt[1]:
            raise ValueError(f"episode {key} of this input (fingerprint {self._in_doubt[0]}) is in doubt: the server "
                             "went away before answering; this is another episode: submit that one again first (it "
                             "is written once), or give keys")
        try:
            accepted = self._send(episode, key)
        except ConnectionError:
            self._in_doubt = (fingerprint(episode), _content(episode))
            raise
        except ValueError:  # refused (bad input): not written, so not in doubt; it takes no position
            self._in_doubt = None
            raise
        self._in_doubt, self._position = None, self._position + 1
        self._kept(key, episode)
        return accepted

    def _send(self, episode: Mapping[str, np.ndarray], key: Key) -> bool:
        """Write one episode on the upload call and read the server's answer (reconnecting first if the
        server went away)."""
        batch = encode_episode(episode, key, self.schema)  # bad tables: ValueError before anything is sent
        if self._broken:
            self._recover()
        self._write(batch)
        try:
            return self._ack(key)
        except (Refused, ConnectionError):
            raise
        except BaseException:
            self._abandon_call()
            raise

    def _kept(self, key: Key, episode: Mapping[str, np.ndarray]) -> None:
        """An answered episode, kept until a sync confirms it committed (syncing now past the bound)."""
        self._keep(key, episode)
        if self._unsynced_bytes > self.max_unsynced_bytes:
            self.sync()

    def ingest(self, episodes: Iterable[Mapping[str, np.ndarray]], keys: Iterable[Key] | None = None,
               window: int = 8, resume: bool = False) -> int:
        """Submit every episode (with `keys`, one per episode), then `sync()`; returns how many were written.
        Without keys, the episodes are one input, keyed and refused or resumed as by `DatasetWriter.ingest`; an
        ingest of this writer that raised (ConnectionError, a refused episode, an interrupt) is finished by the
        same call again (the input is resumed: what the server has is passed over). Up to `window` episodes are
        on their way at once (their acks are read as the next ones go out), so the producer encodes and sends
        while the server writes. A refused episode raises ValueError naming it; the episodes after it in this
        call are not written (ingest them again)."""
        it = iter(keys) if keys is not None else None
        if self._broken:
            self._recover()
        self._input = None
        pending: list[Key] = []  # sent on the upload call, their answers not read yet
        written, sent = 0, 0
        stop: Exception | None = None  # an episode or key this producer refuses: the ones sent before finish
        writing: Mapping[str, np.ndarray] | None = None  # the episode on its way out, if a write fails
        try:
            for i, episode in enumerate(episodes):
                given = next(it, None) if it is not None else None
                if it is not None and given is None:  # (as DatasetWriter.ingest: one line, not StopIteration)
                    stop = ValueError(f"keys: fewer keys than episodes (none for episode {i})")
                    break
                try:  # refused here, before it is sent: the ones sent before it are answered first
                    episode = self._as_tables(episode)
                    key: Key | None = check_key(given) if given is not None else None
                except (ValueError, TypeError) as exc:
                    stop = _refused_here(i, exc)
                    break
                if key is None:  # (the first begins the input: the server's refusal of it is raised as it is)
                    key = self._position_of(i, episode, resume)
                try:
                    batch = encode_episode(episode, key, self.schema)
                except (ValueError, TypeError) as exc:
                    stop = _refused_here(i, exc)
                    break
                writing = episode
                self._write(batch)
                writing = None
                self._keep(key, episode)
                sent = i + 1
                pending.append(key)
                if len(pending) >= window:
                    written += self._ack(pending[0])
                    pending.pop(0)
                if not pending and self._unsynced_bytes > self.max_unsynced_bytes:
                    self.sync()
            while pending:
                written += self._ack(pending[0])
                pending.pop(0)  # (after its answer: a refusal finds it pending)
        except Refused as exc:  # one of pending was refused; the server read nothing after it in this call
            if not pending:
                raise
            unread = self._unread(exc, len(pending))  # answered by the server before it, answers not read
            written += exc.answered.accepted - self._answers.accepted if exc.answered else 0
            refused = len(self._unsynced) - len(pending) + unread
            del self._unsynced[refused:]
            self._unsynced_bytes = sum(_nbytes(ep) for _, ep in self._unsynced)
            self._position = sent - len(pending) + unread  # a key-less submit next takes the refused one's place
            raise ValueError(f"{exc}; nothing after it in this call was written") from None
        except ConnectionError:
            if self._input is not None:  # what went out is re-sent by the next call; the one being sent is in doubt
                self._position = sent
                self._in_doubt = (fingerprint(writing), _content(writing)) if writing is not None else None
            raise
        except BaseException:  # (an interrupt, a failing iterator) with answers unread: see `_abandon_call`
            if pending:
                self._abandon_call()
            self._position = sent
            raise
        self._position = sent
        if stop is not None:
            raise stop
        self.sync()
        if self._input is not None:
            self._interrupted.discard(self._input)
        return written

    def _position_of(self, i: int, episode: Mapping[str, np.ndarray], resume: bool) -> Key:
        """The key of a key-less ingest's `i`-th episode: its position in the input, which the first begins."""
        if i == 0:
            self._begin_input(episode, resume)
            self._interrupted.add(self._input)  # type: ignore[arg-type]  # until this call finishes
        return Position(self._input, i)  # type: ignore[arg-type]  # set by _begin_input

    def _unread(self, refusal: Refused, pending: int) -> int:
        """How many of the `pending` episodes (sent, answers not read) the server had answered before refusing
        one: the refused one is the next (the first, from a server that does not say)."""
        if refusal.answered is None:
            return 0
        return min(max(refusal.answered.episodes - self._answers.episodes, 0), pending - 1)

    def _as_tables(self, episode: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """A replay buffer's episode given as Diffusion Policy's dict (key -> steps) as its tables, as the
        server takes it (`ValueError` naming the key if it cannot be); any other episode as it is."""
        if self._dataset_schema is None:  # a server before 0.3 does not say its schema
            return episode
        return as_tables(episode, self._dataset_schema, strict=True)

    def _begin_input(self, first: Mapping[str, np.ndarray], resume: bool) -> None:
        """The server records the input whose first episode is `first` (refusing a repeat without resume). An
        input whose ingest by this writer did not finish is resumed. One whose beginning went unanswered (the
        server may have recorded it) is begun, or resumed if the server had recorded it (or if another producer
        had begun it meanwhile: the retry then resumes theirs, passing over what they wrote)."""
        if self._dataset_schema is not None:  # a refused first episode begins no input (as DatasetWriter's)
            check_episode(first, self._dataset_schema)
        if self._broken:
            self._recover()
        input_id = fingerprint(first)
        if input_id in self._interrupted:
            resume = True
        try:
            self._action("begin_input", {"input": input_id, "resume": resume})
        except ValueError:
            if resume or input_id != self._unanswered:
                raise
            self._action("begin_input", {"input": input_id, "resume": True})  # it was recorded, unanswered
        except ConnectionError:
            self._unanswered = input_id
            raise
        self._input, self._position, self._in_doubt, self._unanswered = input_id, 0, None, None

    def _keep(self, key: Key, episode: Mapping[str, np.ndarray]) -> None:
        """Remember a sent episode until a sync confirms it committed (re-sent after a reconnect)."""
        self._unsynced.append((key, episode))
        self._unsynced_bytes += _nbytes(episode)

    def _write(self, batch: Any) -> None:
        """Send one encoded episode (`encode_episode`) on the upload call, opening one if none is open."""
        try:
            if self._put is None:
                self._put = self._watch.run(lambda: self._client.do_put(episodes_descriptor(self.dataset),
                                                                        self.schema, self._stream_options))
                self._answers = Answered()
            put = self._put
            self._watch.run(lambda: put[0].write_batch(batch))
        except flight.FlightError as exc:
            raise self._failed(exc) from None
        except (OSError, Stalled) as exc:
            raise self._gone(exc) from None

    def _ack(self, key: Key) -> bool:
        """The server's answer for the oldest episode sent on this call (`key`): accepted or passed over."""
        writer, reader = self._put
        try:
            ack = self._watch.run(reader.read)
        except flight.FlightError as exc:
            raise self._failed(exc) from None
        except (OSError, Stalled) as exc:
            raise self._gone(exc) from None
        if ack is None:  # the server ended the call: its reason arrives when ours is closed
            self._put = None
            try:
                self._watch.run(writer.close)
            except flight.FlightError as exc:
                raise self._failed(exc) from None
            except (OSError, Stalled) as exc:
                raise self._gone(exc) from None
            raise self._gone(RuntimeError(f"the call ended without accepting episode {key}"))
        doc = json.loads(ack.to_pybytes())
        self._accepted_by.add(doc.get("instance", ""))
        self._answers.count(bool(doc["accepted"]))
        return bool(doc["accepted"])

    def _failed(self, exc: flight.FlightError) -> Exception:
        """A Flight error of an upload call as one line: refused input (ValueError; the server ended this
        call, the next opens one), a missing token, or the server gone."""
        if isinstance(exc, flight.FlightUnauthenticatedError):
            self._drop_put()
            return PermissionError(f"{self.url}: the server wants a token (RemoteWriter(..., token=...))")
        if isinstance(exc, flight.FlightUnauthorizedError):
            self._drop_put()
            return PermissionError(f"{self.url}: {server_message(exc)}")
        if isinstance(exc, flight.FlightUnavailableError) and server_message(exc).startswith("zarrfeed:"):
            self._drop_put()  # busy, or shutting down: the next call reconnects and re-sends what is unsynced
            self._broken = True
            return ConnectionError(f"{self.url}: {server_message(exc)}")
        if isinstance(exc, flight.FlightServerError):
            self._drop_put()
            return Refused(server_message(exc), Answered.of(exc))
        return self._gone(exc)

    @property
    def unsynced(self) -> list[Key]:
        """The keys of the episodes sent and not yet confirmed committed (by `sync`), oldest first: what a
        reconnect sends again."""
        return [key for key, _ in self._unsynced]

    def sync(self) -> dict[str, int]:
        """Returns once every episode accepted so far is committed; the committed rows per table."""
        if self._broken:
            self._recover()
        reply = self._action("sync")
        if self._unsynced and self._accepted_by != {reply.get("instance")}:
            # the server that answers did not accept them all: it restarted since (and what the old one had not
            # committed is gone), so send them again; the committed ones are passed over by key
            self._recover()
            reply = self._action("sync")
        committed = reply["committed"]
        self._unsynced.clear()
        self._accepted_by.clear()
        self._unsynced_bytes = 0
        return committed

    def _abandon_call(self) -> None:
        """Leave an upload call whose answers were not all read (an interrupt or an error mid-stream): its
        unread answers would be taken for the next episodes', and a sync could return before the server had
        taken the episodes still on their way. The next call reconnects and sends every unconfirmed episode
        again (the server passes over what it has, by key), so a sync then covers all of them."""
        self._drop_put()
        self._broken = True

    def _drop_put(self) -> None:
        if self._put is not None:
            writer, self._put = self._put[0], None
            try:
                self._watch.run(writer.close)
            except Exception:  # the call already failed (or the server stopped answering): nothing to wait for
                pass

    def close(self) -> dict[str, int]:
        """Finish the upload call and wait until everything accepted is committed (again: the same answer)."""
        if self._closed is not None:
            return self._closed
        if self._put is not None and not self._broken:
            writer, _ = self._put
            try:
                self._watch.run(writer.done_writing)
                self._watch.run(writer.close)
            except (flight.FlightError, OSError, Stalled) as exc:
                self._gone(exc)  # the server went away: the sync below reconnects and sends the unsynced again
            self._put = None
        committed = self.sync()
        self._watch.close()
        self._client.close()
        self._closed = committed
        return committed

    def __enter__(self) -> "RemoteWriter":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        elif self._closed is None:
            self._drop_put()
            self._watch.close()
            self._client.close()


def _refused_here(i: int, exc: Exception) -> Exception:
    """The one line for an ingest's `i`-th episode or key that this producer refuses before sending it."""
    return type(exc)(f"episode {i} of this ingest: {exc} (the {i} before it were sent; nothing after it was)")


class Refused(Error, ValueError):
    """The server refused an uploaded episode (bad input) and ended the call; `answered`: what it had answered
    on that call before. (Here, not in `core.errors`: it carries the protocol's `Answered`.)"""

    def __init__(self, message: str, answered: Answered | None) -> None:
        super().__init__(message)
        self.answered = answered

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.answered)


def _content(episode: Mapping[str, np.ndarray]) -> str:
    """A digest of every byte of an episode (table names, dtypes, shapes, records): what tells a retry of an
    episode in doubt from another one. Computed only after a ConnectionError (the fingerprint samples 8 KiB)."""
    h = xxhash.xxh3_128()
    for name in sorted(episode, key=str):
        arr = np.ascontiguousarray(episode[name])
        h.update(f"{name}|{arr.dtype.descr}|{arr.shape}|".encode())
        h.update(arr.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _nbytes(episode: Mapping[str, np.ndarray]) -> int:
    return sum(np.asarray(a).nbytes for a in episode.values())


