"""The options every writer of a dataset takes, declared once (as `loader.options` declares the loaders'):
`WriteOptions` names, types and documents them (`DatasetWriter` and `zarrfeed.writer.dask.ingest` take
`**options: Unpack[WriteOptions]`, and the API reference lists them on each page); `Writes` holds their
defaults and checks them once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, TypedDict

from ..core.keywords import choice, flag, mapping, seconds, taken
from ..core.storage_layout import DEFAULT_SHARD_BYTES, StorageLayout


class WriteOptions(TypedDict, total=False):
    """Options every writer takes, keyword-only, besides its own."""

    mode: str
    """"w" (default) creates a new dataset; "a" appends to an existing one, first dropping rows that were
    written but never committed."""
    overwrite: bool
    """With mode "w", replace the dataset already at the path (a location that holds anything but a zarr
    dataset is refused even then). Default False: refuse a non-empty location."""
    compressor: Any
    """A numcodecs codec for a new dataset's chunks instead of the schema's (L5Kit's: Blosc lz4, level 5, byte
    shuffle). Ignored with mode "a": the dataset keeps its own."""
    chunks: Mapping[str, int] | None
    """Rows per chunk for some tables of a new dataset (`{"agents": 50_000}`), instead of the schema's; a table
    the schema does not have is refused. Larger chunks mean fewer, larger objects; a loader reads and decodes
    whole chunks. Ignored with mode "a"."""
    on_error: str
    """What a bad episode does: "raise" (default) raises naming table, field and row, with nothing of it
    written; "skip" logs a warning, records its key (or position) as skipped and goes on."""
    progress: bool
    """Show a progress bar while ingesting (default False)."""
    commit_interval: float
    """Seconds between commits while writing (default 1.0). Lower: readers see rows sooner; higher: fewer
    manifest writes and fewer chunks shared by two writes."""
    storage_options: Mapping[str, Any] | None
    """fsspec options for a URL path (credentials, `endpoint_url`, ...); merged into those of a `Location`."""
    zarr_format: int
    """The zarr format of a new dataset: 2 (default; what L5Kit's own code and zarr-python read as records) or
    3 (sharded, a crc32c checksum on every inner chunk: fewer objects on an object store). Ignored with
    mode "a": the dataset keeps its own."""
    shard_bytes: int | None
    """With zarr_format=3, the decoded bytes a shard holds at most (whole chunks; default 16 MiB, see
    docs/format.md). Ignored otherwise."""
    durable: bool
    """On a local disk (default True), every commit survives a power loss once it is acknowledged: the chunks
    it names are fsynced before the manifest that names them, which is written aside, fsynced, renamed and its
    folder fsynced. False: commits survive a killed process but may be lost, or torn, by a power loss or a
    kernel crash (for scratch data). Object stores: a PUT is durable when it returns, either way."""


@dataclass(frozen=True)
class Writes:
    """`WriteOptions` with their defaults (the same names: a test holds the two equal)."""

    mode: str = "w"
    overwrite: bool = False
    compressor: Any = None
    chunks: Mapping[str, int] | None = None
    on_error: str = "raise"
    progress: bool = False
    commit_interval: float = 1.0
    storage_options: Mapping[str, Any] | None = None
    zarr_format: int = 2
    shard_bytes: int | None = None
    durable: bool = True

    def __post_init__(self) -> None:
        choice(self.on_error, "on_error", ("raise", "skip"))
        choice(self.mode, "mode", ("w", "a"))
        for name in ("overwrite", "progress", "durable"):
            object.__setattr__(self, name, flag(getattr(self, name), name))
        object.__setattr__(self, "commit_interval", seconds(self.commit_interval, "commit_interval", zero=True))
        mapping(self.storage_options, "storage_options")
        mapping(self.chunks, "chunks")
        self.layout  # checked: a format or a shard size that is not one is refused here
        if self.compressor is not None and not hasattr(self.compressor, "get_config"):
            raise ValueError(f"compressor must be a numcodecs codec (or None), got {self.compressor!r}")

    @property
    def layout(self) -> StorageLayout:
        """How a new dataset is stored (`zarr_format`, `shard_bytes`)."""
        return StorageLayout(self.zarr_format, DEFAULT_SHARD_BYTES if self.shard_bytes is None else self.shard_bytes)

    @classmethod
    def of(cls, given: Mapping[str, Any], who: str) -> "Writes":
        """The options `who` (the function, e.g. "DatasetWriter.__init__") was given; an unknown one refused in
        one line, naming the close one."""
        return taken(cls, given, who)
