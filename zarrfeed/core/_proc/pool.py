"""A pool of worker processes that talk through small messages, and notice when the other side dies.

Each worker runs `setup(wid, *args)` once, which returns `handle(msg) -> reply`, then answers the messages
of its own pipe on the same pipe. If `handle.urgent(msg)` exists, messages waiting in the pipe for which it
is true are answered before the others (a reader worker gathers a batch the trainer waits for before it
fetches chunks for later windows), and `handle.waiting(msgs)`, if it exists, is told of the messages still
waiting (so a worker can start fetching what they will need while it does something else). A worker exits
when sent None, after a failed message (reporting it with its traceback), or by itself within half a second
once its parent is gone. The parent waits on the pipes and
the processes' sentinels together, so it learns of a dead worker at once, with its index, pid and signal.
Pipes rather than queues, and the standard library's C pickler rather than the pure-Python one
`multiprocess` uses for its connections: a small message must cost microseconds, not the work it asks for.
"""
from __future__ import annotations

import contextlib
import copyreg
import io
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import multiprocess as mp

from ..errors import WorkerError
from .imports import (NOT_IN_A_FILE, PACKAGE, fork_server_imports_with_our_path, missing_from_a_script_not_in_a_file,
    script_unnamed_if_unreadable, script_workers_cannot_read, shadowing_folder)

_READY_TIMEOUT = 120.0


@dataclass(frozen=True)
class RemoteError:
    """An exception raised in a worker, carried to the parent as an object (as PyTorch's ExceptionWrapper
    does): the exception itself when it survives pickling, so the parent can raise `from` it and callers can
    look at its type; always its type name, message and the worker's traceback."""

    exc: BaseException | None
    type_name: str
    message: str
    traceback: str

    @classmethod
    def capture(cls, exc: BaseException) -> "RemoteError":
        """The exception being handled, ready to send (call it in an `except` block). A name of a script that
        workers could not run again says so (`NOT_IN_A_FILE`)."""
        try:
            carried: BaseException | None = pickle.loads(pickle.dumps(exc, pickle.HIGHEST_PROTOCOL))
        except Exception:  # an exception holding something unpicklable: its text still travels
            carried = None
        message = str(exc)
        if missing_from_a_script_not_in_a_file(exc):
            message = f"{message} ({NOT_IN_A_FILE})"
        return cls(carried, f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
                   message, traceback.format_exc())

    def __str__(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type_name}: {first}" if first else self.type_name


@dataclass(frozen=True, slots=True)
class Ready:
    """A worker's first reply: it ran its setup and waits for messages."""

    worker: int


@dataclass(frozen=True, slots=True)
class Failed:
    """A worker's last reply: its handler raised on `message` (None: its setup raised) and it exits."""

    worker: int
    message: Any
    error: RemoteError


class _CPickled:
    """One argument of a worker, pickled by the C pickler when the worker starts (inside the start, so shared
    memory blocks pass their descriptors): `multiprocess` pickles what starts a process with dill, a pure-Python
    pickler, which took 58 ms a worker for a LeRobot loader's 0.9 MB of arrays. What the C pickler refuses, or
    would pickle by a reference to the script's `__main__` (which dill pickles by value, and a worker may not
    have), goes to dill as it is. (Callables, such as a transform, are never wrapped: see `_packed`.)"""

    def __init__(self, arg: Any) -> None:
        self.arg = arg

    def __reduce__(self) -> tuple[Any, ...]:
        try:
            payload = _c_pickled(self.arg)
        except (pickle.PicklingError, TypeError, AttributeError):
            payload = b"__main__"
        if b"__main__" in payload:
            return _same, (self.arg,)
        return pickle.loads, (payload,)


def _c_pickled(arg: Any) -> bytes:
    """`arg` pickled by the C pickler with `multiprocess`'s own reducers (a `Connection` or `Queue` passes its
    descriptors to the worker, as `multiprocess` pickles them, rather than their numbers)."""
    from multiprocess.reduction import ForkingPickler

    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, **ForkingPickler._extra_reducers}
    pickler.dump(arg)
    return buffer.getvalue()


def _same(arg: Any) -> Any:
    return arg


def _packed(args: tuple) -> tuple:
    """`args` with each argument that is not a callable wrapped in `_CPickled`."""
    return tuple(a if callable(a) else _CPickled(a) for a in args)


def _unpacked(args: tuple) -> tuple:
    """What `_packed` made, as it was (a forked worker gets the wrappers themselves: nothing was pickled)."""
    return tuple(a.arg if isinstance(a, _CPickled) else a for a in args)


def _parent_gone(parent_pid: int, direct: bool) -> bool:
    """Whether the process that started this worker has exited. Under "fork" and "spawn" it is our parent
    (`direct`) until it dies, and then we are reparented; under "forkserver" our parent is the fork server, so
    the pid itself is asked, and a zombie (killed, not yet reaped by its own parent) counts as gone. (A parent
    that dies also closes its end of our pipe, which ends the loop below: this check is for the "fork" case,
    where siblings forked later may hold that end too.)"""
    if os.getppid() == parent_pid:
        return False
    if direct:
        return True
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's: not ours, so ours is gone
        return True
    return process_state(parent_pid) == "Z"  # None without /proc (not Linux): the signal check is all there is


def process_state(pid: int) -> str | None:
    """The state letter of process `pid` in /proc/PID/stat ("R" running, "S" sleeping, "D" in a disk wait, "T"
    stopped by a signal, "t" stopped by a tracer, "Z" a zombie, ...); None if it is gone or /proc says nothing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


# seconds a wait on a process may last with nothing moving before it is said in the log (loaders and writers), so
# that a wait on a stopped process (SIGSTOP, Ctrl+Z, a debugger), which is right to wait, is never a silent one
SAY_STALL_AFTER = 10.0


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, Ctrl+Z, a debugger or tracer, a frozen cgroup's SIGSTOP): it
    lives, holds what it holds, and does nothing until it gets SIGCONT."""
    return process_state(pid) in ("T", "t")


@dataclass(frozen=True)
class ParentSettings:
    """What a worker takes from its parent as the pool starts: the environment and the umask. A worker forked from
    the fork server would otherwise have the server's, from when the server started (at the script's import of
    zarrfeed): a script that sets `CUDA_VISIBLE_DEVICES`, S3 credentials or a private umask after its imports
    expects its workers to have them. (What a library the server imported read from the environment as it was
    imported, numpy's BLAS threads for one, stays as it was then.)"""

    environ: dict[str, str]
    umask: int | None

    @classmethod
    def now(cls) -> "ParentSettings":
        umask = None
        try:  # (from /proc: setting it to read it, as os.umask does, would race with this process's threads)
            with open("/proc/self/status") as f:
                umask = next((int(line.split()[1], 8) for line in f if line.startswith("Umask:")), None)
        except (OSError, ValueError):
            pass
        return cls(dict(os.environ), umask)

    def apply(self) -> None:
        if os.environ != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        if self.umask is not None:
            os.umask(self.umask)


def _serve(wid: int, conn: Any, parent_pid: int, blosc_threads: int,
           setup: Callable[..., Callable[[Any], Any]], args: tuple, parent: ParentSettings | None = None) -> None:
    """A worker's life (see the module docstring). A parent that dies (even SIGKILLed with replies unread,
    which resets the pipe) ends it quietly: the parent's death is the message, not a traceback per worker."""
    import numcodecs.blosc

    if parent is not None:
        parent.apply()
    args = _unpacked(args)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the parent's to handle
    if hasattr(signal, "pthread_sigmask"):  # started with it held back (see `sigint_held`): ignored from here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    numcodecs.blosc.set_nthreads(blosc_threads)
    numcodecs.blosc.use_threads = blosc_threads > 1
    try:
        _answer(wid, conn, parent_pid, os.getppid() == parent_pid, setup, args)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the pipe's other end, the parent, is gone
        pass


def _answer(wid: int, conn: Any, parent_pid: int, direct: bool, setup: Callable[..., Callable[[Any], Any]],
            args: tuple) -> None:
    def send(reply: Any) -> None:
        conn.send_bytes(pickle.dumps(reply, pickle.HIGHEST_PROTOCOL))

    try:
        handle = setup(wid, *args)
    except BaseException as exc:
        send(Failed(wid, None, RemoteError.capture(exc)))
        return
    send(Ready(wid))
    urgent, waiting = getattr(handle, "urgent", None), getattr(handle, "waiting", None)
    backlog: list = []
    while True:
        if not backlog and not conn.poll(0.5):
            if _parent_gone(parent_pid, direct):
                return
            continue
        if not backlog:
            backlog.append(pickle.loads(conn.recv_bytes()))
        while urgent and conn.poll(0):  # everything waiting, to pick the urgent ones first
            backlog.append(pickle.loads(conn.recv_bytes()))
        pick = next((i for i, m in enumerate(backlog) if m is None or urgent(m)), 0) if urgent else 0
        msg = backlog.pop(pick)
        if waiting is not None and backlog:
            waiting(backlog)
        if msg is None or _parent_gone(parent_pid, direct):  # messages still buffered from a dead parent: not done
            return
        try:
            reply = handle(msg)
        except BaseException as exc:
            send(Failed(wid, msg, RemoteError.capture(exc)))
            return
        send(reply)


# Imported once by the fork server, not by each worker: fsspec and numcodecs (else a worker imports them when it
# opens its first array: most of a worker's start, most of the time to the first batch), numpy 2 imports
# numpy.random on first use, and whichever pool starts the server first decides the list for every later pool
# of the process (a Loader's workers forked from a server a writer started would import the loader themselves,
# before the first batch).
_PRELOAD = {"numpy", "numpy.random", "numcodecs", "fsspec", "zarrfeed.core.zarr_array"}


def preload_in_workers(*modules: str) -> None:
    """Have the fork server import `modules` (worker modules name themselves when imported), if it has not
    started yet; once it runs, workers import what they need themselves."""
    _PRELOAD.update(modules)


_RERUN_EXIT = 87  # a worker's exit code: it ran the user's script again, whose top-level code starts workers


def _leave_if_rerunning_the_script() -> None:
    """In a worker that is running the user's script again while starting (as "forkserver" and "spawn" do, as
    `__mp_main__`), the script's unguarded top-level code is making a pool of its own: exit at once, quietly,
    with `_RERUN_EXIT`. The parent then says so in one line (see `WorkerPool._wait_ready`) instead of every
    worker printing multiprocessing's RuntimeError about the bootstrapping phase."""
    if getattr(mp.current_process(), "_inheriting", False):
        os._exit(_RERUN_EXIT)


def _quiet_when_the_script_fails_again(previous: Callable[..., Any] = sys.excepthook) -> None:
    """Installed in every process that imports this module (a fork server preloads it, a spawned worker imports
    it with the script): an exception raised while a starting worker runs the user's script again
    (multiprocessing's `_fixup_main_from_path` / `_fixup_main_from_name` in the traceback) ends that worker
    quietly with `_RERUN_EXIT`, so that the parent says it once; any other exception is printed as before."""
    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        names = {frame.f_code.co_name for frame, _ in traceback.walk_tb(tb)}
        if {"_fixup_main_from_path", "_fixup_main_from_name"} & names:
            os._exit(_RERUN_EXIT)
        previous(kind, value, tb)

    sys.excepthook = hook


_quiet_when_the_script_fails_again()


def _one_line_if_uncaught(exc: BaseException) -> None:
    """Have Python print `exc`, should it end the program, as its last line alone: the fix it names is in the
    user's script, and the traceback through zarrfeed would only hide it. Caught, it is an exception as any."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        chain: BaseException | None = value
        seen: set[int] = set()
        while chain is not None and id(chain) not in seen and chain is not exc:
            seen.add(id(chain))
            chain = chain.__cause__ or chain.__context__
        if chain is exc:
            print(traceback.format_exception_only(kind, value)[-1].rstrip("\n"), file=sys.stderr)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook


@contextlib.contextmanager
def sigint_held(tracker: bool) -> Iterator[None]:
    """Ctrl+C held back (SIGINT blocked in this thread) while processes are started. A terminal's Ctrl+C goes
    to every process of the command, and a fork server or a worker still importing its modules (the fork
    server preloads numpy and numcodecs for about half a second) would print a KeyboardInterrupt traceback of its
    own. A started process inherits the blocked signal: a worker ignores it (`_serve`), the fork server too
    (it ignores SIGINT once it has preloaded; as the standard library's resource tracker is started), and this
    thread receives it as soon as the processes are started, as the command's interrupt. `tracker`: start
    multiprocess's resource tracker first, as "forkserver" and "spawn" do when they start a process, for its
    start unblocks SIGINT when it is done."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    if tracker:
        from multiprocess import resource_tracker

        resource_tracker.ensure_running()
    # blocked in this thread only: the kernel then gives a process-wide SIGINT to another thread that does not
    # block it (a pool's or a cache's thread), and Python raises KeyboardInterrupt in the main thread all the
    # same, mid-start (a child then read half its start-up data: "EOFError" from the fork server). So in the main
    # thread a Python handler only notes it, and the interrupt is raised once the processes are started. (A
    # handler set from C, which `getsignal` shows as None, is left alone: it was not Python's to raise.)
    noted: list[int] = []
    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # only read: a block made before `try` could leak
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if callable(handler):
            signal.signal(signal.SIGINT, handler)
            if noted:
                handler(signal.SIGINT, None)  # the interrupt, now (Python's own handler raises KeyboardInterrupt)


def _ensure_fork_server() -> None:
    from multiprocess import forkserver  # the same module as the context's: its lock makes this safe

    with sigint_held(tracker=True):
        forkserver.ensure_running()


def context(start_method: str | None, setup: Callable | None = None) -> Any:
    """The multiprocessing context for workers: `start_method`, or by default "forkserver" where there is
    one. Why not "fork", the fastest: the process that starts workers has threads (the writer's lease
    heartbeat, fsspec's event loop, Blosc, the user's own), and a forked child may inherit a lock one of them
    held and deadlock; Python 3.12 warns of it and 3.14 stops defaulting to it. The fork server is started
    once per process with the worker modules (`_PRELOAD`) and `setup`'s imported, so later workers start only a little
    later than forked ones, and the first pool of a process pays for starting the server (see `start_fork_server`;
    bench/bench_loader.py measures the time to the first batch). Pass start_method="fork" to trade that safety for
    speed."""
    _leave_if_rerunning_the_script()
    methods = mp.get_all_start_methods()
    ctx = mp.get_context(start_method or ("forkserver" if "forkserver" in methods else None))
    if ctx.get_start_method() == "forkserver":
        fork_server_imports_with_our_path()  # not the working directory's folders (see there)
        if setup is not None:
            ctx.set_forkserver_preload(sorted(_PRELOAD | {setup.__module__}))
    return ctx


def start_fork_server(start_method: str | None, setup: Callable) -> None:
    """Start the fork server now, in a background thread, so that the first pool of this process does not
    wait for it (about 0.5 s: a new interpreter importing numpy, numcodecs and the worker modules). Loaders call it
    when made, so the server starts while the training script builds its model."""
    ctx = context(start_method, setup)
    if ctx.get_start_method() == "forkserver":
        threading.Thread(target=_ensure_fork_server, name="zarrfeed-forkserver", daemon=True).start()


def start_fork_server_early() -> None:
    """Start this process's fork server now, in the background, when a module that makes worker pools is first
    imported (`DatasetWriter`'s, the loaders'): its new interpreter imports numpy, numcodecs and the worker
    modules (a quarter to half a second here) while the script goes on (making its data, its model), so that the
    first pool does not wait for it. Starting it is a fork and exec (safe beside threads), a few milliseconds; the
    server exits with this process. Only in the user's own process: not in the fork server or a worker, ours or
    one of the standard library's pools (they import these modules too), nor where the default start method is
    not "forkserver", nor in the command line (see `zarrfeed.core._proc.early_fork_server`)."""
    from . import early_fork_server

    std = sys.modules.get("multiprocessing")  # (a worker of the standard library's pools has imported it)
    if (not early_fork_server or mp.parent_process() is not None or in_the_fork_server()
            or (std is not None and std.parent_process() is not None)
            or getattr(mp.current_process(), "_inheriting", False)):  # (a worker unpickling what it was sent)
        return
    ctx = context(None)
    if ctx.get_start_method() != "forkserver":
        return
    ctx.set_forkserver_preload(sorted(_PRELOAD))
    _ensure_fork_server()


def _forget_the_fork_server() -> None:
    """In a child this process forked (os.fork, a torch rank started with "fork"): the fork server is its
    parent's, not its own, and multiprocess would wait for it as for a child ("ChildProcessError: No child
    processes" at the child's first pool). The child starts its own when it needs one; its parent's lock, which a
    thread may have held at the fork, is replaced."""
    from multiprocess import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        try:  # (the parent's server then exits with the parent alone)
            os.close(server._forkserver_alive_fd)
        except OSError:
            pass
    server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None
    server._lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_the_fork_server)


def in_the_fork_server() -> bool:
    """Whether this process is a fork server importing its preloaded modules (multiprocess's `forkserver.main`
    is on the stack): it has no parent process of multiprocessing's to tell it apart otherwise."""
    frame: Any = sys._getframe()
    while frame is not None:
        if frame.f_globals.get("__name__") == "multiprocess.forkserver":
            return True
        frame = frame.f_back
    return False


class WorkerPool:
    """`n` processes named `{name}-{i}`, each answering the messages of its own pipe."""

    def __init__(self, n: int, setup: Callable[..., Callable[[Any], Any]], args: tuple, name: str,
                 start_method: str | None = None) -> None:
        self._ctx = context(start_method, setup)
        self.name, self._setup, self._args = name, setup, args
        self.conns: list[Any] = [None] * n
        self.procs: list[Any] = [None] * n
        self._poller: Any = None
        self._pending: list[Any] = []
        self._threads = max(1, (os.cpu_count() or 1) // max(n, 1))
        for i in range(n):
            self._start(i)
        self._wait_ready(set(range(n)))

    def _start(self, wid: int) -> None:
        mine, theirs = self._ctx.Pipe()
        self.conns[wid] = mine
        self.procs[wid] = self._ctx.Process(
            target=_serve, name=f"{self.name}-{wid}", daemon=True,
            args=(wid, theirs, os.getpid(), self._threads, self._setup, _packed(self._args), ParentSettings.now()))
        with sigint_held(tracker=self._ctx.get_start_method() != "fork"):  # ours, once the worker started
            try:
                with script_unnamed_if_unreadable():
                    self.procs[wid].start()
            except BrokenPipeError:  # it exited before it had read what it is started with (a large `args`):
                self.procs[wid] = None  # under "forkserver", the user's script run again and exiting (see
                self.kill()  # `_leave_if_rerunning_the_script`) is what does that
                err = WorkerError(self._shadowed_message(wid, None)
                                  or f"{self.name} {wid} exited while it was being started{self._start_hint()}")
                _one_line_if_uncaught(err)
                raise err from None
        theirs.close()
        self._poller = None  # register the new pipe and sentinel at the next receive

    def _wait_ready(self, waiting: set[int]) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        while waiting:
            for msg in self._receive(0.1):
                if isinstance(msg, Ready) and msg.worker in waiting:
                    waiting.discard(msg.worker)
                elif isinstance(msg, Failed) and msg.message is None:
                    self.kill()
                    shadowed = self._shadowed_message(msg.worker, None) if isinstance(msg.error.exc, ImportError) \
                        else None
                    raise WorkerError(shadowed or f"{self.name} {msg.worker} failed to start: {msg.error}",
                                      msg.error) from msg.error.exc
                else:
                    self._pending.append(msg)
            dead = [d for d in self.dead() if d[0] in waiting]
            if dead:
                self.kill()
                shadowed = self._shadowed_message(*dead[0][:2])
                if shadowed or dead[0][2] == _RERUN_EXIT:
                    err = WorkerError(shadowed or self._rerun_message(*dead[0][:2]))
                    _one_line_if_uncaught(err)
                    raise err
                raise WorkerError(describe_exit(self.name, *dead[0]) + " while starting" + self._start_hint())
            if time.monotonic() > deadline:
                self.kill()
                raise WorkerError(f"{self.name}s did not start within {_READY_TIMEOUT:.0f} s")

    def _start_hint(self) -> str:
        """Why a worker most often dies while starting under "spawn" or "forkserver": it imports the user's
        script again (as Python does for these methods), and the script's unguarded top-level code runs."""
        script = getattr(sys.modules.get("__main__"), "__file__", None)
        if self._ctx.get_start_method() == "fork" or not script or script_workers_cannot_read():
            return ""
        return (f" (with start method {self._ctx.get_start_method()!r} every worker imports {script} again: put "
                f"its top-level code under `if __name__ == \"__main__\":`)")

    def _shadowed_message(self, wid: int, pid: int | None) -> str | None:
        """The line for a worker that could not start because it imports another folder as `zarrfeed` (see
        `shadowing_folder`), or None when it does not (a forked worker imports nothing: it has this process's
        modules)."""
        folder = shadowing_folder() if self._ctx.get_start_method() != "fork" else None
        if folder is None:
            return None
        which = f"{self.name} {wid}" + (f" (pid {pid})" if pid is not None else "")
        return (f"{which} could not start: it imports the folder {folder} as zarrfeed, in place of {PACKAGE} (a "
                f"folder named zarrfeed in {os.path.dirname(folder)}, which is on the workers' sys.path): rename that "
                "folder or take its parent off sys.path")

    def _rerun_message(self, wid: int, pid: int) -> str:
        script = getattr(sys.modules.get("__main__"), "__file__", "the script")
        return (f"{self.name} {wid} (pid {pid}) ran {script} again while starting, as start method "
                f"{self._ctx.get_start_method()!r} does, and its top-level code failed there or started workers "
                "of its own: put its "
                "top-level code under `if __name__ == \"__main__\":` (or pass start_method=\"fork\")")

    def restart(self, wid: int) -> None:
        """Start a new process in place of dead worker `wid` (its unanswered messages must be sent again)."""
        self.procs[wid].join(1)
        self.conns[wid].close()
        self._start(wid)
        self._wait_ready({wid})

    def send(self, wid: int, msg: Any, waiting: Callable[[], None] | None = None) -> None:
        """Send `msg` to worker `wid`; if it has died, `poll` and `dead` report it. With `waiting`, a send that
        finds the pipe full (a stopped worker reads nothing) waits for room in steps of 0.1 s, calling
        `waiting()` between them, which may raise: a write into a full pipe would block where nothing can look
        at the wait (the loader's stall watch and `stall_timeout`)."""
        data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        conn = self.conns[wid]
        if waiting is not None:
            room = select.poll()  # writable: a Unix socket with under a quarter of its send buffer queued
            room.register(conn.fileno(), select.POLLOUT)
            while not room.poll(100) and self.procs[wid].exitcode is None:
                waiting()
        try:
            conn.send_bytes(data)
        except OSError:  # BrokenPipeError: the worker is gone
            pass

    def _receive(self, timeout: float) -> list[Any]:
        if self._poller is None:  # one poll object for all pipes and process sentinels, kept between calls
            self._poller, self._by_fd = select.poll(), {}
            for wid, (c, p) in enumerate(zip(self.conns, self.procs, strict=True)):
                if c is not None and not c.closed and p.exitcode is None:
                    self._by_fd[c.fileno()] = c
                    self._poller.register(c.fileno(), select.POLLIN)
                    self._poller.register(p.sentinel, select.POLLIN)
        out = []
        for fd, _ in self._poller.poll(max(0, int(timeout * 1000))):
            conn = self._by_fd.get(fd)
            if conn is None:  # a process sentinel: that worker has exited
                self._poller.unregister(fd)
                continue
            try:
                while conn.poll():
                    out.append(pickle.loads(conn.recv_bytes()))
            except (EOFError, OSError):  # the worker is gone; `dead()` says how
                self._poller.unregister(fd)
                del self._by_fd[fd]
        return out

    def poll(self, timeout: float) -> list[Any]:
        """Replies that arrived within `timeout` (all that are waiting); returns early if a worker dies."""
        out, self._pending = self._pending, []
        return out + self._receive(0 if out else timeout)

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [p.pid for p in self.procs]

    def stopped(self) -> list[tuple[int, int]]:
        """(worker index, pid) of workers that are stopped (see `is_stopped`)."""
        return [(i, p.pid) for i, p in enumerate(self.procs) if p is not None and p.exitcode is None
                and is_stopped(p.pid)]

    def dead(self) -> list[tuple[int, int, int | None]]:
        """(worker index, pid, exit code) of workers that have exited."""
        return [(i, p.pid, p.exitcode) for i, p in enumerate(self.procs) if p.exitcode is not None]

    def stop(self, timeout: float = 2.0) -> None:
        """Ask every worker to finish, then kill those still running after `timeout` seconds."""
        for wid in range(len(self.conns)):
            self.send(wid, None)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p is not None and p.exitcode is None:
                p.kill()
        for p in self.procs:
            if p is not None:
                p.join(5)
        for c in self.conns:
            if c is not None:
                c.close()


def describe_exit(name: str, wid: int, pid: int, code: int | None) -> str:
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"{name} {wid} (pid {pid}) {how}"
