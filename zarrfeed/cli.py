"""The `zarrfeed` command: demo, ingest, load, mask, export, info, validate, plot, serve, status (it composes
`writer` and `loader`; the commands are in `zarrfeed.commands`).

Exit codes: 0 success, 1 the dataset is invalid, 2 the input cannot be read (one line on stderr, no traceback),
3 `validate --deep` found nothing wrong but could not check every chunk against a recorded digest,
130 interrupted (Ctrl+C), at any moment: this module imports nothing but the standard library, so that a Ctrl+C
while the commands import numpy, zarr and pyarrow (a good part of a second) is an interrupt too, not a
traceback through the import machinery. And once the command has its exit code, the process's exit keeps it:
see `_exit_keeps_the_code`.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any, Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in `argv` (default: the command line); its exit code. Called without `argv`, as the
    `zarrfeed` command and `python -m zarrfeed` call it, it is the program: a Ctrl+C while the process then
    exits does not change that code (see `_exit_keeps_the_code`). Called with `argv` (from Python, in a
    process that goes on), it leaves the process's handling of Ctrl+C as it was."""
    program = argv is None
    if program:  # registered before the commands import anything: atexit runs it after every other function
        atexit.register(_teardown_ignores_sigint)
    interrupted = False
    try:
        from .core import _proc

        _proc.early_fork_server = False  # the commands that make workers start it then
        from .commands import run

        code = run(argv)
    except KeyboardInterrupt:
        if program:  # a second Ctrl+C, while this says so, is part of the same interrupt
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        interrupted, code = True, 130
    if interrupted:  # said once the exception is gone (see `commands.run`): this line is the last
        print("zarrfeed: interrupted", file=sys.stderr)
    if program:
        _exit_keeps_the_code(code)
    return code


def _exit_keeps_the_code(code: int) -> None:
    """From now on, a Ctrl+C (SIGINT: a terminal sends it to every process of the command) ends the process at
    once with `code`: the command's work and output are done, and what is left is Python's exit, which waits
    for the threads that are not daemons, runs the atexit functions (multiprocess stops its processes there),
    then tears the interpreter down. A KeyboardInterrupt raised in the first two would print a traceback ("Exception
    ignored in ..."), and in the teardown Python has already put back SIGINT's default action (it drops its own
    handlers before it collects the last objects and frees the modules, a tenth of a second and more under load): a
    Ctrl+C there would kill the process by the signal, with nothing said (returncode -2). For
    the teardown, which waits for nothing, SIGINT is ignored (`_teardown_ignores_sigint`).
    A Python signal handler runs in the main thread only, and only once that thread wakes: while it waits for another
    thread to end, a SIGINT that the kernel delivers to that other thread wakes nothing (a hang). So the signal's
    number also goes to a pipe (`signal.set_wakeup_fd`, written by the C-level handler in whichever thread takes it),
    which a daemon thread reads and acts on."""
    def exit_now(*_: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader that left, a stream already closed: nothing to say there
                pass
        os._exit(code)

    def watch(fd: int) -> None:
        while True:
            got = os.read(fd, 64)
            if not got or signal.SIGINT in got:
                break
        if got:
            exit_now()

    signal.signal(signal.SIGINT, exit_now)
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    threading.Thread(target=watch, args=(r,), name="zarrfeed: Ctrl+C at exit", daemon=True).start()


def _teardown_ignores_sigint() -> None:
    """The last atexit function: SIGINT ignored from here to the end of the process. Python's teardown comes
    next, and resets a signal that has a Python handler to its default action, which for SIGINT is to die by
    it; an ignored signal it leaves ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
