"""Episode keys: what makes an episode recognisable across crashes, retries and resumes.

A key is the caller's (a str or an int) or, by default, a `Position`: the episode's index in one ingest's
input together with that input's fingerprint (the digest of its first episode). Resume skips exactly the
committed keys, so the same input resumed after an append, a crash or another resume ends with every episode
exactly once, and an input whose first episode differs is recognised as another input.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Union

import numpy as np

_SAMPLE = 4096  # bytes read from each end of each table: a fingerprint costs microseconds, not a pass over the data


@dataclass(frozen=True, order=True)
class Position:
    """The default key: episode `index` of the ingest whose input has fingerprint `input`."""

    input: str
    index: int

    def __str__(self) -> str:  # messages speak of the episode's index in the user's input
        return str(self.index)


Key = Union[str, int, Position]


@functools.lru_cache(maxsize=256)
def _dtype_text(dtype: np.dtype) -> str:
    """str() of a record dtype, once per dtype: it costs as much as the rest of a fingerprint."""
    return str(dtype)


def fingerprint(episode: Any) -> str:
    """A 16-hex-digit digest of an episode: per table its name, dtype, row count and the first and last 4 KiB of
    its records. It tells different inputs apart (another seed, another source); it is not a checksum of every
    byte (that would cost a pass over the data on the writer's critical path)."""
    h = hashlib.blake2b(digest_size=8)
    if not isinstance(episode, Mapping):
        h.update(type(episode).__name__.encode())
        return h.hexdigest()
    for name in sorted(episode, key=str):
        arr = episode[name]
        kind = _dtype_text(arr.dtype) if isinstance(arr, np.ndarray) else getattr(arr, "dtype", type(arr).__name__)
        h.update(f"{name}|{kind}|{len(arr) if hasattr(arr, '__len__') else -1}".encode())
        if isinstance(arr, np.ndarray) and arr.nbytes:
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            h.update(raw[:_SAMPLE].tobytes())
            h.update(raw[-_SAMPLE:].tobytes())
    return h.hexdigest()


def check_key(key: Any) -> Key:
    """A caller's key must be a str or an int (they travel in JSON and across machines)."""
    if isinstance(key, Position) or (isinstance(key, (str, int)) and not isinstance(key, bool)):
        return key
    raise TypeError(f"an episode key is a str or an int, got {type(key).__name__} {key!r}")


def key_to_json(key: Key) -> Any:
    return {"input": key.input, "index": key.index} if isinstance(key, Position) else key


def key_from_json(doc: Any) -> Key:
    return Position(doc["input"], int(doc["index"])) if isinstance(doc, dict) else doc
