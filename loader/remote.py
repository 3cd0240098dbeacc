"""`RemoteLoader`: a Loader's batches from a `zarrfeed serve` process, over Arrow Flight.

The batches are exactly those of a local `Loader(path, table, batch_size, ...)` with the same arguments, in
the same order: the server runs that Loader (its workers do the decoding and gathering) and ships each batch
as one Arrow record batch; the order is a pure function of the arguments and the dataset's commit, which the
first call pins, so every rank of a job reads the same rows while a writer appends. The length of an epoch
is computed here from the plan, and a resumed epoch asks the server to start at its batch (nothing skipped is
sent). Any Flight client can read the same streams (see `Ticket`); the server never runs code a client sends.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator

import numpy as np
import pyarrow.flight as flight

from writer.arrow_records import columns_from_arrow, dtype_from_descr
from writer.remote import call_options

from .plan import EpochPlan, PlanConfig
from .state import LoaderState

PROTOCOL = 1


@dataclass(frozen=True)
class Ticket:
    """What a do_get stream is: a Loader's arguments, the commit and where to start. Sent as JSON."""

    table: str
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    shuffle_window: int = 8
    rank: int = 0
    world_size: int = 1
    fields: list[str] | None = None
    drop_last: bool = False
    commit: int | None = None
    epoch: int = 0
    batch: int = 0
    version: int = PROTOCOL

    def encode(self) -> flight.Ticket:
        return flight.Ticket(json.dumps(asdict(self)).encode())

    @classmethod
    def decode(cls, raw: bytes) -> "Ticket":
        """A ticket from its JSON; ValueError (one line) for anything else."""
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ValueError("ticket: not JSON") from None
        if not isinstance(doc, dict) or doc.get("version") != PROTOCOL:
            raise ValueError(f"ticket: expected a zarrfeed ticket of version {PROTOCOL}")
        try:
            return cls(**doc)
        except TypeError as exc:
            raise ValueError(f"ticket: {exc}") from None


def describe(client: flight.FlightClient, options: flight.FlightCallOptions) -> dict[str, Any]:
    """The server's dataset: id, commit, and per table its rows, chunk rows and numpy dtype."""
    results = list(client.do_action(flight.Action("describe", b""), options))
    return json.loads(results[0].body.to_pybytes())


class RemoteLoader:
    """Batches of `table` from the zarrfeed server at `url` (`grpc://host:port` or `grpc+tls://...`), as a
    local Loader with the same arguments would yield them: dicts of numpy columns (views of the received
    Arrow buffers, owned by the batch: they stay valid), or RecordBatches with `output="arrow"`."""

    def __init__(self, url: str, table: str = "agents", batch_size: int = 256, seed: int = 0, shuffle: bool = True,
                 shuffle_window: int | None = None, rank: int = 0, world_size: int = 1,
                 fields: list[str] | None = None, drop_last: bool = False, token: str | None = None,
                 output: str = "numpy", tls_root_certs: bytes | None = None, timeout: float = 30.0) -> None:
        if output not in ("numpy", "arrow"):
            raise ValueError(f"output must be 'numpy' or 'arrow', got {output!r}")
        self.url, self.output = url, output
        self._options = call_options(token, timeout)
        self._stream_options = call_options(token)  # a stream lasts an epoch: no deadline
        kwargs = {"tls_root_certs": tls_root_certs} if tls_root_certs else {}
        self._client = flight.connect(url, **kwargs)
        try:
            info = describe(self._client, self._options)
        except flight.FlightUnauthenticatedError:
            raise PermissionError(f"{url}: the server wants a token (RemoteLoader(..., token=...))") from None
        except flight.FlightUnavailableError as exc:
            raise ConnectionError(f"{url}: no zarrfeed server answers ({str(exc).splitlines()[0]})") from None
        if table not in info["tables"]:
            raise ValueError(f"table {table!r} is not served by {url} (tables: {', '.join(info['tables'])})")
        t = info["tables"][table]
        self.dtype = dtype_from_descr(t["dtype"])
        names = list(self.dtype.names or ())
        unknown = [f for f in fields or [] if f not in names]
        if unknown:
            raise ValueError(f"fields: no field {unknown[0]!r} (fields: {', '.join(names)})")
        if fields:
            self.dtype = np.dtype([(f, self.dtype[f]) for f in fields])
        self.dataset_id, self.commit = info["dataset_id"], info["commit"]
        self._ticket = Ticket(table, batch_size, seed, shuffle, shuffle_window or 8, rank, world_size,
                              list(fields) if fields else None, drop_last, self.commit)
        self._config = PlanConfig(t["rows"], t["chunk_rows"], batch_size, shuffle, seed, shuffle_window or 8,
                                  rank, world_size, drop_last)
        self.epoch, self._position = 0, 0

    def __len__(self) -> int:
        """Batches in the current epoch for this rank (from the plan: no call to the server)."""
        return len(EpochPlan(self._config, self.epoch))

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._position = int(epoch), 0

    def __iter__(self) -> Iterator[Any]:
        if self._position >= len(self):
            self.epoch, self._position = self.epoch + 1, 0
        ticket = replace(self._ticket, epoch=self.epoch, batch=self._position)
        reader = self._client.do_get(ticket.encode(), self._stream_options)
        try:
            for chunk in reader:
                self._position += 1
                yield chunk.data if self.output == "arrow" else columns_from_arrow(chunk.data, self.dtype)
        finally:
            reader.cancel()  # a loop left early: the server stops making this stream's batches
        if self._position >= len(self):
            self.epoch, self._position = self.epoch + 1, 0

    def state(self) -> LoaderState:
        c = self._config
        settings = {"table": self._ticket.table, "table_rows": c.n_rows, "chunk_rows": c.chunk_rows,
                    "batch_size": c.batch_size, "shuffle": c.shuffle, "seed": c.seed,
                    "shuffle_window": c.shuffle_window, "rank": c.rank, "world_size": c.world_size,
                    "drop_last": c.drop_last}
        return LoaderState("Loader", self.dataset_id, self.commit, settings, "all", self.epoch, self._position)

    def state_dict(self) -> dict[str, Any]:
        """The same state a local Loader with these arguments saves: either can resume the other's."""
        return self.state().to_dict()

    def load_state_dict(self, state: dict[str, Any] | LoaderState) -> None:
        saved = LoaderState.from_dict(state)
        saved.check_resumes(self.state())
        self.epoch, self._position = int(saved.epoch), int(saved.batch)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "RemoteLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

