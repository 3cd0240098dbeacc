"""Write, read and load a dataset on S3 (or any fsspec store), with storage options, a pinned commit and a
local cache of chunk objects.

Run: python examples/object_store.py s3://BUCKET/PREFIX ENDPOINT_URL
     (with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY set; on AWS itself leave the endpoint out of `options`)
"""
import sys
import tempfile

from zarrfeed.loader import Dataset, Loader
from zarrfeed.writer import DatasetWriter, synthetic

if __name__ == "__main__":  # workers import this script again (see "Start methods" in docs/guides/loading.md)
    if len(sys.argv) < 3:
        sys.exit(f"usage: python {sys.argv[0]} s3://BUCKET/PREFIX ENDPOINT_URL")
    url = sys.argv[1].rstrip("/") + "/scenes.zarr"
    options = {"endpoint_url": sys.argv[2]}  # anything the filesystem takes: key, secret, profile, anon, ...

    episodes = list(synthetic.episodes(4, seed=0))
    with DatasetWriter(url, workers=2, storage_options=options) as w:  # holds the dataset's lease until closed
        w.ingest(episodes[:2])
        pinned = w.commit  # a commit number: every rank that opens with it reads the same rows
        w.ingest(episodes[2:], keys=["scene-2", "scene-3"])  # the caller's keys: retries never duplicate

    ds = Dataset.open(url, storage_options=options)
    print("rows:", ds.rows, "commit:", ds.commit)
    print("pinned rows:", Dataset.open(url, storage_options=options, commit=pinned).rows)
    print("valid:", ds.validate().ok)

    with Loader(url, "agents", batch_size=4096, num_workers=2, storage_options=options,
                cache_dir=tempfile.mkdtemp()) as loader:  # epoch 2 reads complete chunks from the local cache
        for epoch in range(2):
            print("epoch", epoch, "rows:", sum(len(batch["centroid"]) for batch in loader))
