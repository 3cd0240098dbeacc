"""The epoch plan: which rows form which batch, from (seed, epoch, rank) alone.

Chunks are put in a random order (the same for every rank), grouped into windows of `shuffle_window`
chunks, and the rows of each window are shuffled: in order 2 (the default) stratified, in blocks that each
hold every chunk of the window in proportion, in order 1 (a state saved in it resumes in it) by one Fisher-Yates
shuffle of the window (`order.py` specifies both). Concatenated, the windows give the epoch's row sequence.
A loader's default window is the whole table when its decoded chunks fit `shuffle_bytes` (`window_chunks`).
Rank r takes the r-th of `world_size` equal, contiguous parts of it, so it reads only about 1/world_size of
the chunks; parts are made equal by repeating rows from the start of the sequence (or, with `drop_last`, by
dropping the tail). Each part is cut into batches of `batch_size`. Everything here is a pure function of
small numbers, so the consumer and a resumed run compute the same plan without reading any data. The orders
(of chunks, and of each window's rows) are zarrfeed's own (`order.py`), not numpy's generators: the same on
every machine and numpy release; any position's row (`row_at`) or any row's position (`position_of`) needs
only its window's order.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import asdict, dataclass, replace

from typing import Any, NamedTuple

import numpy as np

from ..options import ShardOptions, ShuffleOptions
from .order import CHUNKS, ORDERS, block_count, block_starts, fill_block, inverse, permutation, shuffle, strata



class Piece(NamedTuple):
    """Part of a batch that comes from one window: batch `batch` (counted from the group's first), rows
    [row, row + rows) of it, from the window's shuffled rows [position, position + rows)."""

    batch: int
    row: int
    window: int
    position: int
    rows: int


@dataclass(frozen=True)
class PlanConfig:
    """A plan's configuration for one table, fixed once its window is resolved: the table's rows and chunk rows,
    the batch size, the order (`shuffling`, its `shuffle_window` a number of plan chunks) and this rank's share."""

    n_rows: int                # committed rows of the table
    chunk_rows: int
    batch_size: int
    shuffling: ShuffleOptions = ShuffleOptions(shuffle_window=8)
    shard: ShardOptions = ShardOptions()

    def __post_init__(self) -> None:
        s = self.shuffling
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if s.shuffle_window is None or s.shuffle_window < 1:
            raise ValueError(f"shuffle_window must be >= 1, got {s.shuffle_window}")
        if s.order not in ORDERS:
            raise ValueError(f"epoch order {s.order!r}: this zarrfeed orders epochs with orders {ORDERS}")

    @classmethod
    def of(cls, n_rows: int, chunk_rows: int, batch_size: int, shuffling: ShuffleOptions,
           shard: ShardOptions) -> "PlanConfig":
        """The plan of a table of `n_rows` rows in chunks of `chunk_rows`; a window left to the loader's default
        is 1 chunk here, until the loader resolves it from what an epoch reads (`Loader`)."""
        if shuffling.shuffle_window is None:
            shuffling = replace(shuffling, shuffle_window=1)
        return cls(n_rows, chunk_rows, batch_size, shuffling, shard)

    def as_options(self) -> dict[str, Any]:
        """The loader options that make this plan (the window given), as a loader takes them."""
        shuffling = {k: v for k, v in asdict(self.shuffling).items() if k != "shuffle_bytes"}
        return {"batch_size": self.batch_size, **shuffling, **asdict(self.shard)}

    @property
    def window(self) -> int:
        """Plan chunks shuffled together."""
        return self.shuffling.shuffle_window  # type: ignore[return-value]  # resolved: checked above

    def with_window(self, window: int) -> "PlanConfig":
        return replace(self, shuffling=replace(self.shuffling, shuffle_window=window))


MIN_WINDOW = 8  # chunks a default window holds at least (order 1's default window)


def window_chunks(shuffle_bytes: int, chunks: int, epoch_bytes: int) -> int:
    """The window (in plan chunks) that `shuffle_bytes` gives an epoch reading `chunks` chunks, `epoch_bytes`
    decoded: all of them when they fit, else as many as fit, and never fewer than `MIN_WINDOW` (a smaller
    budget would mix batches less than zarrfeed always did). A function of the dataset and the options only,
    never of this machine's memory, so that every rank and a resumed run make the same order."""
    if isinstance(shuffle_bytes, bool) or not isinstance(shuffle_bytes, int) or shuffle_bytes < 1:
        raise ValueError(f"shuffle_bytes must be a positive number of bytes, got {shuffle_bytes!r}")
    if chunks <= 0:
        return 1
    if epoch_bytes <= shuffle_bytes:
        return chunks
    return min(chunks, max(MIN_WINDOW, shuffle_bytes * chunks // max(epoch_bytes, 1)))


def selected_rows_per_chunk(n_rows: int, chunk_rows: int, rows: np.ndarray | None) -> list[np.ndarray] | None:
    """For a row selection (index array or boolean mask), the selected rows of each chunk, chunk-relative;
    None when every row is selected."""
    if rows is None:
        return None
    rows = np.asarray(rows)
    if rows.size == 0 and rows.ndim == 1:  # `rows=[]` is float64 to numpy, but it selects nothing: an empty epoch
        rows = rows.astype(np.int64)
    if rows.dtype == bool:
        if rows.shape != (n_rows,):
            raise ValueError(f"rows: a boolean mask must have one entry per committed row ({n_rows}), "
                             f"got shape {rows.shape}")
        idx = np.flatnonzero(rows)
    else:
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise ValueError("rows: expected a 1-D integer index array or a boolean mask, "
                             f"got {rows.dtype}{rows.shape}")
        idx = np.unique(rows)
        if len(idx) != len(rows):
            raise ValueError("rows: the index array has repeated rows")
        if len(idx) and (idx[0] < 0 or idx[-1] >= n_rows):
            raise ValueError(f"rows: indices must be in [0, {n_rows}), got [{idx[0]}, {idx[-1]}]")
    n_chunks = -(-n_rows // chunk_rows)
    bounds = np.searchsorted(idx, np.arange(n_chunks + 1) * chunk_rows)
    return [idx[bounds[c]:bounds[c + 1]] - c * chunk_rows for c in range(n_chunks)]


class EpochPlan:
    """The plan of one epoch for one rank."""

    def __init__(self, config: PlanConfig, epoch: int, selection: list[np.ndarray] | None = None,
                 spans: list[tuple[int, int]] | None = None) -> None:
        """`spans`: the positions of the epoch's sequence this rank reads, in order, when they are not its
        usual share (the rest of an epoch resumed on another number of ranks: see `remaining`)."""
        self.config, self.epoch, self.selection = config, epoch, selection
        c = config
        n_chunks = -(-c.n_rows // c.chunk_rows)
        sizes = np.array([len(s) for s in selection] if selection is not None else
                         [min(c.chunk_rows, c.n_rows - i * c.chunk_rows) for i in range(n_chunks)], np.int64)
        chunks = np.flatnonzero(sizes)  # chunks with nothing selected are never read
        if c.shuffling.shuffle:
            chunks = chunks[permutation(len(chunks), c.shuffling.seed, epoch, CHUNKS)]
        if c.shuffling.order == 2 and len(chunks):  # windows of equal size (to a chunk): no last window of one chunk
            self.windows = list(np.array_split(chunks, -(-len(chunks) // c.window)))
        else:
            self.windows = [chunks[i:i + c.window] for i in range(0, len(chunks), c.window)]
        window_rows = np.array([sizes[w].sum() for w in self.windows], np.int64)
        self.window_starts = np.concatenate([[0], np.cumsum(window_rows)]).astype(np.int64)
        self._starts = self.window_starts.tolist()
        self.total = int(self.window_starts[-1])
        n, b = self.total, c.batch_size
        if spans is None:  # the rank's share: a contiguous part of the sequence (past its end: repeated rows)
            m = n // c.shard.world_size if c.shard.drop_last else -(-n // c.shard.world_size)
            self.spans, self.resumed = [(c.shard.rank * m, c.shard.rank * m + m)], False
            self.num_batches = m // b if c.shard.drop_last else -(-m // b)
        else:  # every row of the spans, exactly once: the last batch may be short whatever drop_last says
            self.spans, self.resumed = [(int(a), int(z)) for a, z in spans if z > a], True
            m = sum(z - a for a, z in self.spans)
            self.num_batches = -(-m // b)
        self.per_rank = m
        self._span_starts = list(itertools.accumulate([0] + [z - a for a, z in self.spans]))
        self._sizes = sizes
        self._orders: dict[int, np.ndarray] = {}  # the last windows' rows in order (for batch_row_ids)
        self._strata_of: dict[int, tuple] = {}  # order 2: the last windows' strata (see _strata)

    def __len__(self) -> int:
        return self.num_batches

    @property
    def resumed_spans(self) -> tuple[tuple[int, int], ...] | None:
        """The spans this plan was made with (an epoch resumed on another number of ranks), else None: what a
        worker needs to make the same plan."""
        return tuple(self.spans) if self.resumed else None

    def batch_rows(self, k: int) -> int:
        """Rows in batch k."""
        b = self.config.batch_size
        return min(b, self.per_rank - k * b)

    def group_pieces(self, k0: int, count: int) -> list[Piece]:
        """Batches k0..k0+count-1 cut where batches or windows end (see `Piece`). Plain Python: a group has a
        few pieces, and numpy's per-call cost would be most of the work."""
        if not (0 <= k0 and k0 + count <= self.num_batches):
            raise IndexError(f"batches {k0}..{k0 + count - 1} of an epoch of {self.num_batches}")
        b, m, n = self.config.batch_size, self.per_rank, self.total
        starts = self._starts
        out = []
        for i in range(count):
            first = 0
            for pos, end in self._positions((k0 + i) * b, min((k0 + i + 1) * b, m)):
                while pos < end:
                    q = pos % n  # past the end: the repeated rows that even out the ranks
                    w = bisect.bisect_right(starts, q) - 1
                    take = min(end - pos, starts[w + 1] - q)
                    out.append(Piece(i, first, w, q - starts[w], take))
                    pos += take
                    first += take
        return out

    def _positions(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """This rank's rows [lo, hi) as ranges of positions in the epoch's sequence."""
        out = []
        j = bisect.bisect_right(self._span_starts, lo) - 1
        while lo < hi:  # the spans are not empty and cover [0, per_rank): each step takes some
            a, z = self.spans[j]
            off = self._span_starts[j]
            take = min(hi, off + z - a) - lo
            out.append((a + lo - off, a + lo - off + take))
            lo += take
            j += 1
        return out

    def remaining(self, batch: int) -> list[tuple[int, int]]:
        """The positions this rank has not read once batches [0, batch) are made: what an epoch resumed on
        another number of ranks shares out."""
        # with drop_last, not the rows past the rank's last whole batch: its epoch never reads them (a resumed
        # plan's batches cover all of its rows)
        end = min(self.per_rank, self.num_batches * self.config.batch_size)
        return self._positions(min(batch * self.config.batch_size, end), end)

    def segments(self, k: int) -> list[tuple[int, int, int]]:
        """Batch k as (window, first position in the window's shuffled rows, count), in batch order."""
        return [(w, pos, n) for _, _, w, pos, n in self.group_pieces(k, 1)]

    def batch_windows(self, k: int) -> list[int]:
        return sorted({w for w, _, _ in self.segments(k)})

    def group_windows(self, k0: int, count: int) -> list[int]:
        """The windows batches k0..k0+count-1 read, in the order they read them."""
        return list(dict.fromkeys(p.window for p in self.group_pieces(k0, count)))

    def _stratified(self, w: int) -> bool:
        return self.config.shuffling.shuffle and self.config.shuffling.order == 2

    def _strata(self, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
        """Order 2, window w: its chunks' rows, multipliers and offsets, its blocks and where they start."""
        if w not in self._strata_of:
            if len(self._strata_of) >= 2:
                del self._strata_of[next(iter(self._strata_of))]
            sizes = self._sizes[self.windows[w]].astype(np.int64)
            mults, offsets = strata(sizes, self.config.shuffling.seed, self.epoch, w)
            blocks = block_count(int(sizes.sum()))
            self._strata_of[w] = (sizes, mults, offsets, blocks, block_starts(sizes, blocks))
        return self._strata_of[w]

    def index_parts(self, w: int, rows: int = 262144) -> list[tuple[int, int]]:
        """Window w's order cut into parts of about `rows` rows that can be made apart (order 2: ranges of
        blocks, so that workers fill a window's index together), as (first block, end block); one part
        (0, 0) when the order is made in one piece."""
        if not self._stratified(w):
            return [(0, 0)]
        blocks = self._strata(w)[3]
        step = max(1, rows // 32768)
        return [(t, min(t + step, blocks)) for t in range(0, blocks, step)]

    def part_positions(self, w: int, part: tuple[int, int]) -> tuple[int, int]:
        """The positions of window w's order that part `part` (see `index_parts`) makes."""
        if part == (0, 0):
            return 0, self._window_rows(w)
        starts = self._strata(w)[4]
        return int(starts[part[0]]), int(starts[part[1]])

    def fill_order(self, out: np.ndarray, w: int, chunk_base: np.ndarray | None = None,
                   part: tuple[int, int] = (0, 0)) -> None:
        """Part `part` (see `index_parts`) of window w's order into `out`, which holds the whole window's
        order: positions [start, end) of the part only (order 2), or all of it."""
        if not self._stratified(w) or part == (0, 0):
            out[:self._window_rows(w)] = self.window_order(w, chunk_base)
            return
        bases, lookup = self._bases(w, chunk_base)
        sizes, mults, offsets, blocks, starts = self._strata(w)
        c = self.config
        for t in range(*part):
            block = out[starts[t]:starts[t + 1]]
            fill_block(block, bases, sizes, mults, offsets, t, blocks, c.shuffling.seed, self.epoch, w)
            if lookup is not None:
                block[:] = lookup[block]

    def _window_rows(self, w: int) -> int:
        return int(self.window_starts[w + 1] - self.window_starts[w])

    def _bases(self, w: int, chunk_base: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        """Each chunk's first address and, with a selection, the address of every selected row (the blocks
        then number rows within the window)."""
        c, chunks = self.config.chunk_rows, self.windows[w]
        base = np.arange(len(chunks), dtype=np.int64) * c if chunk_base is None else np.asarray(chunk_base, np.int64)
        if self.selection is None:
            return base, None
        sizes = self._sizes[chunks]
        lookup = np.concatenate([base[j] + self.selection[ch] for j, ch in enumerate(chunks)]).astype(np.int64)
        return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64), lookup

    def window_order(self, w: int, chunk_base: np.ndarray | None = None) -> np.ndarray:
        """Window w's rows in their shuffled order, as row r of the window's j-th chunk -> chunk_base[j] + r
        (default chunk_base[j] = j * chunk_rows: the window's chunks laid end to end). The order of rows does
        not depend on chunk_base, so a reader can ask for its own addresses directly."""
        c, chunks = self.config.chunk_rows, self.windows[w]
        if self._stratified(w):
            out = np.empty(self._window_rows(w), np.int64)
            blocks = self._strata(w)[3]
            self.fill_order(out, w, chunk_base, (0, blocks))
            return out
        base = np.arange(len(chunks)) * c if chunk_base is None else np.asarray(chunk_base)
        contiguous = (np.diff(base) == c).all() and (self._sizes[chunks[:-1]] == c).all()
        n = int(self._sizes[chunks].sum())
        if self.selection is None and contiguous:  # no gap: one range (a window has at least one chunk)
            rows = np.arange(int(base[0]), int(base[0]) + n, dtype=np.int64)
        else:
            parts = []
            for j, ch in enumerate(chunks):
                mine = self.selection[ch] if self.selection is not None else np.arange(self._sizes[ch])
                parts.append(base[j] + mine)
            rows = np.concatenate(parts).astype(np.int64, copy=False)
        return shuffle(rows, self.config.shuffling.seed, self.epoch, w) if self.config.shuffling.shuffle else rows

    def _local_at(self, w: int, q: int) -> int:
        """The window-local row (chunks laid end to end, selected rows only) at position q of window w."""
        if not self.config.shuffling.shuffle:
            return q
        if not self._stratified(w):
            return int(permutation(self._window_rows(w), self.config.shuffling.seed, self.epoch, w)[q])
        sizes, mults, offsets, blocks, starts = self._strata(w)
        t = int(np.searchsorted(starts, q, side="right")) - 1
        block = np.empty(int(starts[t + 1] - starts[t]), np.int64)
        bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        fill_block(block, bases, sizes, mults, offsets, t, blocks, self.config.shuffling.seed, self.epoch, w)
        return int(block[q - starts[t]])

    def _position_in(self, w: int, j: int, r: int) -> int:
        """Where row r of window w's j-th chunk (selected rows numbered) comes in the window's order."""
        sizes = self._sizes[self.windows[w]]
        local = int(sizes[:j].sum()) + r
        if not self.config.shuffling.shuffle:
            return local
        if not self._stratified(w):
            return int(inverse(permutation(int(sizes.sum()), self.config.shuffling.seed, self.epoch, w))[local])
        sizes, mults, offsets, blocks, starts = self._strata(w)
        s = int(sizes[j])
        a, b = int(mults[j]), int(offsets[j])
        v = ((r - b) * pow(a, -1, s)) % s if s > 1 else 0  # the inverse of r = (a * v + b) mod s
        t = ((v + 1) * blocks + s - 1) // s - 1  # the block whose share of chunk j holds v
        block = np.empty(int(starts[t + 1] - starts[t]), np.int64)
        bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        fill_block(block, bases, sizes, mults, offsets, t, blocks, self.config.shuffling.seed, self.epoch, w)
        return int(starts[t]) + int(np.flatnonzero(block == local)[0])

    def batch_row_ids(self, k: int) -> np.ndarray:
        """The table rows that batch k holds, in its order (int64): each window's order is made once, when a
        batch first reads it (2.4 ns a row), and kept while batches read it."""
        parts = []
        for w, pos, n in self.segments(k):
            if w not in self._orders:
                if len(self._orders) >= 2:  # a batch reads at most two windows in a row
                    del self._orders[next(iter(self._orders))]
                self._orders[w] = self.window_order(w, self.windows[w] * self.config.chunk_rows)
            parts.append(self._orders[w][pos:pos + n])
        return np.concatenate(parts)  # a batch has rows: group_pieces refuses a k past the last

    def row_at(self, position: int) -> int:
        """The row (of the table) at `position` in the epoch's sequence, computed on its own: only the order of
        the window (order 2: the block) it falls in is made (resuming or re-splitting an epoch needs no
        replay)."""
        if not 0 <= position < self.total:
            raise IndexError(f"position {position} outside an epoch of {self.total} rows")
        w = bisect.bisect_right(self._starts, position) - 1
        q = self._local_at(w, position - self._starts[w])
        chunks = self.windows[w]
        sizes = self._sizes[chunks]
        j = int(np.searchsorted(np.cumsum(sizes), q, side="right"))
        r = q - int(sizes[:j].sum())
        ch = int(chunks[j])
        return ch * self.config.chunk_rows + (int(self.selection[ch][r]) if self.selection is not None else r)

    def position_of(self, row: int) -> int:
        """Where `row` comes in the epoch's sequence (its first place, for a rank's repeated tail), from its
        window's (order 2: its block's) order alone; ValueError if the epoch does not read it."""
        ch, r = divmod(int(row), self.config.chunk_rows)
        if self.selection is not None:
            sel = self.selection[ch] if 0 <= ch < len(self.selection) else np.zeros(0, np.int64)
            i = int(np.searchsorted(sel, r))
            if i >= len(sel) or sel[i] != r:
                raise ValueError(f"row {row} is not selected")
            r = i
        where = [(w, j) for w, chunks in enumerate(self.windows) for j, c in enumerate(chunks) if c == ch]
        if not where or not 0 <= r < self._sizes[ch]:
            raise ValueError(f"row {row} is not in this epoch")
        w, j = where[0]
        return self._starts[w] + self._position_in(w, j, r)

    def window_batches(self) -> dict[int, tuple[int, int]]:
        """For each window this rank reads: (first batch, last batch) reading it, in order of first batch."""
        b, n = self.config.batch_size, self.total
        out: dict[int, tuple[int, int]] = {}
        for (s0, s1), off in zip(self.spans, self._span_starts, strict=False):  # off: the span's first row here
            for wrap in range(0, s1, max(n, 1)):  # positions past n repeat the sequence from its start
                for w in range(len(self.windows)):
                    a = max(s0, int(self.window_starts[w]) + wrap)
                    z = min(s1, int(self.window_starts[w + 1]) + wrap)
                    if a < z and (off + a - s0) // b < self.num_batches:
                        first = (off + a - s0) // b
                        last = min((off + z - 1 - s0) // b, self.num_batches - 1)
                        old = out.get(w, (first, last))
                        out[w] = (min(old[0], first), max(old[1], last))
        return dict(sorted(out.items(), key=lambda item: item[1]))


@dataclass
class WorkerPlan:
    """An epoch plan as a worker holds it, with what the worker derives from it (`orders`: window -> its
    rows' order)."""

    plan: EpochPlan
    orders: dict[int, np.ndarray]


class WorkerPlans:
    """The plans a worker makes from its messages' (epoch, spans): the same plans as the consumer's, made from
    the same inputs. Plans of the current epoch are kept (with and without spans); another epoch's are
    dropped."""

    def __init__(self, config: PlanConfig, selection: list[np.ndarray] | None) -> None:
        self.config, self.selection = config, selection
        self._plans: dict[tuple, WorkerPlan] = {}

    def get(self, epoch: int, spans: tuple[tuple[int, int], ...] | None = None) -> WorkerPlan:
        """The plan of `epoch`, resumed on `spans` if given (see `EpochPlan.resumed_spans`)."""
        key = (epoch, spans)
        if key not in self._plans:
            if any(e != epoch for e, _ in self._plans):
                self._plans.clear()
            plan = EpochPlan(self.config, epoch, self.selection, None if spans is None else list(spans))
            self._plans[key] = WorkerPlan(plan, {})
        return self._plans[key]
