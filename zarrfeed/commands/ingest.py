"""`zarrfeed ingest`: write episodes to a dataset with a pool of writer processes."""
from __future__ import annotations

import argparse
import sys


from .. import writer
from ..core.location import Location
from ..loader import Dataset
from ..writer.dataset_writer import DatasetWriter
from ..writer.dataset_episodes import DatasetSource, dataset_episodes
from ..core.sizes import decimal_size
from .common import (Command, Sized, add_format_args, chunks_arg, count_arg, plural, positive_arg, rows_text,
                     show_progress, store_options)


def add(command: Command) -> None:
    """Its parser, made by `command` (see `build_parser`)."""
    p = command("ingest", "write episodes to a dataset with a pool of writer processes")
    p.add_argument("out", help="dataset to write: a directory or an fsspec URL (s3://bucket/name.zarr)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--synthetic", type=positive_arg, metavar="N_SCENES", help="generate N synthetic L5Kit scenes")
    src.add_argument("--from", dest="from_path", metavar="PATH", help="copy another dataset, episode by episode "
                     "(re-chunk or re-compress it)")
    p.add_argument("--workers", type=count_arg, default=2, help="writer processes (0: write in this process)")
    p.add_argument("--seed", type=count_arg, default=0, help="seed of the synthetic scenes")
    p.add_argument("--chunks", type=chunks_arg, metavar="TABLE=ROWS,...",
                   help="chunk rows per table, e.g. agents=20000")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--overwrite", action="store_true", help="replace an existing dataset (refused for "
                     "anything that is not a zarr dataset)")
    how.add_argument("--append", action="store_true", help="add the episodes to an existing dataset")
    how.add_argument("--resume", action="store_true", help="finish an interrupted ingest of the same input")
    dask = p.add_mutually_exclusive_group()
    dask.add_argument("--scheduler", metavar="ADDRESS", help="ingest on this Dask cluster (tcp://host:8786); "
                      "the workers write straight to the output, which they must reach")
    dask.add_argument("--dask-workers", type=positive_arg, metavar="N", help="ingest on a Dask cluster of N worker "
                      "processes started on this machine")
    add_format_args(p)
    p.add_argument("--no-fsync", dest="durable", action="store_false", help="do not fsync: for scratch data on "
                   "a local disk; commits then survive a killed process but not a power loss (see the writing guide)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def print_summary(summary: dict, committed: dict[str, int]) -> None:
    if not summary["episodes"]:  # (a resumed ingest that was complete: no rate of nothing)
        print(f"nothing to write: every episode of the input is committed ({rows_text(committed)})")
        return
    rate = summary["bytes"] / max(summary["seconds"], 1e-9)
    print(f"wrote {plural(summary['episodes'], 'episode')} ({rows_text(summary['rows'])}), "
          f"{decimal_size(summary['bytes'])} in {summary['seconds']:.2f} s ({decimal_size(rate, 'B/s')}); "
          f"committed: {rows_text(committed)}")


def run(args: argparse.Namespace) -> int:
    options = store_options(args)
    out = Location.of(args.out, options)
    if args.from_path:
        source = Location.of(args.from_path, options)
        if source.same_place(out):
            raise ValueError(f"{args.out}: the output is also the input (--from); write to another path")
        source_episodes = DatasetSource(source)
        episodes: DatasetSource | Sized = source_episodes
        schema = source_episodes.schema
    else:
        episodes = Sized(writer.synthetic.episodes(args.synthetic, seed=args.seed), args.synthetic)
        schema = writer.L5KIT_SCHEMA
    if args.chunks and (args.append or args.resume):
        raise ValueError("--chunks: applies to a new dataset; one appended to or resumed keeps its own chunks")
    unknown = [t for t in args.chunks or {} if t not in schema.tables]
    if unknown:
        raise ValueError(f"--chunks: no table {', '.join(map(repr, unknown))} in the "
                         f"{'input' if args.from_path else 'synthetic scenes'} (tables: {', '.join(schema.tables)})")
    mode = "a" if (args.append or args.resume) else "w"
    if args.scheduler or args.dask_workers:
        return ingest_on_dask(args, out, schema, mode, episodes)
    if (args.append or args.resume) and (args.zarr_format != 2 or args.shard_bytes):
        raise ValueError("--zarr-format/--shard-bytes: apply to a new dataset; one appended to or resumed keeps "
                         "its own format")
    with DatasetWriter(out, schema, workers=args.workers, mode=mode, chunks=args.chunks,
                       overwrite=args.overwrite, progress=show_progress(args), durable=args.durable,
                       zarr_format=args.zarr_format, shard_bytes=args.shard_bytes) as w:
        try:
            summary = w.ingest(episodes, resume=args.resume)
        except KeyboardInterrupt:
            w.abort()
            print(f"zarrfeed: interrupted; committed {rows_text(w.committed)}. Run the same command with --resume "
                  "to finish.", file=sys.stderr)
            return 130
    print_summary(summary, w.committed)
    return 0


SCENES_PER_SOURCE = 10  # a Dask task's share: big enough to outweigh a task's overhead, small enough to spread


def ingest_on_dask(args: argparse.Namespace, out: Location, schema: writer.Schema, mode: str,
                    episodes: DatasetSource | Sized) -> int:
    """`ingest --scheduler ADDRESS` or `--dask-workers N`: the same dataset, written by a Dask cluster."""
    try:
        from distributed import Client, LocalCluster

        from ..writer import dask as zdask
    except ImportError:
        raise ValueError("--scheduler/--dask-workers need Dask: pip install 'zarrfeed[dask]'") from None
    n = len(episodes)
    ranges = [(lo, min(lo + SCENES_PER_SOURCE, n)) for lo in range(0, n, SCENES_PER_SOURCE)]
    if args.from_path:
        src = Location.of(args.from_path, store_options(args))
        sources: list[tuple] = [(src.url, src.storage_options, lo, hi) for lo, hi in ranges]
        read = dataset_episodes
    else:
        sources, read = [(args.seed, lo, hi) for lo, hi in ranges], writer.synthetic.scenes
    if args.scheduler:
        cluster = None
        try:
            client = Client(args.scheduler, timeout=30)
        except (ValueError, OSError) as exc:  # an address it cannot parse, or no scheduler there
            raise ValueError(f"--scheduler {args.scheduler}: {str(exc).splitlines()[0]}") from None
    else:  # a cluster on this machine, on loopback only
        cluster = LocalCluster(n_workers=args.dask_workers, processes=True, threads_per_worker=1,
                               host="127.0.0.1", dashboard_address="127.0.0.1:0",  # loopback, a free port
                               scheduler_kwargs={"dashboard": False})
        client = Client(cluster)
    try:
        summary = zdask.ingest(client, sources, read, out.url, schema, storage_options=out.storage_options,
                               resume=args.resume, mode=mode, overwrite=args.overwrite,
                               chunks=args.chunks, progress=show_progress(args),
                               durable=args.durable, zarr_format=args.zarr_format, shard_bytes=args.shard_bytes)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    committed = Dataset.open(out.url, storage_options=dict(out.storage_options)).rows
    print_summary({"episodes": summary.episodes, "rows": summary.rows, "bytes": summary.bytes,
                    "seconds": summary.seconds}, committed)
    return 0
