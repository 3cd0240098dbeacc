"""Object-store benchmark: the Loader and the writer against a local S3 server (moto, on 127.0.0.1), each
against the bound the store itself allows, measured in the same run.

    python bench/bench_stores.py [--scenes 60] [--repeat 3]

- store bound: every chunk object of `agents` fetched concurrently with s3fs (`cat` of all keys) and decoded;
- Loader over S3, 2 workers, shuffled batches of 4096, first epoch (nothing cached): target >= 0.8x the bound;
- Loader over S3 with `cache_dir`, second epoch, against the Loader on local disk (second epoch): >= 0.8x;
- DatasetWriter to S3, 2 workers, against writing the same encoded chunks with s3fs concurrently: >= 0.7x.
The server is a Python process on the same 2 cores, so absolute speeds say little; ratios are what count.
The writer's `ingest()` alone (without opening and closing the dataset, about 60 small requests) is printed
beside the whole run: on a small dataset start-up is a large share.
Repeats alternate between variants; medians are printed, then the ratios, last.
"""
from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numcodecs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from common import parser, print_ratios  # noqa: E402
from s3server import S3Server  # noqa: E402
from zarrfeed.loader import Dataset, Loader  # noqa: E402
from zarrfeed.writer import synthetic  # noqa: E402
from zarrfeed.writer.dataset_writer import DatasetWriter  # noqa: E402


def load_epoch(loader: Loader) -> int:
    return sum(len(b["centroid"]) for b in loader)


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(scenes=60)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-stores-"))
    server = S3Server()
    try:
        episodes = list(synthetic.episodes(args.scenes))
        nbytes = sum(a.nbytes for ep in episodes for a in ep.values())
        local = tmp / "d.zarr"
        with DatasetWriter(local, workers=2) as w:
            w.ingest(episodes)
        ds_local = Dataset.open(local)
        rows = ds_local.rows["agents"]
        agents = ds_local["agents"]
        chunk_keys = [f"agents/{i}" for i in range(-(-rows // agents.chunks[0]))]
        encoded = {}  # every chunk object of every table, as stored
        for name, arr in ds_local.tables.items():
            for i in range(-(-ds_local.rows[name] // arr.chunks[0])):
                encoded[f"{name}/{i}"] = arr.chunk_store[f"{name}/{i}"]
        print(f"{args.scenes} scenes, {rows:,} agents ({rows * agents.dtype.itemsize / 1e6:.0f} MB decoded), "
              f"{len(chunk_keys)} agents chunks; episodes {nbytes / 1e6:.0f} MB; S3 server {server.endpoint}")
        fs = server.fs()
        speeds: dict[str, list[float]] = {}

        def record(name: str, value: float, unit: str) -> None:
            speeds.setdefault(name, []).append(value)
            print(f"  {name:<28} {value:12,.0f} {unit}", flush=True)

        for r in range(args.repeat):
            print(f"repeat {r + 1}/{args.repeat}")
            bucket = server.bucket()
            url = f"{bucket}/d.zarr"
            # the writer to S3, and the same encoded chunks written with s3fs concurrently
            t0 = time.perf_counter()
            with DatasetWriter(url, workers=2, storage_options=server.options) as w:
                t1 = time.perf_counter()
                w.ingest(episodes)
                t2 = time.perf_counter()
            record("writer-s3 (MB/s)", nbytes / (time.perf_counter() - t0) / 1e6, "MB/s")
            record("writer-s3-ingest-only", nbytes / (t2 - t1) / 1e6, "MB/s (open and close excluded)")
            t0 = time.perf_counter()
            fs.pipe({f"{bucket[5:]}/raw.zarr/{k}": bytes(v) for k, v in encoded.items()})
            record("s3fs-put-chunks (MB/s)", nbytes / (time.perf_counter() - t0) / 1e6, "MB/s")

            # the store bound: fetch every agents chunk concurrently, decode each
            out = np.empty(agents.chunks[0] * agents.dtype.itemsize, np.uint8)
            blosc = numcodecs.Blosc()
            t0 = time.perf_counter()
            got = fs.cat([f"{url[5:]}/{k}" for k in chunk_keys])
            for raw in got.values():
                blosc.decode(raw, out=out)
            record("store-bound (rows/s)", rows / (time.perf_counter() - t0), "rows/s")

            with Loader(url, "agents", batch_size=4096, num_workers=2, storage_options=server.options) as loader:
                t0 = time.perf_counter()
                batches = iter(loader)
                first = len(next(batches)["centroid"])
                t1 = time.perf_counter()
                n = first + sum(len(b["centroid"]) for b in batches)
                t2 = time.perf_counter()
                record("loader-s3-epoch1 (rows/s)", n / (t2 - t0), f"rows/s (first batch after {t1 - t0:.2f} s)")
            cache = tmp / f"cache-{r}"
            with Loader(url, "agents", batch_size=4096, num_workers=2, storage_options=server.options,
                        cache_dir=cache) as loader:
                load_epoch(loader)
                t0 = time.perf_counter()
                n = load_epoch(loader)
                record("loader-s3-cached-epoch2", n / (time.perf_counter() - t0), "rows/s")
            with Loader(local, "agents", batch_size=4096, num_workers=2) as loader:
                load_epoch(loader)
                t0 = time.perf_counter()
                n = load_epoch(loader)
                record("loader-local-epoch2", n / (time.perf_counter() - t0), "rows/s")
            shutil.rmtree(cache, ignore_errors=True)
            fs.rm(bucket[5:], recursive=True)

        median = {k: statistics.median(v) for k, v in speeds.items()}
        print("\nmedians:")
        for k, v in median.items():
            print(f"  {k:<28} {v:12,.0f}")
        print_ratios(median, [("loader-s3-epoch1 (rows/s)", "store-bound (rows/s)", 0.8),
                              ("loader-s3-cached-epoch2", "loader-local-epoch2", 0.8),
                              ("writer-s3 (MB/s)", "s3fs-put-chunks (MB/s)", 0.7),
                              ("writer-s3-ingest-only", "s3fs-put-chunks (MB/s)", None)])
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
