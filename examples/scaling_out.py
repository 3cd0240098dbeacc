"""Ingest on a Dask cluster straight to S3 (or any store), then read a table back as a dask DataFrame.

Run: python examples/scaling_out.py s3://BUCKET/PREFIX ENDPOINT_URL [SCHEDULER_ADDRESS]
     (with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY set). Without SCHEDULER_ADDRESS, a cluster of two worker
     processes starts on this machine, on 127.0.0.1 only.
"""
import sys

from distributed import Client, LocalCluster
from zarrfeed.loader import Dataset
from zarrfeed.writer import dask as zdask
from zarrfeed.writer import synthetic


def read_log(source):
    """Runs on the workers: one source (a file name, a URL, here a seed) in, its episodes out."""
    seed, scenes = source
    return synthetic.scenes((seed, 0, scenes), frames=40)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(f"usage: python {sys.argv[0]} s3://BUCKET/PREFIX ENDPOINT_URL [SCHEDULER_ADDRESS]")
    url = sys.argv[1].rstrip("/") + "/fleet.zarr"
    options = {"endpoint_url": sys.argv[2]}
    cluster = None if len(sys.argv) > 3 else LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                                                          dashboard_address="127.0.0.1:0")
    with Client(sys.argv[3] if len(sys.argv) > 3 else cluster) as client:
        sources = [(seed, 3) for seed in range(8)]
        summary = zdask.ingest(client, sources, read_log, url, storage_options=options)
        print(f"wrote {summary.episodes} episodes from {summary.written} sources in {summary.seconds:.1f} s")
        # run again after a crash: resume=True writes only the sources not committed
        ds = Dataset.open(url, storage_options=options)
        agents = ds.to_dask("agents")  # one partition per 8 chunks, read on the workers
        print("agents:", len(agents), "tracks:", agents["track_id"].nunique().compute())
    if cluster is not None:
        cluster.close()
