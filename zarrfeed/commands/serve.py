"""`zarrfeed serve`: serve the dataset's batches over Arrow Flight (RemoteLoader, any Flight client)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import warnings
from pathlib import Path


from ..core.location import Location
from .common import Command, bytes_arg, count_arg, file_arg, port_arg, rows_text, seconds_arg, store_options


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("serve", "serve the dataset's batches over Arrow Flight (RemoteLoader, any Flight client)")
    p.add_argument("paths", nargs="+", metavar="[NAME=]PATH",
                   help="dataset: directory, .zip file or fsspec URL; several as NAME=PATH each (train=a.zarr "
                        "val=s3://b/val.zarr), which clients name with dataset=NAME")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (beyond loopback: tokens, or --insecure)")
    p.add_argument("--port", type=port_arg, default=8815, help="port (0: a free one, printed at start)")
    p.add_argument("--token-file", type=file_arg, metavar="F", help="a file holding the token every call must "
                   "carry (mode 600): it grants reading (discovery, batches, windows)")
    p.add_argument("--ingest", action="store_true",
                   help="take uploads (RemoteWriter); without --ingest-token-file anyone who may read may upload")
    p.add_argument("--ingest-token-file", type=file_arg, metavar="G",
                   help="a file holding the token uploads need (mode 600; it also reads); implies --ingest")
    p.add_argument("--insecure", action="store_true",
                   help="serve beyond loopback without the tokens that keep reading and uploading private")
    p.add_argument("--tls-cert", type=file_arg, metavar="C", help="PEM certificate: clients connect with grpc+tls://")
    p.add_argument("--tls-key", type=file_arg, metavar="K", help="PEM private key of --tls-cert")
    p.add_argument("--workers", type=count_arg, default=2, help="loader processes per stream")
    p.add_argument("--metrics-port", type=port_arg, metavar="P",
                   help="serve Prometheus metrics at http://HOST:P/metrics (0: a free port; needs zarrfeed[metrics])")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics endpoint")
    limits = p.add_argument_group("limits (defaults sized from this machine; beyond them a client gets one line)")
    for name, kind, text in (("max_streams", count_arg, "streams open at once (each runs --workers processes)"),
                             ("max_uploads", count_arg, "upload calls open at once (each holds one message)"),
                             ("max_message_bytes", bytes_arg, "one uploaded message (e.g. 256M)"),
                             ("max_batch_bytes", bytes_arg, "one batch a ticket asks for (e.g. 512M)"),
                             ("max_transform_args_bytes", bytes_arg, "a ticket's transform arguments, as JSON"),
                             ("stream_idle_timeout", seconds_arg, "seconds a stream waits for its client to take a "
                              "batch before it gives up its slot and loader (default 60; the client, reading on, "
                              "reconnects)"),
                             ("stream_stall_timeout", seconds_arg, "seconds a stream's loader waits on a stopped "
                              "process (a worker under SIGSTOP or a debugger) before the stream fails and its client "
                              "raises the line naming it (default 30)"),
                             ("kept_loaders", count_arg, "loaders kept running after their stream's epoch, with their "
                              "worker processes and decoded chunks, for the same trainer's next epoch (default 8; "
                              "0: none)"),
                             ("kept_loader_seconds", seconds_arg, "how long a kept loader waits for its next epoch "
                              "before it stops (default 120)")):
        limits.add_argument("--" + name.replace("_", "-"), type=kind, metavar="N", help=text)
    p.add_argument("--transforms", metavar="MODULE",
                   help="module name or .py file of named transforms clients may ask for (transform=NAME)")
    p.set_defaults(func=run)


LIMIT_OPTIONS = ("max_streams", "max_uploads", "max_message_bytes", "max_batch_bytes", "max_transform_args_bytes",
                 "stream_idle_timeout", "stream_stall_timeout", "kept_loaders", "kept_loader_seconds")


def run(args: argparse.Namespace) -> int:
    """Serve the dataset's batches over Arrow Flight until SIGTERM or Ctrl+C."""
    import pyarrow as pa

    from ..flight.access import LOOPBACK, Access
    from ..flight.limits import Limits
    from ..flight.server import FeedServer, hide_frames, read_token
    from ..flight.startup import check_certificate, check_port

    hide_frames()
    token = read_token(args.token_file) if args.token_file else None
    ingest_token = read_token(args.ingest_token_file) if args.ingest_token_file else None
    access = Access(token, ingest_token, args.ingest)
    access.check_exposure(args.host, args.insecure)  # before anything listens
    tls = None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_cert:
        tls = (Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes())
        check_certificate(args.tls_cert, args.tls_key)
    check_port(args.host, args.port)
    stopping = threading.Event()

    def stop(*_: object) -> None:  # the first SIGTERM or Ctrl+C stops the server; a second one ends the process
        stopping.set()  # at once (default handlers again): a stop that cannot finish (a store that does not
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # answer) is never a process that ignores every signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, stop)  # before the server listens and says so: a SIGTERM from then on
    signal.signal(signal.SIGINT, stop)  # (a supervisor's, as soon as it reads "serving on") stops it properly
    limits = Limits.for_machine(args.workers)
    limits = dataclasses.replace(limits, **{name: getattr(args, name) for name in LIMIT_OPTIONS
                                            if getattr(args, name) is not None})
    try:
        server = FeedServer(served(args.paths, store_options(args)), host=args.host, port=args.port, token=token,
                            ingest=access.ingest, ingest_token=ingest_token, workers=args.workers, tls=tls,
                            transforms=args.transforms, limits=limits, insecure=args.insecure,
                            verify_chunks=not args.no_verify)
    except pa.ArrowException as exc:  # a busy port, a certificate gRPC cannot use: gRPC's first line says which
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot serve on {args.host}:{args.port}"
                         f"{' with this certificate' if tls else ''}: {detail}") from None
    if args.insecure and args.host not in LOOPBACK and (token is None or (access.ingest and ingest_token is None)):
        warnings.warn(f"serving on {args.host} with --insecure: anyone who reaches this port can read the data"
                      + (" and upload into it" if access.ingest and ingest_token is None else ""))
    named = f"; transforms: {', '.join(server.transforms.named)}" if args.transforms else ""
    if args.metrics_port is not None:
        from ..flight.metrics import serve_metrics
        try:
            port = serve_metrics(server.status, args.metrics_host, args.metrics_port)
        except OSError as exc:
            server.stop(grace=0)
            raise ValueError(f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc.strerror}") \
                from None
        named += f"; metrics: http://{args.metrics_host}:{port}/metrics"
    rights = ("reads need a token" if token else "anyone may read") + "; " + (
        "uploads need the ingest token" if ingest_token else "anyone who may read may upload" if access.ingest
        else "no uploads")
    print(f"serving on {server.url} {' '.join(args.paths)} ({rights})" + named, flush=True)

    while not stopping.wait(0.5):  # the server listens since it was made; this thread waits for a signal
        pass
    stopped = server.stop(grace=1.5)
    committed = "; ".join(f"committed {f'{name}: ' if name else ''}{rows_text(rows)}"
                          for name, rows in stopped.committed.items())
    print("zarrfeed: server stopped" + (f"; {committed}" if committed else ""), file=sys.stderr, flush=True)
    for name, why in stopped.failed.items():  # what was accepted but not committed there is lost: say so
        print(f"zarrfeed: error: {f'{name}: ' if name else ''}the last commit failed: {why}", file=sys.stderr,
              flush=True)
    code = 1 if stopped.failed else 0
    if stopped.calls_left:  # pyarrow's server would wait for them at exit, whatever the clients do
        print("zarrfeed: left calls open at exit (clients that stopped reading or sending)", file=sys.stderr,
              flush=True)
    # everything accepted is committed and the leases are released: exit now. Python's own exit would wait for
    # every non-daemon thread (an upload call still running, a thread a --transforms module started), with the
    # signals that asked for the stop already spent. A stopped worker of a stream still open cannot exit on its
    # own, and the fork server and resource tracker wait for it: it is killed (what it made is the server's)
    from ..core._proc.pool import is_stopped
    from ..flight.activity import descendants
    for pid in descendants(os.getpid()):
        if is_stopped(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def served(paths: list[str], options: dict) -> Location | dict[str, Location]:
    """`serve`'s datasets: one PATH, or NAME=PATH each (a URL's "=" does not count: the name comes first and
    is a plain word)."""
    from ..flight.protocol import DATASET_NAME

    named: dict[str, Location] = {}
    for text in paths:
        name, sep, path = text.partition("=")
        if not sep or not DATASET_NAME.fullmatch(name):
            if len(paths) > 1:
                raise ValueError(f"{text}: several datasets are served by name: NAME=PATH each (train=a.zarr "
                                 "val=s3://b/val.zarr)")
            return Location.of(text, options)
        if name in named:
            raise ValueError(f"dataset name {name!r} given twice")
        named[name] = Location.of(path, options)
    return named
