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

import json
import math
from dataclasses import replace
from typing import Any, Mapping

import numcodecs
import numpy as np

from .record_view import RecordArray, step_dtype
from .schema import ENDS, Link, Schema, Table
from .errors import FormatError, MetaError
from .stores import Store
from .v3_data_types import VARIABLE_LENGTH
from .v3_meta import ZARR_JSON
from .zarr_array import Array, Group

EPISODES, END = "episodes", "end"
DATA, META = "data", "meta"
EPISODE_ENDS = f"{META}/episode_ends"


STEPS = "steps"  # what readers call every key's steps read together
RESERVED = (EPISODES, STEPS)  # names a data key cannot have


def is_replay_buffer(group: Group) -> bool:
    """Whether `group` is laid out as a replay buffer: a `data` group and a `meta` group (whose
    `episode_ends` must be an array: `open_replay_buffer` says so)."""
    store = group.store
    return all(f"{name}/.zgroup" in store or f"{name}/{ZARR_JSON}" in store for name in (DATA, META))


def open_replay_buffer(group: Group, read_only: bool = True) -> tuple[Schema, dict[str, Array], dict[str, str]]:
    """The schema of the replay buffer in `group`, the arrays of its tables, and the arrays that are not its
    tables (name -> what). `FormatError` in one line naming the array for anything that is not a replay
    buffer's: an `episode_ends` that is not a 1-D integer array, a data array not chunked along time only, a
    key that is not a plain name."""
    store = group.store
    if "episode_ends" not in Group(store, META).array_keys():
        raise FormatError(f"{EPISODE_ENDS}: missing (a group with data/ and meta/ is a replay buffer, whose "
                          "episodes it names)")
    ends = _open(store, EPISODE_ENDS, read_only)
    if len(ends.shape) != 1 or ends.dtype.kind not in "iu":
        raise FormatError(f"{EPISODE_ENDS}: a {len(ends.shape)}-D array of {ends.dtype}, not the 1-D integer "
                          "array of episode ends of a replay buffer")
    tables = {EPISODES: Table(EPISODES, step_dtype(END, ends.meta), ends.chunks[0], EPISODE_ENDS)}
    arrays: dict[str, Array] = {EPISODES: RecordArray.of(ends, END, EPISODES)}
    others: dict[str, str] = {}
    data = Group(store, DATA, read_only)
    for key in sorted(data.array_keys()):
        path = f"{DATA}/{key}"
        if key in RESERVED:
            raise FormatError(f"{path}: a data key named '{key}', a name zarrfeed gives the buffer's "
                              f"{'episodes table' if key == EPISODES else 'keys read together'}; rename the key to "
                              "read this replay buffer")
        if _python_objects(store, path):
            others[path] = "an array of Python objects, not steps"
            continue
        unread = _v3_unread(store, path)
        if unread:
            others[path] = unread
            continue
        array = _open(store, path, read_only)  # a damaged or unreadable one refuses the buffer, in one line
        if not array.shape:
            others[path] = "a 0-D array, not steps"
            continue
        try:
            tables[key] = Table(key, step_dtype(key, array.meta), array.chunks[0], path)
        except ValueError as exc:  # a key that is not a plain name
            raise FormatError(f"{path}: {exc}") from None
        arrays[key] = RecordArray.of(array, key)
    for array in arrays.values():  # another tool wrote it: a chunk left out is all fill, as zarr reads it
        array.missing_is_fill = True
    for name in Group(store, META).array_keys():
        if name != "episode_ends":
            others[f"{META}/{name}"] = "metadata of the replay buffer's own"
    links = tuple(Link(EPISODES, END, key, ENDS) for key in tables if key != EPISODES)
    shared = _shared_compressor(arrays)
    for name, array in arrays.items():  # a table compressed otherwise records its own (DP's episode_ends: none)
        config = array.compressor.get_config() if array.compressor else None
        if shared is None or config != shared.get_config():
            tables[name] = replace(tables[name], compressor=config)
        tables[name] = replace(tables[name], missing_is_fill=True)
    try:
        schema = Schema(tables, links, attrs=dict(group.attrs), compressor=shared, name="replay_buffer")
    except ValueError as exc:
        raise FormatError(f"{group.store}: {exc}") from None
    return schema, arrays, others


def _python_objects(store: Store, path: str) -> bool:
    """Whether the array at `path` holds Python objects (zarr's `|O` dtype), which are not steps."""
    try:
        return json.loads(bytes(store[f"{path}/.zarray"])).get("dtype") == "|O"
    except (KeyError, ValueError, TypeError, AttributeError):
        return False


def _v3_unread(store: Store, path: str) -> str | None:
    """What a zarr v3 data array is, if its data type holds values of variable length (strings or bytes, which a
    replay buffer keeps beside its steps): it is left out of the tables, as v2's objects are. Any other data type
    zarrfeed does not read refuses the buffer when the array is opened, in one line naming it."""
    raw = store.get(f"{path}/{ZARR_JSON}")
    if raw is None:
        return None
    try:
        data_type = json.loads(raw).get("data_type")
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None  # damaged: opening it says so
    name = data_type.get("name") if isinstance(data_type, dict) else data_type
    return f"an array of {data_type!r}, not steps" if isinstance(name, str) and name in VARIABLE_LENGTH else None


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


def rows_by_ends(schema: Schema, arrays: Mapping[str, Array], rows: Mapping[str, int]) -> dict[str, int]:
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


def replay_buffer_schema(keys: Mapping[str, tuple[Any, tuple[int, ...]]],
                         chunk_rows: int | Mapping[str, int] | None = None,
                         compressor: numcodecs.abc.Codec | None = None) -> Schema:
    """The schema of a new replay buffer in Diffusion Policy's layout: `keys` maps each data key to the dtype
    and the shape of one step (`{"img": (np.uint8, (96, 96, 3)), "action": (np.float32, (2,))}`).

    `chunk_rows`: steps per chunk, for all keys or per key; by default as Diffusion Policy's
    `get_optimal_chunks` sizes them, about 2 MB a chunk (73 steps of 96x96x3 images). `compressor`: by
    default Diffusion Policy's, Blosc lz4 without shuffle."""
    tables: dict[str, Table] = {EPISODES: Table(EPISODES, np.dtype([(END, np.int64)]), EPISODE_CHUNK, EPISODE_ENDS)}
    for key, (dtype, shape) in keys.items():
        base, shape = np.dtype(dtype), tuple(int(n) for n in shape)
        if key in RESERVED:
            raise ValueError(f"key {key!r}: a name zarrfeed gives the buffer's "
                             f"{'episodes table' if key == EPISODES else 'keys read together'}; name the key "
                             "otherwise")
        if any(n < 1 for n in shape):
            raise ValueError(f"key {key!r}: a step of shape {shape} holds nothing")
        if isinstance(chunk_rows, Mapping):
            rows = int(chunk_rows.get(key, 0)) or _default_chunk_rows(base, shape)
        else:
            rows = int(chunk_rows) if chunk_rows else _default_chunk_rows(base, shape)
        tables[key] = Table(key, np.dtype([(key, base, shape)] if shape else [(key, base)]), rows, f"{DATA}/{key}")
    links = tuple(Link(EPISODES, END, key, ENDS) for key in tables if key != EPISODES)
    return Schema(tables, links, compressor=compressor or numcodecs.Blosc(cname="lz4", clevel=5,
                                                                          shuffle=numcodecs.Blosc.NOSHUFFLE),
                  name="replay_buffer")


EPISODE_CHUNK = 10_000  # episode ends per chunk (80 KB)
_TARGET_CHUNK_BYTES = 2_000_000  # Diffusion Policy's `get_optimal_chunks` target


def _default_chunk_rows(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """Steps per chunk of about 2 MB, as Diffusion Policy sizes them (it also caps them at its first episode's
    length, which a schema made before any episode cannot know)."""
    return max(1, math.ceil(_TARGET_CHUNK_BYTES / (dtype.itemsize * math.prod(shape))))


def steps_episode(schema: Schema, data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """One episode given as Diffusion Policy's `add_episode` takes it, a dict of key -> array of its steps
    (T, ...), as the records of the replay buffer's tables: each key's steps as one-field records (no copy for
    a C-contiguous array of the key's dtype) and the episode's row, whose end is its T. `ValueError` naming the
    key for a missing or unknown key, another step shape or dtype, or arrays of different lengths."""
    steps = schema.step_tables()
    missing = [k for k in steps if k not in data]
    extra = [k for k in data if k not in steps]
    if missing or extra:
        which = f"key '{missing[0]}': missing from the episode" if missing else \
            f"key '{extra[0]}': not a key of this replay buffer (keys: {', '.join(steps)})"
        raise ValueError(which)
    out: dict[str, np.ndarray] = {}
    length = None
    for key in steps:
        want = schema.tables[key].dtype
        sub = want[key]
        value = data[key]
        if not isinstance(value, np.ndarray):
            raise ValueError(f"key '{key}': expected a numpy array of steps, got {type(value).__name__}")
        if value.shape[1:] != sub.shape or value.ndim < 1:
            raise ValueError(f"key '{key}': steps of shape {value.shape[1:]}, expected {sub.shape} (an array of "
                             f"shape (T, {', '.join(map(str, sub.shape))}))")
        if value.dtype != sub.base:
            raise ValueError(f"key '{key}': dtype {value.dtype}, expected {sub.base}")
        if length is not None and len(value) != length:
            raise ValueError(f"key '{key}': {len(value)} steps, but '{steps[0]}' has {length} (every key holds one "
                             "value per step)")
        length = len(value)
        raw = np.ascontiguousarray(value).view(np.uint8)  # the steps' bytes, one record each: no copy
        out[key] = raw.reshape(len(value), want.itemsize).view(want).reshape(-1) if len(value) else \
            np.zeros(0, want)
    out[EPISODES] = np.array([(length or 0,)], schema.tables[EPISODES].dtype)
    return out
