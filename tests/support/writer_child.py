"""Run by tests as a separate process: ingest synthetic scenes slowly, so that it can be killed mid-way.

    python writer_child.py OUT N_SCENES WORKERS [SECONDS_PER_EPISODE] [--resume] [--start-method M] [--v3]
                           [--kill-in-shard-write]

`--v3` writes zarr v3 with shards of three agent chunks (SHARD_BYTES); `--kill-in-shard-write` (with WORKERS 0)
SIGKILLs the process while it writes a shard that holds committed rows: the write is sent (a PUT in flight, a
temporary file being renamed) and the process dies a few milliseconds later, having printed the shard's key.
"""
import os
import signal
import sys
import threading
import time

from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

CHUNKS = {"agents": 2000, "frames": 100, "scenes": 4, "traffic_light_faces": 500}
SHARD_BYTES = 3 * 2000 * 116  # three agent chunks a shard; 51 frames chunks, so episodes share frames shards


def slowly(n: int, pause: float):
    for ep in synthetic.episodes(n, seed=5, frames=40, agents_per_frame=300):
        time.sleep(pause)
        yield ep


def kill_in_shard_write() -> None:
    """Make the first write of a shard that holds committed rows the process's last (see the module)."""
    from zarrfeed.core import stores
    from zarrfeed.core.manifest_io import read_manifest
    from zarrfeed.core.zarr_array import Array

    for kind in (stores.DirectoryStore, stores.FsspecStore):
        real = kind.put_chunks

        def put_chunks(store, values, real=real):
            for key in values:
                table, _, rest = key.partition("/c/")
                if rest and key in store:
                    first = int(rest) * Array.open(store, table).meta.shard_rows
                    if read_manifest(store)["committed"][table] > first:
                        print("killed writing", key, flush=True)
                        threading.Thread(target=real, args=(store, values), daemon=True).start()
                        time.sleep(0.005)
                        os.kill(os.getpid(), signal.SIGKILL)
            return real(store, values)

        kind.put_chunks = put_chunks


if __name__ == "__main__":
    out, n, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pause = float(sys.argv[4]) if len(sys.argv) > 4 and not sys.argv[4].startswith("-") else 0.0
    resume = "--resume" in sys.argv
    method = sys.argv[sys.argv.index("--start-method") + 1] if "--start-method" in sys.argv else None
    v3 = {"zarr_format": 3, "shard_bytes": SHARD_BYTES} if "--v3" in sys.argv else {}
    if "--kill-in-shard-write" in sys.argv:
        kill_in_shard_write()
    with DatasetWriter(out, workers=workers, mode="a" if resume else "w", commit_interval=0.05, start_method=method,
                       chunks=CHUNKS, **v3) as w:
        print("workers", *w.worker_pids, flush=True)
        w.ingest(slowly(n, pause), resume=resume)
    print("done", flush=True)
