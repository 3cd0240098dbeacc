"""What the bench scripts share: their command line, a synthetic dataset to measure on, and ratio printing."""
from __future__ import annotations

import argparse
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from zarrfeed.writer import synthetic, write_dataset


def parser(doc: str) -> argparse.ArgumentParser:
    """--scenes and --repeat, with the script's docstring as its help."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    return p


@contextmanager
def synthetic_dataset(scenes: int) -> Iterator[Path]:
    """A synthetic L5Kit dataset of `scenes` scenes in a temporary folder, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-"))
    try:
        write_dataset(tmp / "d.zarr", synthetic.episodes(scenes), workers=2)
        yield tmp / "d.zarr"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def print_ratios(speed: dict[str, float], pairs: list[tuple[str, str, float | None]], title: str = "ratios",
                 meaning: str = "speed, higher is faster") -> None:
    """For each (a, b, target): speed[a] / speed[b] (higher is faster), and whether it meets the target."""
    print(f"\n{title} ({meaning}):")
    for a, b, target in pairs:
        ratio = speed[a] / speed[b]
        goal = f"  (target >= {target}x: {'met' if ratio >= target else 'NOT met'})" if target else ""
        print(f"  {a} / {b}: {ratio:.2f}x{goal}")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` and every process below it, counting the
    children each has reaped (a stream's loader workers, reaped by the fork server) through cutime/cstime."""
    import os

    from zarrfeed.flight.activity import descendants

    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile: counted in its parent's cutime once reaped
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / tick
