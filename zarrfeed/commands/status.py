"""`zarrfeed status`: what a zarrfeed server is doing: streams, uploads, commit lag, processes, memory."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


from .common import Command, binary_size, pem_arg, plural, rows_text


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("status", "what a zarrfeed server is doing: streams, uploads, commit lag, processes, memory")
    p.add_argument("url", help="grpc://host:port or grpc+tls://host:port (token: ZARRFEED_TOKEN)")
    p.add_argument("--tls-root-certs", type=pem_arg, metavar="PEM", help="the CA certificate (PEM file) that "
                   "signed the server's certificate, for a grpc+tls:// server whose CA is not a public one")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def ask_server(url: str, action: str, tls_root_certs: str | None = None) -> dict:
    """A zarrfeed server's answer to `action`, its errors as one line (the token from ZARRFEED_TOKEN)."""
    import pyarrow.flight as flight

    from ..flight.protocol import call_options, connect, unreachable

    tls = {"tls_root_certs": Path(tls_root_certs).read_bytes()} if tls_root_certs else {}
    try:
        results = list(connect(url, **tls).do_action(flight.Action(action, b""),
                                                            call_options(os.environ.get("ZARRFEED_TOKEN"), 10)))
    except flight.FlightUnauthenticatedError:
        raise ValueError(f"{url}: the server wants a token (set ZARRFEED_TOKEN)") from None
    except flight.FlightUnavailableError as exc:
        raise ValueError(unreachable(url, exc)) from None
    except flight.FlightError as exc:
        from ..flight.protocol import server_message
        raise ValueError(f"{url}: {server_message(exc)}") from None
    return json.loads(results[0].body.to_pybytes())


def describe_server(args: argparse.Namespace) -> int:
    """`zarrfeed info grpc://host:port`: what a zarrfeed server serves (token from ZARRFEED_TOKEN)."""
    doc = ask_server(args.path, "describe")
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{args.path} (dataset {doc['dataset_id']}, commit {doc['commit']})")
    for name, t in doc["tables"].items():
        print(f"{name:<22}{t['rows']:>14,} rows  chunk rows {t['chunk_rows']:,}")
    for name, doc_line in doc.get("transforms", {}).items():
        print(f"transform {name}: {doc_line}" if doc_line else f"transform {name}")
    return 0


def run(args: argparse.Namespace) -> int:
    """`zarrfeed status grpc://host:port`: what the server is doing now."""
    doc = ask_server(args.url, "status", args.tls_root_certs)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    t = doc["totals"]
    print(f"{doc['url']}: up {doc['uptime_s']:.0f} s, {doc['processes']['workers']} worker processes, memory "
          f"{binary_size(doc['memory']['server_rss'])} + workers {binary_size(doc['memory']['workers_rss'])}")
    idle = doc["limits"].get("stream_idle_timeout")
    given_up = f", {t['streams_given_up']:,} given up idle (after {idle:g} s)" if idle is not None and \
        "streams_given_up" in t else ""
    stall = doc["limits"].get("stream_stall_timeout")
    stalls = f"; a stream waiting on a stopped process fails after {stall:g} s" if stall is not None else ""
    print(f"streams: {len(doc['streams'])} open (at most {doc['limits']['max_streams']}), {t['streams']:,} since "
          f"start, {t['rows_sent']:,} rows sent{given_up}{stalls}")
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
                  f"over, {binary_size(up['bytes'])}")
    else:
        print("uploads: not taken (serve --ingest)")
    for name, served in doc["datasets"].items():
        ing = served["ingestion"]
        lag = f"; commit lag {ing['commit_lag_episodes']:,} episodes" if doc["ingesting"] else ""
        print(f"dataset {name + ' ' if name else ''}{served['location']}: committed {rows_text(ing['committed_rows'])}"
              f"{lag}")
    return 0
