"""What `zarrfeed serve` checks before it starts the server, so that a mistake is one line rather than gRPC's
own log lines and "Server did not start properly"."""
from __future__ import annotations


def check_certificate(cert: str, key: str) -> None:
    """Refuse, in one line, files gRPC cannot serve with (it would log its own lines and "Server did not start
    properly")."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ValueError(f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its private key "
                         f"({exc.reason or exc})") from None


def check_port(host: str, port: int) -> None:
    """Refuse, in one line, a port another process listens on (gRPC only says the server did not start)."""
    import errno
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"cannot serve on {host}:{port}: the port is in use (another server?)") from None
            raise ValueError(f"cannot serve on {host}:{port}: {exc.strerror}") from None
