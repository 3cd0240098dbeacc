"""Ingestion on a Dask cluster: episodes are made, checked, relocated, encoded and written on the workers.

`ingest(client, sources, to_episodes, path)` writes the same dataset, chunk for chunk, as a local
`DatasetWriter` ingesting `chain.from_iterable(to_episodes(s) for s in sources)`, whatever the number of
workers and the order in which tasks finish:

1. One task per source runs `to_episodes(source)`, checks every episode and keeps them in the worker's memory
   (a Dask future); only its row counts and fingerprints travel to the client.
2. The client holds the dataset's lease through a `DatasetWriter` with no workers of its own (the one
   committer). It places sources in source order as their counts arrive (`DatasetWriter.reserve`), which is
   what makes the rows deterministic, and sends each source's first row per table to a write task on the
   worker that holds its episodes.
3. The write task relocates the intervals and writes the rows straight to the store. Whole chunks of its
   region have exactly one writer (this task) and are stored without a lock; the chunk at each end of the
   region may be shared with the neighbouring source, so it is read, merged and written through zarr under a
   synchronizer whose locks are `distributed.Lock`s, one per chunk key (zarr's synchronizer interface).
4. Only the client grows arrays, commits and consolidates. Commits advance over the contiguous prefix of
   placed sources whose writes finished, so a crash of the client loses nothing committed, and
   `resume=True` runs only the sources not committed.

A task rerun by Dask (its worker died) writes the same bytes to the same rows again: writes are idempotent.
Keys in the journal are `Position(input, source index)`, where the input is the digest of the sources and of
`to_episodes`'s name. `dask[distributed]` is an optional extra (`zarrfeed[dask]`); the core never imports it.
"""
from __future__ import annotations

import hashlib
import logging
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import zarr

from .chunkio import write_rows
from .dataset_writer import DatasetWriter
from .episode import check_episode
from .keys import Position, fingerprint
from .schema import L5KIT_SCHEMA, Schema
from .store import Location

log = logging.getLogger("zarrfeed")


class IngestError(ValueError):
    """Sources that could not be ingested (the message, one line, names the first: source, episode and what
    is wrong); every other source is committed. `failures` lists them all; fix them and resume."""

    def __init__(self, message: str, failures: list["SourceFailure"]) -> None:
        super().__init__(message)
        self.failures = failures


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
    written: int = 0
    passed_over: int = 0  # committed before (resume)
    episodes: int = 0
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


def _load(to_episodes: Callable[[Any], Iterable[Any]], source: Any, schema_doc: dict, on_error: str
          ) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
    """Run `to_episodes(source)` and check its episodes; return them and their summary (what the client
    needs to place them: rows per table, fingerprints, bad episodes)."""
    schema = Schema.from_json(schema_doc)
    t0 = time.perf_counter()
    kept: list[dict[str, np.ndarray]] = []
    summary: dict[str, Any] = {"rows": {t: 0 for t in schema.tables}, "fingerprints": [], "bad": [],
                               "error": None, "episodes": 0}
    i = -1
    try:
        for i, episode in enumerate(to_episodes(source)):
            summary["episodes"] += 1
            try:
                tables = check_episode(episode, schema)
            except ValueError as exc:
                summary["bad"].append((i, str(exc)))
                if on_error == "raise":
                    break
                continue
            kept.append(tables)
            summary["fingerprints"].append(fingerprint(tables))
            for t, arr in tables.items():
                summary["rows"][t] += len(arr)
    except Exception as exc:  # the user's code failed: the client reports it with the source and episode
        summary["error"] = (i + 1, f"{type(exc).__name__}: {exc}".splitlines()[0])
    summary["seconds"] = time.perf_counter() - t0
    return kept, summary


def _summary(loaded: tuple[list, dict]) -> dict[str, Any]:
    return loaded[1]


_open: dict[tuple, tuple[dict, _ChunkLocks]] = {}  # per worker process: (location, dataset id) -> its tables


def _tables(location: Location, dataset_id: str, names: Sequence[str]) -> tuple[dict, _ChunkLocks]:
    """The dataset's tables, opened once per worker process, and the cluster-wide locks of its chunks."""
    key = (location.url, repr(sorted(location.storage_options.items())), dataset_id)
    if key not in _open:
        store = location.store("w")
        _open.clear()  # one dataset at a time per worker process is the common case: keep memory flat
        _open[key] = ({t: zarr.Array(store, path=t) for t in names}, _ChunkLocks(f"zarrfeed/{dataset_id}"))
    return _open[key]


def _write(loaded: tuple[list, dict], location: Location, dataset_id: str, schema_doc: dict,
           starts: Mapping[str, int], expected: list[str]) -> dict[str, Any]:
    """Write a source's episodes at `starts` (rows per table): relocate, concatenate, write."""
    t0 = time.perf_counter()
    episodes, _ = loaded
    got = [fingerprint(e) for e in episodes]
    if got != expected:  # Dask recomputed the source after a worker died, and it came out different
        raise RuntimeError("to_episodes gave other episodes when Dask ran it again (after a worker was lost); "
                           "it must be deterministic")
    schema = Schema.from_json(schema_doc)
    arrays, locks = _tables(location, dataset_id, list(schema.tables))
    # the source's rows in one array per table, relocated in place (one copy, as `relocate` then concatenate
    # would make two)
    out = {t: np.empty(sum(len(e[t]) for e in episodes), tab.dtype) for t, tab in schema.tables.items()}
    at = {t: 0 for t in schema.tables}
    for tables in episodes:
        for t, arr in tables.items():
            out[t][at[t]:at[t] + len(arr)] = arr
        for link in schema.links:
            part = out[link.parent][at[link.parent]:at[link.parent] + len(tables[link.parent])]
            part[link.field] += starts[link.child] + at[link.child]
        for t, arr in tables.items():
            at[t] += len(arr)
    writes = []
    for t, rows in out.items():
        writes += write_rows(arrays[t], starts[t], rows, locks)
    return {"seconds": time.perf_counter() - t0, "shared_chunks": sum(w.shared for w in writes), "writes": writes}


# ----------------------------------------------------------------------------------------------------- client
def input_id(sources: Sequence[Any], to_episodes: Callable) -> str:
    """The identity of an ingest: a digest of the sources and of the name of the function that reads them."""
    fn = getattr(to_episodes, "func", to_episodes)  # a functools.partial: the function it calls
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{getattr(fn, '__module__', '')}.{name}".encode())
    h.update(pickle.dumps(list(sources), protocol=4))
    return "sources-" + h.hexdigest()


def ingest(client: Any, sources: Sequence[Any], to_episodes: Callable[[Any], Iterable[Mapping[str, np.ndarray]]],
           path: Any, schema: Schema = L5KIT_SCHEMA, storage_options: Mapping[str, Any] | None = None,
           resume: bool = False, on_error: str = "raise", progress: bool = False, overwrite: bool = False,
           chunks: Mapping[str, int] | None = None, compressor: Any = None, commit_interval: float = 1.0,
           mode: str = "w") -> IngestSummary:
    """Ingest `to_episodes(s)` for every `s` in `sources` on the Dask cluster of `client`, into `path`.

    `sources` are small picklable items (file names, URLs, seeds); `to_episodes` runs on the workers and must
    give the same episodes each time it is called with the same source. `mode="a"` appends to an existing
    dataset; `resume=True` finishes an interrupted ingest of the same sources (and appends). A source that
    raises or yields a bad episode is not written: with `on_error="raise"` every other source is committed
    and then `IngestError` names it (source, episode, table/field/row); resume after fixing it writes it.
    With `on_error="skip"` bad episodes are left out (a source that raises, whole) and listed in the summary.
    """
    from distributed import as_completed

    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    sources = list(sources)
    t0 = time.perf_counter()
    writer = DatasetWriter(path, schema, workers=0, mode="a" if resume else mode, overwrite=overwrite,
                           chunks=chunks, compressor=compressor, storage_options=storage_options,
                           commit_interval=commit_interval, on_error=on_error, segment_bytes=0)
    summary = IngestSummary(sources=len(sources))
    failures: list[SourceFailure] = []
    try:
        ingest_id = input_id(sources, to_episodes)
        writer.begin_input(ingest_id, resume, "its sources have the digest", "sources")
        schema_doc = writer.schema.to_json()
        todo = [i for i in range(len(sources)) if not writer.is_committed(Position(ingest_id, i))]
        summary.passed_over = len(sources) - len(todo)
        loads = {i: client.submit(_load, to_episodes, sources[i], schema_doc, on_error, pure=False) for i in todo}
        pending = as_completed()
        what: dict[Any, tuple[str, int]] = {}
        for i, fut in loads.items():
            s = client.submit(_summary, fut, pure=False)
            what[s.key] = ("summary", i)
            pending.add(s)
        counted: dict[int, dict[str, Any]] = {}
        writes: dict[int, tuple[Position, dict]] = {}
        order = iter(todo)
        next_i = next(order, None)
        bar = _bar(progress, len(todo))
        for fut in pending:
            kind, i = what.pop(fut.key)
            if kind == "summary":
                counted[i] = fut.result()
                summary.task_seconds += counted[i]["seconds"]
                while next_i is not None and next_i in counted:  # place sources in source order
                    _place(client, writer, next_i, sources[next_i], counted.pop(next_i), loads, ingest_id,
                           schema_doc, on_error, failures, summary, writes, what, pending)
                    if next_i not in writes:
                        bar.update(1)
                    next_i = next(order, None)
            else:
                result = fut.result()
                summary.task_seconds += result["seconds"]
                key, rows = writes.pop(i)
                writer.written(key, result["writes"])
                del loads[i]  # the episodes may leave the worker's memory
                summary.written += 1
                for t, n in rows.items():
                    summary.rows[t] = summary.rows.get(t, 0) + n
                bar.update(1)
        bar.close()
        writer.close()
    except BaseException:
        writer.abort()  # commits what is written; nothing if closed already
        raise
    summary.seconds = time.perf_counter() - t0
    summary.bytes = sum(n * writer.schema.tables[t].dtype.itemsize for t, n in summary.rows.items())
    if failures and on_error == "raise":
        first = failures[0]
        more = f" (and {len(failures) - 1} other sources)" if len(failures) > 1 else ""
        raise IngestError(f"{first}{more}; the other {summary.written} sources are committed: fix it and "
                          "ingest again with resume=True", failures)
    summary.skipped = failures
    return summary


def _place(client: Any, writer: DatasetWriter, i: int, source: Any, counted: dict[str, Any], loads: dict,
           ingest_id: str, schema_doc: dict, on_error: str, failures: list[SourceFailure],
           summary: IngestSummary, writes: dict, what: dict, pending: Any) -> None:
    """Place source `i` after everything placed so far and start its write; or record why it is not written."""
    key = Position(ingest_id, i)
    failed = None
    if counted["error"] is not None:
        failed = SourceFailure(i, source, counted["error"][0], counted["error"][1])
    elif counted["bad"] and on_error == "raise":
        failed = SourceFailure(i, source, counted["bad"][0][0], counted["bad"][0][1])
    if failed is not None:
        failures.append(failed)
        del loads[i]
        if on_error == "skip":
            log.warning("skipping %s", failed)
            writer.skip(key)
        return
    for j, reason in counted["bad"]:  # on_error="skip": the bad episodes are left out
        failures.append(SourceFailure(i, source, j, reason))
        log.warning("skipping %s", failures[-1])
    summary.episodes += len(counted["fingerprints"])
    rows = counted["rows"]
    digest = hashlib.blake2b("".join(counted["fingerprints"]).encode(), digest_size=8).hexdigest()
    starts = writer.reserve(key, rows, digest)
    fut = client.submit(_write, loads[i], writer.location, writer.dataset_id, schema_doc, starts,
                        counted["fingerprints"], pure=False)
    what[fut.key] = ("write", i)
    writes[i] = (key, rows)
    pending.add(fut)


def _bar(progress: bool, total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="source", desc="ingest", disable=not progress)
