"""Store calls given a time limit: `bounded` raises `StoreTimeout` when a call has not returned in time, `within`
gives up on one quietly (cleanup after an error). A remote store's calls are bounded (`StoreSettings.bound`), a
local disk's are not.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, TypeVar

from .errors import StoreTimeout

log = logging.getLogger("zarrfeed")
T = TypeVar("T")


def bounded(seconds: float | None, fn: Callable[[], T], what: str) -> T:
    """`fn()`, or `StoreTimeout` if it has not returned after `seconds` (None: no bound).

    Written here because no client library bounds every call: aiohttp waits for the "100 Continue" that
    botocore asks for on each PUT with no timeout at all (`read_timeout` arms only once the body is sent), so
    an S3 server that accepts connections and never answers would hang a writer for ever. The call goes on in
    a daemon thread; if it lands later, it is a complete write of a valid object, never half of one."""
    if seconds is None:
        return fn()
    box: list = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread below
            box.append((False, exc))

    t = threading.Thread(target=run, name="zarrfeed-store-call", daemon=True)
    t.start()
    t.join(seconds)
    if not box:
        raise StoreTimeout(f"{what}: no answer in {seconds:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def within(seconds: float | None, fn: Callable[[], Any]) -> bool:
    """Run `fn()` for its effect, giving up after `seconds`; True if it finished without an exception (any
    other outcome is logged at debug level: for cleanup after an error, where nothing more can be done)."""
    try:
        bounded(seconds, fn, getattr(fn, "__name__", "a store call"))
        return True
    except Exception as exc:
        log.debug("%s failed: %s: %s", getattr(fn, "__name__", fn), type(exc).__name__, exc)
        return False
