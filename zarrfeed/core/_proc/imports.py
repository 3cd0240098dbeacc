"""What a worker imports while it starts, and why that can fail: the fork server's sys.path, the user's script
(which "forkserver" and "spawn" workers run again, as `__mp_main__`) and a folder named `zarrfeed` that a
worker would import in place of this package.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from importlib.machinery import PathFinder
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from multiprocess import process, util

PACKAGE = Path(__file__).resolve().parents[2]  # this package's folder (links resolved: an editable install's)
_SERVER_COMMAND = "from multiprocess.forkserver import main"
_MAIN_LOCK = threading.Lock()  # the script's name is set aside while a worker starts: one start at a time


def workers_sys_path() -> list[str]:
    """The sys.path a worker imports with: this process's, its current folder ('') named as multiprocess names
    it for a worker (the folder this process started in), without what Python's import ignores (not a str)."""
    here = process.ORIGINAL_DIR or ""
    return [here if entry == "" else entry for entry in sys.path if isinstance(entry, str)]


def fork_server_imports_with_our_path() -> None:
    """Have a fork server this process starts import with `workers_sys_path()`, as its workers do.

    multiprocess starts the fork server with `python -c`, whose sys.path begins with the current folder, and
    the server ignores the sys.path it is handed (CPython's gh-117378, fixed in the standard library's
    multiprocessing, not in multiprocess): it would import a folder named `zarrfeed` in the working directory (an
    empty one, the clone of this project seen from the folder holding it) in place of this package, and no worker
    forked from it could start. So the server's command sets our path first. It also names PosixPath, which the
    command holds when sys.path does (`sys.path.append(Path(...))`: the import ignores such an entry, but without the
    name the server would fail to start, "NameError: name 'PosixPath' is not defined"). Installed once per process
    (multiprocess starts its processes through `util.spawnv_passfds`; other commands pass unchanged)."""
    spawnv = util.spawnv_passfds
    if getattr(spawnv, "zarrfeed_path", False):
        return

    def spawnv_passfds(path: str, args: list[str], passfds: Any) -> int:
        if args[-2:-1] == ["-c"] and args[-1].startswith(_SERVER_COMMAND):
            args = [*args[:-1], f"import sys; from pathlib import PosixPath; sys.path[:] = {workers_sys_path()!r}; "
                                f"{args[-1]}"]
        return spawnv(path, args, passfds)

    spawnv_passfds.zarrfeed_path = True  # type: ignore[attr-defined]
    util.spawnv_passfds = spawnv_passfds


def script_workers_cannot_read(main: ModuleType | None = None) -> str | None:
    """The name of the user's script (`main`, by default `__main__`) when workers could not run it again (read from
    standard input, `python - <<EOF`, which names it "<stdin>"; a pipe, `python <(...)`; a file since removed);
    None when they can or there is no script (`python -c`, a notebook; `python -m` names a module, not a file)."""
    main = main or sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return None
    return None if os.path.isfile(os.path.join(process.ORIGINAL_DIR or "", path)) else path


@contextlib.contextmanager
def script_unnamed_if_unreadable() -> Iterator[None]:
    """Around a worker's start: a script workers could not read again is not named to them (`__main__.__file__`
    is set aside, then put back). Named, every "forkserver" or "spawn" worker would try to run "<stdin>" again and
    fail. Unnamed, workers start as they do for `python -c`, without the script's top-level names (`NOT_IN_A_FILE`
    says so where that matters)."""
    with _MAIN_LOCK:
        main = sys.modules.get("__main__")
        unreadable = script_workers_cannot_read(main)
        if unreadable is not None:
            del main.__file__  # type: ignore[union-attr]
        try:
            yield
        finally:
            if unreadable is not None:
                main.__file__ = unreadable  # type: ignore[union-attr]


NOT_IN_A_FILE = ("the script was read from standard input or given with -c, not from a file, so workers cannot run it "
                 "again and its top-level names are not defined in them: import what the function uses inside it, "
                 "save the script to a file and run that, or pass start_method=\"fork\"")


def missing_from_a_script_not_in_a_file(exc: BaseException) -> bool:
    """Whether `exc`, raised in a worker, is a name of the user's script that the worker does not have: a NameError
    raised in a function of `__main__` whose code is in no file, in a worker that was not forked (a forked one has
    the script's names)."""
    if not isinstance(exc, NameError) or exc.__traceback__ is None:
        return False
    if getattr(process.current_process(), "_start_method", None) == "fork":
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    main = sys.modules.get("__main__")
    return (main is not None and tb.tb_frame.f_globals is vars(main)
            and not os.path.isfile(tb.tb_frame.f_code.co_filename))


def shadowing_folder() -> str | None:
    """The folder a worker would import as `zarrfeed` in place of this package: a folder of that name in a folder
    on the workers' sys.path (added by the script after it imported zarrfeed, say), taken before this package (a
    package of that name, or any folder when this package is installed editable, through an import hook that
    Python asks after its path). None when the workers would import this package."""
    spec = PathFinder.find_spec("zarrfeed", workers_sys_path())
    if spec is None:  # no folder of that name on the path: the import hook of an editable install finds this one
        return None
    if spec.origin and spec.has_location:
        found = Path(spec.origin)
        return None if found.resolve() == PACKAGE / "__init__.py" else str(found.parent)
    return str(next(iter(spec.submodule_search_locations or []), "")) or None  # a namespace: a folder without code
