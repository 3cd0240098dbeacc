"""A crash of the writer's machine on an object store, for `memory://` and S3 datasets.

An object store keeps no page cache and tears no object: a PUT, a conditional create or a DELETE that returned
is durable, and one in flight when the machine dies either happened entirely or not at all; nothing the dead
machine would have sent afterwards happens. The simulators model that at the lowest layer every write of a
dataset goes through (the writer's chunks, documents and manifest through `FsspecStore`, its lease through the
filesystem directly), and record each operation in order, with its begin and end on one clock (`ops`):
- `ObjectStoreCrash`, for `memory://`: the dict in which fsspec's memory filesystem keeps its objects. While
  installed, that dict is one of its own (`_Objects`): each object stored or deleted is one operation. fsspec's
  memory files are replaced where they are not object-like: a file opened for writing is one PUT of its whole
  bytes when it is closed (as s3fs uploads it), not an empty object filled in place, and an exclusive create
  (`mode="create"`, `"xb"`: `If-None-Match: *` on S3) one conditional operation that checks and stores at once.
- `S3Crash`, for a real S3 server (moto on loopback): s3fs's `_call_s3`, through which every request goes; a
  PUT with `If-None-Match: *` is a create, one with `If-Match` a conditional replace, a multi-object DELETE one
  request (one operation per key, begun and ended together). s3fs sends a batch of PUTs at once, so several
  may be in flight when the machine dies: each that was sent lands (the server had it), none is sent after.
Requests are counted from 1; at request `crash_at` the machine dies: the request lands or not (chosen from
`seed` and `crash_at`, so a case replays), `PowerLoss` (from tests/support/power_loss.py) is raised there, and every
later call, read or write, raises it too.

`durable()` rebuilds what the store holds after the crash from the record alone (the operations that returned,
and those in flight that landed); a new simulator with `objects=` that state is the restart. `order_problems`
reads a record and says where it breaks the commit protocol's order (see there).
"""
from __future__ import annotations

import asyncio
import io
import json
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from fsspec.implementations.memory import MemoryFile, MemoryFileSystem
from power_loss import PowerLoss

from zarrfeed.core.chunks import digest, rows_digest
from zarrfeed.core.commit_log import Segment
from zarrfeed.core.manifest import COMMITS_PREFIX, MANIFEST_KEY, TAILS, parse
from zarrfeed.core.stores import MemoryStore
from zarrfeed.core.v3_meta import ZARR_JSON
from zarrfeed.core.zarr_array import Array

LEASE_KEY = "zarrfeed.lease"
WRITE_MODES = {"wb", "w+b", "xb", "x+b"}


@dataclass
class Op:
    """One operation on the store: `kind` "put", "create" (stored only if absent), "replace" (stored only if
    unchanged: `If-Match`) or "delete", of `key` (below the watched root; a path outside it keeps its full
    path), with the bytes stored; `n`: its request, counted from 1. `begin` and `end` are on one clock (`end`
    None: it never returned, for the crash); `landed`: whether it changed the store (a refused conditional
    write did not: `refused`)."""

    n: int
    kind: str
    key: str
    data: bytes | None
    begin: float
    end: float | None = None
    landed: bool = False
    refused: bool = False

    def __str__(self) -> str:
        what = " refused" if self.refused else "" if self.landed else " (did not land)"
        return f"op {self.n}: {self.kind} {self.key}{what}"


class _Machine:
    """The record of a store's operations, and the machine sending them dying at request `crash_at` (None:
    never). `root`: the dataset's path in the filesystem, whose keys the record names relative to it;
    `objects`: what the store holds to begin with (key below the root -> bytes): durable."""

    def __init__(self, root: str, crash_at: int | None, seed: int, objects: Mapping[str, bytes] | None) -> None:
        self.root = root.rstrip("/")
        self.crash_at = crash_at
        self.rng = random.Random(f"{seed}:{crash_at}")  # the in-flight request's fate replays with the case
        self.before = dict(objects or {})
        self.ops: list[Op] = []
        self.requests = 0
        self.dead = False
        self._clock = 0
        self._pending = 0  # requests sent and not yet answered
        self._lock = threading.RLock()
        self._answered = threading.Condition(self._lock)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _key(self, path: str) -> str:
        return path[len(self.root) + 1:] if path.startswith(self.root + "/") else path

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def down(self) -> BaseException:
        """What a call raises once the machine is down."""
        return PowerLoss("the writer's machine is down")

    def alive(self) -> None:
        """Raise `down()` if the machine is down (every call after the crash)."""
        if self.dead:
            raise self.down()

    def begin(self, kind: str, paths: list[str], data: bytes | None) -> tuple[list[Op], bool]:
        """A request writing `paths` begins: its operations, and whether the machine dies at it (then `fate`
        says whether it lands)."""
        with self._lock:
            self.alive()
            self.requests += 1
            clock = self._tick()
            ops = [Op(self.requests, kind, self._key(p), data, begin=clock) for p in paths]
            self.ops.extend(ops)
            crashing = self.crash_at is not None and self.requests >= self.crash_at
            if crashing:
                self.dead = True
                self.fate = self.rng.random() < 0.5
            self._pending += 1
            return ops, crashing

    def finish(self, ops: list[Op], landed: bool, refused: bool = False, crashed: bool = False) -> None:
        """The request of `ops` was answered (`crashed`: it was the one in flight at the crash: no answer)."""
        with self._lock:
            end = None if crashed else self._tick()
            for op in ops:
                op.end, op.landed, op.refused = end, landed, refused
            self._pending -= 1
            self._answered.notify_all()

    def died(self, ops: list[Op]) -> PowerLoss:
        op = ops[0]
        return PowerLoss(f"the writer's machine died at request {op.n} ({op.kind} {op.key}: "
                         f"{'landed' if op.landed else 'never landed'})")

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every request sent has been answered (those in flight at the crash land meanwhile)."""
        with self._lock:
            if not self._answered.wait_for(lambda: self._pending == 0, timeout):
                raise TimeoutError(f"{self._pending} requests still unanswered after {timeout} s")

    def durable(self) -> dict[str, bytes]:
        """What the store holds after the crash, from the record: the objects there before, then every operation
        that landed, in the order each ended (the crashed one last)."""
        out = dict(self.before)
        for op in sorted((o for o in self.ops if o.landed), key=lambda o: o.end if o.end is not None else 1 << 62):
            if op.kind == "delete":
                out.pop(op.key, None)
            elif op.data is not None:
                out[op.key] = op.data
        return {k: v for k, v in out.items() if not k.startswith(("/", self.root.split("/")[0] + "/"))}

    def crashed(self) -> Op | None:
        """The (first) operation of the request in flight at the crash, if the machine died."""
        return next((o for o in self.ops if o.n == self.crash_at), None) if self.dead else None


class ObjectStoreCrash(_Machine):
    """The memory filesystem's objects, recorded (see the module's docstring). `root`: the dataset's URL
    (`memory://name/d.zarr`); `objects` are stored there to begin with."""

    def __init__(self, root: str, crash_at: int | None = None, seed: int = 0,
                 objects: Mapping[str, bytes] | None = None) -> None:
        super().__init__(MemoryFileSystem._strip_protocol(root), crash_at, seed, objects)
        self.objects = _Objects(self)
        for key, data in self.before.items():
            dict.__setitem__(self.objects, self._path(key), MemoryFile(None, self._path(key), data))

    def install(self, mp: Any) -> "ObjectStoreCrash":
        """Make it every memory filesystem's store for the life of `mp` (a `pytest.MonkeyPatch`)."""
        mp.setattr(MemoryFileSystem, "store", self.objects)
        mp.setattr(MemoryFileSystem, "pseudo_dirs", [""])
        original = MemoryFileSystem._open
        sim = self

        def _open(fs: MemoryFileSystem, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
            if mode not in WRITE_MODES:
                return original(fs, path, mode, *args, **kwargs)
            path = fs._strip_protocol(path)
            if "data" in kwargs:  # pipe_file: the whole object at once
                return sim.put(fs, path, bytes(kwargs["data"] or b""), exclusive="x" in mode)
            if "x" in mode and sim.exists(path):
                raise FileExistsError(path)
            return _Upload(sim, fs, path, exclusive="x" in mode)

        mp.setattr(MemoryFileSystem, "_open", _open)
        return self

    def exists(self, path: str) -> bool:
        with self._lock:
            self.alive()
            return dict.__contains__(self.objects, path)

    def _operate(self, kind: str, path: str, data: bytes | None, apply: Callable[[], Any]) -> Any:
        """One request: begin it, crash there if it is the one, else apply it and answer."""
        with self._lock:
            ops, crashing = self.begin(kind, [path], data)
            refused = kind == "create" and dict.__contains__(self.objects, path)
            if crashing:
                landed = self.fate and not refused
                if landed:
                    apply()
                self.finish(ops, landed, refused, crashed=True)
                raise self.died(ops)
            if refused:
                self.finish(ops, False, refused=True)
                raise FileExistsError(path)
            out = apply()
            self.finish(ops, True)
            return out

    def put(self, fs: Any, path: str, data: bytes, exclusive: bool = False) -> MemoryFile:
        """Store `data` at `path` as one object (`exclusive`: only if none is there, in the same operation)."""
        f = MemoryFile(fs, path, data)

        def apply() -> MemoryFile:
            dict.__setitem__(self.objects, path, f)
            return f
        return self._operate("create" if exclusive else "put", path, data, apply)

    def delete(self, path: str) -> None:
        with self._lock:  # deleting what is not there is no request (fsspec raises before it asks)
            self.alive()
            if not dict.__contains__(self.objects, path):
                raise KeyError(path)
            self._operate("delete", path, None, lambda: dict.__delitem__(self.objects, path))

    def held(self) -> dict[str, bytes]:
        """What the store holds now under the root (read directly, not as the record says)."""
        start = self.root + "/"
        return {p[len(start):]: bytes(f.getbuffer()) for p, f in dict.items(self.objects) if p.startswith(start)}


class _Objects(dict):
    """The memory filesystem's objects (path -> MemoryFile) while an `ObjectStoreCrash` is installed: every
    object stored or deleted by any route is an operation of it; once the machine is down nothing is read."""

    def __init__(self, sim: ObjectStoreCrash) -> None:
        super().__init__()
        self.sim = sim

    def __setitem__(self, path: str, value: Any) -> None:  # a copy (`cp_file`), a file committed by fsspec
        self.sim.put(value.fs, path, bytes(value.getbuffer()))

    def __delitem__(self, path: str) -> None:
        self.sim.delete(path)

    def pop(self, path: str, *default: Any) -> Any:
        if not dict.__contains__(self, path) and default:
            return default[0]
        value = self[path]
        del self[path]
        return value

    def __getitem__(self, path: str) -> Any:
        self.sim.alive()
        return dict.__getitem__(self, path)

    def get(self, path: str, default: Any = None) -> Any:
        self.sim.alive()
        return dict.get(self, path, default)

    def __contains__(self, path: object) -> bool:
        self.sim.alive()
        return dict.__contains__(self, path)

    def __iter__(self) -> Iterator[str]:
        self.sim.alive()
        return iter(list(dict.keys(self)))

    def keys(self) -> Any:
        self.sim.alive()
        return list(dict.keys(self))

    def items(self) -> Any:
        self.sim.alive()
        return list(dict.items(self))

    def values(self) -> Any:
        self.sim.alive()
        return list(dict.values(self))

    def __len__(self) -> int:
        self.sim.alive()
        return dict.__len__(self)


class _Upload(io.BytesIO):
    """A memory file opened for writing: one PUT of its bytes when closed (none if its `with` block raised)."""

    def __init__(self, sim: ObjectStoreCrash, fs: Any, path: str, exclusive: bool) -> None:
        super().__init__()
        self.sim, self.fs, self.path, self.exclusive, self.done = sim, fs, path, exclusive, False

    def close(self) -> None:
        if not self.done:
            self.done = True
            data = self.getvalue()
            super().close()
            self.sim.put(self.fs, self.path, data, exclusive=self.exclusive)

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.done = True
            super().close()
            return
        self.close()

    def discard(self) -> None:
        self.done = True
        super().close()

    def commit(self) -> None:
        self.close()


class MachineDown(Exception):
    """Raised inside fsspec's event loop once the machine is down (a BaseException raised there would make
    fsspec's `sync` return None, as if the call had succeeded); `sync` raises `PowerLoss` in its place."""


class S3Crash(_Machine):
    """Requests to an S3 server through s3fs, recorded (see the module's docstring). `root`: the dataset's URL
    (`s3://bucket/d.zarr`), whose objects the server already holds (`objects`: what it held to begin with);
    `fs`: an S3FileSystem that reaches the server, for `held`."""

    def __init__(self, root: str, fs: Any, crash_at: int | None = None, seed: int = 0,
                 objects: Mapping[str, bytes] | None = None) -> None:
        super().__init__(root.split("://", 1)[-1], crash_at, seed, objects)
        self.fs = fs

    def down(self) -> BaseException:
        return MachineDown("the writer's machine is down")

    def install(self, mp: Any) -> "S3Crash":
        """Put it between every S3FileSystem and its server for the life of `mp` (a `pytest.MonkeyPatch`)."""
        import fsspec.asyn
        import s3fs.core

        original, original_sync, sim = s3fs.core.S3FileSystem._call_s3, fsspec.asyn.sync, self

        async def _call_s3(fs: Any, method: str, *args: Any, **kwargs: Any) -> Any:
            request = _s3_write(method, kwargs)
            if request is None:  # a read
                sim.alive()
                return await original(fs, method, *args, **kwargs)
            kind, paths, data = request
            ops, crashing = sim.begin(kind, paths, data)
            if crashing and not sim.fate:
                sim.finish(ops, False, crashed=True)
                raise MachineDown(str(sim.died(ops)))
            # sent: it lands or is refused whatever becomes of its caller (s3fs cancels the rest of a batch when
            # one request fails; the server has them already), and its answer is recorded when it comes
            sent = asyncio.ensure_future(original(fs, method, *args, **kwargs))

            def answered(done: asyncio.Future) -> None:
                failed = done.cancelled() or done.exception() is not None
                sim.finish(ops, not failed, refused=failed and not done.cancelled() and _refused(done.exception()),
                           crashed=crashing)

            sent.add_done_callback(answered)
            try:
                out = await asyncio.shield(sent)
            except Exception:
                if crashing:
                    raise MachineDown(str(sim.died(ops))) from None
                raise
            if sim.dead:  # it landed, but its answer never reached the machine
                raise MachineDown(str(sim.died(ops)) if crashing else "the writer's machine is down")
            return out

        def sync(loop: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                out = original_sync(loop, func, *args, **kwargs)
            except BaseException:
                if sim.dead:
                    raise PowerLoss("the writer's machine is down") from None
                raise
            sim.alive_here()
            return out

        mp.setattr(s3fs.core.S3FileSystem, "_call_s3", _call_s3)
        mp.setattr(s3fs.core.S3FileSystem, "call_s3", fsspec.asyn.sync_wrapper(_call_s3))
        mp.setattr(fsspec.asyn, "sync", sync)
        mp.setattr(s3fs.core, "sync", sync)
        return self

    def alive_here(self) -> None:
        """`PowerLoss` if the machine is down (in the caller's thread: a call that ended after the crash)."""
        if self.dead:
            raise PowerLoss("the writer's machine is down")

    def held(self) -> dict[str, bytes]:
        """What the server holds now under the root (read with `fs`, outside the simulator)."""
        paths = self.fs.find(self.root)
        start = len(self.root) + 1
        return {p[start:]: data for p, data in self.fs.cat(paths).items()} if paths else {}


def _s3_write(method: str, kwargs: Mapping[str, Any]) -> tuple[str, list[str], bytes | None] | None:
    """(kind, paths, bytes) of an S3 request that writes, or None for one that reads."""
    bucket = kwargs.get("Bucket", "")
    if method == "put_object":
        kind = "create" if kwargs.get("IfNoneMatch") == "*" else "replace" if kwargs.get("IfMatch") else "put"
        body = kwargs.get("Body", b"")
        return kind, [f"{bucket}/{kwargs['Key']}"], bytes(body) if not hasattr(body, "read") else body.read()
    if method == "delete_object":
        return "delete", [f"{bucket}/{kwargs['Key']}"], None
    if method == "delete_objects":
        return "delete", [f"{bucket}/{o['Key']}" for o in kwargs["Delete"]["Objects"]], None
    if method in ("copy_object", "create_multipart_upload", "upload_part", "complete_multipart_upload",
                  "upload_part_copy", "put_object_acl", "delete_bucket", "create_bucket"):
        raise NotImplementedError(f"the simulator does not model S3's {method}")
    return None


def _refused(exc: BaseException) -> bool:
    """Whether a conditional request was refused (its condition did not hold)."""
    if isinstance(exc, FileExistsError):
        return True
    cause = exc.__cause__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code") if cause is not None else None
    return code in ("PreconditionFailed", "412", "ConditionalRequestConflict")


# ---------------------------------------------------------------------------- the commit protocol's order
def order_problems(ops: list[Op], before: Mapping[str, bytes] | None = None) -> list[str]:
    """Where the record `ops` (of one dataset's store, which held `before` when they began) breaks the order of
    the commit protocol on an object store, one line each (none: it holds):
    - a manifest (`zarrfeed.json`) is stored only once everything it names returned: `.zgroup`, each table's
      `.zarray` with at least its committed rows, every chunk below them, every commit log segment it lists,
      each chunk with the size and digest its log records, each last chunk holding the committed rows its
      `tails` record; and no operation on any of them is still in flight then (a create's commit 0, with no
      rows, names nothing: it comes first, and a writer finishes a create stopped after it);
    - each manifest is preceded by a write of the lease since the one before it (the writer renews the lease
      on the store just before every commit), and numbers its commit one more than the manifest it replaces;
    - the numbered commit object `zarrfeed.commits/<n>.json` is created (conditionally: only if absent) only
      once manifest `n` returned;
    - nothing the current manifest names (or one in flight) is deleted, a log segment it lists is never
      rewritten, and a chunk it names is rewritten only with the bytes its log records, or keeping the
      committed rows its `tails` record (a table's last chunk, appended to).
    The manifest is the commit point: a commit is what it names once it is stored, and nothing it names may be
    missing or change at any moment afterwards, whenever the machine dies."""
    state = dict(before or {})
    problems: list[str] = []
    events = sorted([(o.begin, 0, o) for o in ops] + [(o.end, 1, o) for o in ops if o.end is not None],
                    key=lambda e: e[0])
    in_flight: set[int] = set()
    lease_written = False  # a writer's first operation takes the lease
    cache: dict[bytes, _Named] = {}

    def named(raw: bytes | None) -> "_Named | None":
        if raw is None:
            return None
        if raw not in cache:
            cache[raw] = _Named.of(raw, state)
        return cache[raw]

    for _, ending, op in events:
        if ending:
            in_flight.discard(op.n)
            if op.landed:
                if op.kind == "delete":
                    state.pop(op.key, None)
                else:
                    state[op.key] = op.data or b""
                if op.key == LEASE_KEY and op.kind != "delete":
                    lease_written = True
            continue
        current = [n for n in (named(state.get(MANIFEST_KEY)),
                               *(named(o.data) for o in ops if o.n in in_flight and o.key == MANIFEST_KEY))
                   if n is not None]
        busy = {o.key for o in ops if o.n in in_flight}
        in_flight.add(op.n)
        if op.key == MANIFEST_KEY and op.kind != "delete":
            new = _Named.of(op.data or b"", state, fresh=True)
            problems += [f"{op}: {p}" for p in new.problems]
            problems += [f"{op}: commit {new.commit} names {k}, whose write has not returned" for k in new.keys & busy]
            if not lease_written:
                problems.append(f"{op}: commit {new.commit} published with no write of the lease since the last")
            old = named(state.get(MANIFEST_KEY))
            if old is not None and new.commit not in (old.commit, old.commit + 1):
                problems.append(f"{op}: commit {new.commit} replaces commit {old.commit}")
            lease_written = False
            continue
        if op.key.startswith(COMMITS_PREFIX + "/") and op.kind != "delete":
            number = int(op.key.rsplit("/", 1)[-1].split(".")[0])
            got = named(state.get(MANIFEST_KEY))
            if got is None or got.commit != number:
                problems.append(f"{op}: commit object {number} written while the manifest holds "
                                f"{'no commit' if got is None else f'commit {got.commit}'}")
            if op.kind != "create":
                problems.append(f"{op}: commit object {number} written unconditionally (not only if absent)")
            continue
        for doc in current:
            why = doc.breaks(op, state)
            if why:
                problems.append(f"{op}: {why} (named by commit {doc.commit})")
    return problems


class _Named:
    """What one manifest names, read against the store's objects `state` (`problems`: what it names that is
    not there, or not what it records, when `fresh`: checked as the manifest is stored). A table's chunks are
    objects of their own (v2), or inner chunks of shards (v3): an object's records are by position in it (None:
    the object itself)."""

    def __init__(self, commit: int) -> None:
        self.commit = commit
        self.keys: set[str] = set()
        self.segments: set[str] = set()
        self.docs: dict[str, str] = {}  # a table's array document (`.zarray`, `zarr.json`) -> the table
        self.records: dict[str, dict[int | None, tuple[int, str]]] = {}  # object -> position -> (size, digest)
        self.tails: dict[str, tuple[str, int | None, int, str]] = {}  # object -> (table, position, rows, digest)
        self.owner: dict[str, str] = {}  # chunk object -> its table
        self.rows: dict[str, int] = {}  # table -> committed rows
        self.arrays: dict[str, Array] = {}  # table -> its array, as its document was then
        self.problems: list[str] = []

    @classmethod
    def of(cls, raw: bytes, state: Mapping[str, bytes], fresh: bool = False) -> "_Named":
        try:
            doc = parse(raw, MANIFEST_KEY)
        except Exception as exc:
            out = cls(-1)
            out.problems.append(f"a manifest that does not parse ({exc})")
            return out
        out = cls(int(doc["commit"]))
        out.keys.add(MANIFEST_KEY)
        out.rows = dict(doc["committed"])
        arrays = out.arrays
        if out.commit == 0 and not any(out.rows.values()):
            return out  # a create's commit names nothing yet: it comes before the group (`interrupted_create`)
        v3 = ZARR_JSON in state and ".zgroup" not in state
        out.keys.add(ZARR_JSON if v3 else ".zgroup")
        for t, n in out.rows.items():
            doc_key = f"{t}/{ZARR_JSON if v3 else '.zarray'}"
            out.keys.add(doc_key)
            out.docs[doc_key] = t
            raw_meta = state.get(doc_key)
            if raw_meta is None:
                out.problems.append(f"commit {out.commit} names table {t}, whose {doc_key} is not stored")
                continue
            arr = arrays[t] = Array.open(_store({doc_key: raw_meta}), t)
            if arr.shape[0] < n:
                out.problems.append(f"commit {out.commit} counts {n} rows of {t}, its {doc_key.split('/')[-1]} "
                                    f"holds {arr.shape[0]}")
            c = arr.chunks[0]
            for i in range(-(-n // c)):
                key, _ = _place(arr, i)
                out.keys.add(key)
                out.owner[key] = t
        for ref in doc.get("log") or []:
            out.keys.add(ref["key"])
            out.segments.add(ref["key"])
        whole = Segment()
        for ref in doc.get("log") or []:
            raw_segment = state.get(ref["key"])
            if raw_segment is None:
                out.problems.append(f"commit {out.commit} lists log segment {ref['key']}, which is not stored")
                continue
            try:
                whole = whole.then(Segment.from_json(raw_segment, ref["key"]))
            except Exception as exc:
                out.problems.append(f"commit {out.commit} lists log segment {ref['key']}, which is damaged ({exc})")
        for t, chunks in whole.chunks.items():
            for i, record in chunks.items():
                if record is not None and t in arrays:
                    key, position = _place(arrays[t], i)
                    out.records.setdefault(key, {})[position] = record
        for t, rows_digest_ in (doc.get(TAILS) or {}).items():
            if t in arrays:
                c = arrays[t].chunks[0]
                key, position = _place(arrays[t], out.rows[t] // c)
                out.tails[key] = (t, position, out.rows[t] % c, rows_digest_)
        if fresh:
            for key in sorted(out.keys - set(state)):
                if key not in out.segments and key != MANIFEST_KEY and key not in out.docs:
                    out.problems.append(f"commit {out.commit} names {key}, which is not stored")
            for key in sorted(set(out.records) | set(out.tails)):
                if key in state:
                    why = out.holds(key, state[key])
                    if why:
                        out.problems.append(f"commit {out.commit}: {key} {why}")
        return out

    def holds(self, key: str, data: bytes) -> str | None:
        """Why `data` cannot be the object `key` of this commit (None: it can): a chunk with other bytes than its
        log records, a shard without one of its recorded inner chunks as recorded, a last chunk without the
        committed rows its `tails` record."""
        table = self.owner.get(key)
        spec = self.arrays[table].sharding if table in self.arrays else None
        try:
            inner = spec.chunks(data) if spec is not None else {}
        except ValueError as exc:
            return f"does not decode as a shard ({exc})"
        for position, record in sorted(self.records.get(key, {}).items(), key=lambda p: -1 if p[0] is None else p[0]):
            got = data if position is None else inner.get(position)
            what = "" if position is None else f" in inner chunk {position}"
            if got is None:
                return f"does not hold its inner chunk {position}, which its log records"
            if (len(got), digest(got)) != tuple(record):
                return f"holds {len(got)} bytes, digest {digest(got)}{what}; its log records {record[0]}, {record[1]}"
        if key in self.tails:
            t, position, n, want = self.tails[key]
            chunk = data if position is None else inner.get(position)
            what = "" if position is None else f" of inner chunk {position}"
            if chunk is None:
                return f"does not hold its inner chunk {position}, whose {n} committed rows its tails record"
            try:
                got = rows_digest(self.arrays[t], key, None if chunk is None else bytes(chunk), n)
            except Exception as exc:
                return f"cannot be decoded ({exc})"
            if got != want:
                return f"does not hold the {n} committed rows{what} its tails record (digest {got}, recorded {want})"
        return None

    def breaks(self, op: Op, state: Mapping[str, bytes]) -> str | None:
        """Why `op` breaks this commit, while it is the manifest (None: it does not)."""
        if op.key not in self.keys:
            return None
        if op.kind == "delete":
            return f"deletes {op.key}"
        if op.key in self.segments:
            return f"rewrites log segment {op.key}"
        if op.key in self.docs:
            t = self.docs[op.key]
            try:
                shape = json.loads(op.data or b"")["shape"][0]
            except Exception as exc:
                return f"writes {op.key} that does not parse ({exc})"
            return f"shrinks {t} to {shape} rows below its {self.rows[t]} committed" if shape < self.rows[t] else None
        why = self.holds(op.key, op.data or b"")
        return f"rewrites {op.key}, which then {why}" if why else None


def _place(arr: Array, index: int) -> tuple[str, int | None]:
    """Where chunk `index` of `arr` is stored: (its object's key, its position in that shard; None: the object
    is the chunk's own)."""
    key, _, position = arr.chunk_key(index).partition("#")
    return key, int(position) if position else None


def _store(objects: Mapping[str, bytes]) -> MemoryStore:
    store = MemoryStore()
    store.data.update(objects)
    return store

