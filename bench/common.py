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


def add_json_option(p: argparse.ArgumentParser) -> None:
    """--json FILE: also write the run's speeds (name -> per second, higher is faster) for `compare_revisions`."""
    p.add_argument("--json", metavar="FILE", type=Path, help="also write each measured speed (higher is faster) "
                   "to FILE as JSON (what bench/compare_revisions.py reads)")


def write_json(path: Path | None, speeds: dict[str, float]) -> None:
    if path is not None:
        import json

        path.write_text(json.dumps(speeds, indent=1))


def print_ratios(speed: dict[str, float], pairs: list[tuple[str, str, float | None]], title: str = "ratios",
                 meaning: str = "speed, higher is faster") -> None:
    """For each (a, b, target): speed[a] / speed[b] (higher is faster), and whether it meets the target."""
    print(f"\n{title} ({meaning}):")
    for a, b, target in pairs:
        ratio = speed[a] / speed[b]
        goal = f"  (target >= {target}x: {'met' if ratio >= target else 'NOT met'})" if target else ""
        shown = f"{ratio:.3f}" if ratio < 10 else f"{ratio:.1f}"  # a ratio near its target of 0.97 shows it
        print(f"  {a} / {b}: {shown}x{goal}")


def copy_bytes_per_s() -> float:
    """Bytes per second one process copies from one 64 MB buffer to another (the bound of any gather)."""
    import time

    import numpy as np

    src = np.ones(64 << 20, np.uint8)
    dst = np.ones_like(src)  # touched: no page faults in the timing
    np.copyto(dst, src)
    t = time.perf_counter()
    for _ in range(5):
        np.copyto(dst, src)
    return 5 * len(src) / (time.perf_counter() - t)


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


def add_plot_option(p: argparse.ArgumentParser) -> None:
    """--plot FILE.png: draw what the run measured (needs matplotlib: pip install 'zarrfeed[bench]')."""
    p.add_argument("--plot", metavar="FILE.png", type=Path,
                   help="also draw what was measured, with the command and the machine, to FILE.png "
                        "(needs matplotlib: pip install 'zarrfeed[bench]')")


def check_plot_option(path: Path | None) -> None:
    """Refuse --plot before measuring anything when matplotlib is missing (one line, no traceback)."""
    if path is None:
        return
    if not path.absolute().parent.is_dir():
        raise SystemExit(f"--plot {path}: there is no folder {path.absolute().parent}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'zarrfeed[bench]'") from None


def machine() -> str:
    """This machine in one line: CPU model, cores this process may use, memory, Python and numpy."""
    import os
    import platform

    import numpy as np

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    mem = next((int(line.split()[1]) / 2**20 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0.0)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{cpu}, {cores} cores, {mem:.0f} GiB; Python {platform.python_version()}, numpy {np.__version__}, "
            f"{platform.system()} {platform.release()}")


def smaller_than_documented(p: argparse.ArgumentParser, args: argparse.Namespace) -> bool:
    """Whether this run's --scenes or --repeat is below the script's defaults (the documented measurement)."""
    return any(getattr(args, k, None) is not None and getattr(args, k) < p.get_default(k) for k in ("scenes", "repeat"))


def plot_panels(path: Path, title: str, panels: list[tuple[str, str, dict[str, float]]], smoke: bool = False) -> None:
    """Horizontal bars, one panel per (title, unit, {label: value}), with the command that ran and the
    machine it ran on written under them, saved to `path` as a PNG. `smoke`: the run was smaller than the
    documented one, and the figure says so in red across its top."""
    import shlex
    import sys
    import time

    from matplotlib.figure import Figure

    height = sum(1.0 + 0.32 * len(values) for _, _, values in panels) + 1.0
    fig = Figure(figsize=(9, height), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=[len(v) + 1 for _, _, v in panels])[:, 0]
    for ax, (name, unit, values) in zip(axes, panels, strict=True):
        labels, numbers = list(values), list(values.values())
        bars = ax.barh(labels, numbers, color=["tab:blue" if lab.startswith("zarrfeed") else "tab:gray"
                                                for lab in labels])
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in numbers], padding=3,
                     fontsize="small")
        ax.invert_yaxis()
        ax.set_xlim(0, max(numbers, default=1) * 1.18)
        ax.set_xlabel(unit)
        ax.set_title(name, loc="left", fontsize="medium")
    fig.suptitle(title + ("\nSMOKE RUN at tiny sizes: shows the drawing works, not a measurement" if smoke else ""),
                 color="tab:red" if smoke else "black")
    command = "python " + " ".join(shlex.quote(a) for a in [f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    fig.supxlabel(f"{command}\n{machine()}; {time.strftime('%Y-%m-%d')}", fontsize="x-small", ha="left", x=0.01)
    fig.savefig(path, dpi=100)
    print(f"\nplot: {path}")
