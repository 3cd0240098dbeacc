"""Named transforms a server applies for its clients (`zarrfeed serve --transforms MODULE`).

A trainer asks for a transform by name, with JSON arguments (`RemoteLoader(..., transform="name",
transform_args={...})`); the server's loader workers run it, so the trainer receives the compact arrays its
model eats instead of raw records. The code is the server's own: a client sends a name and JSON, never code
or pickled objects. A module's transforms are the names in its `__all__`, or else the public functions it
defines; each is called as `fn(batch, **transform_args)` and returns a dict of arrays whose first axis is
the batch's rows (as a local Loader's `transform`).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np


@functools.lru_cache(maxsize=None)
def load_module(source: str) -> ModuleType:
    """The module `source` names: a module name (`my_pkg.transforms`) or a .py file. A file is loaded from
    its path under a name of its own, so it needs no `sys.path` entry in this process or in a worker."""
    if not (source.endswith(".py") or "/" in source):
        try:
            return importlib.import_module(source)
        except ImportError as exc:
            raise ValueError(f"--transforms {source}: cannot import it ({exc})") from None
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--transforms {source}: no such file")
    spec = importlib.util.spec_from_file_location(f"zarrfeed_transforms_{path.stem}", path)
    assert spec is not None and spec.loader is not None  # a .py file always has a spec
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NamedTransform:
    """Transform `name` of module `source` with `args`. It pickles as those three plain values, so each
    loader worker loads the module itself, whatever its `sys.path` (a fork server started before the module
    was known would not find it by name)."""

    def __init__(self, source: str, name: str, args: dict[str, Any] | None = None) -> None:
        self.source, self.name, self.args = source, name, dict(args or {})

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return getattr(load_module(self.source), self.name)(batch, **self.args)

    def __reduce__(self) -> tuple:
        return NamedTransform, (self.source, self.name, self.args)


class Transforms:
    """The transforms of one module (`source`), by name."""

    def __init__(self, source: str | None = None) -> None:
        self.source = str(Path(source).resolve()) if source and (source.endswith(".py") or "/" in source) \
            else source
        self.named: dict[str, Callable] = {}
        if self.source is None:
            return
        module = load_module(self.source)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n, f in vars(module).items() if not n.startswith("_") and inspect.isfunction(f)
                     and f.__module__ == module.__name__]
        for name in names:
            fn = getattr(module, name, None)
            if not callable(fn):
                raise ValueError(f"--transforms {source}: {name!r} in __all__ is not a function")
            self.named[name] = fn

    def resolve(self, name: str, args: dict[str, Any] | None) -> NamedTransform:
        """Transform `name` with `args` bound; ValueError naming the known ones for an unknown name, and one
        for arguments its signature does not take."""
        if name not in self.named:
            known = ", ".join(sorted(self.named)) or "none: start the server with --transforms MODULE"
            raise ValueError(f"unknown transform {name!r} (transforms: {known})")
        try:
            inspect.signature(self.named[name]).bind(None, **(args or {}))
        except TypeError as exc:
            raise ValueError(f"transform {name!r}: transform_args do not fit it ({exc})") from None
        assert self.source is not None  # names come from a module
        return NamedTransform(self.source, name, args)

    def describe(self) -> dict[str, str]:
        """Each transform's name and the first line of its docstring (for `describe`)."""
        return {n: (inspect.getdoc(f) or "").split("\n")[0] for n, f in sorted(self.named.items())}
