"""What a zarr group that holds no table zarrfeed reads is, in one line: opening one as a dataset is refused.

Opened as a dataset of no tables, such a group would validate as valid, describe as empty and export nothing,
each with exit 0. It is an empty group, the `data/` or `meta/` group of a replay buffer
(opened one folder too deep), xarray's zarr output (arrays with named dimensions), or any other group of arrays
that are not 1-D arrays of structured records. The line says which, and what zarrfeed reads instead.
"""
from __future__ import annotations

import json

from .replay_buffer import DATA, META, is_replay_buffer
from .errors import FormatError
from .location import Location
from .zarr_array import Group

READS = ("zarrfeed reads a dataset it wrote, an L5Kit dataset, a Diffusion Policy replay buffer (a group with "
         "data/ and meta/) or a group of 1-D arrays of structured records")
XARRAY_DIMENSIONS = "_ARRAY_DIMENSIONS"  # the attribute in which xarray records an array's dimension names
SHOWN = 3  # arrays or groups named in the line


def refusal(location: Location, group: Group, others: dict[str, str]) -> FormatError:
    """The `FormatError` for the group at `location` whose arrays `others` (name -> what) hold no table."""
    where = str(location)
    buffer = _buffer_above(location)
    if buffer is not None:
        part = "steps, one array per key" if _name(location) == DATA else "episode ends"
        return FormatError(f"{where}: the {_name(location)}/ group of the replay buffer {buffer} (its {part}), not a "
                           f"dataset; zarrfeed reads the whole buffer: open {buffer}")
    dims = _xarray_dimensions(group, others)
    if dims:
        shown = ", ".join(f"'{name}' ({', '.join(d)})" for name, d in list(dims.items())[:SHOWN])
        return FormatError(f"{where}: a zarr group as xarray writes it ({_count(len(dims), 'array')} with named "
                           f"dimensions: {shown}{_more(dims)}), not a dataset: none is a table; {READS}")
    if others:
        shown = ", ".join(f"'{name}' ({what.split(', not ')[0]})" for name, what in list(others.items())[:SHOWN])
        return FormatError(f"{where}: a zarr group of {_count(len(others), 'array')}, none a table ({shown}"
                           f"{_more(others)}), not a dataset; {READS}")
    groups = sorted(group.group_keys())
    if groups:
        shown = ", ".join(f"{g}/" for g in groups[:SHOWN])
        lacks = {DATA: f"{META}/ (its episode ends)", META: f"{DATA}/ (its steps)"}
        half = "".join(f"; a replay buffer also needs {lacks[g]}" for g in (DATA, META) if g in groups)
        return FormatError(f"{where}: a zarr group of groups only ({shown}{_more(groups)}), not a dataset{half}; "
                           f"{READS}")
    return FormatError(f"{where}: an empty zarr group (no arrays), not a dataset; {READS}")


def _name(location: Location) -> str:
    return location.url.rstrip("/").rsplit("/", 1)[-1]


def _buffer_above(location: Location) -> str | None:
    """The folder above `location`, if `location` is its `data/` or `meta/` and it is a replay buffer."""
    above = location.parent() if _name(location) in (DATA, META) else None
    if above is None:
        return None
    try:
        return str(above) if is_replay_buffer(Group(above.store("r"))) else None
    except (FormatError, OSError, ValueError):  # cannot be read: no hint, the line says what the group is
        return None


def _xarray_dimensions(group: Group, arrays: dict[str, str]) -> dict[str, list[str]]:
    """Each array of `arrays` whose attributes name its dimensions as xarray records them: name -> dimensions."""
    keys = [f"{group.path + '/' if group.path else ''}{name}/.zattrs" for name in arrays]
    found = group.store.get_many(keys)
    out = {}
    for name, key in zip(arrays, keys, strict=True):
        try:
            dims = json.loads(found[key]).get(XARRAY_DIMENSIONS) if key in found else None
        except (ValueError, TypeError, AttributeError):
            dims = None
        if isinstance(dims, list):
            out[name] = [str(d) for d in dims]
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _more(items: dict | list) -> str:
    return f", and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
