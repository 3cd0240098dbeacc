"""The options every remote loader takes, declared once, as `loader.options` declares the local loaders':
`RemoteOptions` names, types and documents them (`**options: Unpack[RemoteOptions]` in each constructor, listed
on each page by griffe's `unpack_typeddict` extension); `Remote` holds them as groups, each checked once. The
options that decide the batches are the local loaders' own groups (`ShuffleOptions`, `ShardOptions`), sent to
the server in the ticket; the server's own workers and cache make them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, TypedDict

from ..core.keywords import choice, mapping, option_names, seconds, text, taken
from ..loader.options import Options, ShardOptions, ShuffleOptions
from .liveness import STALL_TIMEOUT


class RemoteOptions(TypedDict, total=False):
    """Options every remote loader takes, keyword-only, besides its own."""

    shuffle: bool
    """As `LoaderOptions`': shuffle (default), or read in table order."""
    seed: int
    """As `LoaderOptions`': with the epoch, decides the shuffled order (default 0)."""
    shuffle_window: int | None
    """As `LoaderOptions`'; None (default): the server's loader's default window (the whole table up to
    `shuffle_bytes` decoded)."""
    shuffle_bytes: int
    """As `LoaderOptions`' (default 1 GiB): the decoded bytes the default window holds."""
    order: int
    """As `LoaderOptions`': the epoch order's algorithm (default 2; 1: one Fisher-Yates shuffle per window)."""
    drop_last: bool
    """As `LoaderOptions`' (default False)."""
    rank: int
    """As `LoaderOptions`': this process's rank (default 0)."""
    world_size: int
    """As `LoaderOptions`': the ranks sharing each epoch (default 1)."""
    token: str | None
    """The server's read token (or its ingest token), if it needs one; sent as a bearer token."""
    output: str
    """"numpy" (default): dicts of numpy columns; "arrow": the received RecordBatches."""
    transform: str | None
    """The name of one of the server's transforms (`zarrfeed serve --transforms MODULE`), which its workers
    apply to each batch; default none. The server never runs code a client sends."""
    transform_args: dict[str, Any] | None
    """Keyword arguments of the transform, as a JSON object (numbers, strings, lists, dicts)."""
    tls_root_certs: bytes | None
    """PEM bytes of the certificate authority to trust for a `grpc+tls` server (for example a self-signed
    certificate); default: the system's."""
    timeout: float
    """Seconds each call other than a stream may take (default 30): describing the dataset and planning an
    epoch. A stream, which lasts an epoch, has no deadline."""
    reconnect_timeout: float
    """Seconds to keep reconnecting once a stream is lost (default 60); 0: raise at once."""
    dataset: str | None
    """The name of the dataset to read, of a server that serves several (then required)."""
    stall_timeout: float
    """Seconds without a batch after which the loader asks the server whether it still answers (a call with
    this deadline; default 10): a server that does not (a stopped process, a frozen machine) has lost the
    stream within 2 x `stall_timeout` seconds, and the loader reconnects."""


@dataclass(frozen=True)
class ConnectionOptions:
    """How a remote loader reaches its server and how long it waits for it."""

    token: str | None = None
    tls_root_certs: bytes | None = None
    timeout: float = 30.0
    reconnect_timeout: float = 60.0
    dataset: str | None = None
    stall_timeout: float = STALL_TIMEOUT

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name in ("token", "dataset"):
            text(getattr(self, name), name)
        if self.tls_root_certs is not None and not isinstance(self.tls_root_certs, bytes):
            raise ValueError(f"tls_root_certs must be PEM bytes (or None), got {self.tls_root_certs!r}")
        put(self, "timeout", seconds(self.timeout, "timeout"))
        put(self, "reconnect_timeout", seconds(self.reconnect_timeout, "reconnect_timeout", zero=True))
        put(self, "stall_timeout", seconds(self.stall_timeout, "stall_timeout"))


@dataclass(frozen=True)
class StreamOptions:
    """What the server does to each batch (a named transform) and what the loader yields."""

    output: str = "numpy"
    transform: str | None = None
    transform_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        choice(self.output, "output", ("numpy", "arrow"))
        if self.transform is not None and not isinstance(self.transform, str):
            raise ValueError(f"transform: a remote loader names one of the server's transforms (zarrfeed serve "
                             f"--transforms MODULE), a string; got {self.transform!r}")
        mapping(self.transform_args, "transform_args")


@dataclass(frozen=True)
class Remote:
    """`RemoteOptions` as a remote loader holds them: its groups, and which options the user gave (a test holds
    the names equal to `RemoteOptions`')."""

    GROUPS: ClassVar[dict[str, type]] = {"shuffling": ShuffleOptions, "shard": ShardOptions,
                                         "connection": ConnectionOptions, "stream": StreamOptions}
    NOT_GIVEN: ClassVar[tuple[str, ...]] = ("shuffle_bytes", "order")  # as `Options.NOT_GIVEN`

    shuffling: ShuffleOptions = field(default_factory=ShuffleOptions)
    shard: ShardOptions = field(default_factory=ShardOptions)
    connection: ConnectionOptions = field(default_factory=ConnectionOptions)
    stream: StreamOptions = field(default_factory=StreamOptions)
    given: frozenset[str] = frozenset()

    @classmethod
    def of(cls, given: Mapping[str, Any], who: str) -> "Remote":
        """The options `who` was given; an unknown one refused as the local loaders refuse it (a local loader's
        option that the server decides, such as `num_workers`, says so)."""
        server = set(option_names(Options)) - set(option_names(cls))
        for name in set(given) & server:
            raise TypeError(f"{who}.__init__(): {name!r} is the server's to decide (its loaders run with the "
                            "server's own workers, caches and store), not a remote loader's")
        return taken(cls, given, f"{who}.__init__")
