"""The `zarrfeed` command's commands: demo, ingest, load, mask, export, info, validate, plot, serve, status (they
compose `writer` and `loader`). `zarrfeed.cli.main` imports this module, and everything it imports, only once it
can take a Ctrl+C as the command's interrupt.

Exit codes: 0 success, 1 the dataset is invalid, 2 the input cannot be read (one line on stderr, no traceback),
130 interrupted.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from . import __version__, writer
from .core._proc.pool import WorkerError
from .core._proc.shm import ShmSpaceError
from .core.dataset_format import FormatError
from .core.store import Location, in_cli_words, parse_storage_option
from .loader import Dataset, Loader, LoaderError
from .writer.dataset_writer import DatasetWriter
from .writer.lease import LeaseLost
from .writer.source import DatasetSource


def plural(n: int, one: str, many: str | None = None) -> str:
    """"1 scene", "2 scenes", "1,024 batches"."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _counts(rows: dict[str, int]) -> str:
    """"1 scene, 248 frames, ...": table names are plural; one row of a table drops the "s"."""
    return ", ".join(plural(n, t[:-1] if t.endswith("s") else t, t) for t, n in rows.items())


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _decimal(n: float, unit: str = "B") -> str:
    """A size (or a size per second) in decimal units with three significant digits: 340 MB, 12.5 kB, 87 B
    (a small table exported in 0.01 s read "0 MB ... (0 MB/s)")."""
    for prefix in ("", "k", "M", "G", "T"):
        if abs(n) < 999.5 or prefix == "T":
            return f"{n:.3g} {prefix}{unit}"
        n /= 1000
    raise AssertionError


def format_info(info: dict) -> str:
    """A readable table of `Dataset.info()`, then each table's fields."""
    head = f"{'table':<22}{'rows':>14}{'chunk rows':>12}{'chunks':>8}{'bytes':>12}{'stored':>12}{'ratio':>7}"
    lines = [head, "-" * len(head)]
    for name, t in info.items():
        ratio = f"{t['ratio']:.2f}" if t["ratio"] is not None else "-"
        lines.append(f"{name:<22}{t['rows']:>14,}{t['chunk_rows']:>12,}{t['chunks_initialized']:>8,}"
                     f"{_size(t['bytes']):>12}{_size(t['bytes_stored']):>12}{ratio:>7}")
    lines.append("")
    for name, t in info.items():
        fields = ", ".join(f"{f[0]} {f[1]}{tuple(f[2]) if len(f) == 3 else ''}" for f in t["dtype"])
        lines.append(f"{name}: {fields}")
    return "\n".join(lines)


def _validate(ds: Dataset, progress: bool, deep: bool = False) -> int:
    total = sum(ds.rows.values())
    with tqdm(total=total, unit="row", unit_scale=True, desc="validating", disable=not progress,
              leave=False) as bar:
        report = ds.validate(progress=bar.update)
    verified = None
    if deep:
        chunks = sum(-(-ds.rows[t] // a.chunks[0]) for t, a in ds.tables.items())
        with tqdm(total=chunks, unit="chunk", desc="verifying", disable=not progress, leave=False) as bar:
            verified = ds.verify(progress=bar.update)
    if report.ok and (verified is None or verified.ok):
        notes = "".join(f"\n{line}" for line in str(report).splitlines()[1:])  # arrays not checked, if any
        if verified is not None and not verified.recorded:
            print(f"{ds.location}: links valid, chunks {verified} ({_counts(ds.rows)}){notes}")
        else:
            print(f"{ds.location}: valid ({_counts(ds.rows)}){notes}" + (f"\n{verified}" if verified else ""))
        return 0
    print(f"{ds.location}: INVALID" + (f"\n{report}" if not report.ok else "") +
          (f"\n{verified}" if verified is not None else ""))
    return 1


def _progress(args: argparse.Namespace) -> bool:
    """Progress bars go to stderr, and only to a terminal (not to a log file or a CI console) unless --quiet."""
    return not args.quiet and sys.stderr.isatty()


def _options(args: argparse.Namespace) -> dict:
    """--storage-option KEY=VALUE, repeated (fsspec's own environment configuration applies too)."""
    return dict(parse_storage_option(text) for text in args.storage_option or [])


def _open(args: argparse.Namespace) -> Dataset:
    if args.path.startswith(("grpc://", "grpc+tls://")):
        raise ValueError(f"{args.path}: a zarrfeed server, not a dataset's store; `zarrfeed {args.command}` reads a "
                         "directory, a .zip or an fsspec URL. A server's batches are read with zarrfeed.flight."
                         "RemoteLoader in Python; `zarrfeed info` and `zarrfeed status` show what it serves")
    return Dataset.open(args.path, storage_options=_options(args),
                        verify_chunks=not getattr(args, "no_verify", False))


def cmd_info(args: argparse.Namespace) -> int:
    if args.path.startswith(("grpc://", "grpc+tls://")):
        return _info_remote(args)
    with _open(args) as ds:
        info = ds.info()
        print(json.dumps(info, indent=2) if args.json else f"{ds.location} ({ds.schema.name})\n{format_info(info)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the dataset's batches over Arrow Flight until SIGTERM or Ctrl+C."""
    import pyarrow as pa

    from .flight.access import LOOPBACK, Access
    from .flight.limits import Limits
    from .flight.server import FeedServer, hide_frames, read_token

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
        _check_certificate(args.tls_cert, args.tls_key)
    _check_port(args.host, args.port)
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
        server = FeedServer(_served(args.paths, _options(args)), host=args.host, port=args.port, token=token,
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
        from .flight.metrics import serve_metrics
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
    committed = "; ".join(f"committed {f'{name}: ' if name else ''}{_counts(rows)}"
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
    # signals that asked for the stop already spent
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _served(paths: list[str], options: dict) -> Location | dict[str, Location]:
    """`serve`'s datasets: one PATH, or NAME=PATH each (a URL's "=" does not count: the name comes first and
    is a plain word)."""
    from .flight.protocol import DATASET_NAME

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


def _check_certificate(cert: str, key: str) -> None:
    """Refuse, in one line, files gRPC cannot serve with (it would log its own lines and "Server did not start
    properly")."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ValueError(f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its private key "
                         f"({exc.reason or exc})") from None


def _check_port(host: str, port: int) -> None:
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


def _ask_server(url: str, action: str, tls_root_certs: str | None = None) -> dict:
    """A zarrfeed server's answer to `action`, its errors as one line (the token from ZARRFEED_TOKEN)."""
    import pyarrow.flight as flight

    from .flight.protocol import call_options, connect, unreachable

    tls = {"tls_root_certs": Path(tls_root_certs).read_bytes()} if tls_root_certs else {}
    try:
        results = list(connect(url, **tls).do_action(flight.Action(action, b""),
                                                            call_options(os.environ.get("ZARRFEED_TOKEN"), 10)))
    except flight.FlightUnauthenticatedError:
        raise ValueError(f"{url}: the server wants a token (set ZARRFEED_TOKEN)") from None
    except flight.FlightUnavailableError as exc:
        raise ValueError(unreachable(url, exc)) from None
    except flight.FlightError as exc:
        from .flight.protocol import server_message
        raise ValueError(f"{url}: {server_message(exc)}") from None
    return json.loads(results[0].body.to_pybytes())


def _info_remote(args: argparse.Namespace) -> int:
    """`zarrfeed info grpc://host:port`: what a zarrfeed server serves (token from ZARRFEED_TOKEN)."""
    doc = _ask_server(args.path, "describe")
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{args.path} (dataset {doc['dataset_id']}, commit {doc['commit']})")
    for name, t in doc["tables"].items():
        print(f"{name:<22}{t['rows']:>14,} rows  chunk rows {t['chunk_rows']:,}")
    for name, doc_line in doc.get("transforms", {}).items():
        print(f"transform {name}: {doc_line}" if doc_line else f"transform {name}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """`zarrfeed status grpc://host:port`: what the server is doing now."""
    doc = _ask_server(args.url, "status", args.tls_root_certs)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    t = doc["totals"]
    print(f"{doc['url']}: up {doc['uptime_s']:.0f} s, {doc['processes']['workers']} worker processes, memory "
          f"{_size(doc['memory']['server_rss'])} + workers {_size(doc['memory']['workers_rss'])}")
    idle = doc["limits"].get("stream_idle_timeout")
    given_up = f", {t['streams_given_up']:,} given up idle (after {idle:g} s)" if idle is not None and \
        "streams_given_up" in t else ""
    print(f"streams: {len(doc['streams'])} open (at most {doc['limits']['max_streams']}), {t['streams']:,} since "
          f"start, {t['rows_sent']:,} rows sent{given_up}")
    kept, lim = doc.get("kept_loaders"), doc["limits"]
    if kept is not None:
        held = plural(kept["worker_processes"], "worker process", "worker processes")
        print(f"loaders kept for a next epoch: {kept['loaders']} (at most {lim['kept_loaders']}, each for "
              f"{lim['kept_loader_seconds']:g} s), holding {held}")
    for st in doc["streams"]:
        where = f"{st['dataset']}/" if st["dataset"] else ""
        print(f"  #{st['id']} {st['client']} {st['kind']} {where}{st['table']} rank {st['rank']}/{st['world_size']} "
              f"epoch {st['epoch']}: {st['batches']:,} batches, {st['rows_per_s']:,.0f} rows/s")
    if doc["ingesting"]:
        print(f"uploads: {len(doc['uploads'])} open (at most {doc['limits']['max_uploads']}); episodes accepted "
              f"{t['episodes_accepted']:,}, passed over {t['episodes_passed_over']:,}")
        for up in doc["uploads"]:
            where = f" into {up['dataset']}" if up["dataset"] else ""
            print(f"  #{up['id']} {up['client']}{where}: {up['accepted']:,} accepted, {up['passed_over']:,} passed "
                  f"over, {_size(up['bytes'])}")
    else:
        print("uploads: not taken (serve --ingest)")
    for name, served in doc["datasets"].items():
        ing = served["ingestion"]
        lag = f"; commit lag {ing['commit_lag_episodes']:,} episodes" if doc["ingesting"] else ""
        print(f"dataset {name + ' ' if name else ''}{served['location']}: committed {_counts(ing['committed_rows'])}"
              f"{lag}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    with _open(args) as ds:
        return _validate(ds, progress=_progress(args), deep=args.deep)


def _print_summary(summary: dict, committed: dict[str, int]) -> None:
    rate = summary["bytes"] / max(summary["seconds"], 1e-9)
    print(f"wrote {plural(summary['episodes'], 'episode')} ({_counts(summary['rows'])}), "
          f"{_decimal(summary['bytes'])} in {summary['seconds']:.2f} s ({_decimal(rate, 'B/s')}); "
          f"committed: {_counts(committed)}")


def _parse_chunks(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    try:
        return {k.strip(): int(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        raise ValueError(f"--chunks: expected TABLE=ROWS[,TABLE=ROWS...], got {text!r}") from None


def cmd_ingest(args: argparse.Namespace) -> int:
    options = _options(args)
    out = Location.of(args.out, options)
    if args.from_path:
        source = Location.of(args.from_path, options)
        if source.same_place(out):
            raise ValueError(f"{args.out}: the output is also the input (--from); write to another path")
        source_episodes = DatasetSource(source)
        episodes: DatasetSource | _Sized = source_episodes
        schema = source_episodes.schema
    else:
        episodes = _Sized(writer.synthetic.episodes(args.synthetic, seed=args.seed), args.synthetic)
        schema = writer.L5KIT_SCHEMA
    mode = "a" if (args.append or args.resume) else "w"
    if args.scheduler or args.dask_workers:
        return _ingest_on_dask(args, out, schema, mode, episodes)
    with DatasetWriter(out, schema, workers=args.workers, mode=mode, chunks=_parse_chunks(args.chunks),
                       overwrite=args.overwrite, progress=_progress(args)) as w:
        try:
            summary = w.ingest(episodes, resume=args.resume)
        except KeyboardInterrupt:
            w.abort()
            print(f"zarrfeed: interrupted; committed {w.committed}. Run again with --resume to finish.",
                  file=sys.stderr)
            return 130
    _print_summary(summary, w.committed)
    return 0


SCENES_PER_SOURCE = 10  # a Dask task's share: big enough to outweigh a task's overhead, small enough to spread


def _ingest_on_dask(args: argparse.Namespace, out: Location, schema: writer.Schema, mode: str,
                    episodes: DatasetSource | _Sized) -> int:
    """`ingest --scheduler ADDRESS` or `--dask-workers N`: the same dataset, written by a Dask cluster."""
    try:
        from distributed import Client, LocalCluster

        from .writer import dask as zdask
    except ImportError:
        raise ValueError("--scheduler/--dask-workers need Dask: pip install 'zarrfeed[dask]'") from None
    n = len(episodes)
    ranges = [(lo, min(lo + SCENES_PER_SOURCE, n)) for lo in range(0, n, SCENES_PER_SOURCE)]
    if args.from_path:
        src = Location.of(args.from_path, _options(args))
        sources: list[tuple] = [(src.url, src.storage_options, lo, hi) for lo, hi in ranges]
        read = writer.source.dataset_episodes
    else:
        sources, read = [(args.seed, lo, hi) for lo, hi in ranges], writer.synthetic.scenes
    if args.scheduler:
        cluster = None
        client = Client(args.scheduler, timeout=30)
    else:  # a cluster on this machine, on loopback only
        cluster = LocalCluster(n_workers=args.dask_workers, processes=True, threads_per_worker=1,
                               host="127.0.0.1", dashboard_address="127.0.0.1:0",  # loopback, a free port
                               scheduler_kwargs={"dashboard": False})
        client = Client(cluster)
    try:
        summary = zdask.ingest(client, sources, read, out.url, schema, storage_options=out.storage_options,
                               resume=args.resume, mode=mode, overwrite=args.overwrite,
                               chunks=_parse_chunks(args.chunks), progress=_progress(args))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    committed = Dataset.open(out.url, storage_options=dict(out.storage_options)).rows
    _print_summary({"episodes": summary.episodes, "rows": summary.rows, "bytes": summary.bytes,
                    "seconds": summary.seconds}, committed)
    return 0


class _Sized:
    """An iterator with a known length, for the progress bar's total."""

    def __init__(self, it, n: int) -> None:
        self.it, self.n = it, n

    def __iter__(self):
        return iter(self.it)

    def __len__(self) -> int:
        return self.n


def _load(ds: Dataset, table: str, batch_size: int, workers: int, epochs: int, progress: bool) -> dict:
    """Iterate `epochs` epochs of shuffled batches with a progress bar; return rows, bytes, seconds."""
    with Loader(ds, table, batch_size=batch_size, num_workers=workers) as loader:
        itemsize = ds[table].dtype.itemsize
        total = sum(loader.plan(e).per_rank for e in range(epochs))
        t0 = time.perf_counter()
        first = None
        with tqdm(total=total * itemsize, unit="B", unit_scale=True, desc=f"loading {table}",
                  disable=not progress, smoothing=0.1) as bar:
            rows = 0
            for _ in range(epochs):
                for batch in loader:
                    n = len(next(iter(batch.values())))
                    rows += n
                    first = first or time.perf_counter() - t0
                    bar.update(n * itemsize)
        seconds = time.perf_counter() - t0
    return {"rows": rows, "bytes": rows * itemsize, "seconds": seconds, "first_batch": first or seconds,
            "batches": len(loader) * epochs}


def cmd_load(args: argparse.Namespace) -> int:
    with _open(args) as ds:
        if args.table not in ds.tables:
            raise ValueError(f"table {args.table!r} is not in {args.path} (tables: {', '.join(ds.tables)})")
        r = _load(ds, args.table, args.batch_size, args.workers, args.epochs, _progress(args))
    batches = plural(r['batches'], 'shuffled batch', 'shuffled batches')
    print(f"loaded {plural(r['rows'], 'row')} of {args.table} in {batches}"
          f" of {args.batch_size} over {plural(args.epochs, 'epoch')}: {r['seconds']:.2f} s, "
          f"{r['rows'] / r['seconds']:,.0f} rows/s, {r['bytes'] / r['seconds'] / 1e6:,.1f} MB/s; "
          f"first batch after {r['first_batch'] * 1000:.0f} ms")
    return 0


def cmd_mask(args: argparse.Namespace) -> int:
    from .loader import agents_mask

    with _open(args) as ds:
        if not {"scenes", "frames", "agents"} <= set(ds.tables):
            raise ValueError(f"{args.path}: not an L5Kit dataset (it needs tables scenes, frames and agents)")
        agents_mask.check_writable(ds)  # before the work, not after it
        t0 = time.perf_counter()
        with tqdm(total=ds.rows["scenes"], unit="scene", desc="agents mask", disable=args.quiet,
                  leave=False) as bar:
            mask = agents_mask.compute(ds, args.threshold, workers=args.workers, progress=bar.update)
        where = agents_mask.save(ds, mask, args.threshold)
        selected = len(agents_mask.selected_rows(mask))
    commit = f"commit {ds.commit}" if ds.commit is not None else "no commits"
    print(f"{where}: {plural(len(mask), 'agent')}, {selected:,} with >= 10 valid past and >= 1 future frames "
          f"(AgentDataset's samples); {commit}; {time.perf_counter() - t0:.2f} s")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .loader.arrow_bridge import write_ipc_stream
    from .loader.parquet_export import export_parquet

    tables = [t.strip() for t in args.tables.split(",")] if args.tables else None
    if args.out == "-" and args.format != "arrow":
        raise ValueError("export to - (standard output) writes an Arrow IPC stream: add --format arrow")
    if args.out == "-" and sys.stdout.isatty():
        raise ValueError("export to - writes a binary Arrow IPC stream, and standard output is a terminal: "
                         "redirect it to a file (> agents.arrows) or pipe it to a reader")
    with _open(args) as ds:
        for t in tables or []:
            if t not in ds.tables:
                raise ValueError(f"--tables: no table {t!r} in {args.path} (tables: {', '.join(ds.tables)})")
        if args.format == "parquet":
            r = export_parquet(ds, args.out, tables, workers=args.workers, progress=_progress(args),
                               storage_options=_options(args))
            rows = _counts(r["rows"])
            print(f"exported {rows} to {args.out}/<table>/*.parquet: {_decimal(r['bytes'])} of records in "
                  f"{r['seconds']:.2f} s ({_decimal(r['bytes'] / r['seconds'], 'B/s')})", file=sys.stderr)
            return 0
        if tables and len(tables) != 1:
            raise ValueError("--format arrow writes one table as one stream; name one with --tables")
        table = tables[0] if tables else "agents"
        stream = ds.to_batches(table)
        n = write_ipc_stream(stream, sys.stdout.buffer if args.out == "-" else args.out)
        print(f"wrote {n:,} rows of {table} as an Arrow IPC stream to {args.out}", file=sys.stderr)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from . import plot

    try:
        plot.require_matplotlib()
    except ImportError as exc:  # an optional package: one line saying which extra installs it
        print(f"zarrfeed: error: {exc}", file=sys.stderr)
        return 2
    if args.summary == (args.scene is not None):
        raise ValueError("plot: give --scene N (a scene from above) or --summary (the dataset at a glance)")
    out = args.out or ("summary.png" if args.summary else f"scene-{args.scene}.png")
    with _open(args) as ds:
        if args.summary:
            fig = plot.summary_figure(ds)
        else:
            fig = plot.scene_figure(ds, args.scene, args.frame, args.history, args.future)
        fig.savefig(out, dpi=args.dpi)
    print(f"wrote {out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    out = Path(args.out)
    with DatasetWriter(out, workers=args.workers, progress=_progress(args), overwrite=True) as w:  # never a non-dataset
        print(f"ingesting {args.scenes} synthetic L5Kit scenes into {out} with {args.workers} writer processes")
        summary = w.ingest(_Sized(writer.synthetic.episodes(args.scenes, seed=args.seed), args.scenes))
    _print_summary(summary, w.committed)
    print()
    with Dataset.open(out) as ds:
        print(format_info(ds.info()) + "\n")
        status = _validate(ds, progress=_progress(args))
        if status:
            return status
        print()
        r = _load(ds, "agents", 4096, args.workers, 1, progress=_progress(args))
        print(f"loaded {r['rows']:,} agents in shuffled batches of 4096 with {args.workers} loader workers: "
              f"{r['rows'] / r['seconds']:,.0f} rows/s, {r['bytes'] / r['seconds'] / 1e6:,.0f} MB/s")
        from .loader.parquet_export import export_parquet

        parquet = out.with_name(out.name + ".parquet")
        r = export_parquet(ds, parquet, workers=args.workers, progress=_progress(args))
        print(f"\nexported to Parquet in {parquet}/<table>/ ({r['bytes'] / r['seconds'] / 1e6:,.0f} MB/s)")
    _duckdb_query(parquet)
    return 0


def _duckdb_query(parquet: Path) -> None:
    """The demo's last step: one SQL query on the Parquet export."""
    try:
        import duckdb
    except ImportError:
        print("(pip install duckdb, or install zarrfeed[demo], to run a DuckDB query on it)")
        return
    sql = (f"SELECT list_position(label_probabilities::FLOAT[], list_max(label_probabilities::FLOAT[])) - 1 "
           f"AS label, count(*) AS agents, round(avg(sqrt(velocity[1]^2 + velocity[2]^2)), 2) AS mean_speed "
           f"FROM read_parquet('{parquet}/agents/*.parquet') GROUP BY label ORDER BY agents DESC")
    print(f"DuckDB: agents per label, with their mean speed (m/s):\n{duckdb.sql(sql)}")


LIMIT_OPTIONS = ("max_streams", "max_uploads", "max_message_bytes", "max_batch_bytes", "max_transform_args_bytes",
                 "stream_idle_timeout", "kept_loaders", "kept_loader_seconds")


def _bytes(text: str) -> int:
    """A size: bytes, or with K, M or G (powers of 1024)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    try:
        value = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or with K, M or G)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {n}")
    return n


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default, except where there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


class _CommandParser(argparse.ArgumentParser):
    """A command's parser. An option it does not know is refused first (before "one of --synthetic --from is
    required"), under the command's own usage rather than the top level's, naming the option it resembles."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        for token in list(args or []):
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if token.startswith("-") and token != "-" and not token[1:2].isdigit() and not self._knows(name):
                self.error(f"unrecognized argument {name}{self._close_to(name)}")
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra

    def _knows(self, name: str) -> bool:
        """An option of this command, or an abbreviation of exactly one (argparse accepts those)."""
        if name in self._option_string_actions:
            return True
        return name.startswith("--") and sum(o.startswith(name) for o in self._option_string_actions) == 1

    def _close_to(self, name: str) -> str:
        close = difflib.get_close_matches(name, [o for o in self._option_string_actions if o.startswith("--")], n=1)
        return f"; did you mean {close[0]}?" if close else ""


def _check_workers(args: argparse.Namespace) -> None:
    """More worker processes than cores only adds switching: say so (it still runs)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = getattr(args, "workers", 0) or 0
    if workers > cores:
        warnings.warn(f"--workers {workers} is more than the {plural(cores, 'core')} this process may use; "
                      f"{cores} would be as fast")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zarrfeed", description="Training-data loader and writer for "
                                     "datasets of structured records in zarr (L5Kit format).")
    parser.add_argument("--version", action="version", version=f"zarrfeed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help[:1].upper() + help[1:] + ".",
                              formatter_class=_Help)

    p = command("demo", "the whole job on synthetic L5Kit data: write, describe, validate, load, export, query",
                "The whole job on synthetic L5Kit scenes: ingest them with writer processes "
                "into OUT (a dataset there is replaced), print `info`, validate every interval link and chunk, "
                "load one epoch of shuffled batches of 4,096 agents with loader workers, export every table to "
                "Parquet beside it (OUT.parquet/<table>/) and, with DuckDB installed (zarrfeed[demo]), count the "
                "agents per label with one SQL query on the Parquet files.")
    p.add_argument("--out", default="zarrfeed-demo.zarr", help="where to write (a dataset there is replaced; "
                   "anything else is refused)")
    p.add_argument("--scenes", type=_count, default=50, help="synthetic scenes (about 21,000 agents each)")
    p.add_argument("--seed", type=_count, default=0, help="seed of the synthetic scenes")
    p.add_argument("--workers", type=_count, default=2, help="writer, loader and export processes")
    p.set_defaults(func=cmd_demo)
    p = command("ingest", "write episodes to a dataset with a pool of writer processes")
    p.add_argument("out", help="dataset to write: a directory or an fsspec URL (s3://bucket/name.zarr)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--synthetic", type=_count, metavar="N_SCENES", help="generate N synthetic L5Kit scenes")
    src.add_argument("--from", dest="from_path", metavar="PATH", help="copy another dataset, episode by episode "
                     "(re-chunk or re-compress it)")
    p.add_argument("--workers", type=_count, default=2, help="writer processes (0: write in this process)")
    p.add_argument("--seed", type=_count, default=0, help="seed of the synthetic scenes")
    p.add_argument("--chunks", metavar="TABLE=ROWS,...", help="chunk rows per table, e.g. agents=20000")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--overwrite", action="store_true", help="replace an existing dataset (refused for "
                     "anything that is not a zarr dataset)")
    how.add_argument("--append", action="store_true", help="add the episodes to an existing dataset")
    how.add_argument("--resume", action="store_true", help="finish an interrupted ingest of the same input")
    dask = p.add_mutually_exclusive_group()
    dask.add_argument("--scheduler", metavar="ADDRESS", help="ingest on this Dask cluster (tcp://host:8786); "
                      "the workers write straight to the output, which they must reach")
    dask.add_argument("--dask-workers", type=_count, metavar="N", help="ingest on a Dask cluster of N worker "
                      "processes started on this machine")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_ingest)
    p = command("load", "iterate shuffled batches of a table with loader workers (a speed check)")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--table", default="agents", help="table to load")
    p.add_argument("--batch-size", type=int, default=4096, help="rows per batch")
    p.add_argument("--workers", type=_count, default=2, help="loader processes (0: load in this process)")
    p.add_argument("--epochs", type=_count, default=1, help="epochs to iterate")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_load)
    p = command("mask", "compute L5Kit's agents mask and store it at agents_mask/<threshold> in the dataset")
    p.add_argument("path", help="dataset: directory or fsspec URL (not a .zip: read-only)")
    p.add_argument("--threshold", type=float, default=0.5, help="label probability threshold (L5Kit's "
                   "filter_agents_threshold); yaw 30 degrees, extent ratio 1.1, 50 m to the AV, as L5Kit")
    p.add_argument("--workers", type=_count, default=2, help="processes (0: in this process)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_mask)
    p = command("export", "write tables as Parquet (one folder per table) or an Arrow IPC stream")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("out", help="output folder (parquet), or file or - for stdout (arrow)")
    p.add_argument("--format", choices=["parquet", "arrow"], default="parquet", help="output format")
    p.add_argument("--tables", metavar="T1,T2", help="tables to export (default: all; arrow: agents)")
    p.add_argument("--workers", type=_count, default=2, help="writer processes for Parquet (0: this one)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_export)
    p = command("info", "rows, chunks, bytes and compression per table")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)
    p = command("status", "what a zarrfeed server is doing: streams, uploads, commit lag, processes, memory")
    p.add_argument("url", help="grpc://host:port or grpc+tls://host:port (token: ZARRFEED_TOKEN)")
    p.add_argument("--tls-root-certs", metavar="PEM", help="the CA certificate (PEM file) that "
                   "signed the server's certificate, for a grpc+tls:// server whose CA is not a public one")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)
    p = command("serve", "serve the dataset's batches over Arrow Flight (RemoteLoader, any Flight client)")
    p.add_argument("paths", nargs="+", metavar="[NAME=]PATH",
                   help="dataset: directory, .zip file or fsspec URL; several as NAME=PATH each (train=a.zarr "
                        "val=s3://b/val.zarr), which clients name with dataset=NAME")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (beyond loopback: tokens, or --insecure)")
    p.add_argument("--port", type=_count, default=8815, help="port (0: a free one, printed at start)")
    p.add_argument("--token-file", metavar="F", help="a file holding the token every call must carry (mode 600): "
                   "it grants reading (discovery, batches, windows)")
    p.add_argument("--ingest", action="store_true",
                   help="take uploads (RemoteWriter); without --ingest-token-file anyone who may read may upload")
    p.add_argument("--ingest-token-file", metavar="G",
                   help="a file holding the token uploads need (mode 600; it also reads); implies --ingest")
    p.add_argument("--insecure", action="store_true",
                   help="serve beyond loopback without the tokens that keep reading and uploading private")
    p.add_argument("--tls-cert", metavar="C", help="PEM certificate: clients connect with grpc+tls://")
    p.add_argument("--tls-key", metavar="K", help="PEM private key of --tls-cert")
    p.add_argument("--workers", type=_count, default=2, help="loader processes per stream")
    p.add_argument("--metrics-port", type=_count, metavar="P",
                   help="serve Prometheus metrics at http://HOST:P/metrics (0: a free port; needs zarrfeed[metrics])")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics endpoint")
    limits = p.add_argument_group("limits (defaults sized from this machine; beyond them a client gets one line)")
    for name, kind, text in (("max_streams", _count, "streams open at once (each runs --workers processes)"),
                             ("max_uploads", _count, "upload calls open at once (each holds one message)"),
                             ("max_message_bytes", _bytes, "one uploaded message (e.g. 256M)"),
                             ("max_batch_bytes", _bytes, "one batch a ticket asks for (e.g. 512M)"),
                             ("max_transform_args_bytes", _bytes, "a ticket's transform arguments, as JSON"),
                             ("stream_idle_timeout", _seconds, "seconds a stream waits for its client to take a "
                              "batch before it gives up its slot and loader (default 60; the client, reading on, "
                              "reconnects)"),
                             ("kept_loaders", _count, "loaders kept running after their stream's epoch, with their "
                              "worker processes and decoded chunks, for the same trainer's next epoch (default 8; "
                              "0: none)"),
                             ("kept_loader_seconds", _seconds, "how long a kept loader waits for its next epoch "
                              "before it stops (default 120)")):
        limits.add_argument("--" + name.replace("_", "-"), type=kind, metavar="N", help=text)
    p.add_argument("--transforms", metavar="MODULE",
                   help="module name or .py file of named transforms clients may ask for (transform=NAME)")
    p.set_defaults(func=cmd_serve)
    p = command("plot", "draw a scene from above (--scene N) or the dataset at a glance (--summary) as a PNG; "
                "needs zarrfeed[plot]")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--scene", type=_count, metavar="N", help="draw scene N: tracks by label, the ego path, "
                   "traffic-light faces, frame --frame with its window")
    p.add_argument("--summary", action="store_true", help="draw rows per scene, agents per frame, label shares")
    p.add_argument("--frame", type=_count, metavar="T", help="the frame to mark: a row of the frames table "
                   "(global, as WindowLoader's frame_row, not the index within the scene; default: the scene's "
                   "middle)")
    p.add_argument("--history", type=_count, default=10, help="frames before --frame in its window")
    p.add_argument("--future", type=_count, default=50, help="frames after --frame in its window")
    p.add_argument("--out", metavar="FILE.png", help="where to save (default: scene-N.png or summary.png)")
    p.add_argument("--dpi", type=_count, default=100, help="resolution of the PNG")
    p.set_defaults(func=cmd_plot)
    p = command("validate", "check every interval link and decode every chunk; exit 1 if invalid")
    p.add_argument("path", help="dataset: directory, .zip file or fsspec URL")
    p.add_argument("--deep", action="store_true",
                   help="also check every chunk's stored bytes against the size and digest its commit recorded")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_validate)
    for name in ("load", "export", "serve", "mask", "plot"):
        sub.choices[name].add_argument(
            "--no-verify", action="store_true",
            help="read chunks without checking them against the digests their commits recorded (default: every "
            "chunk is checked; unchecked, a changed chunk or another dataset put in its place is read as data)")
    for name, p in sub.choices.items():
        if name in ("demo", "info"):
            p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                       help="an option of the store's fsspec filesystem, e.g. endpoint_url=http://127.0.0.1:9000 "
                       "or anon=true (repeatable; VALUE is read as JSON if it is JSON); fsspec's FSSPEC_<PROTOCOL>_"
                       "<KEY> environment variables and the usual credentials (AWS_*) apply too")
    return parser


def _credential_errors() -> tuple[type[BaseException], ...]:
    """botocore's "no credentials" errors (none when botocore is not installed)."""
    try:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    except ImportError:
        return ()
    return NoCredentialsError, PartialCredentialsError


def _credentials_message(exc: BaseException) -> str:
    """One line for missing S3 credentials: botocore's own words (which are missing) and where it looks."""
    home = os.path.expanduser("~")
    files = [os.environ.get("AWS_SHARED_CREDENTIALS_FILE", f"{home}/.aws/credentials"),
             os.environ.get("AWS_CONFIG_FILE", f"{home}/.aws/config")]
    what = "none found" if type(exc).__name__ == "NoCredentialsError" else str(exc).rstrip(".")
    return (f"S3 credentials: {what}; they are read from --storage-option key=... secret=... "
            "(or profile=...), the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), "
            f"the files {files[0]} and {files[1]}, and a container or EC2 instance role; for a public bucket "
            "pass --storage-option anon=true")


def run(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the command line) and run its command; the exit code."""
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda msg, *a, **k: print(f"zarrfeed: warning: {msg}", file=sys.stderr)
            _check_workers(args)
            return args.func(args)
    except BrokenPipeError:  # the reader of our output left (`zarrfeed info X | head -2`): stop quietly, as
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Unix tools do; no flush error at exit
        return 128 + signal.SIGPIPE
    except (FormatError, ValueError, WorkerError, LoaderError, LeaseLost, ShmSpaceError, OSError) as exc:
        print(f"zarrfeed: error: {in_cli_words(exc)}", file=sys.stderr)
        return 2
    except TypeError as exc:
        if "unexpected keyword argument" not in str(exc):
            raise
        print(f"zarrfeed: error: a --storage-option is not an option of this store's filesystem ({exc})",
              file=sys.stderr)
        return 2
    except MemoryError as exc:  # a batch, a chunk or a table larger than this machine's memory
        print(f"zarrfeed: error: not enough memory{f' ({exc})' if str(exc) else ''}: ask for less at once "
              "(a smaller --batch-size, fewer --workers)", file=sys.stderr)
        return 2
    except _credential_errors() as exc:  # botocore's traceback says only "Unable to locate credentials"
        print(f"zarrfeed: error: {_credentials_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    # said once the exception is gone: a progress bar its frames held (one interrupted while it was being made
    # is closed only when it is collected) has written its last output first, so this line is the last
    print("zarrfeed: interrupted", file=sys.stderr)
    return 130

