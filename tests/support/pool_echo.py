"""A worker setup for the pool tests: it answers each message with what it was started with, applied."""
from typing import Any, Callable


def echo_setup(wid: int, make: Callable[[Any], Any], block: Any) -> Callable[[Any], Any]:
    """Reply to message m with (make(m), the first byte of the shared `block`)."""
    return lambda msg: (make(msg), bytes(block.buf[:1]))


class Carrier:
    """A worker argument holding a `multiprocess` connection (not callable, from an importable module)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn


def forward_setup(wid: int, carrier: Carrier) -> Callable[[Any], Any]:
    """Send each message on to the carrier's connection, then reply "sent"."""
    def handle(msg: Any) -> str:
        carrier.conn.send(("forwarded", msg))
        return "sent"
    return handle
