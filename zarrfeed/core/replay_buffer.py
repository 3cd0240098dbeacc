"""Diffusion Policy's replay buffer, read as a dataset where it lies.

A `ReplayBuffer` (real-stanford/diffusion_policy, `common/replay_buffer.py`) is a zarr v2 group holding
`data/<key>`: one array per quantity, every episode's steps concatenated along the first axis (images
(T, H, W, C), states, actions), chunked along that axis only; and `meta/episode_ends`: the cumulative end of
each episode in those arrays (int64). As a zarrfeed dataset it is the table `episodes` (one record per
episode, its field `end` read from `meta/episode_ends`) and one table per key (records of one field, named
as the key, read from `data/<key>`; `core.record_view`), each linked to `episodes` by an "ends" link: episode
i owns steps [end[i-1], end[i]). Nothing is converted or copied.

The steps a reader may read are those of the episodes `episode_ends` names: Diffusion Policy's writer
resizes the data arrays, writes them, and then `episode_ends`, so a writer that stopped in between left
steps past the last end, which are not an episode (its `ReplayBuffer` refuses to open such a buffer; zarrfeed
reads the episodes and `validate` says what is past them).
"""
from __future__ import annotations

import numpy as np

from .record_view import RecordArray, step_dtype
from .schema import ENDS, Link, Schema, Table
from .store import FormatError
from .stores import Store
from .zarr_array import Array, Group
from .zarr_meta import MetaError

EPISODES, END = "episodes", "end"
DATA, META = "data", "meta"
EPISODE_ENDS = f"{META}/episode_ends"


def is_replay_buffer(group: Group) -> bool:
    """Whether `group` is laid out as a replay buffer: `meta/episode_ends` is an array, `data` a group."""
    store = group.store
    return f"{EPISODE_ENDS}/.zarray" in store and f"{DATA}/.zgroup" in store


def open_replay_buffer(group: Group, read_only: bool = True) -> tuple[Schema, dict[str, Array], dict[str, str]]:
    """The schema of the replay buffer in `group`, the arrays of its tables, and the arrays that are not its
    tables (name -> what). `FormatError` in one line naming the array for anything that is not a replay
    buffer's: an `episode_ends` that is not a 1-D integer array, a data array not chunked along time only, a
    key that is not a plain name."""
    store = group.store
    ends = _open(store, EPISODE_ENDS, read_only)
    if len(ends.shape) != 1 or ends.dtype.kind not in "iu":
        raise FormatError(f"{EPISODE_ENDS}: a {len(ends.shape)}-D array of {ends.dtype}, not the 1-D integer "
                          "array of episode ends of a replay buffer")
    tables = {EPISODES: Table(EPISODES, step_dtype(END, ends.meta), ends.chunks[0], EPISODE_ENDS)}
    arrays: dict[str, Array] = {EPISODES: RecordArray.of(ends, END)}
    others: dict[str, str] = {}
    data = Group(store, DATA, read_only)
    for key in sorted(data.array_keys()):
        path = f"{DATA}/{key}"
        if key == EPISODES:
            raise FormatError(f"{path}: a data key named '{EPISODES}', which zarrfeed names the episodes table; "
                              "rename the key to read this replay buffer")
        try:
            array = _open(store, path, read_only)
        except FormatError as exc:
            others[path] = str(exc).split(": ", 1)[-1]
            continue
        if not array.shape:
            others[path] = "a 0-D array, not steps"
            continue
        try:
            tables[key] = Table(key, step_dtype(key, array.meta), array.chunks[0], path)
        except ValueError as exc:  # a key that is not a plain name
            raise FormatError(f"{path}: {exc}") from None
        arrays[key] = RecordArray.of(array, key)
    for name in Group(store, META).array_keys():
        if name != "episode_ends":
            others[f"{META}/{name}"] = "metadata of the replay buffer's own"
    links = tuple(Link(EPISODES, END, key, ENDS) for key in tables if key != EPISODES)
    try:
        schema = Schema(tables, links, attrs=dict(group.attrs), compressor=_shared_compressor(arrays),
                        name="replay_buffer")
    except ValueError as exc:
        raise FormatError(f"{group.store}: {exc}") from None
    return schema, arrays, others


def _open(store: Store, path: str, read_only: bool) -> Array:
    try:
        return Array.open(store, path, read_only)
    except MetaError as exc:
        raise FormatError(f"{path}: cannot open its array ({exc})") from None


def _shared_compressor(arrays: dict[str, Array]):  # noqa: ANN202  (a numcodecs codec, or None)
    """The compressor the step arrays share (what a writer appending uses), else None."""
    steps = [a for name, a in arrays.items() if name != EPISODES]
    configs = [a.compressor.get_config() if a.compressor else None for a in steps]
    if not configs or configs[0] is None or any(c != configs[0] for c in configs):
        return None
    return steps[0].compressor


def episode_bounds(ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each episode's first step and end (`[start, end)`) from the cumulative `ends`."""
    ends = np.asarray(ends, np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    return starts, ends


def rows_by_ends(schema: Schema, arrays: dict[str, Array], rows: dict[str, int]) -> dict[str, int]:
    """The rows a reader may read of a dataset without a manifest, `rows` being each array's length: a table
    that an "ends" link points into holds the steps of the parent's rows, up to the last end (steps past it
    belong to no episode: a writer stopped before it wrote the end). `FormatError` if an array holds fewer
    steps than the ends name."""
    from .chunks import read_rows  # (chunks imports nothing of this module's; here to keep imports light)

    out = dict(rows)
    for link in schema.links:
        if link.kind != ENDS:
            continue
        n = rows[link.parent]
        last = int(read_rows(arrays[link.parent], n - 1, n)[link.field][0]) if n else 0
        have = arrays[link.child].shape[0]
        if last > have:
            raise FormatError(f"table '{link.child}': {arrays[link.parent].path} says the episodes end at step "
                              f"{last:,}, but {arrays[link.child].path} holds {have:,} steps; the data is "
                              "incomplete")
        out[link.child] = max(last, 0)
    return out
