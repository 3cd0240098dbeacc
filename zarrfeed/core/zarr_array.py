"""Zarr v2 arrays and groups in a `stores.Store`: what zarrfeed opens, creates and reads with, in place of
zarr-python (see `zarr_meta` for why).

An `Array` is its checked `.zarray` (`ArrayMeta`) plus where it lives; it reads and writes slices along its
first axis the way zarr 2 does (a chunk that was never stored reads as the fill value), so `ds["agents"][:10]`
works as it did. zarrfeed's own readers do not go through these slices: they read chunks themselves
(`chunks.read_rows`), where a missing chunk below the committed rows is an error, never fill values.
A `Group` is a folder with a `.zgroup`, its attributes and its members.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numcodecs
import numpy as np

from .stores import Store
from .errors import MetaError
from .v3_meta import ZARR_JSON, ArrayMetaV3, node_type
from .v3_shard_reads import EMPTY, inner_stored, read_indexes, read_inner_chunks
from .v3_sharding import ShardingSpec, assemble
from .zarr_meta import ZARRAY, ZATTRS, ZGROUP, ArrayMeta, V2Codecs, codec, group_problem, json_bytes, load_json

Meta = ArrayMeta | ArrayMetaV3  # an array's checked document, of either version


class Codecs(Protocol):
    """How one chunk's stored bytes decode into a caller's buffer, and a chunk's values encode."""

    def decode_into(self, raw: bytes | memoryview, out: np.ndarray) -> None: ...

    def encode(self, data: Any) -> bytes: ...


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


class Attributes:
    """An array's or group's `.zattrs`, read from the store at each access (another process may change it) and
    written back whole at each change."""

    def __init__(self, store: Store, key: str, read_only: bool = False, inside: bool = False) -> None:
        self.store, self.key, self.read_only = store, key, read_only
        self.inside = inside  # zarr v3: the field 'attributes' of the node's `zarr.json`, not a document

    def asdict(self) -> dict[str, Any]:
        raw = self.store.get(self.key)
        if raw is None:
            return {}
        doc = load_json(raw, self.key)
        if self.inside and isinstance(doc, dict):
            doc = doc.get("attributes", {})
        if not isinstance(doc, dict):
            raise MetaError(f"{self.key}: a JSON {type(doc).__name__}, not an object")
        return doc

    def __getitem__(self, name: str) -> Any:
        return self.asdict()[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.asdict().get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self.asdict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.asdict())

    def __len__(self) -> int:
        return len(self.asdict())

    def keys(self) -> Any:
        return self.asdict().keys()

    def items(self) -> Any:
        return self.asdict().items()

    def _write(self, doc: dict[str, Any]) -> None:
        if self.read_only:
            raise PermissionError(f"{self.key}: opened read-only")
        if self.inside:
            node = load_json(self.store[self.key], self.key)
            doc = {**node, "attributes": doc}
        self.store.put(self.key, json_bytes(doc))

    def __setitem__(self, name: str, value: Any) -> None:
        self.update({name: value})

    def update(self, other: Mapping[str, Any] | None = None, **more: Any) -> None:
        self._write({**self.asdict(), **dict(other or {}), **more})

    def __delitem__(self, name: str) -> None:
        doc = self.asdict()
        del doc[name]
        self._write(doc)

    def __repr__(self) -> str:
        return f"Attributes({self.asdict()!r})"


class Array:
    """A zarr array chunked along its first axis, v2 (`zarr_meta`) or v3 (`v3_meta`): its metadata says where
    each chunk is and how it is encoded; nothing else here depends on the version."""

    def __init__(self, store: Store, path: str, meta: Meta, read_only: bool = False) -> None:
        self.store, self.path, self.meta, self.read_only = store, path, meta, read_only
        # whether a chunk that is not stored reads as the fill value, as zarr reads it: for arrays that another
        # tool wrote, which may leave out a chunk that is all fill (zarr 3 does by default); zarrfeed's own
        # readers otherwise refuse it (below the committed rows a missing chunk is a lost one)
        self.missing_is_fill = False

    @classmethod
    def open(cls, store: Store, path: str, read_only: bool = False) -> "Array":
        """The array at `path`, v2 (`.zarray`) or v3 (`zarr.json`); `MetaError` naming its document if it is
        missing or not one zarrfeed reads."""
        key = _join(path, ZARRAY)
        docs = store.get_many([key, _join(path, ZARR_JSON)])
        if key in docs:
            return cls(store, path, ArrayMeta.parse(load_json(docs[key], key), key), read_only)
        key3 = _join(path, ZARR_JSON)
        if key3 in docs:
            doc = load_json(docs[key3], key3)
            if node_type(doc) == "group":
                raise MetaError(f"{key3}: a group, not an array")
            return cls(store, path, ArrayMetaV3.parse(doc, key3), read_only)
        raise MetaError(f"{key}: missing (no array at '{path}')")

    @classmethod
    def create(cls, store: Store, path: str, meta: Meta, attrs: Mapping[str, Any] | None = None) -> "Array":
        """Write a new array's documents (its chunks are written later) and open it. Its attributes come first
        (v2), or within its one document (v3): once the array is seen, they are there."""
        if isinstance(meta, ArrayMetaV3):
            meta = meta.with_attributes({**meta.attributes, **dict(attrs or {})})
            store.put_many({_join(path, ZARR_JSON): meta.to_bytes()})
            return cls(store, path, meta)
        docs = {_join(path, ZATTRS): json_bytes(dict(attrs))} if attrs else {}
        docs[_join(path, ZARRAY)] = meta.to_bytes()
        store.put_many(docs)
        return cls(store, path, meta)

    @property
    def zarr_format(self) -> int:
        return self.meta.zarr_format

    @property
    def doc_key(self) -> str:
        """The key of the array's metadata document (`.zarray`, or v3's `zarr.json`)."""
        return _join(self.path, ZARR_JSON if isinstance(self.meta, ArrayMetaV3) else ZARRAY)

    def __repr__(self) -> str:
        return f"<zarrfeed Array '{self.path}' {self.shape} {self.dtype}>"

    # ------------------------------------------------------------ what zarr-python's Array shows
    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.meta.chunks

    @property
    def dtype(self) -> np.dtype:
        return self.meta.dtype

    @property
    def ndim(self) -> int:
        return len(self.meta.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.meta.shape))

    @property
    def name(self) -> str:
        return "/" + self.path

    @property
    def table(self) -> str:
        """The name of the dataset's table this array holds (its path, unless read as another's records: see
        `core.record_view`), as commits, digests and messages name it."""
        return self.path

    @property
    def chunk_store(self) -> Store:
        return self.store

    @property
    def fill_value(self) -> Any:
        return self.meta.fill

    @cached_property
    def compressor(self) -> numcodecs.abc.Codec | None:
        if isinstance(self.meta, ArrayMetaV3):
            return self.meta.compressor()
        return codec(self.meta.compressor, _join(self.path, ZARRAY), "compressor")

    @cached_property
    def filters(self) -> list[numcodecs.abc.Codec] | None:
        if isinstance(self.meta, ArrayMetaV3):
            return None
        found = [codec(f, _join(self.path, ZARRAY), "filters") for f in self.meta.filters or []]
        return [f for f in found if f is not None] or None

    @cached_property
    def codecs(self) -> Codecs:
        """How one chunk (as `chunks` has it) decodes and encodes."""
        if isinstance(self.meta, ArrayMetaV3):
            return self.meta.codecs
        return V2Codecs(self.compressor, self.filters)

    @property
    def attrs(self) -> Attributes:
        if isinstance(self.meta, ArrayMetaV3):
            return Attributes(self.store, self.doc_key, self.read_only, inside=True)
        return Attributes(self.store, _join(self.path, ZATTRS), self.read_only)

    @property
    def nchunks(self) -> int:
        return self.meta.nchunks

    def _stored(self) -> dict[str, int]:
        """Every object stored under the array (its chunks in sub-folders too, with the '/' separator), by its
        name below the array -> bytes. Counted from a listing, so its cost grows with what is stored, not with
        the chunks the shape could hold (which may be 2**62 rows)."""
        nested = isinstance(self.meta, ArrayMetaV3) or (self.meta.dimension_separator == "/" and len(self.shape) > 1)
        return self.store.sizes(self.path, recursive=nested)

    @property
    def nchunks_initialized(self) -> int:
        """How many of its chunks (as `chunks` has them) are stored: chunk objects; in a sharded array, the inner
        chunks its shards hold, counted from each shard's index (one range request per shard), not shards times
        chunks per shard as zarr-python 3 counts them (a partly filled last shard, a chunk left out as all fill
        value, would count in full)."""
        stored = self._stored()
        sharding = self.sharding
        if sharding is None:
            return sum(self.meta.chunk_index(name) is not None for name in stored)
        first = {_join(self.path, name): i for name in stored if (i := self.meta.chunk_index(name)) is not None}
        count = 0
        for key, index in read_indexes(self.store, sharding, sorted(first)).items():
            if index is None:  # removed since it was listed
                continue
            present = ~((index[:, 0] == EMPTY) & (index[:, 1] == EMPTY))
            count += int(present[:max(self.meta.nchunks - first[key], 0)].sum())  # (none past the end)
        return count

    @property
    def nshards_initialized(self) -> int:
        """How many objects of its chunk grid are stored: its shards when it is sharded, else its chunks."""
        return sum(self.meta.chunk_index(name) is not None for name in self._stored())

    @property
    def nbytes_stored(self) -> int:
        """Bytes stored for the array: its documents and chunk objects, as the store holds them (a shard
        appended to keeps the bytes of chunks it rewrote: see `v3_sharding.assemble`)."""
        return sum(self._stored().values())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def chunk_key(self, index: int) -> str:
        """The name of chunk `index` along the first axis: its store key; for an inner chunk of a v3 shard, the
        shard's key and its place in the shard (`agents/c/3#5`), which messages, digests and caches name it by."""
        key = _join(self.path, self.meta.chunk_name(index))
        sharding = self.sharding
        return key if sharding is None else f"{key}#{index % sharding.inner_per_shard}"

    @property
    def sharding(self) -> ShardingSpec | None:
        return self.meta.sharding if isinstance(self.meta, ArrayMetaV3) else None

    def read_chunks(self, indices: Sequence[int]) -> list[bytes | None]:
        """The stored bytes of chunks `indices` (None for one not stored): one request per chunk object, all at
        once on an object store; from a sharded array, each shard's index and then only the inner chunks
        asked for, by range requests (`v3_shard_reads`)."""
        sharding = self.sharding
        if sharding is None:
            keys = [self.chunk_key(i) for i in indices]
            got = self.store.get_many(keys)
            return [got.get(k) for k in keys]
        per = sharding.inner_per_shard
        places = [(_join(self.path, self.meta.chunk_name(i)), i % per) for i in indices]
        return read_inner_chunks(self.store, sharding, places, self.table)

    def has_chunk(self, index: int) -> bool:
        """Whether chunk `index` is stored (in a sharded array: its shard is, and holds it)."""
        sharding = self.sharding
        if sharding is None:
            return self.chunk_key(index) in self.store
        key = _join(self.path, self.meta.chunk_name(index))
        return inner_stored(self.store, sharding, [(key, index % sharding.inner_per_shard)], self.table)[0]

    def write_new_chunks(self, chunks: Mapping[int, bytes]) -> list[str]:
        """Store encoded chunks that no commit names yet, leaving their bytes' durability to the commit that will
        (`Store.put_unsynced`); the keys it must sync. Not into a sharded array, whose shards other writes
        share (see `write_chunks`)."""
        if self.read_only:
            raise PermissionError(f"'{self.path}': opened read-only")
        if self.sharding is not None:
            raise ValueError(f"'{self.path}': a sharded array's chunks are written with write_chunks")
        return self.store.put_unsynced({self.chunk_key(i): data for i, data in chunks.items()})

    def write_chunks(self, chunks: Mapping[int, bytes], durable_later: bool = False) -> None:
        """Store encoded chunks (index -> bytes), each object atomically (`durable_later`: through
        `Store.put_chunks`, whose names the next commit makes durable). Into a sharded array, each shard they
        fall in is read and written back whole with them added, append-only (`v3_sharding.assemble`): the
        bytes of the chunks it held keep their places, so a reader holding its old index still finds them, and
        a crash leaves the old shard or the new one, never a mix."""
        if self.read_only:
            raise PermissionError(f"'{self.path}': opened read-only")
        put = self.store.put_chunks if durable_later else self.store.put_many
        sharding = self.sharding
        if sharding is None:
            put({self.chunk_key(i): data for i, data in chunks.items()})
            return
        per = sharding.inner_per_shard
        by_shard: dict[str, dict[int, bytes]] = {}
        for i, data in chunks.items():
            by_shard.setdefault(_join(self.path, self.meta.chunk_name(i)), {})[i % per] = data
        old = self.store.get_many(list(by_shard))
        put({key: assemble(sharding, old.get(key), inner) for key, inner in by_shard.items()})

    # ------------------------------------------------------------ chunks
    def decode_chunk(self, raw: bytes | None) -> np.ndarray:
        """One chunk, decoded (its full shape, as stored); fill values for None (never stored)."""
        shape = self.chunks if self.shape else ()
        out = np.zeros(shape, self.dtype)
        if raw is None:
            if self.meta.fill_value is not None:
                out[...] = self.fill_value
            return out
        self.decode_into(raw, out.reshape(-1).view(np.uint8))
        return out

    def decode_into(self, raw: bytes | memoryview, out: np.ndarray) -> None:
        """Decode one chunk's stored bytes into `out` (the uint8 bytes of one full chunk), through the array's
        codecs (`zarr_meta.V2Codecs`, `v3_codecs.CodecChain`). `ValueError` if the bytes do not decode to
        exactly one chunk."""
        self.codecs.decode_into(raw, out)

    def encode_chunk(self, chunk: np.ndarray) -> bytes:
        """One full chunk encoded as zarr does: the filters in order, then the compressor."""
        return self.encode_values(np.ascontiguousarray(chunk, self.dtype))

    def encode_values(self, data: Any) -> bytes:
        """A chunk's values (C-contiguous, of the array's own dtype and chunk shape) encoded as zarr does."""
        return self.codecs.encode(data)

    # ------------------------------------------------------------ slices along the first axis
    def _rows(self, key: Any) -> tuple[int, int, int, Any, bool]:
        """(start, stop, step, the rest of the index, whether the first index was a single row)."""
        if not isinstance(key, tuple):
            key = (key,)
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if any(k is Ellipsis for k in key):  # as many whole axes as the other indices leave (numpy's meaning)
            at = next(i for i, k in enumerate(key) if k is Ellipsis)
            axes = sum(k is not None for k in key) - 1
            key = key[:at] + (slice(None),) * max(len(self.shape) - axes, 0) + key[at + 1:]
        first, rest = (key[0], key[1:]) if key else (slice(None), ())
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            n = self.shape[0]
            i = int(first) + n if first < 0 else int(first)
            if not 0 <= i < n:
                raise IndexError(f"index {int(first)} is out of bounds for '{self.path}' of {n} rows")
            return i, i + 1, 1, rest, True
        if isinstance(first, slice):
            start, stop, step = first.indices(self.shape[0])
            return start, stop, step, rest, False
        raise TypeError(f"zarrfeed arrays take an int or a slice along the first axis, not {first!r}")

    def __getitem__(self, key: Any) -> Any:
        if not self.shape:
            return self.decode_chunk(self.store.get(self.chunk_key(0)))[()]
        start, stop, step, rest, single = self._rows(key)
        lo, hi = (start, stop) if step > 0 else (stop + 1, start + 1)
        out = self.read(lo, max(lo, hi))
        out = out[::step] if step > 0 else out[::-1][::-step]
        if single:
            out = out[0]
            return out[rest] if rest else out
        return out[(slice(None), *rest)] if rest else out

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) along the first axis; chunks never stored read as fill values."""
        out = np.empty((max(stop - start, 0), *self.shape[1:]), self.dtype)
        if stop <= start:
            return out
        c = self.chunks[0]
        indices = range(start // c, (stop - 1) // c + 1)
        for i, raw in zip(indices, self.read_chunks(list(indices)), strict=True):
            chunk = self.decode_chunk(raw)
            a, b = max(start, i * c), min(stop, (i + 1) * c)
            out[a - start:b - start] = chunk[a - i * c:b - i * c]
        return out

    def __setitem__(self, key: Any, value: Any) -> None:
        start, stop, step, rest, single = self._rows(key)
        if step != 1 or rest:
            raise TypeError("zarrfeed arrays are written by contiguous slices along the first axis")
        self.write(start, np.broadcast_to(np.asarray(value, self.dtype), (stop - start, *self.shape[1:])))

    def write(self, start: int, rows: np.ndarray) -> None:
        """Write `rows` at `start` along the first axis, within the shape: chunks wholly covered are encoded and
        stored; one partly covered is read, merged and written back (no lock: one writer at a time,
        docs/architecture.md#lease)."""
        if self.read_only:
            raise PermissionError(f"'{self.path}': opened read-only")
        stop = start + len(rows)
        if start < 0:
            raise IndexError(f"rows {start}-{stop} of '{self.path}': the first row is negative")
        if stop > self.shape[0]:
            raise IndexError(f"rows {start}-{stop} lie past the end of '{self.path}' ({self.shape[0]} rows)")
        c = self.chunks[0]
        out = {}
        for i in range(start // c, (stop - 1) // c + 1 if stop > start else start // c):
            a, b = max(start, i * c), min(stop, (i + 1) * c)
            if b - a == c:
                chunk = np.ascontiguousarray(rows[a - start:b - start])
            else:
                chunk = self.decode_chunk(self.read_chunks([i])[0]).copy()
                chunk[a - i * c:b - i * c] = rows[a - start:b - start]
            out[i] = self.encode_chunk(chunk)
        self.write_chunks(out)

    def resize(self, rows: int) -> None:
        """Set the length along the first axis; chunks wholly past a shorter end are deleted (as zarr does)."""
        if self.read_only:
            raise PermissionError(f"'{self.path}': opened read-only")
        old = self.meta.nchunks
        if isinstance(self.meta, ArrayMetaV3):  # its attributes live in the same document: keep the latest
            self.meta = self.meta.with_attributes(self.attrs.asdict())
        gone = {self.meta.chunk_name(i) for i in range(self.meta.resized(rows).nchunks, old)}
        self.meta = self.meta.resized(rows)
        self.store.put(self.doc_key, self.meta.to_bytes())
        # whole objects past the end go (a shard that still holds rows stays, its chunks past the end unread)
        kept = {self.meta.chunk_name(i) for i in range(max(self.meta.nchunks - 1, 0), self.meta.nchunks)}
        self.store.delete([_join(self.path, name) for name in sorted(gone - kept)])

    def append(self, rows: np.ndarray) -> None:
        """Rows added at the end (one writer at a time: docs/architecture.md#lease)."""
        start = self.shape[0]
        self.resize(start + len(rows))
        self.write(start, np.asarray(rows, self.dtype))


class Group:
    """A zarr group, v2 (a folder with `.zgroup` and `.zattrs`) or v3 (a folder with a `zarr.json` of node type
    "group", its attributes inside): attributes, arrays and groups."""

    def __init__(self, store: Store, path: str = "", read_only: bool = False, zarr_format: int = 2) -> None:
        self.store, self.path, self.read_only = store, path.strip("/"), read_only
        self.zarr_format = zarr_format

    @classmethod
    def open(cls, store: Store, path: str = "", read_only: bool = False) -> "Group":
        key, key3 = _join(path, ZGROUP), _join(path, ZARR_JSON)
        docs = store.get_many([key, key3])
        if key in docs:
            why = group_problem(load_json(docs[key], key))
            if why:
                raise MetaError(f"{key}: {why}")
            return cls(store, path, read_only)
        if key3 in docs:
            doc = load_json(docs[key3], key3)
            if node_type(doc) != "group":
                raise MetaError(f"{key3}: not a zarr v3 group document (zarr_format {_get(doc, 'zarr_format')!r}, "
                                f"node_type {_get(doc, 'node_type')!r})")
            return cls(store, path, read_only, zarr_format=3)
        raise MetaError(f"{key}: missing (no group at '{path or '/'}')")

    @classmethod
    def create(cls, store: Store, path: str = "", attrs: Mapping[str, Any] | None = None,
               zarr_format: int = 2) -> "Group":
        if zarr_format == 3:
            doc = {"zarr_format": 3, "node_type": "group", "attributes": dict(attrs or {})}
            store.put_many({_join(path, ZARR_JSON): json_bytes(doc)})
            return cls(store, path, zarr_format=3)
        docs = {_join(path, ZGROUP): json_bytes({"zarr_format": 2})}
        if attrs:
            docs[_join(path, ZATTRS)] = json_bytes(dict(attrs))
        store.put_many(docs)
        return cls(store, path)

    def __repr__(self) -> str:
        return f"<zarrfeed Group '{self.path or '/'}'>"

    @property
    def name(self) -> str:
        return "/" + self.path

    @property
    def attrs(self) -> Attributes:
        if self.zarr_format == 3:
            return Attributes(self.store, _join(self.path, ZARR_JSON), self.read_only, inside=True)
        return Attributes(self.store, _join(self.path, ZATTRS), self.read_only)

    def _members(self) -> dict[str, str]:
        """Each member's name -> "array" or "group" (of either version)."""
        names = self.store.listdir(self.path)
        keys = [_join(_join(self.path, n), d) for n in names for d in (ZARRAY, ZGROUP, ZARR_JSON)]
        docs = self.store.get_many(keys)
        out = {}
        for n in names:
            at = _join(self.path, n)
            if _join(at, ZARRAY) in docs:
                out[n] = "array"
            elif _join(at, ZGROUP) in docs:
                out[n] = "group"
            elif _join(at, ZARR_JSON) in docs:
                kind = node_type(_loads(docs[_join(at, ZARR_JSON)]))
                if kind is not None:
                    out[n] = kind
        return out

    def array_keys(self) -> list[str]:
        return [n for n, kind in self._members().items() if kind == "array"]

    def group_keys(self) -> list[str]:
        return [n for n, kind in self._members().items() if kind == "group"]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        at = _join(self.path, name.strip("/"))
        return any(_join(at, d) in self.store for d in (ZARRAY, ZGROUP, ZARR_JSON))

    def __getitem__(self, name: str) -> "Array | Group":
        path = _join(self.path, name.strip("/"))
        docs = self.store.get_many([_join(path, d) for d in (ZARRAY, ZGROUP, ZARR_JSON)])
        if _join(path, ZARRAY) in docs:
            return Array.open(self.store, path, self.read_only)
        if _join(path, ZGROUP) in docs:
            return Group.open(self.store, path, self.read_only)
        if _join(path, ZARR_JSON) in docs:
            kind = node_type(_loads(docs[_join(path, ZARR_JSON)]))
            if kind == "array":
                return Array.open(self.store, path, self.read_only)
            if kind == "group":
                return Group.open(self.store, path, self.read_only)
        raise KeyError(name)

    def create_array(self, name: str, meta: Meta, attrs: Mapping[str, Any] | None = None) -> Array:
        return Array.create(self.store, _join(self.path, name), meta, attrs)

    def require_group(self, name: str) -> "Group":
        path = _join(self.path, name.strip("/"))
        if _join(path, ZGROUP) in self.store:
            return Group(self.store, path, self.read_only)
        if _join(path, ZARR_JSON) in self.store:
            return Group.open(self.store, path, self.read_only)
        return Group.create(self.store, path, zarr_format=self.zarr_format)

    def consolidated_docs(self) -> dict[str, Any]:
        """Every v2 metadata document below this group (key -> parsed JSON), for `.zmetadata`."""
        names = [k for k in self.store.keys() if k.rsplit("/", 1)[-1] in (ZARRAY, ZGROUP, ZATTRS)]
        return {k: load_json(v, k) for k, v in self.store.get_many(names).items()}


def _loads(raw: bytes) -> Any:
    try:
        return load_json(raw, ZARR_JSON)
    except MetaError:
        return None


def _get(doc: Any, name: str) -> Any:
    return doc.get(name) if isinstance(doc, dict) else None
