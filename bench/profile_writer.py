"""Where a local `DatasetWriter`'s time goes: start-up, ingest and close, and CPU-seconds per GB in the parent and
in each worker, against zarr's bulk write of the same rows (the compression every writer pays).

    python bench/profile_writer.py [--scenes 100] [--workers 2] [--repeat 3] [--profile parent.prof]
                                   [--import-late]

DatasetWriter is imported at the top, as a script imports it, and its import starts the process's fork server
in the background; --import-late imports it just before the open, so that the open waits for the server.

One process per measurement (as bench_writer.py), alternating, medians. CPU is the process's user + system time
(workers: read from /proc before they exit), so the figures carry over to a busier machine better than wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_of(pid: int) -> float:
    """User + system CPU-seconds of live process `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(kind: str, scenes: int, workers: int, out: Path, profile: str | None, import_late: bool) -> dict:
    if kind == "zarrfeed" and not import_late:  # at the top, as a script imports (this starts the fork server)
        from zarrfeed.writer.dataset_writer import DatasetWriter
    from zarrfeed.writer import synthetic
    episodes = list(synthetic.episodes(scenes))
    gb = sum(a.nbytes for ep in episodes for a in ep.values()) / 1e9
    shutil.rmtree(out, ignore_errors=True)
    if kind == "bulk":
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_writer import create_arrays, relocated_tables
        tables = relocated_tables(episodes)
        c0, t0 = self_cpu(), time.perf_counter()
        group = create_arrays(out, {t: len(a) for t, a in tables.items()})
        for t, arr in tables.items():
            group[t][:] = arr
        return {"gb": gb, "total": time.perf_counter() - t0, "parent_cpu": self_cpu() - c0}
    from zarrfeed.writer.dataset_writer import DatasetWriter  # noqa: F811 (with --import-late, first here)
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    c0, t0 = self_cpu(), time.perf_counter()
    w = DatasetWriter(out, workers=workers)
    t1, c1 = time.perf_counter(), self_cpu()
    w.ingest(episodes)
    t2, c2 = time.perf_counter(), self_cpu()
    worker_cpu = [cpu_of(p) for p in w.worker_pids]
    w.close()
    t3, c3 = time.perf_counter(), self_cpu()
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    return {"gb": gb, "total": t3 - t0, "start": t1 - t0, "ingest": t2 - t1, "close": t3 - t2,
            "parent_cpu": c3 - c0, "parent_start_cpu": c1 - c0, "parent_ingest_cpu": c2 - c1,
            "parent_close_cpu": c3 - c2, "worker_cpu": worker_cpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenes", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", help="write the parent's cProfile of the last zarrfeed run here")
    p.add_argument("--import-late", action="store_true",
                   help="import DatasetWriter just before opening it (its fork server then starts at the open)")
    p.add_argument("--one", choices=["zarrfeed", "bulk"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.scenes, args.workers, args.out, args.profile, args.import_late)))
        return
    scratch = Path(tempfile.mkdtemp(prefix="zarrfeed-profile-"))
    runs: dict[str, list[dict]] = {"zarrfeed": [], "bulk": []}
    try:
        for r in range(args.repeat):
            for kind in (("zarrfeed", "bulk") if r % 2 == 0 else ("bulk", "zarrfeed")):
                cmd = [sys.executable, __file__, "--one", kind, "--scenes", str(args.scenes), "--workers",
                       str(args.workers), "--out", str(scratch / f"{kind}.zarr")]
                if args.import_late:
                    cmd.append("--import-late")
                if args.profile and kind == "zarrfeed":
                    cmd += ["--profile", args.profile]
                runs[kind].append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = lambda kind, key: statistics.median(r[key] for r in runs[kind])  # noqa: E731
    gb = runs["zarrfeed"][0]["gb"]
    print(f"{args.scenes} scenes, {gb:.2f} GB in memory, DatasetWriter(workers={args.workers}), medians of "
          f"{args.repeat}\n")
    total = med("zarrfeed", "total")
    print(f"  zarrfeed open to close {total:.3f} s ({gb / total * 1e3:,.0f} MB/s): "
          f"start {med('zarrfeed', 'start'):.3f} s, ingest {med('zarrfeed', 'ingest'):.3f} s, "
          f"close {med('zarrfeed', 'close'):.3f} s")
    wcpu = statistics.median(sum(r["worker_cpu"]) for r in runs["zarrfeed"])
    print(f"  CPU-s per GB: parent {med('zarrfeed', 'parent_cpu') / gb:.2f} (start "
          f"{med('zarrfeed', 'parent_start_cpu') / gb:.2f}, ingest {med('zarrfeed', 'parent_ingest_cpu') / gb:.2f}, "
          f"close {med('zarrfeed', 'parent_close_cpu') / gb:.2f}), workers {wcpu / gb:.2f} (before close), "
          f"total {(med('zarrfeed', 'parent_cpu') + wcpu) / gb:.2f}")
    print(f"  zarr bulk write {med('bulk', 'total'):.3f} s ({gb / med('bulk', 'total') * 1e3:,.0f} MB/s), "
          f"CPU-s per GB {med('bulk', 'parent_cpu') / gb:.2f}")
    print(f"\nratio: zarrfeed / zarr bulk write (speed, open to close): "
          f"{med('bulk', 'total') / med('zarrfeed', 'total'):.2f}x")


if __name__ == "__main__":
    main()
