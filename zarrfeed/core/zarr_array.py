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
from typing import Any, Iterator, Mapping

import numcodecs
import numpy as np

from .stores import Store
from .errors import MetaError
from .zarr_meta import ZARRAY, ZATTRS, ZGROUP, ArrayMeta, codec, group_problem, json_bytes, load_json


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


class Attributes:
    """An array's or group's `.zattrs`, read from the store at each access (another process may change it) and
    written back whole at each change."""

    def __init__(self, store: Store, key: str, read_only: bool = False) -> None:
        self.store, self.key, self.read_only = store, key, read_only

    def asdict(self) -> dict[str, Any]:
        raw = self.store.get(self.key)
        if raw is None:
            return {}
        doc = load_json(raw, self.key)
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
    """A zarr v2 array chunked along its first axis (see `zarr_meta` for what is supported)."""

    def __init__(self, store: Store, path: str, meta: ArrayMeta, read_only: bool = False) -> None:
        self.store, self.path, self.meta, self.read_only = store, path, meta, read_only
        # whether a chunk that is not stored reads as the fill value, as zarr reads it: for arrays that another
        # tool wrote, which may leave out a chunk that is all fill (zarr 3 does by default); zarrfeed's own
        # readers otherwise refuse it (below the committed rows a missing chunk is a lost one)
        self.missing_is_fill = False

    @classmethod
    def open(cls, store: Store, path: str, read_only: bool = False) -> "Array":
        """The array at `path`; `MetaError` naming its `.zarray` if it is missing or not one zarrfeed reads."""
        key = _join(path, ZARRAY)
        raw = store.get(key)
        if raw is None:
            raise MetaError(f"{key}: missing (no array at '{path}')")
        return cls(store, path, ArrayMeta.parse(load_json(raw, key), key), read_only)

    @classmethod
    def create(cls, store: Store, path: str, meta: ArrayMeta, attrs: Mapping[str, Any] | None = None) -> "Array":
        """Write a new array's documents (its chunks are written later) and open it. Its attributes come first:
        once the array is seen, they are there."""
        docs = {_join(path, ZATTRS): json_bytes(dict(attrs))} if attrs else {}
        docs[_join(path, ZARRAY)] = meta.to_bytes()
        store.put_many(docs)
        return cls(store, path, meta)

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
        return codec(self.meta.compressor, _join(self.path, ZARRAY), "compressor")

    @cached_property
    def filters(self) -> list[numcodecs.abc.Codec] | None:
        found = [codec(f, _join(self.path, ZARRAY), "filters") for f in self.meta.filters or []]
        return [f for f in found if f is not None] or None

    @property
    def attrs(self) -> Attributes:
        return Attributes(self.store, _join(self.path, ZATTRS), self.read_only)

    @property
    def nchunks(self) -> int:
        return self.meta.nchunks

    def _stored(self) -> dict[str, int]:
        """Every object stored under the array (its chunks in sub-folders too, with the '/' separator), by its
        name below the array -> bytes. Counted from a listing, so its cost grows with what is stored, not with
        the chunks the shape could hold (which may be 2**62 rows)."""
        nested = self.meta.dimension_separator == "/" and len(self.shape) > 1
        return self.store.sizes(self.path, recursive=nested)

    @property
    def nchunks_initialized(self) -> int:
        """How many of its chunks are stored."""
        return sum(self.meta.chunk_index(name) is not None for name in self._stored())

    @property
    def nbytes_stored(self) -> int:
        """Bytes stored for the array: its documents and chunks."""
        return sum(self._stored().values())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def chunk_key(self, index: int) -> str:
        """The store key of chunk `index` along the first axis."""
        return _join(self.path, self.meta.chunk_name(index))

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

    def decode_into(self, raw: bytes, out: np.ndarray) -> None:
        """Decode one chunk's stored bytes into `out` (the uint8 bytes of one full chunk): the compressor, then
        the filters in reverse, as zarr does. With a Blosc compressor and no filters Blosc writes straight into
        `out`, with no intermediate copy (the loader's workers decode into shared memory this way).
        `ValueError` if the bytes do not decode to exactly one chunk."""
        comp = self.compressor
        if isinstance(comp, numcodecs.Blosc) and not self.filters:
            # Blosc accepts a larger `out` silently; its 16-byte header says the decoded size (bytes 4-8)
            header = bytes(memoryview(raw)[:16])
            if len(header) < 16:
                raise ValueError(f"it is {len(raw)} bytes, shorter than a Blosc header (16)")
            size = int.from_bytes(header[4:8], "little")
            if size != out.nbytes:
                raise ValueError(f"it decodes to {size} bytes, a chunk holds {out.nbytes}")
            comp.decode(raw, out=out)
            return
        data: Any = comp.decode(raw) if comp else raw
        for f in reversed(self.filters or []):
            data = f.decode(data)
        flat = np.frombuffer(memoryview(data).cast("B"), np.uint8) if not isinstance(data, np.ndarray) else data
        if flat.nbytes != out.nbytes:
            raise ValueError(f"it decodes to {flat.nbytes} bytes, a chunk holds {out.nbytes}")
        out[:] = flat.reshape(-1).view(np.uint8)

    def encode_chunk(self, chunk: np.ndarray) -> bytes:
        """One full chunk encoded as zarr does: the filters in order, then the compressor."""
        return self.encode_values(np.ascontiguousarray(chunk, self.dtype))

    def encode_values(self, data: Any) -> bytes:
        """A chunk's values (C-contiguous, of the array's own dtype and chunk shape) encoded as zarr does."""
        for f in self.filters or []:
            data = f.encode(data)
        return bytes(self.compressor.encode(data)) if self.compressor else bytes(np.asarray(data).tobytes())

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
        raws = self.store.get_many([self.chunk_key(i) for i in indices])
        for i in indices:
            chunk = self.decode_chunk(raws.get(self.chunk_key(i)))
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
                chunk = self.decode_chunk(self.store.get(self.chunk_key(i))).copy()
                chunk[a - i * c:b - i * c] = rows[a - start:b - start]
            out[self.chunk_key(i)] = self.encode_chunk(chunk)
        self.store.put_many(out)

    def resize(self, rows: int) -> None:
        """Set the length along the first axis; chunks wholly past a shorter end are deleted (as zarr does)."""
        if self.read_only:
            raise PermissionError(f"'{self.path}': opened read-only")
        old = self.meta.nchunks
        self.meta = self.meta.resized(rows)
        self.store.put(_join(self.path, ZARRAY), self.meta.to_bytes())
        self.store.delete([self.chunk_key(i) for i in range(self.meta.nchunks, old)])

    def append(self, rows: np.ndarray) -> None:
        """Rows added at the end (one writer at a time: docs/architecture.md#lease)."""
        start = self.shape[0]
        self.resize(start + len(rows))
        self.write(start, np.asarray(rows, self.dtype))


class Group:
    """A zarr v2 group: a folder with `.zgroup`, attributes, arrays and groups."""

    def __init__(self, store: Store, path: str = "", read_only: bool = False) -> None:
        self.store, self.path, self.read_only = store, path.strip("/"), read_only

    @classmethod
    def open(cls, store: Store, path: str = "", read_only: bool = False) -> "Group":
        key = _join(path, ZGROUP)
        raw = store.get(key)
        if raw is None:
            raise MetaError(f"{key}: missing (no group at '{path or '/'}')")
        why = group_problem(load_json(raw, key))
        if why:
            raise MetaError(f"{key}: {why}")
        return cls(store, path, read_only)

    @classmethod
    def create(cls, store: Store, path: str = "", attrs: Mapping[str, Any] | None = None) -> "Group":
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
        return Attributes(self.store, _join(self.path, ZATTRS), self.read_only)

    def _members(self, doc: str) -> list[str]:
        return [n for n in self.store.listdir(self.path) if _join(_join(self.path, n), doc) in self.store]

    def array_keys(self) -> list[str]:
        return self._members(ZARRAY)

    def group_keys(self) -> list[str]:
        return self._members(ZGROUP)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(_join(_join(self.path, name), d) in self.store for d in (ZARRAY, ZGROUP))

    def __getitem__(self, name: str) -> "Array | Group":
        path = _join(self.path, name.strip("/"))
        if _join(path, ZARRAY) in self.store:
            return Array.open(self.store, path, self.read_only)
        if _join(path, ZGROUP) in self.store:
            return Group.open(self.store, path, self.read_only)
        raise KeyError(name)

    def create_array(self, name: str, meta: ArrayMeta, attrs: Mapping[str, Any] | None = None) -> Array:
        return Array.create(self.store, _join(self.path, name), meta, attrs)

    def require_group(self, name: str) -> "Group":
        path = _join(self.path, name.strip("/"))
        if _join(path, ZGROUP) in self.store:
            return Group(self.store, path, self.read_only)
        return Group.create(self.store, path)

    def consolidated_docs(self) -> dict[str, Any]:
        """Every metadata document below this group (key -> parsed JSON), for `.zmetadata`."""
        names = [k for k in self.store.keys() if k.rsplit("/", 1)[-1] in (ZARRAY, ZGROUP, ZATTRS)]
        return {k: load_json(v, k) for k, v in self.store.get_many(names).items()}
