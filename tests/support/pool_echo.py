"""A worker setup for the pool tests: it answers each message with what it was started with, applied."""
from typing import Any, Callable


def echo_setup(wid: int, make: Callable[[Any], Any], block: Any) -> Callable[[Any], Any]:
    """Reply to message m with (make(m), the first byte of the shared `block`)."""
    return lambda msg: (make(msg), bytes(block.buf[:1]))
