#!/usr/bin/env python3
"""The mutation score of the modules where a wrong line loses or mixes data (issue 26), per module.

    python .ci/mutation.py [--modules keys,plan] [--jobs 2] [--report] [--survivors] [--fresh]

It runs mutmut 3 (`pip install -e '.[mutation]'`): every small change mutmut makes to those modules (a `<`
for a `<=`, a constant off by one, a dropped call, ...) should make some test fail. The score of a module is
caught / (mutants - equivalent) ("of all": caught / mutants): caught means a test failed, hung or crashed; a
surviving mutant is a bug the suite would not see, unless `.ci/mutation_equivalent.txt` lists it with the reason
it cannot change behaviour.
Each module runs against the test files that exercise it in the test process itself (MODULES below: mutmut
sees which functions a test reaches in its own process only, so tests that run the code in worker processes or
servers of their own cannot kill its mutants); for each mutant mutmut runs only the tests that reach the
mutated function, in a process forked from a server that imported everything.

mutmut mutates a copy of the sources laid out as installed (`zarrfeed/writer`, `zarrfeed/loader`), one per
module under build/mutation/<module>/, so the repository's files are never changed. Results are kept between
runs: a run tests the mutants of functions that changed, and tries the survivors again against today's tests.
Measured on 2 cores from scratch (2026-11-26, shared with other work): 1 h 50 min in all, the remote writer 25
minutes, plan 18, the committer 17, lease 15: too slow for every push. Run it before each
release and whenever one of these modules or its tests changes (`--modules` runs just those; `--report` prints
the table of the last runs).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ROOT / "build" / "mutation"
EQUIVALENT = ROOT / ".ci" / "mutation_equivalent.txt"
MUTMUT = [sys.executable, "-m", "mutmut"]
# the tests find the real L5Kit scene beside the repository (tests/conftest.py), not beside build/mutation/<module>
ENV = {"ZARRFEED_REAL_SCENE": str(ROOT.parent / "shared" / "data" / "l5kit_single_scene.zarr"), **os.environ}
ALIVE = ("survived", "no tests", "suspicious")  # verdicts of mutants no test caught
# a mutant that makes a test fail, hang, or crash its process (pyarrow given None) fails the suite: caught
CAUGHT = ("killed", "timeout", "segfault")
TARGET = 0.9  # issue 26: at least 90% of each module's mutants caught

# module (as installed) -> the test files that exercise it
MODULES: dict[str, list[str]] = {
    "zarrfeed/core/keys.py": ["core/test_keys.py", "writer/commit/test_commit_protocol.py",
                              "writer/commit/test_journal.py", "writer/test_write_dataset.py"],
    "zarrfeed/core/commit_log.py": ["core/test_commit_log.py", "writer/commit/test_commit_protocol.py",
                                    "core/checks/test_chunk_digests.py", "writer/test_write_safety_local.py"],
    "zarrfeed/core/links.py": ["core/test_links.py", "writer/test_write_dataset.py", "loader/test_dataset.py"],
    "zarrfeed/writer/commit_tracking.py": ["writer/commit/test_commit_protocol.py", "writer/test_write_safety_local.py",
                                  "core/checks/test_chunk_digests.py"],
    "zarrfeed/writer/journal.py": ["writer/commit/test_journal.py", "writer/commit/test_commit_protocol.py"],
    "zarrfeed/writer/committer.py": ["writer/commit/test_commit_protocol.py", "writer/commit/test_committer_rules.py",
                                     "writer/test_write_safety_local.py"],
    # writer/lease/test_lease_between_processes.py: the same end to end, minutes a mutant
    "zarrfeed/writer/lease.py": ["writer/lease/test_lease_rules.py"],
    "zarrfeed/writer/episode.py": ["writer/test_write_dataset.py", "core/test_keys.py",
                                   "writer/test_dataset_writer.py"],
    "zarrfeed/loader/ordering/plan.py": ["loader/plan/test_plan_contract.py", "loader/plan/test_plan_rules.py",
                                "loader/plan/test_row_ids.py", "loader/plan/test_order.py"],
    "zarrfeed/loader/ordering/order.py": ["loader/plan/test_order.py", "loader/plan/test_plan_contract.py",
                                 "loader/plan/test_plan_rules.py"],
    "zarrfeed/loader/ordering/state.py": ["loader/engine/test_resume_state_rules.py", "loader/engine/test_loader.py",
                                 "loader/plan/test_row_ids.py"],
    "zarrfeed/loader/caches/chunk_cache.py": ["loader/cache/test_process_chunk_cache.py",
                                       "loader/engine/test_resume_state_rules.py", "loader/engine/test_loader.py"],
    "zarrfeed/loader/engine/gather_numpy.py": ["loader/engine/test_gather.py"],
    "zarrfeed/core/arrow_records.py": ["loader/test_arrow_bridge.py", "core/test_arrow_records.py"],
    # flight/test_serve_ingest.py: end to end, a minute a mutant
    "zarrfeed/flight/remote_writer.py": ["flight/test_remote_writer.py"],
}


def stage_of(module: str) -> Path:
    """build/mutation/<module's stem>: one mutmut project per module. One per module because mutmut copies the
    files it is not told to mutate with a fresh time, and a later run told to mutate one of them takes that
    copy for an up-to-date mutant file and tests an unmutated module (every mutant then reads "no tests")."""
    return STAGES / Path(module).stem


def stage(module: str, fresh: bool) -> Path:
    """The sources laid out as installed, the tests, and mutmut's configuration for `module`. Kept between runs
    (unless `fresh`): mutmut then tests only the mutants of functions that changed, or not tested yet."""
    where = stage_of(module)
    if fresh and where.exists():
        shutil.rmtree(where)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "mutants")
    copy = dict(ignore=ignore, dirs_exist_ok=True)
    shutil.copytree(ROOT / "zarrfeed", where / "zarrfeed", **copy)
    for part in ("writer", "loader"):  # package-dir: zarrfeed.writer lives in writer/, as the wheel installs it
        shutil.copytree(ROOT / part, where / "zarrfeed" / part, **copy)
    shutil.rmtree(where / "tests", ignore_errors=True)  # a test deleted here must not run on there
    shutil.copytree(ROOT / "tests", where / "tests", **copy)
    tests = [f"tests/{t}" for t in MODULES[module]]
    # mutmut maps tests to the functions they reach once, by test name: a test changed under the same name
    # keeps its old map (and is not run for mutants it now reaches), so changed tests make it map them again
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((ROOT / "tests").rglob("*.py")))).hexdigest()
    seen = where / "tests.sha256"
    if not seen.exists() or seen.read_text() != digest:
        (where / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
        seen.write_text(digest)
    (where / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["zarrfeed"]\n'
        f"only_mutate = {[module]!r}\n"
        f"pytest_add_cli_args_test_selection = {tests!r}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]\n'
        # each mutant's process is forked from a server that never ran a test: forked from one that had (gRPC
        # threads of the Flight tests), remote_writer's mutants segfaulted
        'process_isolation = "forkserver"\n'
        "[tool.pytest.ini_options]\n"
        'testpaths = ["tests"]\n'
        'pythonpath = ["tests/support"]\n')
    return where


def equivalent() -> dict[str, str]:
    """mutant name -> why it cannot change behaviour (lines `name: reason`, # comments)."""
    out = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, reason = line.partition(":")
                out[name.strip()] = reason.strip()
    return out


def module_of(mutant: str) -> str:
    """zarrfeed.core.keys.x_fingerprint__mutmut_3 -> zarrfeed/core/keys.py"""
    return mutant.split(".x", 1)[0].replace(".", "/") + ".py"


def results(module: str) -> dict[str, str]:
    """mutant name -> mutmut's verdict (killed, survived, no tests, timeout, not checked, ...) for `module`."""
    if not (stage_of(module) / "mutants").exists():
        return {}
    listing = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=stage_of(module), capture_output=True,
                             text=True, check=True).stdout
    found = (re.match(r"^\s*(\S+__mutmut_\d+): (.+)$", line) for line in listing.splitlines())
    return {m[1]: m[2] for m in found if m and module_of(m[1]) == module}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", help="comma-separated names (keys,plan,...); default: all of MODULES")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    ap.add_argument("--survivors", action="store_true", help="print each surviving mutant's diff")
    ap.add_argument("--fresh", action="store_true", help="test every mutant again (default: only what changed)")
    ap.add_argument("--report", action="store_true", help="only report what the last runs found")
    args = ap.parse_args()
    modules = list(MODULES)
    if args.modules:
        want = set(args.modules.split(","))
        modules = [m for m in MODULES if Path(m).stem in want]
        if len(modules) != len(want):
            ap.error(f"--modules: unknown {sorted(want - {Path(m).stem for m in modules})}; known "
                     f"{sorted(Path(m).stem for m in MODULES)}")
    # Worker processes (multiprocess: spawn, forkserver) get this sys.path and import the mutants; scripts a
    # test runs with sys.executable import the installed package, so mutants they alone reach are "no tests"
    # (mutmut sees which functions each test calls in its own process only); in-process tests reach them.
    # (PYTHONPATH=mutants would reach them too, but mutmut's first run then finds no test for any mutant.)
    failed = 0
    for module in modules if not args.report else ():
        started = time.monotonic()
        print(f"mutation: {module} ...", file=sys.stderr, flush=True)
        where = stage(module, args.fresh)
        # mutmut keeps a verdict until its function changes: the survivors of earlier runs whose functions did not
        # change are tried again against today's tests (after the run, which renames the mutants of those that did)
        before = {name for name, status in results(module).items() if status in ALIVE}
        for attempt in ("new", "again"):
            now = results(module) if attempt == "again" else {}
            names = sorted(n for n, status in now.items() if n in before and status in ALIVE)
            if attempt == "again" and not names:
                break
            run = subprocess.run([*MUTMUT, "run", "--max-children", str(args.jobs), *names], cwd=where, env=ENV,
                                 capture_output=True, text=True)
            if run.returncode:
                failed += 1
                tail = (run.stdout.replace("\r", "\n")[-3000:] + run.stderr[-3000:]).strip()
                print(f"mutation: mutmut run failed on {module} (exit {run.returncode}):\n{tail}", file=sys.stderr)
                break
        print(f"mutation: {module} done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    skip = equivalent()
    counts: dict[str, Counter] = {m: Counter() for m in modules}
    survivors, problems, named = [], [], set()
    for module in modules:
        found = results(module)
        named |= set(found)
        if not found:
            problems.append(f"{module}: never run (python .ci/mutation.py --modules {Path(module).stem})")
        for name, status in found.items():
            if name in skip and status in CAUGHT:
                problems.append(f"{name}: listed as equivalent but caught: take it out of {EQUIVALENT.name}")
            elif name in skip:
                status = "equivalent"
            counts[module][status] += 1
            if status in ALIVE:
                survivors.append((name, status))
    ran = {module_of(name) for name in named}
    problems += [f"{name}: listed as equivalent but no such mutant (renumbered after an edit?)"
                 for name in skip if name not in named and module_of(name) in ran]
    print(f"{'module':40} {'mutants':>8} {'caught':>7} {'equiv':>6} {'left':>5} {'unrun':>6} {'score':>7} "
          f"{'of all':>7}")
    total = Counter()
    for module, c in counts.items():
        n, eq, unrun = sum(c.values()), c["equivalent"], c["not checked"]
        killed = sum(c[k] for k in CAUGHT)
        total.update({"n": n, "killed": killed, "eq": eq, "unrun": unrun})
        score = killed / max(n - eq - unrun, 1)
        print(f"{module:40} {n:8d} {killed:7d} {eq:6d} {n - killed - eq - unrun:5d} {unrun:6d} "
              f"{score:7.1%} {killed / max(n - unrun, 1):7.1%}")
        if n and (score < TARGET or unrun):
            problems.append(f"{module}: {score:.1%} of its mutants caught ({unrun} not run); the target is "
                            f"{TARGET:.0%}")
    n, killed, eq, unrun = total["n"], total["killed"], total["eq"], total["unrun"]
    print(f"{'all':40} {n:8d} {killed:7d} {eq:6d} {n - killed - eq - unrun:5d} {unrun:6d} "
          f"{killed / max(n - eq - unrun, 1):7.1%} {killed / max(n - unrun, 1):7.1%}")
    for name, status in survivors:
        print(f"  {status}: {name}")
        if args.survivors:
            print(subprocess.run([*MUTMUT, "show", name], cwd=stage_of(module_of(name)), capture_output=True,
                                 text=True).stdout)
    problems += [f"{name}: {status}, neither caught nor listed as equivalent" for name, status in survivors]
    for line in problems:
        print(f"mutation: {line}", file=sys.stderr)
    return 2 if failed else 1 if problems else 0

if __name__ == "__main__":
    sys.exit(main())
