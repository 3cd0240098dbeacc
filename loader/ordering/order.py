"""zarrfeed's epoch order: a permutation of [0, n) that zarrfeed specifies, so that no numpy upgrade, build
or machine can change which rows an epoch visits in which order (docs/architecture.md#order).

NumPy promises `Generator`'s streams only on the same build, environment and machine (NEP 19): an order
drawn from it could make a run resumed after an upgrade skip or repeat rows with exit 0. This order is
arithmetic on 64-bit integers, specified here:

- the key of (seed, epoch, stream): k = mix(mix(mix(TAG ^ seed) ^ epoch) ^ stream), where mix is SplitMix64's
  finaliser and `stream` is a window's number (or CHUNKS for the order of the chunks);
- `next` is SplitMix64's output stream from state k: state += 0x9E3779B97F4A7C15, output mix(state);
- Fisher-Yates from the end: for i = n - 1 down to 1, swap elements i and j, j = (next * (i + 1)) >> 64.

Random access is by window: the rows at any positions of an epoch, or the positions of any rows, are found
by making only the orders of the windows they fall in (`EpochPlan.row_at`, `position_of`), never the epoch's
whole order, and nothing before them is replayed. Not a keyed bijection (a Feistel network with cycle
walking, as Grain's index_shuffle): with few rounds it correlates an order with its identity and mixes small
domains badly, and with enough rounds it costs more per element than Fisher-Yates, which is exactly uniform
given its generator and a few ns per element (bench/bench_order.py measures it against numpy's).

Order 2 (stratified, the default) orders a window's rows so that every stretch of the
epoch holds each chunk's rows in proportion to its size, as a uniform shuffle only does on average, and
costs no pass over the whole window (a window may be the whole table). For a window of chunks
j = 0..m-1 (in the chunk order) with s_j rows each, S in all:

- the window is cut into T = ceil(S / BLOCK_ROWS) blocks; block t takes from chunk j its rows numbered
  v = floor(t * s_j / T) .. floor((t + 1) * s_j / T) - 1, so each block holds every chunk in proportion;
- chunk j's row numbered v is row (a_j * v + b_j) mod s_j of the chunk: a_j coprime to s_j (a bijection), so
  the rows a block takes are spread over the whole chunk, a different set every epoch. `strata` draws b_j and
  a_j for each chunk in turn from the stream of key(seed, epoch, STRATA + window): b_j = (next * s_j) >> 64,
  then candidates a_j = 1 + ((next * (s_j - 1)) >> 64), up to 64 of them, taking the first coprime to s_j
  whose multiples k * a_j (k = 1..256, below s_j) all stay s_j / (16 k) or more from a multiple of s_j (else
  the first coprime one, else 1; chunks of fewer than 64 rows skip the spacing test): a block's share of a
  chunk is then spread over it, never a few tight runs (about half of all multipliers pass);
- the block's rows (chunk 0's first) are then shuffled by Fisher-Yates as above with
  key(seed, epoch, BLOCKS + window * 2**32 + t).

A batch is a stretch of a block or two: with the whole table in one window, a batch of 4,096 rows from 100
chunks holds rows of all 100 (bench/bench_shuffle.py: every batch, as a uniform shuffle's), and its rows are read from
the decoded chunks directly (no permuted copy). Each block's order is made on its own (a few ns a row, in
L2-sized pieces), so workers fill a window's index in parallel and random access needs one block.

The version of the algorithm is `VERSION`; loader states and remote tickets carry it and both orders stay
available (`ORDERS`: a state saved with order 1 resumes in order 1). The C extension `loader._order` (built
at install) computes them; where it is missing, Python and numpy give the same numbers, slower
(tests/test_order.py holds both to stored golden orders).
"""
from __future__ import annotations

import math
import operator

import numpy as np

try:
    from .. import _order  # type: ignore[attr-defined]  # the C extension, built at install
except ImportError:
    _order = None

VERSION = 2  # the order new loaders use; 1: one Fisher-Yates shuffle per window; 0: numpy's Generator
ORDERS = (1, 2)  # the orders this zarrfeed makes (a state or ticket of order 0 cannot be resumed mid-epoch)
TAG = 0x7A61_7266_6565_6431  # "zarfeed1"
CHUNKS = (1 << 64) - 1  # the stream of the chunk order (windows are 0, 1, ...)
STRATA = 1 << 62  # order 2: STRATA + window is the stream of its chunks' multipliers and offsets
BLOCKS = 1 << 63  # order 2: BLOCKS + window * 2**32 + block is the stream of a block's shuffle
BLOCK_ROWS = 32768  # order 2: a window's rows are cut into blocks of about this many (512 KiB of int64: L2)
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


def _spread(a: int, s: int) -> bool:
    return s < 64 or all(min((k * a) % s, s - (k * a) % s) * 16 * k >= s for k in range(1, min(257, s)))


def strata(sizes: np.ndarray, seed: int, epoch: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Order 2: each chunk's multiplier a_j and offset b_j (see the module docstring), for chunks of `sizes` rows
    (int64, in the window's chunk order)."""
    sizes = np.ascontiguousarray(sizes, np.int64)
    mults, offsets = np.zeros(len(sizes), np.int64), np.zeros(len(sizes), np.int64)
    k = key(seed, epoch, STRATA + integer(window, "window", (1 << 31) - 1))
    if _order is not None:
        _order.strata(sizes, mults, offsets, k)
        return mults, offsets
    state = k

    def draw() -> int:
        nonlocal state
        state = (state + _GOLDEN) & _M64
        return _mix(state)

    for j, n in enumerate(sizes.tolist()):
        if n <= 1:
            continue
        offsets[j] = (draw() * n) >> 64
        first = pick = 0
        for _ in range(64):
            c = 1 + ((draw() * (n - 1)) >> 64)
            if math.gcd(c, n) != 1:
                continue
            first = first or c
            if _spread(c, n):
                pick = c
                break
        mults[j] = pick or first or 1
    return mults, offsets


def block_count(total: int) -> int:
    """Order 2: blocks of a window of `total` rows."""
    return max(1, -(-int(total) // BLOCK_ROWS))


def block_starts(sizes: np.ndarray, blocks: int) -> np.ndarray:
    """Order 2: where each block starts in the window's order (blocks + 1 positions, the last = its rows)."""
    sizes = np.asarray(sizes, np.int64)
    t = np.arange(blocks + 1, dtype=np.int64)
    # sum over chunks of floor(t * s_j / blocks), in pieces of chunks so the table stays small
    out = np.zeros(blocks + 1, np.int64)
    for i in range(0, len(sizes), 4096):
        out += (t[:, None] * sizes[None, i:i + 4096] // blocks).sum(axis=1)
    return out


def fill_block(out: np.ndarray, bases: np.ndarray, sizes: np.ndarray, mults: np.ndarray, offsets: np.ndarray,
               block: int, blocks: int, seed: int, epoch: int, window: int) -> np.ndarray:
    """Order 2: block `block` of `blocks` of a window into `out` (exactly its length, int64): chunk j's rows as
    bases[j] + row, shuffled (see the module docstring)."""
    if out.dtype != np.int64 or out.ndim != 1 or not out.flags.c_contiguous or not out.flags.writeable:
        raise TypeError("order: fill_block takes a writeable C-contiguous 1-D int64 array")
    if blocks >= 1 << 32:
        raise ValueError(f"order: a window of {blocks} blocks is more than order 2 numbers")
    k = key(seed, epoch, BLOCKS + (integer(window, "window", (1 << 31) - 1) << 32) + block)
    arrays = [np.ascontiguousarray(a, np.int64) for a in (bases, sizes, mults, offsets)]
    if _order is not None:
        _order.fill_block(out, *arrays, block, blocks, k)
        return out
    bases, sizes, mults, offsets = arrays
    lo, hi = block * sizes // blocks, (block + 1) * sizes // blocks
    count = hi - lo
    if int(count.sum()) != len(out):
        raise ValueError("order: fill_block's buffers do not match the block")
    chunk = np.repeat(np.arange(len(sizes)), count)
    v = lo[chunk] + np.arange(len(out)) - np.repeat(np.cumsum(count) - count, count)
    s = sizes[chunk]
    out[:] = bases[chunk] + (mults[chunk] * v + offsets[chunk]) % np.maximum(s, 1)
    return shuffle(out, seed, epoch, BLOCKS + (window << 32) + block)
