"""zarr v3 (sharded) against v2, on the same data, in one run.

    python bench/bench_v3.py [--scenes 100] [--repeat 3] [--json run.json]

The bench dataset (synthetic L5Kit scenes, written in v2 as `write_dataset` writes it) is converted to sharded
v3 (`zarrfeed.convert`, default shard size); then, repeats alternating between the formats:
- local disk: a Loader of shuffled batches of 4096 agents, 2 workers: the first epoch with nothing cached
  (`cache_bytes=0`: every chunk fetched, checked and decoded) and a cached epoch (the second): target >= 0.95x v2;
- the writer: `DatasetWriter` of the same episodes, 2 workers, in v3 against v2 (MB/s of episodes);
- S3 (a moto server on 127.0.0.1, behind a counting proxy in this process): the requests, the bytes received
  and the first epoch's rate of the same Loader (no cache), both formats.
Medians of the repeats are printed, then the ratios, last.
"""
from __future__ import annotations

import http.client
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from common import add_json_option, parser, print_ratios, write_json  # noqa: E402
from s3server import S3Server  # noqa: E402
from zarrfeed.loader import Dataset, Loader  # noqa: E402
from zarrfeed.writer import convert, synthetic  # noqa: E402
from zarrfeed.writer.dataset_writer import DatasetWriter  # noqa: E402


class CountingProxy:
    """An HTTP proxy on 127.0.0.1 in front of the S3 server: counts requests and the bytes of their answers."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        counts = self.counts = {"requests": 0, "bytes": 0}
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body or None, headers)
                answer = conn.getresponse()
                data = answer.read()
                with lock:
                    counts["requests"] += 1
                    counts["bytes"] += len(data)
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self) -> dict[str, int]:
        """The counts since the last call."""
        out = dict(self.counts)
        self.counts["requests"] = self.counts["bytes"] = 0
        return out

    def stop(self) -> None:
        self.server.shutdown()


def epochs(path: str, cache_bytes: int | None, storage_options: dict | None = None, n: int = 2) -> list[float]:
    """Rows/s of `n` epochs of a Loader (shuffled batches of 4096 agents, 2 workers)."""
    ds = Dataset.open(path, storage_options=storage_options)
    out = []
    with Loader(ds, "agents", batch_size=4096, num_workers=2, seed=0, cache_bytes=cache_bytes) as loader:
        for _ in range(n):
            t0 = time.perf_counter()
            rows = sum(len(b["centroid"]) for b in loader)
            out.append(rows / (time.perf_counter() - t0))
    return out


def main() -> None:
    p = parser(__doc__)
    add_json_option(p)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-v3-"))
    server = S3Server()
    proxy = CountingProxy(server.endpoint)
    options = {**server.options, "endpoint_url": proxy.endpoint, "skip_instance_cache": True}
    try:
        episodes = list(synthetic.episodes(args.scenes))
        nbytes = sum(a.nbytes for ep in episodes for a in ep.values())
        paths = {2: str(tmp / "v2.zarr"), 3: str(tmp / "v3.zarr")}
        with DatasetWriter(paths[2], workers=2) as w:
            w.ingest(episodes)
        convert(paths[2], paths[3], zarr_format=3)
        ds2, ds3 = Dataset.open(paths[2]), Dataset.open(paths[3])
        shards = ds3["agents"].meta.shard_rows // ds3["agents"].chunks[0]
        print(f"{args.scenes} scenes, {ds2.rows['agents']:,} agents ({nbytes / 1e6:.0f} MB of episodes); agents chunks "
              f"of {ds2['agents'].chunks[0]:,} rows, {shards} per v3 shard; S3 server {server.endpoint} (counted "
              f"through {proxy.endpoint})")
        runs: dict[str, list[float]] = {}

        def record(name: str, value: float, unit: str) -> None:
            runs.setdefault(name, []).append(value)
            print(f"  {name:<34} {value:14,.1f} {unit}", flush=True)

        s3 = {}
        for fmt in (2, 3):  # the datasets on S3, once (the writer's rate there is bench_stores.py's)
            url = f"{server.bucket()}/v{fmt}.zarr"
            convert(paths[2], url, zarr_format=fmt, storage_options=options)
            s3[fmt] = url
        for r in range(args.repeat):
            print(f"repeat {r + 1}/{args.repeat}")
            for fmt in ((2, 3) if r % 2 == 0 else (3, 2)):
                first, _ = epochs(paths[fmt], 0)
                record(f"v{fmt} first epoch (rows/s)", first, "rows/s")
                _, cached = epochs(paths[fmt], None)
                record(f"v{fmt} cached epoch (rows/s)", cached, "rows/s")
                out = tmp / f"w{fmt}-{r}.zarr"
                t0 = time.perf_counter()
                with DatasetWriter(out, workers=2, zarr_format=fmt) as w:
                    w.ingest(episodes)
                record(f"v{fmt} writer (MB/s)", nbytes / (time.perf_counter() - t0) / 1e6, "MB/s")
                shutil.rmtree(out, ignore_errors=True)
                proxy.take()
                (s3_first,) = epochs(s3[fmt], 0, options, n=1)
                counted = proxy.take()
                record(f"v{fmt} S3 first epoch (rows/s)", s3_first, "rows/s")
                record(f"v{fmt} S3 requests", counted["requests"], "requests (open + one epoch)")
                record(f"v{fmt} S3 MB received", counted["bytes"] / 1e6, "MB")
        speed = {name: statistics.median(values) for name, values in runs.items()}
        print("\nmedians:")
        for name, value in speed.items():
            print(f"  {name:<34} {value:14,.1f}")
        write_json(args.json, speed)
        print_ratios(speed, [("v3 first epoch (rows/s)", "v2 first epoch (rows/s)", 0.95),
                             ("v3 cached epoch (rows/s)", "v2 cached epoch (rows/s)", 0.95),
                             ("v3 writer (MB/s)", "v2 writer (MB/s)", None),
                             ("v3 S3 first epoch (rows/s)", "v2 S3 first epoch (rows/s)", None)])
        print_ratios(speed, [("v3 S3 requests", "v2 S3 requests", None),
                             ("v3 S3 MB received", "v2 S3 MB received", None)],
                     title="S3 cost per epoch", meaning="v3 over v2, lower is fewer")
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
