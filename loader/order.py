"""zarrfeed's epoch order: a permutation of [0, n) that zarrfeed specifies, so that no numpy upgrade, build
or machine can change which rows an epoch visits in which order.

NumPy promises `Generator`'s streams only on the same build, environment and machine (NEP 19), and the
loader's orders came from it: a run resumed after an upgrade could skip or repeat rows with exit 0. This
order is arithmetic on 64-bit integers, specified here:

- the key of (seed, epoch, stream): k = mix(mix(mix(TAG ^ seed) ^ epoch) ^ stream), where mix is SplitMix64's
  finaliser and `stream` is a window's number (or CHUNKS for the order of the chunks);
- `next` is SplitMix64's output stream from state k: state += 0x9E3779B97F4A7C15, output mix(state);
- Fisher-Yates from the end: for i = n - 1 down to 1, swap elements i and j, j = (next * (i + 1)) >> 64.

Random access is by window: the rows at any positions of an epoch, or the positions of any rows, are found
by making only the orders of the windows they fall in (`EpochPlan.row_at`, `position_of`), never the epoch's
whole order, and nothing before them is replayed. A keyed bijection (a Feistel network with cycle walking, as
Grain's index_shuffle) was measured first: 4 rounds correlated an order with its identity at 3x a random
permutation's spread (0.0095 against 0.0032 at n = 100,000) and small domains badly (-0.16 instead of -0.07
between neighbours at n = 16); 6 rounds fixed the first but cost 17.5 ns per element against 10 for a
window's order before. Fisher-Yates is exactly uniform given its generator and takes 2.5 ns per element
(numpy's shuffle: 11; the C shuffle this replaces: 10).

The version of this algorithm is `VERSION`; loader states and remote tickets carry it. The C extension
`loader._order` (built at install) computes it; where it is missing, Python integers give the same numbers,
at about 800 ns per element (tests/test_order.py holds both to stored golden orders).
"""
from __future__ import annotations

import operator

import numpy as np

try:
    from . import _order  # type: ignore[attr-defined]  # the C extension, built at install
except ImportError:
    _order = None

VERSION = 1  # 0: the orders of numpy's Generator (zarrfeed before this module)
TAG = 0x7A61_7266_6565_6431  # "zarfeed1"
CHUNKS = (1 << 64) - 1  # the stream of the chunk order (windows are 0, 1, ...)
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: int) -> int:
    x &= _M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def key(seed: int, epoch: int, stream: int) -> int:
    """The order's key for (seed, epoch, stream), all >= 0 and below 2**64."""
    seed, epoch, stream = (integer(v, name) for name, v in (("seed", seed), ("epoch", epoch), ("stream", stream)))
    return _mix(_mix(_mix(TAG ^ seed) ^ epoch) ^ stream)


def integer(value: object, name: str, most: int = _M64) -> int:
    """`value` as a Python int in [0, most] (numpy integers included, bools and floats refused), or one line."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = operator.index(value)  # type: ignore[arg-type]
    if not 0 <= v <= most:
        raise ValueError(f"{name} must be in [0, {most + 1}), got {v}")
    return v


def permutation(n: int, seed: int, epoch: int, stream: int) -> np.ndarray:
    """The order of 0..n-1 for (seed, epoch, stream): an int64 array holding each once."""
    return shuffle(np.arange(n, dtype=np.int64), seed, epoch, stream)


def shuffle(a: np.ndarray, seed: int, epoch: int, stream: int) -> np.ndarray:
    """`a` (a C-contiguous int64 array) put in the order of (seed, epoch, stream), in place, and returned:
    `a[permutation(len(a), ...)]` without making the permutation (the swaps do not depend on the contents)."""
    if a.dtype != np.int64 or a.ndim != 1 or not a.flags.c_contiguous or not a.flags.writeable:
        raise TypeError("order: shuffle takes a writeable C-contiguous 1-D int64 array")
    k = key(seed, epoch, stream)
    if _order is not None:
        _order.shuffle(a, k)
        return a
    items, state = a.tolist(), k
    for i in range(len(items) - 1, 0, -1):
        state = (state + _GOLDEN) & _M64
        j = (_mix(state) * (i + 1)) >> 64
        items[i], items[j] = items[j], items[i]
    a[:] = items
    return a


def inverse(order: np.ndarray) -> np.ndarray:
    """Where each of 0..n-1 comes in `order`: inverse(order)[order[p]] == p."""
    where = np.empty(len(order), np.int64)
    where[order] = np.arange(len(order))  # stored as int64 whatever arange gives
    return where
