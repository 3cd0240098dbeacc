"""Names of a package imported on first use (PEP 562).

A package's `__init__` that imported every module would make each worker process load all of them: importing
`zarrfeed.writer.write_worker` runs `zarrfeed.writer`'s `__init__` first, and an eager one pulls in pyarrow and
the pool's parent side, which a worker never uses (and which delays the fork server's start). With this, a
worker loads what its own module imports, and `from zarrfeed.writer import DatasetWriter` works as an eager
import would.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(package: str, homes: dict[str, str],
               modules: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: each name of `homes` is imported from the module it maps to
    (relative to `package`) when first asked for, then kept; `modules` are submodules exported as names. The
    package keeps a literal `__all__` (what linters and the docs read); a test checks it names the same."""
    names = sorted([*homes, *modules])

    def __getattr__(name: str) -> Any:
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name], package), name)
        vars(importlib.import_module(package))[name] = value  # asked once: later lookups find it directly
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
