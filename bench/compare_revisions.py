"""Compare two revisions of zarrfeed with one bench script, in the same run: is this checkout slower?

    python bench/compare_revisions.py --base PYTHON [--repeat 3] SCRIPT [SCRIPT ARGS ...]

PYTHON is the interpreter of an environment where another revision of zarrfeed is installed, for example
one made with `git worktree add ../base <rev> && python3 -m venv ../base/.venv &&
../base/.venv/bin/pip install -e '../base[bench]'`. SCRIPT (bench_loader.py, bench_writer.py, ...; from this
folder) runs --repeat times under this interpreter and under PYTHON, alternating which goes first, each time
with `--repeat 1 --json FILE`; the script and its baselines are this checkout's, only the zarrfeed it imports
differs. Printed last: for every speed the script measures, the median of each revision's runs and
this / base (higher is faster), with the spread of the per-repeat ratios (each run against its neighbour:
drift of this shared machine between repeats cancels).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(python: str, script: Path, args: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="zarrfeed-compare-") as tmp:
        out = Path(tmp) / "speeds.json"
        # run from an empty folder: from a checkout's root, its `zarrfeed/` would shadow the installed revision
        subprocess.run([python, str(script), *args, "--repeat", "1", "--json", str(out)], check=True,
                       stdout=subprocess.DEVNULL, cwd=tmp)
        return json.loads(out.read_text())


def revision(python: str) -> str:
    code = "import zarrfeed, pathlib; print(pathlib.Path(zarrfeed.__file__).parent.parent)"
    where = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True, cwd="/").stdout.strip()
    head = subprocess.run(["git", "-C", where, "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return f"{where} ({head.stdout.strip()[:60] or 'not a git checkout'})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, metavar="PYTHON", help="interpreter with the other revision installed")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("script", help="a bench script of this folder, such as bench_loader.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (not --repeat or --json)")
    args = p.parse_args()
    script = HERE / args.script
    if not script.is_file():
        p.error(f"no bench script {script}")
    this, base = sys.executable, args.base
    print(f"this: {revision(this)}\nbase: {revision(base)}\n{args.script} {' '.join(args.args)}, "
          f"{args.repeat} repeats, alternating which goes first", flush=True)
    speeds: dict[str, list[dict[str, float]]] = {"this": [], "base": []}
    order = [("this", this), ("base", base)]
    for rep in range(args.repeat):
        for name, python in order if rep % 2 == 0 else order[::-1]:
            speeds[name].append(run(python, script, args.args))
            print(f"  repeat {rep + 1}: {name} done", flush=True)
    keys = [k for k in speeds["this"][0] if all(k in s for s in speeds["this"] + speeds["base"])]
    print(f"\n{'speed (per second)':<34}{'this':>14}{'base':>14}{'this/base':>11}{'per repeat':>20}")
    for k in keys:
        a = statistics.median(s[k] for s in speeds["this"])
        b = statistics.median(s[k] for s in speeds["base"])
        per = [t[k] / u[k] for t, u in zip(speeds["this"], speeds["base"], strict=True)]
        print(f"{k:<34}{a:>14,.1f}{b:>14,.1f}{a / b:>10.3f}x{min(per):>9.3f}-{max(per):.3f}x")


if __name__ == "__main__":
    main()
