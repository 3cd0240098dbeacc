"""`zarrfeed` as the command line runs it, with one change for tests: a server asked to listen on 0.0.0.0
(every interface) listens on 127.0.0.1 instead, and says on stderr where it was asked to listen. A test runs
the whole path of `zarrfeed serve --host 0.0.0.0` (options, the exposure check, --insecure's warning, the
"serving on" line) without binding beyond loopback. Any other address but loopback is refused.

    python tests/support/serve_loopback.py serve PATH --host 0.0.0.0 --insecure ...
"""
import sys

import pyarrow.flight as flight

from zarrfeed import cli
from zarrfeed.flight import server


class _OnLoopback(flight.FlightServerBase):
    """Where FeedServer's super().__init__ binds: 0.0.0.0 moved to 127.0.0.1, loopback as is, else refused."""

    def __init__(self, location: str, *args, **kwargs) -> None:
        scheme, _, rest = location.partition("://")
        host, _, port = rest.rpartition(":")
        if host == "0.0.0.0":
            print(f"serve_loopback: asked to listen on {location}; listening on 127.0.0.1", file=sys.stderr,
                  flush=True)
            location = f"{scheme}://127.0.0.1:{port}"
        elif not host.startswith("127."):
            raise RuntimeError(f"serve_loopback: {location}: tests listen on loopback only")
        super().__init__(location, *args, **kwargs)


class LoopbackFeedServer(server.FeedServer, _OnLoopback):
    """FeedServer whose FlightServerBase.__init__ (the bind) is reached through `_OnLoopback`."""


if __name__ == "__main__":  # guarded: worker processes started by spawn or forkserver import this module
    server.FeedServer = LoopbackFeedServer  # type: ignore[misc]  # what `zarrfeed serve` imports when it runs
    sys.exit(cli.main(sys.argv[1:]))
