"""Ingestion on a Dask cluster: episodes are made, checked, relocated, encoded and written on the workers.

`ingest(client, sources, to_episodes, path)` writes the same dataset, chunk for chunk, as a local
`DatasetWriter` ingesting `chain.from_iterable(to_episodes(s) for s in sources)`, whatever the number of
workers and the order in which tasks finish:

1. One task per source runs `to_episodes(source)`, checks every episode and keeps them in the worker's memory
   (a Dask future); only its row counts and fingerprints travel to the client.
2. The client holds the dataset's lease through a `Committer` (the only one; no writer processes of its
   own). It places sources in source order as their counts arrive (`Committer.reserve`, one
   episode at a time), which is what makes the rows deterministic, and sends the first row per table of the
   source's episodes not yet committed to a write task on the worker that holds them.
3. The write task relocates the intervals and writes the rows straight to the store. Whole chunks of its
   region have exactly one writer (this task) and are stored without a lock; the chunk at each end of the
   region may be shared with the neighbouring source, so it is read, merged and written through zarr under a
   synchronizer whose locks are `distributed.Lock`s, one per chunk key (zarr's synchronizer interface).
   It first reads the lease document: a client that lost the lease has its tasks write nothing.
4. Only the client grows arrays, commits and consolidates. Commits advance over the contiguous prefix of
   placed episodes whose writes finished, so a crash of the client loses nothing committed, and
   `resume=True` writes only the episodes not committed.

A task rerun by Dask (its worker died) writes the same bytes to the same rows again: writes are idempotent.
Keys in the journal are those of a local ingest of the same episodes, `Position(input, index)`: the input's
identity is its first episode's fingerprint and `index` the episode's position in the sources' episodes,
so local, Dask and server ingests recognise each other's inputs. `dask[distributed]` is an optional extra
(`zarrfeed[dask]`); the core never imports it.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Unpack, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..core.keywords import spelled_out
from .options import WriteOptions, Writes
from ..core import dataset_format
from ..core.errors import IngestError
from ..core.keys import Position, fingerprint
from ..core.schema import L5KIT_SCHEMA, Schema, Table
from ..core.location import Location
from .chunk_write import ChunkWrite, write_rows
from .committer import Committer
from .episode import as_tables, check_episode, relocate_all
from .lease import check_held

log = logging.getLogger("zarrfeed")


@dataclass(frozen=True)
class SourceFailure:
    """Source number `index` (its value `source`) failed at its episode `episode` (None: before any)."""

    index: int
    source: Any
    episode: int | None
    reason: str

    def __str__(self) -> str:
        where = f", episode {self.episode}" if self.episode is not None else ""
        return f"source {self.index} ({self.source!r}){where}: {self.reason}"


@dataclass
class IngestSummary:
    """What `ingest` did. `task_seconds` is the time the workers spent in its tasks: `rows / task_seconds` is
    the rate of one worker, the figure that says how a bigger cluster would scale."""

    sources: int = 0
    written: int = 0  # sources with episodes written
    passed_over: int = 0  # episodes committed before (resume)
    episodes: int = 0  # episodes written
    rows: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    task_seconds: float = 0.0
    skipped: list[SourceFailure] = field(default_factory=list)  # with on_error="skip"


# ---------------------------------------------------------------------------------------------------- workers
class _ChunkLocks:
    """A zarr synchronizer (a mapping from key to lock) whose locks are cluster-wide `distributed.Lock`s."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        from distributed import Lock

        return Lock(f"{self.prefix}/{key}")


@dataclass
class _Counted:
    """What the client needs of a loaded source to place it: per episode yielded, its fingerprint (the
    episode's identity, as a local ingest computes it) and rows per table (0 for a bad one); the bad ones
    (index, reason); and where `to_episodes` raised, if it did (index of the episode it was making, reason)."""

    fingerprints: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # of each episode as checked ("" if bad): reruns must match
    rows: list[dict[str, int]] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)
    error: tuple[int, str] | None = None
    seconds: float = 0.0


def _load(to_episodes: Callable[[Any], Iterable[Any]], source: Any, schema_doc: dict, on_error: str
          ) -> tuple[list[dict[str, np.ndarray] | None], _Counted]:
    """Run `to_episodes(source)` and check its episodes; return them (None for a bad one) and their counts.
    With on_error="raise", it stops at the first bad episode (nothing after it can be placed)."""
    schema = Schema.from_json(schema_doc)
    t0 = time.perf_counter()
    kept: list[dict[str, np.ndarray] | None] = []
    counted = _Counted()
    i = -1
    try:
        for i, episode in enumerate(to_episodes(source)):
            counted.fingerprints.append(fingerprint(as_tables(episode, schema)))
            try:
                tables = check_episode(episode, schema)
            except ValueError as exc:
                counted.bad.append((i, str(exc)))
                counted.rows.append({t: 0 for t in schema.tables})
                counted.checked.append("")
                kept.append(None)
                if on_error == "raise":
                    break
                continue
            kept.append(tables)
            counted.checked.append(fingerprint(tables))
            counted.rows.append({t: len(tables.get(t, ())) for t in schema.tables})
    except BaseException as exc:  # the user's code failed: the client reports it with the source and episode
        # (BaseException too: a sys.exit() escaping a task kills the worker, or leaves the client waiting)
        counted.error = (i + 1, f"{type(exc).__name__}: {exc}".splitlines()[0])
    counted.seconds = time.perf_counter() - t0
    return kept, counted


def _counts(loaded: tuple[list, _Counted]) -> _Counted:
    return loaded[1]


_open: dict[tuple, tuple[dict, _ChunkLocks]] = {}  # per worker process: (location, dataset id) -> its tables


def _tables(location: Location, dataset_id: str, tables: Sequence[Table]) -> tuple[dict, _ChunkLocks]:
    """The dataset's tables, opened once per worker process, and the cluster-wide locks of its chunks."""
    key = (location.url, repr(sorted(location.storage_options.items())), dataset_id)
    if key not in _open:
        store = location.store("w")
        _open.clear()  # one dataset at a time per worker process is the common case: keep memory flat
        _open[key] = ({t.name: dataset_format.table_array(store, t) for t in tables},
                      _ChunkLocks(f"zarrfeed/{dataset_id}"))
    return _open[key]


def _write(loaded: tuple[list, _Counted], which: list[int], expected: list[str], location: Location,
           dataset_id: str, lease_token: str, schema_doc: dict, starts: Mapping[str, int]) -> dict[str, Any]:
    """Write the source's episodes `which` (indices among those it yielded; `expected`, their fingerprints
    when the client placed them), one after another from `starts` (the first row per table): relocate,
    concatenate, write. Nothing is written unless the client that placed them still holds the lease."""
    t0 = time.perf_counter()
    episodes, _ = loaded
    chosen = [episodes[j] for j in which]
    if [fingerprint(e) for e in chosen] != expected:
        # Dask recomputed the source after a worker died, and it came out different
        raise RuntimeError("to_episodes gave other episodes when Dask ran it again (after a worker was lost); "
                           "it must be deterministic")
    schema = Schema.from_json(schema_doc)
    arrays, locks = _tables(location, dataset_id, list(schema.tables.values()))
    out = relocate_all(chosen, schema, starts)
    store = next(iter(arrays.values())).store
    checked = [-1.0]

    def guard() -> None:  # the lease document, read again before a write at most once a second
        if time.monotonic() - checked[0] > 1.0:
            check_held(store, lease_token, location)
            checked[0] = time.monotonic()

    writes = []
    for t, rows in out.items():
        writes += write_rows(arrays[t], starts[t], rows, locks, guard)
    return {"seconds": time.perf_counter() - t0, "shared_chunks": sum(w.shared for w in writes), "writes": writes}


# ----------------------------------------------------------------------------------------------------- client
@spelled_out(WriteOptions, Writes)
def ingest(client: Any, sources: Sequence[Any], to_episodes: Callable[[Any], Iterable[Mapping[str, np.ndarray]]],
           path: Any, schema: Schema = L5KIT_SCHEMA, *, resume: bool = False,
           **options: Unpack[WriteOptions]) -> IngestSummary:
    """Ingest `to_episodes(s)` for every `s` in `sources` on the Dask cluster of `client`, into `path`.

    `sources` are small picklable items (file names, URLs, seeds); `to_episodes` runs on the workers and must
    give the same episodes each time it is called with the same source. The input is the sources' episodes one
    after another, with the identity a local ingest gives it: its first episode's fingerprint, and each
    episode's position in it. So the same episodes ingested before by any path (a local writer, this, the
    server) are refused without `resume=True`, and with it passed over. `mode="a"` appends to an existing
    dataset. A bad episode (with on_error="raise") or a source that raises ends the ingest there: everything
    before it is committed and `IngestError` names it (source, episode, table/field/row); fix it and resume.
    With on_error="skip", bad episodes are left out and listed in the summary. Resume loads every source
    again (to know its episodes' positions) and writes only what is not committed. With `durable` (the
    default) every commit survives a power loss once `ingest` returns (or, if it raises, the commits it
    reports). It takes every writer's options ([`WriteOptions`][zarrfeed.writer.WriteOptions], listed below),
    keyword-only.

    Args:
        client: The Dask client of the cluster.
        sources: Small picklable items (file names, URLs, seeds), one task each.
        to_episodes: Gives a source's episodes, on the workers (the same each time).
        path: Where the dataset is: a local directory or any fsspec URL.
        schema: The tables, links and compressor of a new dataset (default L5Kit's).
        resume: Pass over the episodes already committed (the same input, ingested before).
    """
    from distributed import as_completed

    o = Writes.of(options, "ingest")  # "ingest() got an unexpected keyword argument"
    storage_options, on_error, progress, overwrite = o.storage_options, o.on_error, o.progress, o.overwrite
    chunks, compressor, commit_interval, mode, durable = o.chunks, o.compressor, o.commit_interval, o.mode, o.durable
    sources = list(sources)
    t0 = time.perf_counter()
    location = replace(Location.of(path, storage_options), durable=durable)
    writer = Committer(location, schema, mode="a" if resume else mode, overwrite=overwrite, chunks=chunks,
                       compressor=compressor, commit_interval=commit_interval,
                       store_timeout=location.settings.bound(120.0), layout=o.layout)
    summary = IngestSummary(sources=len(sources))
    placer = _Placer(client, writer, resume, on_error, summary)
    loads: dict[int, Any] = {}  # per source, its loaded episodes (a future), until written
    running: dict[Any, Any] = {}  # key -> future, of the counts and writes not yet seen done
    try:
        loads = {i: client.submit(_load, to_episodes, s, placer.schema_doc, on_error, pure=False)
                 for i, s in enumerate(sources)}
        pending = as_completed()
        what: dict[Any, tuple[str, int]] = {}
        for i, fut in loads.items():
            c = client.submit(_counts, fut, pure=False)
            what[c.key] = ("counts", i)
            pending.add(c)
            running[c.key] = c
        counted: dict[int, _Counted] = {}
        next_i = 0
        bar = _bar(progress, len(sources))
        for fut in pending:
            kind, i = what.pop(fut.key)
            running.pop(fut.key)
            if kind == "counts":
                if placer.failure is not None:
                    continue  # cancelled: the ingest ends at the failure
                counted[i] = fut.result()
                summary.task_seconds += counted[i].seconds
                while next_i in counted and placer.failure is None:  # place sources in source order
                    write = placer.place(next_i, sources[next_i], counted.pop(next_i), loads[next_i])
                    if write is None:
                        del loads[next_i]
                        bar.update(1)
                    else:
                        what[write.key] = ("write", next_i)
                        pending.add(write)
                        running[write.key] = write
                    next_i += 1
                if placer.failure is not None:
                    client.cancel([f for j, f in loads.items() if j >= next_i])
            else:
                result = fut.result()
                summary.task_seconds += result["seconds"]
                placer.written(i, result["writes"])
                del loads[i]  # the episodes may leave the worker's memory
                bar.update(1)
        bar.close()
        writer.close()
    except BaseException as exc:
        # no task of this ingest may keep the sources' episodes in the workers' memory while the exception is
        # held (its traceback holds these futures: a notebook keeps it until the user goes on)
        with contextlib.suppress(Exception):  # a client that lost its scheduler: the error to report is exc
            client.cancel([*loads.values(), *running.values()])
        writer.fail(exc, remove=False)  # commits what is written; nothing if closed already
        raise
    summary.seconds = time.perf_counter() - t0
    summary.bytes = sum(n * writer.schema.tables[t].dtype.itemsize for t, n in summary.rows.items())
    if placer.failure is not None:
        failure = placer.failure
        raise IngestError(f"{failure}; the {summary.passed_over + summary.episodes} episodes before it are "
                          "committed: fix it and ingest again with resume=True", [failure])
    return summary


class _Placer:
    """Places sources, in source order, in the input's positions (the client's side of `ingest`)."""

    def __init__(self, client: Any, writer: Committer, resume: bool, on_error: str, summary: IngestSummary
                 ) -> None:
        self.client, self.writer, self.resume, self.on_error, self.summary = client, writer, resume, on_error, summary
        self.schema_doc = writer.schema.to_json()
        self.input: str | None = None  # the input's identity: its first episode's fingerprint
        self.base = 0  # episodes in the sources placed so far
        self.failure: SourceFailure | None = None  # where the ingest ends (a source raised, a bad episode)
        self._writes: dict[int, list[tuple[Position, dict[str, int]]]] = {}  # source -> keys placed, rows

    def place(self, i: int, source: Any, counted: _Counted, loaded: Any) -> Any:
        """Place source `i`'s episodes not yet committed and return the task that writes them (None: none)."""
        yielded = len(counted.fingerprints)
        bad = dict(counted.bad)
        if self.input is None and yielded and not (0 in bad and self.on_error == "raise"):
            # as a local ingest: a refused first episode begins no input (fixed, its resume is the input's start)
            self.input = counted.fingerprints[0]
            self.writer.begin_input(self.input, self.resume, "its first episode has fingerprint", "episodes")
        stop = yielded
        if counted.error is not None:
            stop = counted.error[0]
            self.failure = SourceFailure(i, source, counted.error[0], counted.error[1])
        if bad and self.on_error == "raise":
            stop = min(bad)
            self.failure = SourceFailure(i, source, stop, bad[stop])
        which, placed, starts = [], [], None
        for j in range(stop):
            key = Position(self.input, self.base + j)  # type: ignore[arg-type]  # set: the source yielded j
            if j in bad:  # on_error="skip"
                self.summary.skipped.append(SourceFailure(i, source, j, bad[j]))
                log.warning("skipping %s", self.summary.skipped[-1])
                if not self.writer.is_committed(key):
                    self.writer.skip(key)
            elif self.writer.is_committed(key):
                self.summary.passed_over += 1
            else:
                first = self.writer.reserve(key, counted.rows[j], counted.fingerprints[j])
                starts = starts or first  # the source's episodes follow one another from there
                which.append(j)
                placed.append((key, counted.rows[j]))
        self.base += yielded
        if not which:
            return None
        self._writes[i] = placed
        expected = [counted.checked[j] for j in which]
        return self.client.submit(_write, loaded, which, expected, self.writer.location, self.writer.dataset_id,
                                  self.writer.lease_token, self.schema_doc, starts, pure=False)

    def written(self, i: int, writes: list[ChunkWrite]) -> None:
        """Source `i`'s write task finished: its episodes commit (in the order placed) with these chunks."""
        placed = self._writes.pop(i)
        for n, (key, rows) in enumerate(placed):
            self.writer.written(key, writes if n == 0 else ())
            for t, k in rows.items():
                self.summary.rows[t] = self.summary.rows.get(t, 0) + k
        self.summary.episodes += len(placed)
        self.summary.written += 1


def _bar(progress: bool, total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=" sources", desc="ingest", disable=not progress)
