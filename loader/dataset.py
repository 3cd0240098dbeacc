"""`Dataset`: open a zarrfeed or L5Kit dataset (or a replay buffer, or a LeRobot v3 root: `lerobot_dataset`),
describe it (`info`) and check it (`validate`)."""
from __future__ import annotations


import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

from ..core import chunk_check, commit_log_reads, dataset_format, manifest_io, not_a_dataset
from ..core.chunk_check import ChunkCheck
from ..core.chunks import Check, check_chunk, read_coordinates, read_rows
from ..core.errors import ChunkChanged, ChunkError, FormatError
from ..core.links import Violation, link_checker, require_link
from ..core.schema import Schema, field_names
from ..core.bounded_calls import bounded
from ..core.location import Location
from ..core.zarr_array import Array, Group

if TYPE_CHECKING:  # (imported where used: pyarrow takes a tenth of a second to import, see `zarrfeed.loader`)
    import pyarrow as pa

    from .arrow_bridge import ArrowStream


STEPS = "steps"  # a replay buffer's step tables read together (see `read_rows`)

# datasets of other formats, without a zarr group, each read by a module of its own that adds itself here when
# the package is imported (a LeRobot v3 root: `lerobot_dataset`): (whether a location holds one, its opener)
OTHER_ROOTS: list[tuple[Callable[[Location], bool], Callable[[Location, str, int | None], "Dataset"]]] = []


@dataclass
class ValidationReport:
    """Every violation found (the first `limit` listed, all counted).

    Args:
        violations: The violations listed.
        count: All violations found.
        not_read: Arrays of the group that are not tables (name -> what), listed, not checked.
    """

    violations: list[Violation] = field(default_factory=list)
    count: int = 0
    not_read: dict[str, str] = field(default_factory=dict)  # arrays that are not tables: listed, not checked

    @property
    def ok(self) -> bool:
        """Whether no violation was found."""
        return self.count == 0

    def __str__(self) -> str:
        lines = ["valid"] if self.ok else \
            [f"{self.count} violation{'s' * (self.count != 1)}:"] + [f"  {v}" for v in self.violations]
        if self.count > len(self.violations):
            lines.append(f"  ... and {self.count - len(self.violations)} more")
        if self.not_read:
            lines.append(f"not checked: {_list(self.not_read)} (not tables of this dataset)")
        return "\n".join(lines)


@dataclass
class VerifyReport:
    """What `Dataset.verify` found: chunks whose stored bytes match the size and digest their commit recorded,
    chunks with no record (written before digests, or by another tool; `left_out` of them not stored at all,
    read as the fill value as zarr reads a chunk it left out), and each chunk that differs or is missing, one line
    each. `recorded` is False when the dataset records no digests at all."""

    verified: int = 0
    unverifiable: int = 0
    problems: list[str] = field(default_factory=list)
    recorded: bool = True
    left_out: int = 0

    @property
    def ok(self) -> bool:
        """Whether no chunk differs from what its commit recorded (chunks with no record are not checked)."""
        return not self.problems

    @property
    def all_verified(self) -> bool:
        """Whether every chunk was checked against its recorded digest, and matched."""
        return self.ok and self.recorded and not self.unverifiable

    def __str__(self) -> str:
        if not self.recorded:
            return (f"not verifiable: no chunk digests are recorded (written by another tool or an older zarrfeed): "
                    f"none of its {self.unverifiable:,} chunk{'s' * (self.unverifiable != 1)} could be checked")
        lines = [f"{self.verified} chunk{'s' * (self.verified != 1)} match their recorded digests"]
        if self.unverifiable:
            fill = (f"; {self.left_out} of them not stored, read as the fill value as zarr reads a chunk it left "
                    "out") if self.left_out else ""
            lines.append(f"{self.unverifiable} not verifiable (no digest recorded{fill})")
        if self.problems:
            many = len(self.problems) != 1
            lines = [f"{len(self.problems)} chunk{'s' * many} differ{'s' * (not many)} from what was committed:",
                     *(f"  {p}" for p in self.problems)] + lines
        return "\n".join(lines)


class Dataset:
    """A dataset's tables as zarr arrays, the committed row count of each, and its schema.

    `rows[name]` is what readers may read: the count the zarrfeed writer committed (in commit number
    `commit`), or for datasets written by other tools, the array's length (`commit` is None).

    Every chunk read through it (`read_rows`, `to_arrow`, the loaders made from it, exports) is checked
    against the size and digest its commit recorded, as taken when it was opened (`core.chunk_check`):
    a changed chunk, or another dataset put in its place, raises `ChunkError`. `verify_chunks=False` reads
    without checking.

    Made by `Dataset.open` (the constructor takes what opening found):

    Args:
        location: Where the dataset is (its store).
        group: Its zarr group.
        tables: Each table's array.
        rows: Each table's committed rows.
        schema: Its schema.
        commit: The commit read (None: a dataset another tool wrote).
        dataset_id: Its id (None: a dataset another tool wrote).
    """

    def __init__(self, location: Location, group: Group, tables: dict[str, Array],
                 rows: dict[str, int], schema: Schema, commit: int | None = None,
                 dataset_id: str | None = None) -> None:
        self.location, self.group, self.tables, self.rows, self.schema = location, group, tables, rows, schema
        self.commit, self.dataset_id = commit, dataset_id
        # which commit this is among copies of the dataset (they share its id and may reach the same commit number
        # with other rows): its `commit_tag` (random per commit; for commits before tags, the newest log segment's key,
        # None without a log or for a pinned commit that recorded none)
        self.commit_tag: str | None = None
        self.others: dict[str, str] = {}  # arrays in the group that are not tables of it (name -> what)
        self._digests: dict[str, dict[int, tuple[int, str]]] | None = None
        self._digests_read = False
        self.verify_chunks = True  # see `check`
        self._check: ChunkCheck | None = None
        self._check_error: FormatError | None = None  # why the records could not be taken (see `check`)

    @classmethod
    def open(cls, path_or_url: str | os.PathLike | Location, mode: str = "r",
             storage_options: dict[str, Any] | None = None, commit: int | None = None,
             verify_chunks: bool = True) -> "Dataset":
        """Open a directory, a `.zip` file (read-only) or any fsspec URL (with `storage_options`, e.g.
        `{"endpoint_url": ..., "key": ..., "secret": ...}` for S3); `FormatError` if unreadable.

        The rows are those of the latest commit when opened, or of commit number `commit` (pin one to make
        every rank of a job read the same rows while a writer appends: `Dataset.open(path).commit` on one rank,
        then `commit=` on all). On S3 the whole opening is bounded by the store's budget (`zarrfeed_timeout`):
        each call has that budget, and an opening makes several.

        Args:
            path_or_url: A directory, a `.zip` file, an fsspec URL (`s3://bucket/prefix`) or a `Location`.
            mode: "r" (default) opens it read-only; any other mode opens the zarr group and arrays writable
                (outside zarrfeed's commits; a `.zip` is refused).
            storage_options: fsspec options for a URL (credentials, `endpoint_url`, `zarrfeed_timeout`, ...).
            commit: The commit number whose rows to read (default: the latest).
            verify_chunks: Check every chunk read against the size and digest its commit recorded (default).
                False reads chunks unchecked: a chunk changed on disk, or another dataset put in this one's
                place while it is read, is then read as this dataset's rows (see docs/guides/loading.md).
        """
        location = Location.of(path_or_url, storage_options)
        ds = bounded(location.budget, lambda: cls._open(location, mode, commit),
                     f"{location}: opening the dataset (the store does not answer)")
        ds.verify_chunks = bool(verify_chunks)
        return ds

    @classmethod
    def _open(cls, location: Location, mode: str, commit: int | None, read_check: bool = True) -> "Dataset":
        try:
            group = dataset_format.open_group(location, mode)
        except FormatError:
            other = next((open_root for holds, open_root in OTHER_ROOTS if holds(location)), None)
            if other is None:
                raise
        else:
            other = None
        if other is not None:  # no zarr group: a dataset of another format, read in place
            return other(location, mode, commit)
        schema, arrays, others = dataset_format.open_tables(group, "r" if mode == "r" else "r+")
        if not schema.tables:  # an empty group, a replay buffer's data/, xarray's output: said so, not read as empty
            raise not_a_dataset.refusal(location, group, others)
        if others:
            warnings.warn(f"{location}: not reading {_list(others)}: not tables of this dataset "
                          f"({schema.name})", stacklevel=2)
        tables = {name: arrays[name] if name in arrays else dataset_format.empty_table(table)
                  for name, table in schema.tables.items()}
        doc = manifest_io.read_manifest(group.store, commit)
        rows = dataset_format.readable_rows(schema, tables, doc)
        for name, n in rows.items():
            if n > tables[name].shape[0]:
                raise FormatError(f"table '{name}': {n} rows committed but the array holds {tables[name].shape[0]}")
        ds = cls(location, group, tables, rows, schema, doc["commit"] if doc else None,
                 doc.get("dataset_id") if doc else None)
        ds.others = others
        ds.commit_tag = manifest_io.commit_tag(doc)
        if read_check:  # the records as of this opening: a dataset put in its place later is told apart
            try:
                ds._check = chunk_check.read(group.store, str(location), doc, rows,
                                             {t: a.chunks[0] for t, a in tables.items()})
            except FormatError as exc:  # a damaged commit log: `validate` reports it, a checked read refuses
                ds._check_error = exc
        return ds

    @classmethod
    def reopen(cls, location: Location, commit: int | None = None, check: ChunkCheck | None = None) -> "Dataset":
        """`open` again in another process (a worker's, a task's) what the parent opened, checking chunks
        against the parent's records (`check`: its `Dataset.check`; None: unchecked), not those found now:
        the parent has said what there was to say, so nothing is warned again."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = bounded(location.budget, lambda: cls._open(location, "r", commit, read_check=False),
                         f"{location}: opening the dataset (the store does not answer)")
        ds._check = check
        ds.verify_chunks = check is not None
        return ds

    @property
    def check(self) -> ChunkCheck | None:
        """What chunks read from this dataset are checked against: the records of its commit, taken when it
        was opened (see `core.chunk_check`); None with `verify_chunks=False` or when nothing is recorded
        (a dataset written by another tool or by a zarrfeed before digests). `FormatError` if the records
        could not be taken (a damaged commit log segment; `validate` names it): nothing is read unchecked
        unless asked (`verify_chunks=False`)."""
        if not self.verify_chunks:
            return None
        if self._check_error is not None:
            raise self._check_error
        return self._check

    def _checker(self) -> Check | None:
        check = self.check
        return check.check if check is not None else None

    def _steps(self, table: str) -> list[str] | None:
        """The step tables `table` names, if it is a replay buffer's `steps` (every key read together)."""
        steps = self.schema.step_tables()
        return steps if table == STEPS and steps and table not in self.tables else None

    def read_rows(self, table: str, start: int, stop: int, fields: list[str] | None = None) -> np.ndarray:
        """Rows [start, stop) of `table` (only `fields`, if given), each chunk checked (see `check`). A replay
        buffer's `steps` are the rows of every step table at once, one field per key."""
        if self._steps(table):
            names = field_names(self.record_dtype(table), fields)
            out = np.empty(max(stop - start, 0), self.record_dtype(table)[names])
            for name in names:
                out[name] = read_rows(self.tables[name], start, stop, check=self._checker())[name]
            return out
        return read_rows(self.tables[table], start, stop, fields, check=self._checker())

    def record_dtype(self, table: str) -> np.dtype:
        """The records of `table` (for a replay buffer's `steps`: one field per step table)."""
        steps = self._steps(table)
        if steps:
            return np.dtype([self.tables[t].dtype.descr[0] for t in steps])
        if table not in self.tables:
            raise ValueError(f"table: no table {table!r} (tables: {', '.join(self.readable_tables())})")
        return self.tables[table].dtype

    def row_count(self, table: str) -> int:
        """The rows of `table` a reader may read (`rows[table]`; a replay buffer's `steps`: its steps)."""
        return self.rows[self.tables_of(table)[0]]

    def readable_tables(self) -> list[str]:
        """The names `read_rows`, `to_arrow` and the loaders take: the tables, and `steps` in a replay buffer."""
        return list(self.tables) + ([STEPS] if self._steps(STEPS) else [])

    def tables_of(self, table: str) -> list[str]:
        """The tables whose arrays `table` is read from: itself, or a replay buffer's step tables for `steps`."""
        return self._steps(table) or [table]

    def read_coordinates(self, table: str, rows: np.ndarray) -> np.ndarray:
        """The records of `table` at `rows` (any order, repeats allowed), each chunk checked (see `check`)."""
        return read_coordinates(self.tables[table], rows, check=self._checker())

    def version_tag(self) -> str:
        """What tells this state of the dataset from any other at the same place: the newest commit's key
        (`commit_tag`) and number; without a commit log (a dataset L5Kit or another tool wrote, which may be
        rewritten in place), a digest of every stored file's name, size and modification time (one listing of
        the store)."""
        if self.commit_tag is not None:
            return f"{self.commit_tag}#{self.commit}"
        return self.location.contents_tag()

    def __getitem__(self, table: str) -> Array:
        """The zarr v2 array of `table` (zarrfeed's own `Array`: shape, dtype, chunks, attrs, slices along the
        first axis), for its metadata. Its slices read as zarr does: unchecked against the recorded digests, and
        a missing chunk reads as fill values; read rows with `read_rows`, `read_coordinates` or `to_arrow`."""
        return self.tables[table]

    def __repr__(self) -> str:
        rows = ", ".join(f"{name}={n}" for name, n in self.rows.items())
        return f"Dataset({str(self.location)!r}, schema={self.schema.name!r}, rows: {rows})"

    def close(self) -> None:
        """Close the store (a `.zip` file's handle; nothing to close for a directory or a URL)."""
        close = getattr(self.group.store, "close", None)
        if close:
            close()

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def info(self) -> dict[str, dict[str, Any]]:
        """Per table: rows, dtype, chunk rows, chunks stored, bytes, bytes stored (its documents and chunk objects,
        as the store holds them) and their ratio. A zarr v3 table also says so (`zarr_format`), with the rows of
        a shard (`shard_rows`, None when it is not sharded) and the shards stored (`shards_initialized`); its
        `chunks_initialized` counts the inner chunks its shards hold (None if a shard's index cannot be read:
        `validate` names it)."""
        out = {}
        for name, arr in self.tables.items():
            nbytes = self.rows[name] * arr.dtype.itemsize
            stored = arr.nbytes_stored
            try:
                chunks: int | None = arr.nchunks_initialized
            except ChunkError:
                chunks = None
            out[name] = {
                "rows": self.rows[name],
                "dtype": [list(map(str, f)) if len(f) == 2 else [f[0], f[1], list(f[2])] for f in arr.dtype.descr],
                "chunk_rows": arr.chunks[0],
                "chunks_initialized": chunks,
                "bytes": nbytes,
                "bytes_stored": stored,
                "ratio": round(nbytes / stored, 3) if stored else None,
            }
            if arr.zarr_format == 3:
                out[name].update(zarr_format=3, shard_rows=arr.meta.shard_rows if arr.sharding else None,
                                 shards_initialized=arr.nshards_initialized)
        return out

    def chunks(self, table: str) -> "ChunkReader":
        """`table`'s committed rows one chunk at a time, as (start row, records), None for a missing chunk; a
        chunk that cannot be decoded raises `FormatError`."""
        return ChunkReader(self, table)

    def validate(self, limit: int = 20, progress: Callable[[int], None] | None = None) -> ValidationReport:
        """Check every link's intervals (L5Kit semantics), that every chunk below the committed rows exists, and
        the dataset's commits: every commit log segment is read and checked (they are small), and the commit
        number must not be below a commit made before (see `commit_violations`).

        Every chunk of every table is read once, checked as every read is (see `check`: a chunk that is not the
        one its commit recorded is a violation naming table and chunk) and decoded, so a truncated or corrupt
        chunk is a violation naming table and chunk key (a v3 shard whose index cannot be read, one naming the
        shard, whatever number of its chunks it fails). `progress(rows)` is called after each chunk.
        """
        report = ValidationReport(not_read=dict(self.others))
        checkers = {name: [link_checker(link, self.rows[link.child], limit) for link in self.schema.links_from(name)]
                    for name in self.tables}

        def add(v: Violation) -> None:
            report.count += 1
            if len(report.violations) < limit:
                report.violations.append(v)

        for v in self.commit_violations():
            add(v)
        for v in self.steps_past_the_episodes():
            add(v)

        check = self._checker() if self._check_error is None else None  # (a damaged log: reported above)
        for name in self.tables:
            reader, unchecked = ChunkReader(self, name, check), ChunkReader(self, name)
            said: set[str] = set()  # a v3 shard that cannot be read fails each of its chunks alike: said once
            for start in reader.starts():
                try:
                    try:
                        block = reader.read(start)
                    except ChunkChanged as exc:  # a violation; its rows' links are still checked, as they are
                        add(Violation(name, None, start, str(exc)))
                        block = unchecked.read(start)
                except (ChunkError, FormatError) as exc:  # a chunk that cannot be decoded: invalid, its table's
                    # links unchecked past it (ChunkReader says a broken file as FormatError)
                    if str(exc) not in said:
                        said.add(str(exc))
                        add(Violation(name, None, start, f"{exc}; the links of table '{name}' are not checked past "
                                                         f"row {start}"))
                    checkers[name] = []
                    continue
                if block is None:
                    end = min(start + self.tables[name].chunks[0], self.rows[name])
                    add(Violation(name, None, start, f"chunk '{self.chunk_key(name, start)}' (rows {start}-{end}) "
                                                     "is missing: it would read as fill values"))
                else:
                    for checker in checkers[name]:
                        checker.feed(block[checker.link.field])
                if progress:
                    progress(len(block) if block is not None else 0)
            for checker in checkers[name]:
                checker.finish()
                report.count += checker.count
                report.violations.extend(checker.violations[: max(0, limit - len(report.violations))])
        return report

    def steps_past_the_episodes(self) -> list[Violation]:
        """What makes a replay buffer one that Diffusion Policy's `ReplayBuffer` will not open (it requires every
        data array to be `episode_ends[-1]` steps long): without zarrfeed commits, steps stored past the last
        episode's end (its writer stopped after writing an episode's steps, before its end), which are not
        read; with them, arrays whose lengths are not the last commit's (a writer stopped while it set them),
        which the next writer sets right."""
        found = []
        for name in self.schema.step_tables() if self.schema.step_tables() else []:
            stored, rows = self.tables[name].shape[0], self.rows[name]
            if self.commit is None and stored > rows:
                found.append(Violation(name, None, rows, f"{self.tables[name].path} holds {stored - rows:,} steps "
                                       f"past the last episode's end ({rows:,}): an episode written without its "
                                       "end (a writer stopped before it wrote episode_ends); they are not read, and "
                                       "Diffusion Policy's ReplayBuffer will not open the buffer"))
        if self.commit is not None and self.schema.step_tables():
            # what Diffusion Policy's reader sees: episode_ends as long as its shape says, every data array as
            # long as its last value (arrays longer than the commit's, all alike, hold a commit that did not
            # publish, which it reads whole and the next writer drops)
            ends = self.tables["episodes"]
            e = ends.shape[0]
            last = int(read_rows(ends, e - 1, e)[ends.dtype.names[0]][0]) if e else 0
            odd = [t for t in self.schema.step_tables() if self.tables[t].shape[0] != last]
            if odd:
                t = odd[0]
                found.append(Violation(t, None, None, f"{self.tables[t].path} is {self.tables[t].shape[0]:,} long, "
                                       f"but {ends.path} ends at {last:,} (a writer stopped while it set the "
                                       "arrays' lengths, or one is writing now): Diffusion Policy's ReplayBuffer "
                                       "will not open the buffer until a writer opens it "
                                       "(DatasetWriter(path, mode='a').close() sets them)"))
        return found

    def commit_violations(self) -> list[Violation]:
        """What is wrong with the latest commit's records, each naming its file: a commit log segment that is
        missing, unreadable or holds an entry of the wrong shape, and a commit number below that of a commit
        object or log segment made before (the next append would reuse it). None for a dataset without
        zarrfeed commits."""
        store = self.group.store
        doc = manifest_io.read_manifest(store)
        if doc is None:
            return []
        found = []
        why = commit_log_reads.history_problem(store, doc)
        if why:
            found.append(why)
        try:
            commit_log_reads.latest_log(store)
        except FormatError as exc:
            found.append(str(exc))
        return [Violation(where, None, None, what) for where, _, what in (f.partition(": ") for f in found)]

    def require_link(self, parent: str, field: str, intervals: np.ndarray) -> None:
        """`FormatError` naming the first violation (table, field, row) if `intervals`, the link field `field` of
        `parent` over its committed rows, do not tile the child's committed rows. Loaders that read a link's
        intervals when they open call this: row counts that contradict the links are then one line, not an
        `IndexError` from deep inside a loader."""
        links = [link for link in self.schema.links if link.parent == parent and link.field == field]
        if not links:
            raise FormatError(f"{self.location}: schema '{self.schema.name}' has no link {parent}.{field}")
        require_link(links[0], intervals, self.rows[links[0].child],
                     f"{self.location} does not validate, so it is not loaded")

    def digests(self, tail: bool = True) -> dict[str, dict[int, tuple[int, str]]] | None:
        """The size and digest its commit recorded for each chunk of this dataset's rows that can be checked
        (see `commit_log_reads.sealed_chunks`; `tail=False` leaves out each table's last, partly filled chunk,
        which the next writer rewrites); None if it records none. Those taken when it was opened (see `check`),
        else read now."""
        if not self._digests_read:
            self._digests_read = True
            self._digests = self._check.records if self._check is not None else self._sealed()
        if tail or self._digests is None:
            return self._digests
        return {t: {i: r for i, r in recs.items() if (i + 1) * self.tables[t].chunks[0] <= self.rows[t]}
                for t, recs in self._digests.items()}

    def _sealed(self) -> dict[str, dict[int, tuple[int, str]]] | None:
        return commit_log_reads.sealed_chunks(self.group.store, self.rows,
                                            {t: a.chunks[0] for t, a in self.tables.items()}, self.commit)

    def verify(self, progress: Callable[[int], None] | None = None, batch: int = 16) -> VerifyReport:
        """Read every chunk object below the committed rows and check its size and digest against what its
        commit recorded (a bit flipped inside a compressed chunk, a chunk file replaced by another, a missing
        chunk). Reads the stored bytes only, `batch` chunks at a time, and decodes only each table's last, partly
        filled chunk when its stored bytes are not the recorded ones (a writer appended since, or was killed
        before it sealed it): its committed rows are checked against their recorded digest (see
        `core.chunk_check`). A chunk with no record that is not stored, in a table whose chunks holding only the
        fill value were left out by the tool that wrote it (zarr 3 stores none such; `missing_is_fill`), reads as
        that value, as every reader reads it: it is counted as not verifiable, not as missing. A v3 shard whose
        index cannot be read (truncated, corrupt) is one problem naming the shard. `progress(chunks)` is called
        as it goes."""
        digests = self.digests()
        report = VerifyReport(recorded=digests is not None)
        check = self._check if self._check_error is None else None
        for name, arr in self.tables.items():
            c, n = arr.chunks[0], self.rows[name]
            recorded = (digests or {}).get(name, {})
            indices = list(range(-(-n // c)))
            for at in range(0, len(indices), batch):
                part = indices[at:at + batch]
                keys = [arr.chunk_key(i) for i in part]
                for i, key, raw in zip(part, keys, _read_each(arr, part, report.problems), strict=True):
                    if isinstance(raw, ChunkError):  # in a v3 shard whose index or bytes cannot be read
                        continue
                    if raw is None:
                        tail = check is not None and name in check.tails and (i + 1) * c > n
                        if arr.missing_is_fill and i not in recorded and not tail:
                            report.unverifiable += 1  # left out by the tool that wrote it, and read as the fill
                            report.left_out += 1  # value, as the readers read it (`missing_is_fill`)
                        else:
                            report.problems.append(f"table '{name}': chunk '{key}' is missing" + (
                                " (its commit recorded it as stored)" if arr.missing_is_fill else ""))
                    elif check is not None and name in check.tails and (i + 1) * c > n:
                        try:  # the last, partly filled chunk: by its committed rows when its bytes differ
                            check.check(arr, i, key, raw)
                            report.verified += 1
                        except ChunkError as exc:
                            report.problems.append(str(exc))
                    elif i not in recorded:
                        report.unverifiable += 1
                    else:
                        try:
                            check_chunk(key, raw, recorded[i], arr.table)
                            report.verified += 1
                        except ChunkError as exc:
                            if (i + 1) * c > n and (self._sealed() or {}).get(name, {}).get(i) != recorded[i]:
                                report.unverifiable += 1  # the last chunk: a writer opened it since; not a fault
                            else:
                                report.problems.append(str(exc))
                if progress:
                    progress(len(part))
        return report

    def to_batches(self, table: str, batch_size: int = 65_536, fields: list[str] | str | None = None,
                   join: dict[str, str] | None = None, row_index: str | None = None) -> ArrowStream:
        """`table` in row order as an Arrow stream (see `zarrfeed.loader.arrow_bridge.table_batches`): iterate it for
        RecordBatches, or pass it to polars, DuckDB or pyarrow, which read its Arrow C stream.

        Args:
            table: The table to read.
            batch_size: Rows per RecordBatch (default 65,536).
            fields: The fields to read, in this order (default all; one name reads one field).
            join: Child tables to nest, each with the interval field that points at it
                (`{"agents": "agent_index_interval"}`): a list<struct> column of each row's child rows.
            row_index: The name of a column to add holding each row's index in the table (default: none).
        """
        from .arrow_bridge import table_batches

        return table_batches(self, table, batch_size, fields, join, row_index)

    def to_arrow(self, table: str, fields: list[str] | str | None = None) -> pa.Table:
        """All committed rows of `table` as one Arrow table."""
        return self.to_batches(table, fields=fields).read_all()

    def to_dask(self, table: str, chunks_per_partition: int = 8, fields: list[str] | str | None = None) -> Any:
        """`table`'s committed rows as a dask DataFrame: one partition per `chunks_per_partition` chunks, each
        read through the Arrow bridge on whichever worker computes it (pyarrow-backed columns; subarray
        fields are fixed-size lists). The rows are those of this dataset's commit, pinned, so every partition
        agrees while a writer appends."""
        import dask.dataframe as dd
        import pandas as pd

        from ..core.arrow_records import records_to_arrow

        if table not in self.tables:
            raise ValueError(f"table: no table {table!r} (tables: {', '.join(self.tables)})")
        names = field_names(self[table].dtype, fields)
        c = self[table].chunks[0] * max(1, chunks_per_partition)
        n = self.rows[table]
        check = self.check

        def piece(a: int, b: int) -> _Partition:
            return _Partition(self.location, self.commit, table, a, b, names,
                              check.part(table, a, b) if check is not None else None)

        pieces = [piece(a, min(a + c, n)) for a in range(0, n, c)] or [piece(0, 0)]
        meta = records_to_arrow(np.zeros(0, self[table].dtype), names).to_pandas(types_mapper=pd.ArrowDtype)
        divisions = [p.start for p in pieces] + [max(n - 1, 0)]
        return dd.from_map(_dask_partition, pieces, meta=meta, divisions=divisions, enforce_metadata=False)

    def chunk_key(self, table: str, row: int) -> str:
        """The store key of the chunk of `table` that holds `row`."""
        arr = self.tables[table]
        return arr.chunk_key(row // arr.chunks[0])


class ChunkReader:
    """Iterates (start row, records) over a table's committed rows, one chunk at a time; None for a missing chunk.
    Each chunk is checked as every read of the dataset is (see `Dataset.check`): a changed one raises
    `ChunkChanged`."""

    def __init__(self, dataset: Dataset, table: str, check: Check | None = None) -> None:
        self.dataset, self.table = dataset, table
        self.array = dataset.tables[table]
        self.check = check

    def starts(self) -> range:
        """The first row of each chunk below the committed rows."""
        return range(0, self.dataset.rows[self.table], self.array.chunks[0])

    def read(self, start: int) -> np.ndarray | None:
        """The committed records of the chunk that starts at row `start`; None if it is missing."""
        arr = self.array
        # missing, unless another tool left it out holding only the fill value (then its table is
        # `missing_is_fill` and no commit records the chunk)
        if not arr.has_chunk(start // arr.chunks[0]):
            check = self.dataset._check
            if not arr.missing_is_fill or (check is not None and check.recorded(self.table, start // arr.chunks[0])):
                return None
        stop = min(start + arr.chunks[0], self.dataset.rows[self.table])
        try:
            return read_rows(arr, start, stop, check=self.check)
        except ChunkChanged:
            raise
        except ChunkError as exc:  # (its message already says what is wrong with the file)
            raise FormatError(str(exc)) from None

    def __iter__(self):
        if self.check is None:
            self.check = self.dataset._checker()
        for start in self.starts():
            yield start, self.read(start)


class _Partition(NamedTuple):
    """A partition of `Dataset.to_dask`: rows [start, end) of `table` at `commit` of the dataset at `location`."""

    location: Location
    commit: int | None
    table: str
    start: int
    end: int
    fields: list[str] | None
    check: ChunkCheck | None


def _dask_partition(piece: _Partition) -> Any:
    """A partition's rows as a pandas DataFrame indexed by row number."""
    import pandas as pd

    from ..core.arrow_records import records_to_arrow

    ds = Dataset.reopen(piece.location, piece.commit, piece.check)
    rows = ds.read_rows(piece.table, piece.start, piece.end)
    df = records_to_arrow(rows, piece.fields).to_pandas(types_mapper=pd.ArrowDtype)
    df.index = pd.RangeIndex(piece.start, piece.end)
    return df


def _list(arrays: dict[str, str]) -> str:
    return ", ".join(f"'{name}' ({what})" for name, what in arrays.items())


def _read_each(arr: Array, indices: list[int], problems: list[str]) -> list[bytes | None | ChunkError]:
    """`arr.read_chunks(indices)`; if that fails (a v3 shard whose index is damaged, or whose bytes are cut
    short), each chunk read alone, one that cannot be read given as its error, said once in `problems` (every
    chunk of a shard with a damaged index fails alike: one line for the shard)."""
    try:
        return list(arr.read_chunks(indices))
    except ChunkError:
        pass
    out: list[bytes | None | ChunkError] = []
    for i in indices:
        try:
            out.append(arr.read_chunks([i])[0])
        except ChunkError as exc:
            out.append(exc)
            if str(exc) not in problems:
                problems.append(str(exc))
    return out

