"""On an object store a commit survives the writer's machine dying, in the order the protocol
promises. The writer (in this process, workers=0) writes episodes by key to a `memory://` dataset, which takes
the object-store path (`FsspecStore`: one PUT per object, no renames, conditional creates) and whose every
store operation goes through the simulator of tests/support/object_store_crash.py; the machine dies at one of
those operations, chosen at random among all of them (seeded: a failure prints the seed and the operation; set
ZARRFEED_CRASH_SEED and ZARRFEED_CRASH_AT to replay it), the operation in flight landing or not (a few cases
run on a real S3 server too, moto on loopback, where s3fs's requests are the operations). A new writer
then opens what the store holds (the operations that returned, and the one in flight if it landed) and the same
episodes are sent again. Always: every acknowledged episode was committed, every committed chunk reads as written
before anything is sent again, the dataset then holds every episode once, in order (equal to one written in one
go), `validate` and `verify` pass, and the record of both writers
keeps the protocol's order (`order_problems`: chunks and log segments before the manifest that names them, the
lease written on the store before each manifest, the numbered commit object created only after its manifest,
nothing a manifest names deleted or changed). A control shows that check, and the whole test, failing on a
writer that publishes its manifest before its chunks. The same runs in zarr v3 with small shards, each written
again (one PUT of the whole shard) while it holds committed inner chunks; `order_problems` then reads each shard's
inner chunks, and its own controls show it flags a shard written again without one."""
import dataclasses
import json
import os
import random
import uuid
from typing import Any, Callable

import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from object_store_crash import ObjectStoreCrash, Op, S3Crash, order_problems
from power_loss import PowerLoss

from zarrfeed import Dataset, DatasetWriter
from zarrfeed.core import manifest_io as commits
from zarrfeed.core.manifest import MANIFEST_KEY
from zarrfeed.core.errors import ChunkError, FormatError
from zarrfeed.core.stores import FsspecStore
from zarrfeed.writer import lease as leases
from zarrfeed.writer import synthetic

CHUNKS = {"agents": 700, "frames": 40, "scenes": 3, "traffic_light_faces": 90}  # chunks shared, tails rewritten
EPISODES = [synthetic.episode(i, seed=37, frames=12, agents_per_frame=20) for i in range(10)]
ACK_EVERY = 3  # sync() after every third episode
CRASH_POINTS = int(os.environ.get("ZARRFEED_CRASH_POINTS", "60"))  # per seed, among all the store's operations
SEEDS = [int(s) for s in os.environ.get("ZARRFEED_CRASH_SEED", "1,2").split(",")]
REPLAY = [int(n) for n in os.environ.get("ZARRFEED_CRASH_AT", "").split(",") if n]  # these operations only
S3_CRASH_POINTS = int(os.environ.get("ZARRFEED_S3_CRASH_POINTS", "6"))  # on S3, with the first seed
# zarr v3: inner chunks small against their shards (agents 3 a shard, frames 25): each shard is written in parts,
# as episodes arrive, and holds committed inner chunks when it is written again
V3_CHUNKS = {"agents": 100, "frames": 10, "scenes": 2, "traffic_light_faces": 40}
V3 = {"zarr_format": 3, "shard_bytes": 35_000}
V3_SEED = int(os.environ.get("ZARRFEED_CRASH_SEED_V3", "3"))
LEASE_TIMEOUT = 600.0  # no heartbeat within a case: every run makes the same operations
SEGMENT_BYTES = 1 << 20  # not an object store's 16 MiB: six of them made and freed per writer cost seconds here


@dataclasses.dataclass
class Place:
    """Where a case writes: a dataset's URL, its storage options, and the simulator of its store (`sim(**kw)`:
    a new one, with `crash_at`, `seed` or `objects`); the chunk rows and zarr format of the dataset made there
    (`layout`: the writer's zarr_format and shard_bytes; none: v2)."""

    url: str
    options: dict
    sim: Callable[..., Any]
    chunks: dict = dataclasses.field(default_factory=lambda: CHUNKS)
    layout: dict = dataclasses.field(default_factory=dict)


@pytest.fixture
def place():
    """A `memory://` dataset of its own; fsspec's real memory store holds nothing of it afterwards (the
    simulator's objects are in a store of their own, put in place only while a case runs)."""
    url = f"memory://zarrfeed-crash-{uuid.uuid4().hex[:12]}/d.zarr"
    yield Place(url, {}, lambda **kw: ObjectStoreCrash(url, **kw))
    root = MemoryFileSystem._strip_protocol(url).rsplit("/", 1)[0]
    assert not [p for p in MemoryFileSystem.store if p.startswith(root + "/")]


def write(place: Place, acked: list[str], mode: str = "w") -> None:
    """Send EPISODES by key, acknowledging every ACK_EVERY with `sync()` (the keys acknowledged so far are in
    `acked` once `sync()` returns; all of them once `close()` returned)."""
    with DatasetWriter(place.url, workers=0, chunks=place.chunks, commit_interval=3600, mode=mode,
                       lease_timeout=LEASE_TIMEOUT, segment_bytes=SEGMENT_BYTES,
                       storage_options=place.options, **place.layout) as w:
        for i, ep in enumerate(EPISODES):
            w.submit(ep, key=f"e{i}")
            if i % ACK_EVERY == ACK_EVERY - 1:
                w.sync()
                acked[:] = [f"e{j}" for j in range(i + 1)]
    acked[:] = [f"e{j}" for j in range(len(EPISODES))]


def tables(place: Place) -> dict[str, np.ndarray]:
    ds = Dataset.open(place.url, storage_options=place.options)
    return {t: ds.read_rows(t, 0, ds.rows[t]) for t in ds.tables}


def crash(mp: pytest.MonkeyPatch, sim, run) -> None:
    """`run()` on the machine of `sim`, until it dies (or `run` returns); then the machine is gone: the leases
    its writers took are no longer held by a live process (their heartbeats stop, their tokens are not this
    process's any more), as after a restart, where a lease naming a dead process is taken over at once; and
    every request it sent has been answered."""
    taken: list[leases.Lease] = []
    init = leases.Lease.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        taken.append(self)

    sim.install(mp)
    mp.setattr(leases.Lease, "__init__", recorded)
    try:
        run()
    except PowerLoss:
        pass
    finally:
        sim.settle()
        for lease in taken:
            lease._stop.set()
            if lease._thread is not None:
                lease._thread.join(5)
            leases._live_tokens.discard(lease.holder.token)
            lease._backend = None
            lease.fence.close()


def recorded_run(place: Place, broken: Callable[[pytest.MonkeyPatch], None] | None = None):
    """Write EPISODES in one go on the simulated store (`broken`: with a broken writer); the tables written (None
    for a broken writer: they need not read) and the record of the store's operations."""
    with pytest.MonkeyPatch.context() as mp:
        sim = place.sim().install(mp)
        if broken:
            broken(mp)
        write(place, [])
        return (tables(place) if broken is None else None), sim.ops


@pytest.fixture(scope="module")
def reference():
    """The dataset written in one go on the simulated store, and the record of its operations."""
    url = f"memory://zarrfeed-crash-{uuid.uuid4().hex[:12]}/d.zarr"
    return recorded_run(Place(url, {}, lambda **kw: ObjectStoreCrash(url, **kw)))


@pytest.fixture(scope="module")
def reference_v3():
    """The same in zarr v3, with small shards."""
    url = f"memory://zarrfeed-crash-{uuid.uuid4().hex[:12]}/d.zarr"
    return recorded_run(Place(url, {}, lambda **kw: ObjectStoreCrash(url, **kw), V3_CHUNKS, V3))


def crash_and_restart(place: Place, crash_at: int, seed: int, expected: dict[str, np.ndarray],
                      check_order: bool = True, read_first: bool = True):
    """Write until the machine dies at request `crash_at`, restart on what the store holds and send every
    episode again; check what the module's docstring says (`check_order`: the record's order too;
    `read_first`: the committed rows read as written before anything is sent again)."""
    acked: list[str] = []
    sim = place.sim(crash_at=crash_at, seed=seed)
    with pytest.MonkeyPatch.context() as mp:
        crash(mp, sim, lambda: write(place, acked))
    assert sim.dead, "the machine never died"
    assert not (check_order and (problems := order_problems(sim.ops))), "\n".join(problems)
    objects = sim.durable()
    assert objects == sim.held(), "the record does not say what the store holds"

    restart = place.sim(objects=objects)
    with pytest.MonkeyPatch.context() as mp:
        restart.install(mp)
        if read_first and MANIFEST_KEY in objects and any(json.loads(objects[MANIFEST_KEY])["committed"].values()):
            ds = Dataset.open(place.url, storage_options=place.options)  # before anything is sent again: every
            for t, rows in expected.items():  # committed chunk reads as written
                assert ds.read_rows(t, 0, ds.rows[t]).tobytes() == rows[:ds.rows[t]].tobytes(), t
            assert ds.verify().ok
        if MANIFEST_KEY not in objects:  # no commit landed: nothing was acknowledged, the place is free
            assert acked == [], f"no manifest survived, yet {acked} were acknowledged"
            assert set(objects) <= {leases.LEASE_KEY}, f"no manifest, yet {sorted(objects)} are stored"
            write(place, [])
        else:
            with DatasetWriter(place.url, workers=0, chunks=place.chunks, mode="a", lease_timeout=LEASE_TIMEOUT,
                               segment_bytes=SEGMENT_BYTES, storage_options=place.options) as w:
                lost = [k for k in acked if not w.is_committed(k)]
                assert not lost, f"acknowledged episodes lost by the crash: {lost}"
                for i, ep in enumerate(EPISODES):  # the same episodes again: committed ones are passed over
                    w.submit(ep, key=f"e{i}")
        assert not (check_order and (problems := order_problems(restart.ops, objects))), \
            "after the restart:\n" + "\n".join(problems)
        got = tables(place)
        for t, rows in expected.items():
            assert got[t].tobytes() == rows.tobytes(), f"table {t}: not the episodes once each, in order"
        ds = Dataset.open(place.url, storage_options=place.options)
        report, verified = ds.validate(), ds.verify()  # `zarrfeed validate --deep`
        assert report.ok and verified.ok, (report, verified)
    return sim


def crash_at_points(place: Place, expected, ops: list[Op], seed: int, points: list[int],
                    clear: Callable[[], None] = lambda: None) -> set[bool]:
    """`crash_and_restart` at each of `points` (of the requests of the run without a crash, `ops`); a failure
    names the case and how to replay it. The fates of the requests in flight at the crashes."""
    fates = set()
    for crash_at in points:
        try:
            sim = crash_and_restart(place, crash_at, seed, expected)
        except BaseException as exc:
            first = next((o for o in ops if o.n == crash_at), None)
            test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
            raise AssertionError(f"crash at request {crash_at} of {ops[-1].n} ({first} in the run without a "
                                 f"crash; seed {seed}: ZARRFEED_CRASH_SEED={seed} ZARRFEED_CRASH_AT={crash_at} "
                                 f"pytest '{test}' replays it): {type(exc).__name__}: {exc}") from exc
        finally:
            clear()
        fates.add(sim.crashed().landed)
    return fates


def test_the_writers_record_keeps_the_commit_protocols_order(reference):
    """Without a crash: every manifest comes after what it names, the lease before each, the commit objects
    after theirs; and the record holds what the checks look for (so they are not vacuous)."""
    _, ops = reference
    assert not (problems := order_problems(ops)), "\n".join(problems)
    manifests = [o for o in ops if o.key == MANIFEST_KEY]
    assert len(manifests) >= 5
    assert any(o.kind == "create" and o.key.startswith("zarrfeed.commits/") for o in ops)
    assert any(o.kind == "create" and o.key == leases.LEASE_KEY for o in ops)
    assert any(o.kind == "delete" and o.key.startswith("zarrfeed.log/") for o in ops)  # merged segments
    assert sum(o.key == "agents/1" for o in ops) >= 2  # a last chunk rewritten as rows are appended


@pytest.mark.parametrize("seed", SEEDS)
def test_every_acknowledged_episode_survives_a_crash_at_any_store_operation(place, reference, seed):
    expected, ops = reference
    n = ops[-1].n
    points = REPLAY or sorted(random.Random(seed).sample(range(1, n + 1), min(CRASH_POINTS, n)))
    fates = crash_at_points(place, expected, ops, seed, points)
    if not REPLAY and len(points) >= 20:
        assert fates == {True, False}, "the request in flight should both land and not, across the cases"


def test_v3_shards_survive_a_crash_at_any_store_operation(place, reference_v3):
    """In zarr v3 with small shards: a shard that holds committed inner chunks is written again (one PUT of the
    whole shard) as rows arrive; a crash at any operation, the PUT in flight landing or not, keeps every committed
    inner chunk as its log records it (`order_problems` reads each shard's inner chunks)."""
    expected, ops = reference_v3
    assert not (problems := order_problems(ops)), "\n".join(problems)
    assert sum(o.key == "agents/c/2" for o in ops) >= 3  # a shard written in parts, across commits
    n = ops[-1].n
    points = REPLAY or sorted(random.Random(V3_SEED).sample(range(1, n + 1), min(CRASH_POINTS, n)))
    fates = crash_at_points(dataclasses.replace(place, chunks=V3_CHUNKS, layout=V3), expected, ops, V3_SEED, points)
    if not REPLAY and len(points) >= 20:
        assert fates == {True, False}, "the request in flight should both land and not, across the cases"


def test_on_s3_too(s3, reference):
    """The same on a real S3 server (moto, on 127.0.0.1): s3fs's requests are the operations, the lease and the
    numbered commits are conditional PUTs (`If-None-Match`, `If-Match`), a batch of PUTs is in flight at once.
    Fewer cases, each about 3 s: ZARRFEED_S3_CRASH_POINTS (default 6) with the first seed, one in each sixth of
    the requests."""
    on_s3(s3, reference, SEEDS[0])


def test_v3_shards_on_s3_too(s3, reference_v3):
    """The same in zarr v3: each shard is one PUT of the whole object, whatever its inner chunks."""
    on_s3(s3, reference_v3, V3_SEED, V3_CHUNKS, V3)


def on_s3(s3, reference, seed: int, chunks: dict = CHUNKS, layout: dict | None = None) -> None:
    bucket, server = s3
    url = f"{bucket}/d.zarr"
    options = {**server.options, "zarrfeed_timeout": 60}  # a loaded machine's moto is no store that stopped
    place = Place(url, options, lambda **kw: S3Crash(url, server.fs(), **kw), chunks, layout or {})

    def clear() -> None:
        fs = server.fs()
        if fs.find(url):
            fs.rm(url, recursive=True)

    expected, _ = reference
    got, ops = recorded_run(place)
    clear()
    assert all(got[t].tobytes() == rows.tobytes() for t, rows in expected.items())
    assert not (problems := order_problems(ops)), "\n".join(problems)
    assert any(o.kind == "replace" and o.key == leases.LEASE_KEY for o in ops)  # renewed with If-Match
    assert any(o.kind == "create" and o.key.startswith("zarrfeed.commits/") for o in ops)  # If-None-Match
    n, k, rng = ops[-1].n, min(S3_CRASH_POINTS, ops[-1].n), random.Random(seed)
    points = REPLAY or [rng.randrange(i * n // k, (i + 1) * n // k) + 1 for i in range(k)]
    crash_at_points(place, expected, ops, seed, points, clear)


def test_a_create_stopped_between_its_documents_is_finished(place, reference):
    """A create is its manifest (commit 0, no rows), then `.zgroup`, `.zattrs` and each table's
    `.zarray`, separate PUTs on an object store; the machine dying among them left `.zgroup` without every
    `.zarray`, which a writer appending refused ("table 'frames': missing from the dataset") where it finishes a
    create stopped before `.zgroup` (`dataset_format.interrupted_create`). Here it dies at the second `.zarray`."""
    expected, ops = reference
    second = [o for o in ops if o.key.endswith("/.zarray")][1]
    crash_and_restart(place, second.n, seed=1, expected=expected)


# ---------------------------------------------------------------------------- controls: the checks can fail
def publish_first(mp: pytest.MonkeyPatch) -> None:
    """A broken writer: its chunks' PUTs are held back (it reads them from where they are held) until the next
    manifest is stored, then sent."""
    held: dict[FsspecStore, dict[str, bytes]] = {}
    put_chunks, get_many, write_manifest = FsspecStore.put_chunks, FsspecStore.get_many, commits.write_manifest

    def later(store, values):
        held.setdefault(store, {}).update(values)

    def read(store, keys):
        mine = held.get(store, {})
        return {**get_many(store, [k for k in keys if k not in mine]), **{k: mine[k] for k in keys if k in mine}}

    def manifest_first(store, *args, **kwargs):
        write_manifest(store, *args, **kwargs)
        put_chunks(store, held.pop(store, {}))

    mp.setattr(FsspecStore, "put_chunks", later)
    mp.setattr(FsspecStore, "get_many", read)
    mp.setattr(commits, "write_manifest", manifest_first)


def drop_one(mp: pytest.MonkeyPatch) -> None:
    """A broken writer (or store): one chunk's PUT is lost, though it returned."""
    put_chunks = FsspecStore.put_chunks

    def lossy(store, values):
        put_chunks(store, {k: v for k, v in values.items() if k != "agents/0"})

    mp.setattr(FsspecStore, "put_chunks", lossy)


@pytest.mark.parametrize("broken", [publish_first, drop_one])
def test_the_order_check_flags_a_manifest_published_before_its_chunks(place, broken):
    _, ops = recorded_run(place, broken)
    problems = order_problems(ops)
    assert any("names agents/0, which is not stored" in p for p in problems), problems


def test_a_crash_finds_a_writer_that_publishes_before_its_chunks(place, reference):
    """The crash test fails on that writer even without the order check: the machine dying between its
    manifest and its chunks leaves a commit whose chunks are missing, which the read of the committed rows
    after the crash refuses, and so does a writer appending (here the machine dies at the second request after
    the first manifest with rows)."""
    expected, _ = reference
    _, ops = recorded_run(place, publish_first)
    first = next(o for o in ops if o.key == MANIFEST_KEY and b'"agents": 0' not in (o.data or b""))
    with pytest.MonkeyPatch.context() as mp:
        publish_first(mp)
        with pytest.raises(ChunkError, match="is missing, below the committed rows; the dataset is incomplete"):
            crash_and_restart(place, first.n + 2, seed=0, expected=expected, check_order=False)
        with pytest.raises(FormatError, match="is missing, below the .* rows committed; the dataset is damaged"):
            crash_and_restart(place, first.n + 2, seed=0, expected=expected, check_order=False, read_first=False)


def one_after_another(ops: list[Op]) -> list[Op]:
    """The operations in this order, each returning before the next begins (renumbered)."""
    return [dataclasses.replace(o, n=i + 1, begin=2 * i + 1, end=2 * i + 2) for i, o in enumerate(ops)]


def index(ops: list[Op], pred, after: int = -1) -> int:
    return next(i for i, o in enumerate(ops) if i > after and pred(o))


def manifest(commit: int):
    return lambda o: o.key == MANIFEST_KEY and json.loads(o.data)["commit"] == commit


def merged_segment_deleted_early(ops: list[Op]) -> list[Op]:
    """The segment merged into a new one deleted before the manifest that no longer lists it."""
    d = index(ops, lambda o: o.kind == "delete" and o.key.startswith("zarrfeed.log/"))
    m = max(i for i in range(d) if ops[i].key == MANIFEST_KEY)
    return ops[:m] + [ops[d]] + ops[m:d] + ops[d + 1:]


def commit_object_first(ops: list[Op]) -> list[Op]:
    """Commit object 1 created before manifest 1."""
    m, c = index(ops, manifest(1)), index(ops, lambda o: o.key == "zarrfeed.commits/0000000001.json")
    return ops[:m] + [ops[c]] + ops[m:c] + ops[c + 1:]


def no_lease_renewal(ops: list[Op]) -> list[Op]:
    """Manifest 2 stored without the lease written on the store since manifest 1."""
    m = index(ops, manifest(2))
    lease = max(i for i in range(m) if ops[i].key == leases.LEASE_KEY)
    return ops[:lease] + ops[lease + 1:]


def sealed_chunk_rewritten(ops: list[Op]) -> list[Op]:
    """A chunk whose rows are all committed, rewritten with other bytes."""
    m = index(ops, manifest(2))
    return ops[:m + 1] + [dataclasses.replace(ops[m], key="agents/0", data=b"other bytes")] + ops[m + 1:]


def tail_rewritten_without_its_rows(ops: list[Op]) -> list[Op]:
    """The last chunk of a table rewritten with bytes that do not hold the rows committed in it."""
    m = index(ops, manifest(1))
    zero = next(o for o in ops if o.key == "agents/0")
    return ops[:m + 1] + [dataclasses.replace(zero, key="agents/1")] + ops[m + 1:]


def array_shrunk(ops: list[Op]) -> list[Op]:
    """A table's .zarray rewritten with fewer rows than are committed."""
    m = index(ops, manifest(1))
    empty = next(o for o in ops if o.key == "agents/.zarray")  # as created: 0 rows
    return ops[:m + 1] + [empty] + ops[m + 1:]


def chunk_in_flight(ops: list[Op]) -> list[Op]:
    """A chunk's PUT still in flight when the manifest naming it is stored (the two overlap)."""
    ops = one_after_another(ops)
    m = index(ops, manifest(1))
    c = max(i for i in range(m) if ops[i].key == "agents/0")
    ops[c].end = ops[m].end + 0.5
    return ops


@pytest.mark.parametrize("disorder, said", [
    (merged_segment_deleted_early, "delete zarrfeed.log/0000000001-"),
    (commit_object_first, "commit object 1 written while the manifest holds commit 0"),
    (no_lease_renewal, "commit 2 published with no write of the lease since the last"),
    (sealed_chunk_rewritten, "rewrites agents/0, which then holds 11 bytes"),
    (tail_rewritten_without_its_rows, "agents/1, which then does not hold the 32 committed rows its tails record"),
    (array_shrunk, "shrinks agents to 0 rows below its 732 committed"),
    (chunk_in_flight, "commit 1 names agents/0, whose write has not returned"),
])
def test_the_order_check_flags_each_kind_of_disorder(reference, disorder, said):
    """Each rule of `order_problems`, broken in the record of the run without a crash."""
    _, ops = reference
    problems = order_problems(one_after_another(disorder(list(ops))) if disorder is not chunk_in_flight
                              else disorder(list(ops)))
    assert any(said in p for p in problems), problems


def committed(rows: int):
    return lambda o: o.key == MANIFEST_KEY and json.loads(o.data)["committed"]["agents"] >= rows


def sealed_inner_chunk_dropped(ops: list[Op]) -> list[Op]:
    """A shard rewritten, once a manifest records each of its inner chunks, with its first version (which held
    one of them)."""
    m = index(ops, committed(900))  # agents/c/2 holds rows 600-900
    first = next(o for o in ops if o.key == "agents/c/2")
    return ops[:m + 1] + [first] + ops[m + 1:]


def tail_inner_chunk_dropped(ops: list[Op]) -> list[Op]:
    """The shard of a table's last, partly filled inner chunk rewritten without it."""
    m = index(ops, committed(701))  # the last inner chunk is agents/c/2#1 (rows 700-800)
    first = next(o for o in ops if o.key == "agents/c/2")
    return ops[:m + 1] + [first] + ops[m + 1:]


@pytest.mark.parametrize("disorder, said", [
    (sealed_inner_chunk_dropped, "rewrites agents/c/2, which then does not hold its inner chunk 1, which its log"),
    (tail_inner_chunk_dropped, "rewrites agents/c/2, which then does not hold its inner chunk 1, whose 32 committed"),
])
def test_the_order_check_reads_the_inner_chunks_of_a_shard(reference_v3, disorder, said):
    """A control of the v3 crash test: a shard written again without a committed inner chunk is flagged."""
    _, ops = reference_v3
    assert json.loads(next(o for o in ops if committed(701)(o)).data)["committed"]["agents"] == 732
    problems = order_problems(one_after_another(disorder(list(ops))))
    assert any(said in p for p in problems), problems
