"""The ingesting side of `zarrfeed serve` (do_put, `zarrfeed.flight.RemoteWriter`).

The server holds the dataset's writer lease from the first upload until it stops, and writes every
producer's episodes through one DatasetWriter (calls are serialised by a lock: the writer places episodes in
one order). Each episode is acknowledged once accepted; the writer commits as it goes while uploads arrive,
a thread commits what is left once they pause for a second, and the action "sync" waits until everything
accepted is committed. Bad input is refused with the writer's one line (table, field, row) and nothing of it
written; the other producers go on.
"""
from __future__ import annotations

import errno
import json
import logging
import threading
import time
import uuid
from typing import Any, Callable, Iterator, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from ..core.errors import WorkerError
from ..core.keys import key_to_json
from ..core.location import Location
from ..writer.dataset_writer import DatasetWriter
from .activity import UploadRecord, outcome_of
from .limits import MiB
from .protocol import Answered, decode_episodes
from .serving import Serving

log = logging.getLogger("zarrfeed.serve")
T = TypeVar("T")


class Ingestion:
    """Writes the episodes producers upload into the dataset at `location` (served as `name`), with the
    server's writer processes and limits (`serving`); `committed()` gives the committed rows when no writer
    is open (the dataset's latest commit). Each dataset has its own writer and so its own lease."""

    def __init__(self, location: Location, name: str, serving: Serving,
                 committed: Callable[[], dict[str, int]]) -> None:
        self.location, self.name, self.workers, self._committed = location, name, serving.workers, committed
        self.limits, self.activity, self.uploads = serving.limits, serving.activity, serving.uploads
        self._accepted = self._committed_before = 0  # episodes accepted, and committed, since the writer opened
        # who accepted an episode: a sync answered by another instance (the server restarted meanwhile, or the
        # writer that accepted it stopped) does not confirm it, and the producer sends it again
        self.instance = uuid.uuid4().hex
        self._writer: DatasetWriter | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_submit, self._unsynced = 0.0, False
        self._thread = threading.Thread(target=self._commit_loop, name="zarrfeed-commit", daemon=True)

    def start(self, every_second: Callable[[], None] = lambda: None) -> None:
        """Start the thread that commits what is left once uploads pause (and calls `every_second`)."""
        self._every_second = every_second
        self._thread.start()

    def close(self) -> dict[str, int] | None:
        """Commit everything accepted and release the lease; the committed rows (None: nothing was uploaded).
        Uploads after this are refused ("server shutting down"): what was acknowledged is committed."""
        self._stop.set()
        with self._lock:
            self._closed = True
            committed = self._writer.close() if self._writer is not None else None
            self._writer = None
        return committed

    def _open(self) -> DatasetWriter:
        """The writer, opened (taking the dataset's lease) at the first upload; call with the lock."""
        if self._closed:
            raise flight.FlightUnavailableError("zarrfeed: server shutting down: the episodes it acknowledged are "
                                                "committed; send the others again once it is back")
        if self._writer is None:
            try:
                self._writer = DatasetWriter(self.location, mode="a", workers=self.workers)
            except OSError as exc:  # a store this server cannot write into: said, not a traceback
                raise self._refused(exc) from None
            self._accepted, self._committed_before = 0, self._writer.committer.committed_episodes
        return self._writer

    def _refused(self, exc: OSError) -> flight.FlightError:
        """Why the writer did not open (a read-only store, no permission to write, a store that does not
        answer), in one line in the server's log naming the dataset and the file, and one to the producer
        without the server's paths: a refusal (PermissionError at RemoteWriter) when the store may not be
        written, else a server error."""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        dataset = f"dataset {self.name!r} ({self.location})" if self.name else f"dataset {self.location}"
        log.error("zarrfeed: %s: uploads refused: its writer did not open: %s", dataset, text)
        why = exc.strerror or text  # strerror: without the file's path on the server
        said = (f"zarrfeed: uploads refused: this server cannot write into "
                f"{f'dataset {self.name!r}' if self.name else 'its dataset'} ({why})")
        if isinstance(exc, PermissionError) or exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return flight.FlightUnauthorizedError(said)
        return flight.FlightServerError(said)

    def _with_writer(self, call: Callable[[DatasetWriter], T]) -> T:
        with self._lock:
            return self._call(call)

    def _call(self, call: Callable[[DatasetWriter], T]) -> T:
        """`call(writer)`, with the lock held: bad input is one line to the client, a writer that stopped is
        dropped (the next upload reopens it in mode "a", which resumes)."""
        try:
            return call(self._open())
        except flight.FlightError:
            raise
        except ValueError as exc:  # bad input: nothing of it written, the writer goes on
            raise flight.FlightServerError(f"zarrfeed: {exc}") from None
        except (WorkerError, RuntimeError) as exc:
            self._drop_writer()
            raise flight.FlightServerError(f"zarrfeed: the writer stopped: {exc}") from None

    def _commit_loop(self) -> None:
        """While uploads arrive, the writer commits as it goes (every second, within submit); once they pause
        for a second, this commits what is left. It never waits on the writer while producers are sending."""
        while not self._stop.wait(1.0):
            self._every_second()
            if time.monotonic() - self._last_submit < 1.0 or not self._unsynced:
                continue
            with self._lock:
                self._unsynced = False
                if self._writer is not None:
                    try:
                        self._writer.sync()
                    except Exception as exc:  # the writer stopped (a dead worker): the next upload reopens it
                        log.error("zarrfeed: the writer stopped: %s", exc)
                        self._drop_writer()

    def _drop_writer(self) -> None:
        """Forget a writer that stopped (call with the lock). What it accepted and had not committed is gone
        (the next writer resumes from the last commit), so the instance changes: a producer's next sync is
        answered by an instance that did not accept those episodes, and it sends them again."""
        self._writer = None
        self.instance = uuid.uuid4().hex

    def status(self) -> dict[str, Any]:
        """The action "status"'s ingestion part: whether a writer is open, what it committed, how far
        committing lags behind accepting (episodes accepted but not yet committed)."""
        w = self._writer
        if w is None:
            return {"writer_open": False, "committed_rows": self._committed(), "commit_lag_episodes": 0}
        lag = self._committed_before + self._accepted - w.committer.committed_episodes
        return {"writer_open": True, "committed_rows": w.committed, "commit_number": w.committer.commit_number,
                "episodes_committed": w.committer.committed_episodes, "commit_lag_episodes": max(0, lag)}

    def put(self, reader: Any, writer: Any, client: str = "") -> None:
        """do_put: each uploaded episode submitted, then acknowledged (accepted, or passed over as committed)."""
        self.uploads.take()
        record, outcome = self.activity.upload_started(client, self.name), "ok"
        try:
            self._put(reader, writer, record)
        except BaseException as exc:
            outcome = outcome_of(exc)
            raise
        finally:
            self.uploads.give()
            self.activity.upload_ended(record, outcome)

    def _put(self, reader: Any, writer: Any, record: UploadRecord) -> None:
        """Each episode of the call submitted and answered in order; a refusal ends the call, saying how many
        were answered before it (`Answered`)."""
        answered = Answered()
        try:
            self._put_each(reader, writer, record, answered)
        except flight.FlightServerError as exc:
            raise answered.refusal(str(exc)) from None

    def _put_each(self, reader: Any, writer: Any, record: UploadRecord, answered: Answered) -> None:
        limit = self.limits.max_message_bytes
        for chunk in _chunks(reader):
            if chunk.data.nbytes > limit:  # gRPC receives a message whole: refused before it is decoded or copied
                raise flight.FlightServerError(
                    f"zarrfeed: an uploaded message of {chunk.data.nbytes / MiB:.1f} MiB is over the server's "
                    f"--max-message-bytes of {limit / MiB:.1f} MiB (send one episode per message)")
            try:
                episodes = decode_episodes(chunk.data)
            except (ValueError, KeyError, pa.ArrowException) as exc:
                raise flight.FlightServerError(f"zarrfeed: {exc}") from None
            for key, episode in episodes:
                # the instance read with the lock held: the one whose writer accepted it
                accepted, instance = self._with_writer(lambda w: (w.submit(episode, key=key), self.instance))  # noqa: B023
                self._last_submit, self._unsynced = time.monotonic(), True
                self._accepted += accepted
                self.activity.received(record, accepted, sum(a.nbytes for a in episode.values()))
                writer.write(pa.py_buffer(json.dumps({"key": key_to_json(key), "accepted": accepted,
                                                      "instance": instance}).encode()))
                answered.count(accepted)

    def begin_input(self, body: bytes) -> dict[str, Any]:
        """The action "begin_input": record an input (its first episode's fingerprint) as a local ingest does,
        so an input ingested before by any path is refused unless resumed."""
        try:
            doc = json.loads(body)
            input_id, resume = doc["input"], doc.get("resume", False)
            if not isinstance(input_id, str) or not isinstance(resume, bool):
                raise TypeError("input must be a string and resume a boolean")
        except (ValueError, KeyError, TypeError) as exc:
            raise flight.FlightServerError(f"zarrfeed: begin_input: bad request ({exc})") from None
        self._with_writer(lambda w: w.committer.begin_input(input_id, resume, "its first episode has fingerprint",
                                                            "episodes"))
        return {"input": input_id}

    def sync(self, body: bytes) -> dict[str, Any]:
        """The action "sync": wait until every accepted episode is committed; the committed rows."""
        def sync(w: DatasetWriter) -> dict[str, Any]:
            w.sync()
            return {"committed": w.committed, "instance": self.instance}

        with self._lock:
            if self._writer is None:  # nothing uploaded since the last writer closed: no lease taken for this
                return {"committed": self._committed(), "instance": self.instance}
            return self._call(sync)


def _chunks(reader: Any) -> Iterator[Any]:
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return
