"""Episodes: one unit of input (e.g. a scene with its frames, agents and faces), intervals local to it.

`check_episode` refuses bad input before anything is written; `relocate` shifts local intervals to global rows.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..core.links import check_link
from ..core.replay_buffer import EPISODES, steps_episode
from ..core.schema import Link, Schema, dtype_difference

Episode = Mapping[str, np.ndarray]


def as_tables(episode: Any, schema: Schema, strict: bool = False) -> Any:
    """The episode as its tables: a replay buffer's episode given as Diffusion Policy's `add_episode` takes it
    (key -> steps) converted (`steps_episode`); anything else as given, and one that cannot be converted as
    given too (`check_episode` says why), or with `strict` a ValueError naming the key. What fingerprints are
    taken of, so that an episode is the same episode whichever form it came in and whichever path wrote it (a
    local writer, Dask, the server)."""
    if isinstance(episode, Mapping) and schema.step_tables() and EPISODES not in episode:
        try:
            return steps_episode(schema, episode)
        except ValueError:
            if strict:
                raise
            return episode
    return episode


def check_episode(episode: Any, schema: Schema) -> dict[str, np.ndarray]:
    """The episode's tables if they fit `schema`; else `ValueError` naming table, field and row. An episode of a
    replay buffer may also come as Diffusion Policy's `add_episode` takes it: key -> array of its steps."""
    if not isinstance(episode, Mapping):
        raise ValueError(f"expected a dict of table name -> structured ndarray, got {type(episode).__name__}")
    if schema.step_tables() and EPISODES not in episode:
        episode = steps_episode(schema, episode)
    missing = [n for n in schema.tables if n not in episode]
    extra = [n for n in episode if n not in schema.tables]
    if missing:
        raise ValueError(f"table '{missing[0]}': missing from the episode")
    if extra:
        raise ValueError(f"table '{extra[0]}': not in schema '{schema.name}' (tables: {', '.join(schema.tables)})")
    tables = {}
    for name, table in schema.tables.items():
        arr = episode[name]
        if not isinstance(arr, np.ndarray) or arr.dtype.names is None:
            raise ValueError(f"table '{name}': expected a structured ndarray, got "
                             f"{type(arr).__name__}{' of ' + str(arr.dtype) if isinstance(arr, np.ndarray) else ''}")
        if arr.ndim != 1:
            raise ValueError(f"table '{name}': expected 1-D records, got shape {arr.shape}")
        diff = dtype_difference(arr.dtype, table.dtype)
        if diff:
            raise ValueError(f"table '{name}': wrong dtype, it {diff}")
        tables[name] = arr
    for link in schema.links:
        violations, _ = check_link(link, tables[link.parent][link.field], len(tables[link.child]), limit=1)
        if violations:
            raise ValueError(str(violations[0]))
    return tables


def rows_of(episode: Episode) -> dict[str, int]:
    return {name: len(arr) for name, arr in episode.items()}


def _moved(schema: Schema) -> list[Link]:
    """The links whose field moves with its child's rows, one per field: an "ends" field names the rows of
    every step table, which move together, so it moves once."""
    return list({(link.parent, link.field): link for link in reversed(schema.links)}.values())[::-1]


def relocate(episode: Episode, schema: Schema, offsets: Mapping[str, int]) -> dict[str, np.ndarray]:
    """A copy of the episode whose interval fields point at global rows (child table's offset added).

    Only parent tables are copied; child-only tables (agents, faces) are passed through untouched.
    """
    out = dict(episode)
    for link in _moved(schema):
        if out[link.parent] is episode[link.parent]:
            out[link.parent] = episode[link.parent].copy()
        out[link.parent][link.field] += offsets[link.child]
    return out


def relocate_all(episodes: Sequence[Episode], schema: Schema, starts: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The episodes one after another, one array per table, their intervals pointing at global rows as
    `relocate` makes them when the first episode's rows go at `starts` (the first row per table). One copy
    (`relocate` per episode, then concatenate, would make two)."""
    out = {t: np.empty(sum(len(e.get(t, ())) for e in episodes), tab.dtype) for t, tab in schema.tables.items()}
    at = {t: 0 for t in schema.tables}
    for tables in episodes:
        for t, arr in tables.items():
            out[t][at[t]:at[t] + len(arr)] = arr
        for link in _moved(schema):
            part = out[link.parent][at[link.parent]:at[link.parent] + len(tables.get(link.parent, ()))]
            part[link.field] += starts[link.child] + at[link.child]
        for t, arr in tables.items():
            at[t] += len(arr)
    return out
