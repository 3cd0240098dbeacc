"""zarrfeed's Flight protocol, shared by the server and its clients and versioned together (`PROTOCOL`):
tickets (what a do_get stream is), the actions and what they answer, the auth header and the server's error
line, and the episode codec of do_put uploads."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from ..core.arrow_records import arrow_schema, from_arrow, records_to_arrow
from ..core.keys import Key, check_key, key_from_json, key_to_json
from ..core.schema import dtype_from_descr
from ..loader.options import ShardOptions, ShuffleOptions
from ..loader.ordering.order import ORDERS, VERSION as ORDER


# --------------------------------------------------------------------------------------------- tickets
PROTOCOL = 2  # 2: the plan's settings travel as one object, "plan"
MAX_BATCH_ROWS = 1 << 24  # a ticket's batch size at most (the server's memory check refuses less, sooner)
MAX_TRANSFORM_ARGS = 64 << 10  # bytes of JSON
DATASET_NAME = re.compile(r"[A-Za-z][\w.-]*")  # a dataset's name on a server of several


TICKET_BYTES = 64 << 10  # what a ticket's own settings may take (fields included), beside its transform arguments


KINDS = ("batches", "windows", "agents", "ego")  # Loader, WindowLoader, AgentSampleLoader, EgoSampleLoader
SAMPLES = ("windows", "agents", "ego")  # kinds whose batches hold a sample per row, each of T frames
# AgentSampleLoader's options alone: a ticket of another kind may carry them only at their defaults (what every
# client sends in every ticket: EgoSampleLoader's label threshold is 0.5 too); another value is refused
AGENTS_ONLY = ("threshold", "min_history", "min_future")


@dataclass(frozen=True)
class TicketPlan:
    """What decides a remote loader's batches, as its ticket carries them: the batch size, the order and the
    share. On the wire one flat JSON object of those loader options (`shuffle_window` null: the server loader's
    default window; `shuffle_bytes` null: not given)."""

    batch_size: int = 256
    shuffling: ShuffleOptions = field(default_factory=ShuffleOptions)
    shard: ShardOptions = field(default_factory=ShardOptions)
    bytes_given: bool = False  # the client gave shuffle_bytes (it widens some loaders' default windows)

    def to_dict(self) -> dict[str, Any]:
        o, r = self.shuffling, self.shard
        return {"batch_size": self.batch_size, "shuffle": o.shuffle, "seed": o.seed, "shuffle_window": o.shuffle_window,
                "rank": r.rank, "world_size": r.world_size, "drop_last": r.drop_last, "order": o.order,
                "shuffle_bytes": o.shuffle_bytes if self.bytes_given else None}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "TicketPlan":
        """A plan from its JSON object (checked by `Ticket.check_plan` first: the options' own checks then
        pass); a field it does not have raises TypeError."""
        shuffle = {k: doc[k] for k in ("shuffle", "seed", "shuffle_window", "order") if k in doc}
        if doc.get("shuffle_bytes") is not None:
            shuffle["shuffle_bytes"] = doc["shuffle_bytes"]
        unknown = set(doc) - {"batch_size", "shuffle_bytes", *shuffle, "rank", "world_size", "drop_last"}
        if unknown:
            raise TypeError(f"unexpected plan field {sorted(unknown)[0]!r}")
        return cls(doc.get("batch_size", 256), ShuffleOptions(**shuffle),
                   ShardOptions(**{k: doc[k] for k in ("rank", "world_size", "drop_last") if k in doc}),
                   doc.get("shuffle_bytes") is not None)

    def as_options(self) -> dict[str, Any]:
        """The loader options that make these batches (those the client did not give left out: defaults)."""
        return {k: v for k, v in self.to_dict().items() if not (k == "shuffle_bytes" and v is None)}

    @property
    def rank(self) -> int:
        return self.shard.rank

    @property
    def world_size(self) -> int:
        return self.shard.world_size


@dataclass(frozen=True)
class Ticket:
    """What a do_get stream is: a loader's arguments (`kind` "batches": Loader, "windows": WindowLoader,
    "agents": AgentSampleLoader, "ego": EgoSampleLoader; the plan's settings as a local loader takes them), the
    commit and where to start. Sent as JSON."""

    table: str
    plan: TicketPlan = field(default_factory=TicketPlan)
    fields: list[str] | None = None
    commit: int | None = None
    epoch: int = 0
    batch: int = 0
    version: int = PROTOCOL
    kind: str = "batches"
    history: int = 10
    future: int = 50
    transform: str | None = None
    transform_args: dict[str, Any] | None = field(default=None)
    dataset: str | None = None  # which of the server's datasets (None: its only one)
    order: int = ORDER  # the epoch order's algorithm the client expects (loader/ordering/order.py)
    row_ids: bool = False  # batches carry `_row`, each row's index in its table (Loader's row_ids)
    whole_windows: bool = False  # WindowLoader's whole_windows
    step_time: float = 0.1  # the sample loaders' step_time
    threshold: float = 0.5  # AgentSampleLoader's agents mask threshold
    min_history: int = 10  # AgentSampleLoader's min_history and min_future
    min_future: int = 1

    def encode(self) -> flight.Ticket:
        return flight.Ticket(self.to_json())

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "plan": self.plan.to_dict()}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Ticket":
        """A ticket from its JSON; ValueError (one line) for anything else."""
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ValueError("ticket: not JSON") from None
        if not isinstance(doc, dict) or doc.get("version") != PROTOCOL:
            raise ValueError(f"ticket: expected a zarrfeed ticket of version {PROTOCOL}")
        doc.setdefault("order", 0)  # a client from before the order was versioned expects numpy's order
        plan = doc.pop("plan", {})
        if not isinstance(plan, dict):
            raise ValueError("ticket: plan must be an object of the plan's settings")
        plan.setdefault("order", doc["order"])  # a client from before order 2 names it once, outside the plan
        check_plan(plan, doc["order"])
        try:
            ticket = cls(**doc, plan=TicketPlan.from_dict(plan))
        except TypeError as exc:
            raise ValueError(f"ticket: {exc}") from None
        ticket.check()
        return ticket

    def check(self) -> None:
        """Refuse, in one line naming the field, a value of the wrong type or out of its range (JSON gives
        floats, strings and huge numbers as readily as the integers a loader needs)."""
        check_plan(self.plan.to_dict(), self.order)
        for name, value, lo, hi in (("epoch", self.epoch, 0, 2**31 - 1), ("batch", self.batch, 0, 2**63 - 1),
                                    ("history", self.history, 0, 1 << 16), ("future", self.future, 0, 1 << 16),
                                    ("min_history", self.min_history, 0, 1 << 16),
                                    ("min_future", self.min_future, 0, 1 << 16)):
            if not _integer(value) or not lo <= value <= hi:
                raise ValueError(f"ticket: {name} must be an integer in [{lo}, {hi}], got {value!r}")
        if self.commit is not None and (not _integer(self.commit) or self.commit < 0):
            raise ValueError(f"ticket: commit must be a commit number (an integer >= 0) or null, got {self.commit!r}")
        for name, value in (("row_ids", self.row_ids), ("whole_windows", self.whole_windows)):
            if not isinstance(value, bool):
                raise ValueError(f"ticket: {name} must be true or false, got {value!r}")
        if self.row_ids and self.kind != "batches":
            raise ValueError("ticket: row_ids is for batches of rows (a window's row is its frame_row)")
        if self.kind not in KINDS:
            raise ValueError(f"ticket: kind must be one of {', '.join(map(repr, KINDS))}, got {self.kind!r}")
        if self.kind != "agents":  # the agents mask's options: another kind would ignore them
            for name in AGENTS_ONLY:
                value, default = getattr(self, name), _DEFAULTS[name]
                if value != default:
                    raise ValueError(f"ticket: {name} is an option of kind 'agents' (the agents mask), not of kind "
                                     f"{self.kind!r}, got {value!r}")
        for name, number, least, most in (("step_time", self.step_time, 1e-9, 1e6),
                                          ("threshold", self.threshold, 0.0, 1.0)):
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not least <= number <= most:
                raise ValueError(f"ticket: {name} must be a number in [{least}, {most}], got {number!r}")
        if not isinstance(self.table, str) or not all(v is None or isinstance(v, str)
                                                      for v in (self.transform, self.dataset)):
            raise ValueError("ticket: table, transform and dataset must be strings")
        if self.fields is not None and (not isinstance(self.fields, list)
                                        or not all(isinstance(f, str) for f in self.fields)):
            raise ValueError(f"ticket: fields must be a list of field names or null, got {self.fields!r}")
        if self.transform_args is not None:
            if not isinstance(self.transform_args, dict):
                raise ValueError("ticket: transform_args must be an object or null")
            if len(json.dumps(self.transform_args)) > MAX_TRANSFORM_ARGS:
                raise ValueError(f"ticket: transform_args is larger than {MAX_TRANSFORM_ARGS} bytes of JSON")


_DEFAULTS = {f.name: f.default for f in fields(Ticket) if f.name in AGENTS_ONLY}


def check_plan(p: Mapping[str, Any], order: Any) -> None:
    """Refuse, in one line naming the field, a ticket's plan (its JSON object) that a loader would not take;
    `order`: the ticket's own epoch order, which the plan's must equal."""
    for name, lo, hi in (("batch_size", 1, MAX_BATCH_ROWS), ("seed", 0, 2**64 - 1), ("world_size", 1, 1 << 20),
                         ("rank", 0, p.get("world_size", 1) - 1 if _integer(p.get("world_size", 1)) else 0)):
        value = p.get(name, _PLAN_DEFAULTS[name])
        if not _integer(value) or not lo <= value <= hi:
            raise ValueError(f"ticket: plan.{name} must be an integer in [{lo}, {hi}], got {value!r}")
    for name, most in (("shuffle_window", 1 << 20), ("shuffle_bytes", 1 << 50)):
        value = p.get(name)
        if value is not None and (not _integer(value) or not 1 <= value <= most):
            raise ValueError(f"ticket: plan.{name} must be an integer in [1, {most}] or null (the loader's "
                             f"default), got {value!r}")
    for name in ("shuffle", "drop_last"):
        value = p.get(name, _PLAN_DEFAULTS[name])
        if not isinstance(value, bool):
            raise ValueError(f"ticket: plan.{name} must be true or false, got {value!r}")
    mine = p.get("order", order)
    if _integer(order) and _integer(mine) and mine != order:
        raise ValueError(f"ticket: plan.order {mine!r} and order {order!r} differ (one epoch order)")
    if not _integer(order) or order not in ORDERS or mine != order:
        raise ValueError(f"ticket: epoch order {order!r}; this server orders epochs with orders "
                         f"{', '.join(map(str, ORDERS))} (a client and server of different zarrfeed releases: "
                         "upgrade the older one)")


_PLAN_DEFAULTS = TicketPlan().to_dict()


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_args(args: dict[str, Any] | None) -> dict[str, Any] | None:
    """`transform_args` as they travel: a JSON object (the server takes nothing else)."""
    if args is None:
        return None
    if not isinstance(args, dict):
        raise ValueError(f"transform_args must be a dict, got {type(args).__name__}")
    try:
        return json.loads(json.dumps(args))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"transform_args must be JSON (numbers, strings, lists, dicts): {exc}") from None


# --------------------------------------------------------------------------------------------- actions
@dataclass(frozen=True)
class Action:
    """One Flight action of zarrfeed's server: its name, what its body holds and what it answers (JSON)."""

    name: str
    request: str
    reply: str
    ingests: bool = False  # needs the right to upload (see access.py)

    @property
    def description(self) -> str:
        return f"{self.request} -> {self.reply}"


# The server's actions, versioned with the tickets (PROTOCOL): the server dispatches by this table and
# `list_actions` reports it, so the two cannot drift apart.
ACTIONS = {a.name: a for a in (
    Action("describe", 'empty or {"dataset": name}',
           "the dataset: id, commit, schema, per table its rows, chunk rows and numpy dtype; the server's "
           "transforms"),
    Action("plan", "a ticket (JSON)", "its loader's resume state and the number of batches of its epoch"),
    Action("status", "empty", "what the server is doing: streams (client, table, rank, epoch, rows/s), uploads, "
                              "totals, ingestion and its commit lag, limits, processes, memory, uptime"),
    Action("begin_input", '{"input": first episode\'s fingerprint, "resume": bool, "dataset": name or absent}',
           "starts an input of Position-keyed episodes: refused if it was ingested before, unless resume",
           ingests=True),
    Action("sync", 'empty or {"dataset": name}',
           "once every accepted episode is committed: the committed rows per table", ingests=True),
)}


def describe(client: flight.FlightClient, options: flight.FlightCallOptions,
             dataset: str | None = None) -> dict[str, Any]:
    """The server's dataset (`dataset`: which, of several): id, commit, per table its rows, chunk rows and
    numpy dtype; its transforms."""
    body = json.dumps({"dataset": dataset}).encode() if dataset else b""
    results = list(client.do_action(flight.Action("describe", body), options))
    return json.loads(results[0].body.to_pybytes())


def dataset_of(body: bytes) -> str | None:
    """The dataset an action's JSON body (or a ticket) names; None for an empty body or none named."""
    if not body:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None  # the handler says what is wrong with it
    name = doc.get("dataset") if isinstance(doc, dict) else None
    if name is not None and not isinstance(name, str):
        raise ValueError(f"dataset must be a name, got {name!r}")
    return name


def episodes_descriptor(dataset: str | None) -> flight.FlightDescriptor:
    """Where a producer uploads episodes: ["episodes"], or [dataset, "episodes"] for one of several."""
    return flight.FlightDescriptor.for_path(*([dataset] if dataset else []), "episodes")


# ------------------------------------------------------------------------------ credentials and errors
def call_options(token: str | None, timeout: float | None = None) -> flight.FlightCallOptions:
    """Flight call options carrying `token` as `authorization: Bearer <token>` (what the server checks)."""
    if token is not None and (not token or token != token.strip() or any(c.isspace() or not c.isprintable()
                                                                         for c in token)):
        raise ValueError("token: empty, or holds spaces, a newline or other unprintable characters (a token "
                         "read from a file: strip it)")
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return flight.FlightCallOptions(headers=headers, timeout=timeout)


def connect(url: str, tls_root_certs: bytes | None = None) -> flight.FlightClient:
    """A Flight client of the server at `url` (grpc://host:port or grpc+tls://host:port); a URL of another
    kind is a one-line ValueError, not pyarrow's "no client transport" error."""
    try:
        return flight.connect(url, **({"tls_root_certs": tls_root_certs} if tls_root_certs else {}))
    except (pa.ArrowException, ValueError) as exc:
        raise ValueError(f"{url}: not a zarrfeed server's URL: use grpc://HOST:PORT or grpc+tls://HOST:PORT "
                         f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") \
            from None


def unreachable(url: str, exc: BaseException) -> str:
    """Why no server answered at `url`, in one line: a failed TLS handshake says so and why (gRPC reports it
    as "unavailable", like a server that is not there)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    handshake = re.search(r"handshake failed.*?(?:routines::|: )([^:]+(?::[^:]+)?)$", text, re.IGNORECASE)
    if handshake:
        return (f"{url}: the TLS handshake failed: {handshake.group(1).strip()} (tls_root_certs= must hold the "
                "certificate of the CA that signed the server's)")
    if url.startswith("grpc://") and text.endswith("Socket closed"):
        return f"{url}: the server closed the connection (is it a TLS server? then use grpc+tls://)"
    return f"{url}: no zarrfeed server answers ({text})"


def server_message(exc: Exception) -> str:
    """The server's one line, without gRPC's details."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". Detail:")[0]


# ----------------------------------------------------------------------------------- episodes (do_put)


@dataclass
class Answered:
    """How many episodes of an upload call the server had answered, and how many of those it accepted, when it
    ended the call refusing the next one. Sent with the refusal: a producer that had not read all those answers
    yet (gRPC may surface the end of the call on a write, before the answers it buffered) learns which episode
    was refused, and that the ones before it were written."""
    episodes: int = 0
    accepted: int = 0

    def count(self, accepted: bool) -> None:
        self.episodes += 1
        self.accepted += accepted

    def refusal(self, message: str) -> flight.FlightServerError:
        """The server's error ending the call, carrying these counts."""
        return flight.FlightServerError(message, extra_info=json.dumps(asdict(self)).encode())

    @staticmethod
    def of(exc: flight.FlightError) -> Answered | None:
        """The counts a refusal carries (None from a server before 0.4, or for another error)."""
        try:
            doc = json.loads(exc.extra_info)
            return Answered(int(doc["episodes"]), int(doc["accepted"]))
        except (ValueError, TypeError, KeyError):
            return None



DTYPES_KEY = b"zarrfeed.dtypes"


def episode_schema(dtypes: Mapping[str, np.dtype], records: bool = True) -> pa.Schema:
    """The schema of a batch of episodes with these tables: each table a column of the numpy records' bytes
    (`records=True`, what RemoteWriter sends: no conversion on either side) or of list<struct> (columns, as
    any Arrow producer makes them). The server reads both; the dtypes travel in the metadata."""
    fields = [pa.field("key", pa.string(), nullable=False)]
    for table, dtype in dtypes.items():
        kind = pa.large_binary() if records else pa.list_(pa.struct(list(arrow_schema(dtype))))
        fields.append(pa.field(table, kind, nullable=False))
    meta = {DTYPES_KEY: json.dumps({t: [list(f) for f in d.descr] for t, d in dtypes.items()}).encode()}
    return pa.schema(fields, metadata=meta)


def encode_episode(episode: Mapping[str, np.ndarray], key: Key, schema: pa.Schema) -> pa.RecordBatch:
    """One episode as a one-row record batch of `schema` (tables the episode lacks are empty). Records
    columns share the episode's memory when it is C-contiguous."""
    dtypes = json.loads(schema.metadata[DTYPES_KEY])
    unknown = sorted(set(episode) - set(dtypes))
    if unknown:
        raise ValueError(f"table {unknown[0]!r}: not a table of this dataset (tables: {', '.join(dtypes)})")
    columns: list[pa.Array] = [_one_string(json.dumps(key_to_json(key)))]
    for table, descr in dtypes.items():
        dtype = dtype_from_descr(descr)
        records = np.asarray(episode.get(table, np.zeros(0, dtype)))
        if records.dtype != dtype:
            raise ValueError(f"table {table!r}: dtype {records.dtype}, the dataset's is {dtype}")
        if schema.field(table).type == pa.large_binary():
            raw = np.ascontiguousarray(records).reshape(-1).view(np.uint8)
            offsets = pa.py_buffer(np.array([0, raw.nbytes], np.int64))
            columns.append(pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(raw)]))
            continue
        rb = records_to_arrow(records)
        struct = pa.StructArray.from_arrays(rb.columns, fields=list(rb.schema))
        columns.append(pa.ListArray.from_arrays(pa.array([0, len(records)], pa.int32()), struct))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _one_string(text: str) -> pa.Array:
    """A one-value string array, made from its buffers: `pa.array([text])` imports pandas the first time it
    runs in a process (a fraction of a second, paid by every new producer)."""
    data = text.encode()
    offsets = pa.py_buffer(np.array([0, len(data)], np.int32))
    return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])


def decode_episodes(batch: pa.RecordBatch) -> list[tuple[Key, dict[str, np.ndarray]]]:
    """The (key, episode) pairs of a batch made by `encode_episode` (either form); ValueError naming table
    and row. Records columns become read-only views of the batch's buffers (no copy)."""
    raw = (batch.schema.metadata or {}).get(DTYPES_KEY)
    if raw is None or "key" not in batch.schema.names:
        raise ValueError("not a batch of zarrfeed episodes (no key column or no dtypes in its metadata)")
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise TypeError(f"an object of table -> dtype, not a {type(doc).__name__}")
        dtypes = {t: dtype_from_descr(d) for t, d in doc.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"the batch's {DTYPES_KEY.decode()} metadata is not zarrfeed's: {exc}") from None
    missing = [t for t in dtypes if t not in batch.schema.names]
    if missing:
        raise ValueError(f"table {missing[0]!r}: no column for it")
    out = []
    for i in range(batch.num_rows):
        try:
            key = check_key(key_from_json(json.loads(batch.column("key")[i].as_py())))
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"row {i}: bad key ({exc})") from None
        episode = {}
        for table, dtype in dtypes.items():
            column = batch.column(table)
            if pa.types.is_large_binary(column.type) or pa.types.is_binary(column.type):
                buf = column[i].as_buffer()
                if buf is None or buf.size % dtype.itemsize:
                    size = 0 if buf is None else buf.size
                    raise ValueError(f"episode {key}, table '{table}': {size} bytes is not a whole number of "
                                     f"{dtype.itemsize}-byte records")
                episode[table] = np.frombuffer(buf, dtype)
                continue
            struct = column[i].values
            records = pa.RecordBatch.from_struct_array(struct) if len(struct) else \
                records_to_arrow(np.zeros(0, dtype))
            episode[table] = from_arrow(records, dtype, where=f"episode {key}, table '{table}'")
        out.append((key, episode))
    return out
