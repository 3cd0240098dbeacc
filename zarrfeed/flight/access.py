"""Who may do what on `zarrfeed serve`: reading (discovery, batches, windows) and ingesting (uploads of
episodes, begin_input, sync) are separate rights with separate credentials, so a trainer's token cannot write
into the dataset.

- `read_token`: every call must carry it (or the ingest token); without it anyone who reaches the port reads.
- `ingest`: uploads are taken at all (off by default: a server only feeds unless told to ingest).
- `ingest_token`: the credential uploads need (it also reads: a producer checks what it writes into). Without
  it, anyone who may read may upload: right for a loopback server, refused elsewhere unless `--insecure`.

Beyond loopback, a server without the tokens that keep it private is refused before it listens (by
`FeedServer` itself, and by `zarrfeed serve` before it starts one), unless its operator says `insecure`.

Tokens are compared in constant time. A call is refused before anything is read.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as flight

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Access:
    """The server's credentials and whether it ingests."""

    read_token: str | None = None
    ingest_token: str | None = None
    ingest: bool = False

    def __post_init__(self) -> None:
        if self.ingest_token is not None and not self.ingest:
            object.__setattr__(self, "ingest", True)  # an ingest token enables ingestion
        if self.ingest_token is not None and self.ingest_token == self.read_token:
            raise ValueError("the ingest token must differ from the read token (or a trainer could upload)")

    def check_exposure(self, host: str, insecure: bool, names: "Names | None" = None) -> None:
        """Refuse, in one line, serving beyond loopback without the credentials that keep it private; `names`
        spells the credentials and the opt-out as the caller takes them (default: `zarrfeed serve`'s options)."""
        if host in LOOPBACK or insecure:
            return
        n = names or CLI
        if self.read_token is None:
            raise ValueError(f"serving on {host} without {n.token} lets anyone who reaches the port read the "
                             f"data: give {n.give_token}, or {n.insecure} to serve it openly")
        if self.ingest and self.ingest_token is None:
            raise ValueError(f"ingesting on {host} without {n.ingest_token} lets every reader write into the "
                             f"dataset: give {n.give_ingest_token}, or {n.insecure}")

    def grants(self, presented: list[bytes]) -> "Grants":
        """What a call carrying these `authorization` header values may do; refused if it may do nothing."""
        def carries(token: str | None) -> bool:
            want = f"Bearer {token}".encode()
            return token is not None and any(hmac.compare_digest(p, want) for p in presented)

        if carries(self.ingest_token):
            return Grants(read=True, ingest=True)
        if self.read_token is not None and not carries(self.read_token):
            raise flight.FlightUnauthenticatedError("zarrfeed: this server needs a token")
        return Grants(read=True, ingest=self.ingest and self.ingest_token is None)

    def refuse_upload(self, grants: "Grants") -> None:
        """Raise the one line that says why this call may not ingest, if it may not."""
        if not self.ingest:
            raise flight.FlightUnauthorizedError("zarrfeed: this server does not take uploads (start it with "
                                                 "--ingest or --ingest-token-file)")
        if not grants.ingest:
            raise flight.FlightUnauthorizedError("zarrfeed: this token may read, not upload (uploads need the "
                                                 "server's ingest token)")


@dataclass(frozen=True)
class Names:
    """How a caller spells the credentials and the opt-out in a refusal of `Access.check_exposure`."""

    token: str
    give_token: str
    ingest_token: str
    give_ingest_token: str
    insecure: str


CLI = Names("--token-file", "a token file", "--ingest-token-file", "an ingest token file", "--insecure")
PYTHON = Names("a token", "token=...", "an ingest token", "ingest_token=...", "insecure=True")


@dataclass(frozen=True)
class Grants:
    """What one call may do."""

    read: bool
    ingest: bool


class AccessCheck(flight.ServerMiddlewareFactory):
    """Judges each call's `authorization` header by `access` before anything is read; handlers find the call's
    grants with `grants_of(context)`."""

    def __init__(self, access: Access) -> None:
        self.access = access

    def start_call(self, info: Any, headers: dict[str, list]) -> "_Granted":
        presented = [h.encode() if isinstance(h, str) else h for h in headers.get("authorization", [])]
        return _Granted(self.access.grants(presented))


class _Granted(flight.ServerMiddleware):
    def __init__(self, grants: Grants) -> None:
        self.grants = grants


def grants_of(context: Any) -> Grants:
    """The grants `AccessCheck` gave the call of `context`."""
    middleware = context.get_middleware("access")
    return middleware.grants if middleware is not None else Grants(read=True, ingest=False)
