"""The one place the measured figures the docs quote live: docs/figures.json (those of the README, the home page,
the performance page's loader, samples, episodes, ranks, writer, Dask, serving and shuffle sections, and the
loading, writing, Dask and serving guides; what no bench script's --json gives, such as compare_revisions.py's
ratios between revisions, chunk counts and memory, is still written by hand). A figure is quoted in a page as
its number followed by a marker, `45.6<!--fig:loader.cached_4096--> M rows/s` (the comment shows in neither
GitHub nor the site); tests/e2e/test_figures.py fails when a quoted number is not the recorded one, when a marker
names no figure, when a figure is quoted nowhere, or when a figure names a speed its script does not write, so
that the pages cannot drift apart.

    python bench/bench_loader.py --repeat 3 --json run.json   # any bench script with --json
    python bench/figures.py record bench_loader.py run.json   # its figures into docs/figures.json
    python bench/figures.py set loader.first_batch_256 0.21   # a figure by hand (digits, '.', ',', '-')
    python bench/figures.py sync                              # every marked number in the docs rewritten
    python bench/figures.py check                             # what the test checks

A figure computed by a script names it (`script`), the speed it is (`speed`, a key of that script's --json
output), optionally the speed it is divided by (`over`), `invert` (a time, from a speed), a `scale` and a
`format`, and `args` when it comes from a run other than at the script's defaults (`bench_episodes.py --image
12`: `record bench_episodes.py run.json --args "--image 12"` records those, and a run without --args the
others); `record` stores the value with the date and machine of the run. Each figure's `command` is how to
measure and record it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.json"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"([0-9][0-9.,\-]*)<!--fig:([A-Za-z0-9_.\-]+)-->")


def load() -> dict[str, dict]:
    return json.loads(FIGURES.read_text())


def save(figures: dict[str, dict]) -> None:
    FIGURES.write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    return cpu


def computed(figure: dict, speeds: dict[str, float]) -> str:
    """The figure's value from a script's --json speeds."""
    value = speeds[figure["speed"]]
    if "over" in figure:
        value /= speeds[figure["over"]]
    if figure.get("invert"):
        value = 1 / value
    return figure.get("format", "{:.2f}").format(value * figure.get("scale", 1))


def record(script: str, run: Path, args: str = "") -> list[str]:
    """Every figure of `script` (a name or a path: bench/bench_loader.py) run with `args` (its figures' `args`:
    none for a run at its defaults) from its --json output `run`; the names changed. SystemExit (one line) for a
    run that is not such an output, or misses a speed a figure needs."""
    script = Path(script).name
    try:
        speeds = json.loads(run.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"figures: {run}: not a bench script's --json output ({exc})") from None
    if not isinstance(speeds, dict):
        raise SystemExit(f"figures: {run}: not a bench script's --json output (a JSON object of speeds)")
    figures = load()
    mine = {name: f for name, f in figures.items() if f.get("script") == script and f.get("args", "") == args}
    if not mine:
        others = sorted({f.get("args", "") for f in figures.values() if f.get("script") == script})
        if others:
            raise SystemExit(f"figures: no figure comes from {script} {args or '(at its defaults)'}; its figures' "
                             f"--args: {', '.join(repr(a) if a else '(none)' for a in others)}")
        raise SystemExit(f"figures: no figure comes from {script} (scripts: "
                         f"{', '.join(sorted({f['script'] for f in figures.values() if 'script' in f}))})")
    missing = sorted({k for f in mine.values() for k in (f["speed"], f.get("over")) if k and k not in speeds})
    if missing:
        raise SystemExit(f"figures: {run} has no {', '.join(map(repr, missing))}: run {script} in full (not "
                         "--check-only or the like) to record its figures")
    for key in sorted({k for f in mine.values() for k in (f["speed"], f.get("over")) if k}):
        value = speeds[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise SystemExit(f"figures: {run}: {key!r} is {value!r}; a speed is a positive number (per second)")
    stamp = {"date": datetime.date.today().isoformat(), "machine": machine()}
    changed = []
    for name, figure in figures.items():
        if name in mine:
            figure.update(value=computed(figure, speeds), **stamp)
            changed.append(name)
    save(figures)
    return changed


def quotes() -> list[tuple[Path, int, str, str]]:
    """Every marked number in the pages: (page, line, number, figure)."""
    out = []
    for page in PAGES:
        fenced = False
        for i, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            spans = [m.span() for m in re.finditer(r"`[^`]*`", line)]  # inline code
            if fenced or any(a <= m.start() < b for m in MARKER.finditer(line) for a, b in spans):
                if MARKER.search(line):  # a comment in code shows as text: not a quote
                    out.append((page, i, "", "(a marker in a code block)"))
                continue
            out += [(page, i, m.group(1), m.group(2)) for m in MARKER.finditer(line)]
    return out


def check() -> list[str]:
    """What disagrees: a quoted number that is not its figure's, a marker of no figure, a figure quoted nowhere."""
    figures, problems, used = load(), [], set()
    for page, line, number, name in quotes():
        used.add(name)
        if name not in figures:
            problems.append(f"{page.relative_to(ROOT)}:{line}: no figure {name!r} in docs/figures.json")
        elif number != figures[name]["value"]:
            problems.append(f"{page.relative_to(ROOT)}:{line}: {name} is quoted as {number}, recorded as "
                            f"{figures[name]['value']} (python bench/figures.py sync)")
    problems += [f"figure {name!r} is quoted in no page" for name in sorted(set(figures) - used)]
    return problems


def sync() -> int:
    """Rewrite every marked number in the pages to its recorded value; the count of numbers changed."""
    figures, changed = load(), 0
    for page in PAGES:
        text = page.read_text()

        def put(m: re.Match) -> str:
            nonlocal changed
            value = figures.get(m.group(2), {}).get("value", m.group(1))
            changed += value != m.group(1)
            return f"{value}<!--fig:{m.group(2)}-->"

        new = MARKER.sub(put, text)
        if new != text:
            page.write_text(new)
    return changed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="a bench script's figures from its --json output")
    r.add_argument("script")
    r.add_argument("run", type=Path)
    r.add_argument("--args", default="", metavar="ARGS",
                   help="the script's arguments in that run, for the figures of a run other than at its defaults "
                        "(the figures' `args`, such as \"--image 12\")")
    s = sub.add_parser("set", help="one figure's value, by hand")
    s.add_argument("name")
    s.add_argument("value")
    sub.add_parser("sync", help="rewrite every marked number in the docs")
    sub.add_parser("check", help="what the test checks")
    argv = sys.argv[1:]  # `--args "--image 12"`: a value that starts with a dash, which argparse takes for a flag
    argv = [f"--args={argv[i + 1]}" if a == "--args" and i + 1 < len(argv) else a for i, a in enumerate(argv)
            if not (i > 0 and argv[i - 1] == "--args")]
    args = ap.parse_args(argv)
    if args.command == "record":
        print("recorded:", ", ".join(record(args.script, args.run, args.args)))
    elif args.command == "set":
        figures = load()
        if args.name not in figures:
            print(f"no figure {args.name!r} (figures: {', '.join(sorted(figures))})", file=sys.stderr)
            return 2
        if not re.fullmatch(MARKER.pattern.split("<")[0], args.value):  # a page quotes it before its marker
            print(f"a figure is a number as a page quotes it (digits, '.', ',', '-'), got {args.value!r}",
                  file=sys.stderr)
            return 2
        figures[args.name].update(value=args.value, date=datetime.date.today().isoformat(), machine=machine())
        save(figures)
    elif args.command == "sync":
        print(f"{sync()} numbers rewritten")
    problems = check()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
