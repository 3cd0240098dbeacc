"""Keyword options taken as `**options` (the loaders' and writers' option declarations): an unknown name is
refused as Python refuses an unknown keyword argument of a function's own, naming the close one, and each
value is checked once, here, in one line naming the option (a wrong type failing deep inside, or a string
taken as True, is what these prevent: `overwrite="no"` once replaced a dataset)."""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
from collections.abc import Mapping
from typing import Any, Callable, TypeVar

import numpy as np

T = TypeVar("T")


def refuse_unknown(given: Mapping[str, Any], known: list[str], who: str) -> None:
    """TypeError, as Python words it for a function's own parameters, for a name of `given` not `known`
    (`who`: the function, e.g. "Loader.__init__")."""
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f". Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{who}() got an unexpected keyword argument {name!r}{hint}")


def option_names(cls: Any) -> dict[str, Any]:
    """Option name -> default, of an option dataclass or of options made of groups (`GROUPS`: field -> the
    dataclass of that group), in declaration order."""
    groups = getattr(cls, "GROUPS", None)
    if groups is None:
        return {f.name: f.default for f in dataclasses.fields(cls)}
    return {name: default for group in groups.values() for name, default in option_names(group).items()}


def taken(cls: Any, given: Mapping[str, Any], who: str) -> Any:
    """The options `who` (e.g. "Loader.__init__") was given, as `cls`: an option dataclass, or one made of
    groups (`GROUPS`), each group checked by its own `__post_init__`; an unknown name refused as Python refuses
    an unknown keyword. Options made of groups also record which the user gave (`given`, a field: a None is
    the default, not a choice), since a default window or a resumed order depends on it."""
    refuse_unknown(given, list(option_names(cls)), who)
    groups = getattr(cls, "GROUPS", None)
    if groups is None:
        return cls(**given)
    parts = {field: group(**{k: v for k, v in given.items() if k in option_names(group)})
             for field, group in groups.items()}
    return cls(**parts, given=frozenset(k for k, v in given.items() if v is not None))


class NotGiven:
    """The default shown for an option whose absence is not its default value (see `spelled_out`)."""

    def __repr__(self) -> str:
        return "<not given>"


def spelled_out(declared: Any, defaults: Any) -> Callable[[T], T]:
    """A decorator for a class (its `__init__`) or a function taking `**options` declared by the TypedDict
    `declared`: its signature, as `help()` and `inspect.signature` show it, lists each option as keyword-only
    with its default (from the option dataclass `defaults`) in place of `**options`; an option named in
    `defaults.NOT_GIVEN` (one that means more given than left out) shows `<not given>`. The options stay
    declared once; this only shows them where a reader looks."""
    unset = getattr(defaults, "NOT_GIVEN", ())
    values = {name: NotGiven() if name in unset else default for name, default in option_names(defaults).items()}

    def spell(target: T) -> T:
        function: Any = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in own}
        options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=values[name],
                                     annotation=getattr(kind, "__forward_arg__", kind))  # as the code spells it
                   for name, kind in declared.__annotations__.items() if name not in names]
        # On the function, not the class: a subclass with an `__init__` of its own shows its own signature
        # (`inspect.signature` of a class reads its `__init__`'s, less `self`).
        function.__signature__ = signature.replace(parameters=own + options)
        return target
    return spell


def flag(value: Any, name: str, none: bool = False) -> bool | None:
    """`value` as True or False (None too, with `none`); anything else (a string "no" is true to Python)
    refused."""
    if value is None and none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        also = " or None" if none else ""
        raise ValueError(f"{name} must be True or False{also}, got {value!r}")
    return bool(value)


def count(value: Any, name: str, least: int, none: str | None = None) -> int | None:
    """`value` as a Python int >= `least` (numpy integers taken, bools and floats refused), or None when
    `none` says what None means; else one line."""
    if value is None and none is not None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < least:
        also = f" (or None: {none})" if none else ""
        raise ValueError(f"{name} must be an integer >= {least}{also}, got {value!r}")
    return int(value)


def seconds(value: Any, name: str, zero: bool = False, none: str | None = None) -> float | None:
    """`value` as a number of seconds > 0 (>= 0 with `zero`), or None when `none` says what None means."""
    if value is None and none is not None:
        return None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)) \
        and math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        also = f" (or None: {none})" if none else ""
        raise ValueError(f"{name} must be a number of seconds {'>= 0' if zero else '> 0'}{also}, got {value!r}")
    return float(value)


def choice(value: Any, name: str, choices: tuple) -> Any:
    if value not in choices or isinstance(value, bool):
        said = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {said}, got {value!r}")
    return value


def mapping(value: Any, name: str) -> Mapping | None:
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a dict (or None), got {value!r}")
    return value


def text(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be a string (or None), got {value!r}")
    return value


def folder(value: Any, name: str) -> Any:
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a path (or None), got {value!r}")
    return value
