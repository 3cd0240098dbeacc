"""The codec chain of a zarr v3 array (a `zarr.json`'s `codecs`): how one chunk's values become the bytes stored,
and back, written by zarrfeed itself on numcodecs' compressors.

Written from the v3 specification (https://zarr-specs.readthedocs.io/en/latest/v3/codecs/index.html): a chain
is array->array codecs (`transpose`), exactly one array->bytes codec (`bytes`, with its `endian`, or
`sharding_indexed`: see `v3_sharding`), then bytes->bytes codecs (`blosc`, `gzip`, `zstd`, `crc32c`), decoded
in reverse. Chunks decode straight into the caller's buffer where the codecs allow it (zstd and blosc write
into it; a crc32c is checked in place), as `zarr_array.Array.decode_into` does for v2, so the loader's workers
decode into shared memory with no copy; a transpose or big-endian bytes cost one pass more.

Byte-compatible with zarr-python 3 (checked by tests/core/test_v3_codecs.py): a crc32c is the 4 bytes of the
Castagnoli CRC of what precedes it, appended little-endian. Refused in one line naming the document, the codec
and the field: unknown codecs, codecs out of order, bad configurations, a `transpose` before
`sharding_indexed` and bytes->bytes codecs after it (a whole-shard compression defeats reading one inner
chunk), nested sharding.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

import numcodecs
import numpy as np

from .blosc_frame import blosc_decoded_size
from .errors import FieldError, MetaError
from .v3_sharding import ShardingSpec

BLOSC_CNAMES = ("lz4", "lz4hc", "blosclz", "zstd", "snappy", "zlib")
BLOSC_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")  # numcodecs' 0, 1, 2
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"



def has_byte_order(dtype: np.dtype) -> bool:
    """Whether values of `dtype` have a byte order (a field of more than one byte that is not raw bytes), i.e.
    whether the `bytes` codec needs an `endian`."""
    if dtype.subdtype is not None:
        return has_byte_order(dtype.subdtype[0])
    if dtype.fields is not None:
        return any(has_byte_order(dtype.fields[n][0]) for n in dtype.names or ())
    return dtype.byteorder != "|"


# ---------------------------------------------------------------- checksums
def _python_crc32c() -> Callable[[Any], int]:
    """CRC-32C (Castagnoli) in plain Python: the fallback when neither google-crc32c nor crc32c is installed
    (slow, tens of MB/s; fine for shard indexes)."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)

    def crc(data: Any) -> int:
        c = 0xFFFFFFFF
        for b in bytes(data):
            c = table[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF
    return crc


def _crc32c_function() -> Callable[[Any], int]:
    """The fastest CRC-32C installed: google-crc32c (zarr-python 3's and numcodecs' choice, in C), crc32c, or
    plain Python."""
    try:
        import google_crc32c
        return google_crc32c.value  # type: ignore[no-any-return]
    except ImportError:
        pass
    try:
        import crc32c as package
        return package.crc32c  # type: ignore[no-any-return]
    except ImportError:
        return _python_crc32c()


_crc32c_of = _crc32c_function()


def crc32c(data: Any) -> int:
    """The CRC-32C (Castagnoli) of a bytes-like object, with no copy (google-crc32c takes bytes and numpy
    arrays, not memoryviews)."""
    return _crc32c_of(np.frombuffer(data, np.uint8))


# ---------------------------------------------------------------- bytes -> bytes codecs
@dataclass(frozen=True)
class BytesBytesCodec:
    """One bytes->bytes codec: its document (as parsed; what makes two equal) and the numcodecs codec that runs
    it (None: crc32c)."""

    doc: dict[str, Any] = field(hash=False)
    codec: Any = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return str(self.doc["name"])

    def encode(self, data: Any) -> Any:
        if self.codec is None:
            view = memoryview(data).cast("B")
            return bytes(view) + crc32c(view).to_bytes(4, "little")
        return self.codec.encode(data)

    def decode(self, data: memoryview) -> memoryview:
        """`data` decoded (a crc32c checked and cut off, with no copy); `ValueError` if it does not decode."""
        if self.codec is None:
            return _checked(data)
        if self.name == "blosc":
            blosc_decoded_size(data)
        try:
            out = self.codec.decode(data)
        except (RuntimeError, ValueError, TypeError, OSError, EOFError) as exc:
            raise ValueError(f"'{self.name}' cannot decode it ({type(exc).__name__}: {exc})") from None
        return memoryview(out).cast("B")

    def decode_into(self, data: memoryview, out: np.ndarray) -> None:
        """`data` decoded into `out`, straight into it with zstd and blosc; `ValueError` if it does not decode to
        exactly `out.nbytes` bytes."""
        if self.name not in ("blosc", "zstd"):
            _copy_exact(self.decode(data), out)
            return
        size = blosc_decoded_size(data) if self.name == "blosc" else _zstd_size(data)
        if size not in (None, out.nbytes):  # (both accept a larger `out` silently)
            raise ValueError(f"it decodes to {size} bytes, a chunk holds {out.nbytes}")
        try:
            self.codec.decode(data, out=out)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"'{self.name}' cannot decode it ({type(exc).__name__}: {exc})") from None


def _checked(data: memoryview) -> memoryview:
    """The bytes before a crc32c, checked against it (the 4 last bytes, little-endian)."""
    if len(data) < 4:
        raise ValueError(f"it is {len(data)} bytes, shorter than a crc32c checksum (4)")
    body, stored = data[:-4], int.from_bytes(data[-4:], "little")
    if crc32c(body) != stored:
        raise ValueError(f"crc32c checksum mismatch (stored {stored:#010x}, computed {crc32c(body):#010x})")
    return body


def _copy_exact(data: memoryview, out: np.ndarray) -> None:
    if len(data) != out.nbytes:
        raise ValueError(f"it decodes to {len(data)} bytes, a chunk holds {out.nbytes}")
    out[:] = np.frombuffer(data, np.uint8)


def _zstd_size(data: memoryview) -> int | None:
    """The content size a zstd frame header says, None where it does not say (numcodecs then checks the size
    decoded against the buffer's)."""
    head = bytes(data[:18])
    if len(head) < 6 or head[:4] != _ZSTD_MAGIC:
        return None
    descriptor = head[4]
    single = (descriptor >> 5) & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single else 0, 2, 4, 8)[descriptor >> 6]
    if width == 0 or len(head) < at + width:
        return None
    size = int.from_bytes(head[at:at + width], "little")
    return size + 256 if width == 2 else size


def _whole(value: Any, least: int, most: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least and (
        most is None or value <= most)


def _config(doc: dict[str, Any], allowed: set[str], required: Collection[str] = ()) -> dict[str, Any]:
    """A codec's configuration (absent: empty), with only `allowed` keys and every `required` one."""
    config = doc.get("configuration", {})
    if not isinstance(config, dict):
        raise FieldError("configuration", f"is {config!r}, not an object")
    extra, missing = set(config) - allowed, set(required) - set(config)
    if extra or missing:
        raise FieldError("configuration", f"is {config!r}: " + (f"keys {sorted(extra)} it does not have" if extra
                                                              else f"keys {sorted(missing)} missing"))
    return config


def _blosc(doc: dict[str, Any], dtype: np.dtype) -> Any:
    config = _config(doc, {"cname", "clevel", "shuffle", "typesize", "blocksize"}, {"cname", "clevel", "shuffle"})
    checks = {"cname": (lambda v: v in BLOSC_CNAMES, f"one of {list(BLOSC_CNAMES)}"),
              "clevel": (lambda v: _whole(v, 0, 9), "a whole number 0-9"),
              "shuffle": (lambda v: v in BLOSC_SHUFFLES, f"one of {list(BLOSC_SHUFFLES)}"),
              "typesize": (lambda v: _whole(v, 1), "a whole number >= 1"),
              "blocksize": (lambda v: _whole(v, 0), "a whole number >= 0")}
    for key, (ok, what) in checks.items():
        if key in config and not ok(config[key]):
            raise FieldError(key, f"is {config[key]!r}, not {what}")
    if config["shuffle"] != "noshuffle" and "typesize" not in config:
        raise FieldError("typesize", f"is missing, and shuffle '{config['shuffle']}' needs it")
    args = dict(cname=config["cname"], clevel=config["clevel"], shuffle=BLOSC_SHUFFLES.index(config["shuffle"]),
                blocksize=config.get("blocksize", 0))
    try:
        return numcodecs.Blosc(**args, typesize=config.get("typesize", 1))
    except TypeError:  # numcodecs < 0.16 takes the type size from the buffer's items (see `_typed`)
        return numcodecs.Blosc(**args)


def _zstd(doc: dict[str, Any], dtype: np.dtype) -> Any:
    config = _config(doc, {"level", "checksum"})
    if not _whole(config.get("level", 0), -131072, 22):
        raise FieldError("level", f"is {config['level']!r}, not a whole number from -131072 to 22")
    if not isinstance(config.get("checksum", False), bool):
        raise FieldError("checksum", f"is {config['checksum']!r}, not true or false")
    return numcodecs.Zstd(level=config.get("level", 0), checksum=config.get("checksum", False))


def _gzip(doc: dict[str, Any], dtype: np.dtype) -> Any:
    config = _config(doc, {"level"}, {"level"})
    if not _whole(config["level"], 0, 9):
        raise FieldError("level", f"is {config['level']!r}, not a whole number 0-9")
    return numcodecs.GZip(level=config["level"])


def _crc32c(doc: dict[str, Any], dtype: np.dtype) -> Any:
    _config(doc, set())
    return None


BYTES_BYTES = {"blosc": _blosc, "zstd": _zstd, "gzip": _gzip, "crc32c": _crc32c}


# ---------------------------------------------------------------- the chain
@dataclass(frozen=True)
class CodecChain:
    """A checked `codecs` list for chunks of `chunk_shape` values of `dtype`: transposes (each an axis order),
    the `bytes` codec's `endian` (None: not written, allowed where values have no byte order and for records,
    which zarr-python 3 writes so and reads as little-endian) or `sharding`, and the bytes->bytes codecs."""

    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    transposes: tuple[tuple[int, ...], ...] = ()
    endian: str | None = "little"
    sharding: ShardingSpec | None = None
    compressors: tuple[BytesBytesCodec, ...] = ()
    docs: tuple[dict[str, Any], ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def parse(cls, codecs: Any, dtype: np.dtype, chunk_shape: tuple[int, ...], where: str) -> "CodecChain":
        """A `codecs` list checked against the specification and what zarrfeed supports; `MetaError` naming
        `where`, the codec and the field otherwise."""
        dtype, chunk_shape = np.dtype(dtype), tuple(int(n) for n in chunk_shape)
        if not (isinstance(codecs, list) and codecs):
            raise MetaError(f"{where}: field 'codecs' is {codecs!r}, not a non-empty list of codecs")
        parts: dict[str, Any] = {"transposes": [], "compressors": [], "endian": None, "sharding": None}
        stage = 0  # 0: array->array, 1: array->bytes seen, then bytes->bytes
        for i, doc in enumerate(codecs):
            name = doc.get("name") if isinstance(doc, dict) else None
            try:
                stage = _one(doc, name, stage, parts, dtype, chunk_shape, where)
            except FieldError as exc:
                raise MetaError(f"{where}: codec {i} ({name!r}) in 'codecs': {exc}") from None
        if stage == 0:
            raise MetaError(f"{where}: field 'codecs' is {codecs!r}: no array->bytes codec ('bytes' or "
                            "'sharding_indexed')")
        if parts["sharding"] is not None and parts["compressors"]:
            raise MetaError(f"{where}: field 'codecs' has {[c.name for c in parts['compressors']]} after "
                            "'sharding_indexed'; zarrfeed reads shards whose inner chunks are compressed, not whole "
                            "shards (compress inside the sharding codec's 'codecs')")
        return cls(dtype, chunk_shape, tuple(parts["transposes"]), parts["endian"], parts["sharding"],
                   tuple(parts["compressors"]), tuple(copy.deepcopy(codecs)))

    @classmethod
    def default(cls, dtype: np.dtype, chunk_shape: tuple[int, ...], compressor: Any = None, *,
                crc32c: bool = False) -> "CodecChain":
        """The chain zarrfeed writes: `bytes` (little-endian where values have a byte order, as zarr-python 3
        writes it) and a compressor: zstd level 0 (zarr-python 3's default) for None, else a numcodecs
        `Blosc`, `Zstd` or `GZip` turned into its v3 codec; then a crc32c of the compressed bytes if asked."""
        dtype = np.dtype(dtype)
        docs = [bytes_json(dtype), compressor_json(compressor, dtype)]
        return cls.parse(docs + ([{"name": "crc32c"}] if crc32c else []), dtype, chunk_shape, "codecs")

    @classmethod
    def sharded(cls, dtype: np.dtype, shard_shape: tuple[int, ...], inner_shape: tuple[int, ...],
                compressor: Any = None, *, index_location: str = "end", crc32c: bool = False) -> "CodecChain":
        """A chain of one `sharding_indexed` codec as zarr-python 3 writes it: inner chunks of `inner_shape`
        encoded by `default(dtype, inner_shape, compressor, crc32c=crc32c)`, the index by `bytes` + `crc32c`."""
        inner = cls.default(dtype, inner_shape, compressor, crc32c=crc32c)
        doc = {"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(inner_shape), "codecs": inner.to_json(),
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": index_location}}
        return cls.parse([doc], dtype, shard_shape, "codecs")

    def to_json(self) -> list[dict[str, Any]]:
        """The `codecs` list (the inverse of `parse`)."""
        return copy.deepcopy(list(self.docs))

    # ------------------------------------------------------------ sizes
    @property
    def nbytes(self) -> int:
        """Bytes of one decoded chunk."""
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    def encoded_size(self) -> int | None:
        """Bytes of one encoded chunk where every codec keeps a fixed size (`bytes`, `transpose`, `crc32c`:
        a shard index), else None."""
        if self.sharding is not None or any(c.codec is not None for c in self.compressors):
            return None
        return self.nbytes + 4 * len(self.compressors)

    # ------------------------------------------------------------ decoding and encoding
    def _unsharded(self, what: str) -> None:
        if self.sharding is not None:
            raise TypeError(f"a sharded chain does not {what} a whole shard; see zarrfeed.core.v3_sharding")

    @property
    def _swapped(self) -> bool:
        return self.endian == "big" and has_byte_order(self.dtype)

    def decode_into(self, raw: bytes | memoryview, out: np.ndarray) -> None:
        """Decode one chunk's stored bytes into `out` (a writable, C-contiguous uint8 array of exactly one
        chunk's bytes, values native little-endian in C order): straight into `out` with zstd and blosc when
        there is no transpose and no big-endian; `ValueError` if the bytes do not decode to exactly one chunk or
        a crc32c does not match."""
        self._unsharded("decode")
        if out.dtype != np.uint8 or out.nbytes != self.nbytes or not out.flags.c_contiguous:
            raise ValueError(f"out is {out.dtype} of {out.nbytes} bytes, not contiguous uint8 of {self.nbytes}")
        direct = not self.transposes and not self._swapped
        target = out.reshape(-1) if direct else np.empty(self.nbytes, np.uint8)
        data = memoryview(raw).cast("B")
        for step in reversed(self.compressors[1:]):
            data = step.decode(data)
        if self.compressors:
            self.compressors[0].decode_into(data, target)
        else:
            _copy_exact(data, target)
        if not direct:
            self._arrange(target, out)

    def _arrange(self, stored: np.ndarray, out: np.ndarray) -> None:
        """The values as the `bytes` codec holds them (transposed, in its byte order) into `out`, in one pass."""
        shape = list(self.chunk_shape)
        for order in self.transposes:
            shape = [shape[a] for a in order]
        values = stored.view(self.dtype.newbyteorder(">") if self._swapped else self.dtype).reshape(shape)
        for order in reversed(self.transposes):
            values = values.transpose(np.argsort(order))
        out.view(self.dtype).reshape(self.chunk_shape)[...] = values

    def encode(self, values: np.ndarray) -> bytes:
        """One full chunk (C-contiguous values of the chain's dtype and chunk shape) encoded."""
        self._unsharded("encode")
        if values.dtype != self.dtype or values.shape != self.chunk_shape:
            raise ValueError(f"values are {values.dtype} {values.shape}, not a chunk of {self.dtype} "
                             f"{self.chunk_shape}")
        for order in self.transposes:
            values = values.transpose(order)
        stored = np.ascontiguousarray(values.astype(self.dtype.newbyteorder(">")) if self._swapped else values)
        data: Any = stored.reshape(-1).view(np.uint8)
        for step in self.compressors:
            data = step.encode(_typed(data, step))
        return bytes(data)


def _typed(data: Any, step: BytesBytesCodec) -> Any:
    """Bytes for Blosc as items of its type size where numcodecs takes the size from the buffer (< 0.16)."""
    size = step.doc.get("configuration", {}).get("typesize", 1) if step.name == "blosc" else 1
    if size in (2, 4, 8) and isinstance(data, np.ndarray) and data.nbytes % size == 0:
        return data.view(f"u{size}")
    return data


def _one(doc: Any, name: Any, stage: int, parts: dict[str, Any], dtype: np.dtype, chunk_shape: tuple[int, ...],
         where: str) -> int:
    """Check codec `doc` at its place in the chain (`stage`) and add it to `parts`; the stage after it."""
    if not isinstance(name, str) or set(doc) - {"name", "configuration", "must_understand"}:
        raise FieldError("name", f"is {name!r} in {doc!r}, not a codec ({{\"name\": ..., \"configuration\": ...}})")
    if name == "transpose":
        if stage:
            raise FieldError("name", "is 'transpose' after the array->bytes codec; array->array codecs come first")
        order = _config(doc, {"order"}, {"order"})["order"]
        if not (isinstance(order, list) and sorted(order) == list(range(len(chunk_shape)))
                and all(_whole(a, 0) for a in order)):
            raise FieldError("order", f"is {order!r}, not an order of the axes 0-{len(chunk_shape) - 1}")
        parts["transposes"].append(tuple(order))
        return 0
    if name in ("bytes", "sharding_indexed"):
        if stage:
            raise FieldError("name", f"is '{name}', a second array->bytes codec")
        if name == "bytes":
            parts["endian"] = _endian(doc, dtype)
        else:
            if parts["transposes"]:
                raise FieldError("name", "is 'sharding_indexed' after a 'transpose', which zarrfeed does not read "
                               "(transpose inside the sharding codec's 'codecs')")
            parts["sharding"] = ShardingSpec.parse(_config(doc, {"chunk_shape", "codecs", "index_codecs",
                                                                  "index_location"}, {"chunk_shape", "codecs"}),
                                                   dtype, chunk_shape, f"{where}: sharding_indexed", _inner)
        return 1
    if name not in BYTES_BYTES:
        raise FieldError("name", f"is '{name}', a codec zarrfeed does not know (it reads {['transpose', 'bytes']} + "
                       f"{sorted(BYTES_BYTES)} and 'sharding_indexed')")
    if not stage:
        raise FieldError("name", f"is '{name}' (bytes->bytes) before the array->bytes codec")
    parts["compressors"].append(BytesBytesCodec(doc, BYTES_BYTES[name](doc, dtype)))
    return 2


def _inner(codecs: Any, dtype: np.dtype, chunk_shape: tuple[int, ...], where: str) -> CodecChain:
    """An inner or index chain of a shard (not itself sharded)."""
    chain = CodecChain.parse(codecs, dtype, chunk_shape, where)
    if chain.sharding is not None:
        raise MetaError(f"{where}: a shard of shards, which zarrfeed does not read")
    return chain


def _endian(doc: dict[str, Any], dtype: np.dtype) -> str | None:
    endian = _config(doc, {"endian"}).get("endian")
    if endian not in (None, "little", "big"):
        raise FieldError("endian", f"is {endian!r}, not 'little' or 'big'")
    if endian is None and has_byte_order(dtype) and dtype.fields is None:
        raise FieldError("endian", f"is missing, and {dtype} values have a byte order")
    return endian


def bytes_json(dtype: np.dtype, endian: str = "little") -> dict[str, Any]:
    """The `bytes` codec as zarr-python 3 writes it: no configuration where values have no byte order."""
    if not has_byte_order(np.dtype(dtype)):
        return {"name": "bytes"}
    return {"name": "bytes", "configuration": {"endian": endian}}


def compressor_json(compressor: Any, dtype: np.dtype) -> dict[str, Any]:
    """A numcodecs compressor (None: zarr-python 3's default, zstd level 0) as its v3 codec."""
    if compressor is None:
        return {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
    config = compressor.get_config()
    if config["id"] == "blosc":
        shuffle = config.get("shuffle", 1)
        if shuffle == -1:  # numcodecs' AUTOSHUFFLE: bits for one-byte items, bytes otherwise
            shuffle = 2 if np.dtype(dtype).itemsize == 1 else 1
        return {"name": "blosc", "configuration": {
            "typesize": config.get("typesize") or np.dtype(dtype).itemsize, "cname": config["cname"],
            "clevel": config["clevel"], "shuffle": BLOSC_SHUFFLES[shuffle], "blocksize": config.get("blocksize", 0)}}
    if config["id"] == "zstd":
        return {"name": "zstd", "configuration": {"level": config.get("level", 0),
                                                  "checksum": bool(config.get("checksum", False))}}
    if config["id"] == "gzip":
        return {"name": "gzip", "configuration": {"level": config.get("level", 1)}}
    raise MetaError(f"compressor {config!r}: zarr v3 has no codec for it (use Blosc, Zstd or GZip)")
