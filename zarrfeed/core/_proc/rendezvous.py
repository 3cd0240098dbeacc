"""One anonymous memory file per name, per user, per host (and per namespace): found by any process that asks
for the name, with no daemon, nothing in /dev/shm and no file of the memory on disk.

How. Each process that holds the memory file (`memfd_create`) serves it: it listens on a Unix socket in
Linux's abstract namespace (a name, not a file: it goes away with the process, even after SIGKILL) whose name
says the process and the descriptor that holds the file. A process that asks for the name takes the name's
lookup lock (see below), looks for a live server in /proc/net/unix, and opens the file through
/proc/<pid>/fd/<fd> of that server (the kernel allows it for processes of the same user only, and it needs
nothing of the server: a stopped or busy server still hands it over); where /proc refuses (a process that is
not dumpable), a thread of the server passes the descriptor over the socket (SCM_RIGHTS), after checking with
SO_PEERCRED that the peer runs as the same user. Either way the asker checks that the file is a zarrfeed
memory file of that name owned by its own user (abstract socket names have no permissions: anyone can bind
one, so a server is never trusted by its name alone). If no server hands it over, the asker creates the
file; then it serves too. Because every holder serves, the file stays reachable as long as any process holds
it, and it is freed by the kernel when the last one closes it or dies. We write this ourselves: no library we
know of shares a memfd between unrelated processes without a broker process.

The lookup lock. Two processes that look up one name at once must not both create the file, so a lookup
holds a lock. It is an OFD lock (see `ofd`: released by the kernel when the process dies) on one byte, chosen
by the name, of an empty file `lookup.lock` in a directory of this user's only: `/tmp/zarrfeed-<uid>` (made
with mode 0700), or `~/.cache/zarrfeed` where that one is another user's, open to others or a link. Not an
abstract socket name: another user could bind it first (the name is in /proc/net/unix for all to see) and
hold every lookup of this user's caches for ever; a directory that only this user can write cannot be
squatted, and one that is not this user's, or a lock file in it that is not,
is never used.

Namespaces. `ZARRFEED_CACHE_NAMESPACE` (letters, digits, '.', '_', '-') puts this process's names in a
namespace of their own: processes see only the caches and the budget ledger of their namespace (a test suite,
or a job that must not share its decoded chunks or its budget with others). Unset: the user's default one.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import re
import socket
import stat
import struct
import threading
import time
from typing import Callable, Iterator

from ..errors import RendezvousError
from .ofd import ProcessLocks

_PREFIX = "zarrfeed"
_LOCK_WAIT = 10.0  # seconds to wait for another process's lookup of the same name before giving up
_ASK_TIMEOUT = 1.0  # seconds a server may take to answer before the next one is tried
NAMESPACE_ENV = "ZARRFEED_CACHE_NAMESPACE"
_NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_LOCK_FILE = "lookup.lock"


def namespace() -> str:
    """This process's namespace of host caches: `ZARRFEED_CACHE_NAMESPACE`, or "" (the user's default one)."""
    ns = os.environ.get(NAMESPACE_ENV, "")
    if ns and not _NAMESPACE.fullmatch(ns):
        raise RendezvousError(f"{NAMESPACE_ENV}={ns!r}: a namespace is 1 to 64 letters, digits, '.', '_' or '-'")
    return ns


def _base(uid: int) -> str:
    """Where the names of user `uid` in this process's namespace start (without the leading NUL)."""
    ns = namespace()
    return f"{_PREFIX}/{uid}/" + (f"ns={ns}/" if ns else "")


def served(name_prefix: str, uid: int | None = None) -> list[str]:
    """The sockets serving names that start with `name_prefix` to user `uid` (default: this one) in this
    process's namespace on this host: what a check that nothing outlives its processes looks at."""
    return _servers(f"\0{_base(os.geteuid() if uid is None else uid)}{name_prefix}")


def _servers(prefix: str) -> list[str]:
    """The listening abstract sockets whose names start with `prefix` on this host (this network namespace)."""
    want = "@" + prefix[1:]
    found = []
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[7].startswith(want) and parts[5] == "01":  # 01: listening
                    found.append("\0" + parts[7][1:])
    except OSError:
        pass
    return found


def _memfd_name(name: str) -> str:
    return f"{_PREFIX}-{name[:40]}"


def _ours(fd: int, name: str | None) -> bool:
    """Whether `fd` is a memory file of this user (and, given `name`, made for that name)."""
    try:
        st = os.fstat(fd)
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    if st.st_uid != os.geteuid() or not target.startswith("/memfd:"):
        return False
    return name is None or target[len("/memfd:"):].removesuffix(" (deleted)") == _memfd_name(name)


def ask(server: str, name: str | None = None, timeout: float = _ASK_TIMEOUT) -> int | None:
    """The descriptor served at abstract name `server` (checked to be this user's memory file for `name`), or
    None if it cannot be had (gone, refused us, or not what it should be)."""
    fd = _from_proc(server)
    if fd is None:
        fd = _from_socket(server, timeout)
    if fd is not None and not _ours(fd, name):
        os.close(fd)
        return None
    return fd


def _from_proc(server: str) -> int | None:
    """The server's descriptor, opened through /proc/<pid>/fd/<fd> (the numbers its socket's name gives)."""
    try:
        pid, fd, _ = server.rsplit("/", 1)[1].split("-")
        return os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_RDWR | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None


def _from_socket(server: str, timeout: float) -> int | None:
    """The descriptor the server's thread passes over its socket, if the server runs as this user."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(server)
            _, peer_uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if peer_uid != os.geteuid():
                return None
            _, fds, _, _ = socket.recv_fds(s, 16, 1)
        except OSError:
            return None
    return fds[0] if fds else None


class Server:
    """Serves `fd` under `prefix` to processes of this user, from a daemon thread, until `close()`. It serves
    a duplicate of its own, closed only once its thread has ended, so the caller may close `fd` at any time."""

    def __init__(self, fd: int, prefix: str) -> None:
        self.fd = os.dup(fd)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(f"{prefix}{os.getpid()}-{self.fd}-{id(self):x}")  # see _from_proc
        self.sock.listen(64)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="zarrfeed-rendezvous", daemon=True)
        self._thread.start()
        _SERVERS.add(self)

    def _serve(self) -> None:
        uid = os.geteuid()
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    _, peer_uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                    if peer_uid == uid:  # another user gets nothing: the connection just closes
                        socket.send_fds(conn, [b"z"], [self.fd])
                except OSError:
                    pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _SERVERS.discard(self)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the thread
        except OSError:
            pass
        self._thread.join(2)
        self.sock.close()
        if not self._thread.is_alive():  # else it may still send it: left open, the process's exit closes it
            os.close(self.fd)

    def forget_in_child(self) -> None:
        """In a forked child, which does not run the serving thread: close the socket and the descriptor."""
        self._closed = True
        for close in (self.sock.close, lambda: os.close(self.fd)):
            try:
                close()
            except OSError:
                pass


_SERVERS: set[Server] = set()


def _close_in_child() -> None:
    """A forked child does not run the serving threads: close their sockets there, or a process that asks
    would wait for an answer that never comes."""
    for server in list(_SERVERS):
        server.forget_in_child()
    _SERVERS.clear()


os.register_at_fork(after_in_child=_close_in_child)


def lock_dirs(uid: int) -> list[str]:
    """Where the lookup lock of user `uid` may be, in order: the first that is this user's only is used."""
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = os.path.expanduser("~")
    return [f"/tmp/zarrfeed-{uid}", os.path.join(home, ".cache", "zarrfeed")]


def _private_dir(path: str, uid: int) -> str | None:
    """Why directory `path` (made, mode 0700, if missing) cannot hold user `uid`'s lock; None if it can."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != uid:
        return f"{path} belongs to uid {st.st_uid}"
    if st.st_mode & 0o077:  # ours, but open to others: close it (a file they put there is refused below)
        try:
            os.chmod(path, 0o700)
        except OSError as exc:
            return f"{path} is open to other users and cannot be closed ({exc.strerror})"
    return None


def _lock_file(uid: int) -> int:
    """A descriptor of this user's lookup lock file, in the first of `lock_dirs` that is this user's only."""
    why = []
    for path in lock_dirs(uid):
        problem = _private_dir(path, uid)
        if problem is None:
            file = os.path.join(path, _LOCK_FILE)
            try:
                fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                why.append(f"{file}: {exc.strerror}")
                continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                return fd
            os.close(fd)
            problem = f"{file} belongs to uid {st.st_uid}" if st.st_uid != uid else f"{file} is not a file"
        why.append(problem)
    raise RendezvousError(f"no directory of this user's only for the host caches' lookup lock ({'; '.join(why)})")


@contextlib.contextmanager
def _lookup_lock(name: str, uid: int) -> Iterator[None]:
    """Hold the lookup of `name` (its byte of this user's lock file) against this user's other processes and
    threads; another process's lookup is waited for up to `_LOCK_WAIT` seconds."""
    fd = _lock_file(uid)
    try:
        locks = ProcessLocks(fd)  # a description of this lookup's own: it excludes this process's other threads
    finally:
        os.close(fd)
    at = int.from_bytes(hashlib.sha256(name.encode()).digest()[:5], "big")  # below 2**40: any byte may be locked
    deadline = time.monotonic() + _LOCK_WAIT
    try:
        while not locks.lock(at, wait=False):
            if time.monotonic() > deadline:
                raise RendezvousError(f"another process of this user has held the lookup of shared cache {name!r} "
                                      f"for {_LOCK_WAIT:.0f} s")
            time.sleep(0.002)
        yield
    finally:
        locks.close()


def find_or_create(name: str, size: int, init: Callable[[int], None]) -> tuple[int, bool, Server]:
    """The memory file shared under `name` by this user's processes on this host, in this process's namespace:
    (descriptor, whether this call created it, the server that now also serves it from this process). A new
    file is `size` bytes and `init(fd)` prepares it before any other process can see it."""
    uid = os.geteuid()
    prefix = f"\0{_base(uid)}{name}/serve/"
    with _lookup_lock(_base(uid) + name, uid):
        fd = None
        for server in _servers(prefix):
            fd = ask(server, name)
            if fd is not None:
                break
        created = fd is None
        if fd is None:
            fd = os.memfd_create(_memfd_name(name), os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                init(fd)
            except BaseException:
                os.close(fd)
                raise
        return fd, created, Server(fd, prefix)
