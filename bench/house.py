"""The questions a newcomer asks of the package, measured: how many classes share a name, how many places
declare an option, and how many modules a chunk passes through on its way into a batch.

    python bench/house.py [FOLDER] [--rev REV] [--json]

FOLDER is a checkout (default: the one holding this script); `--rev REV` measures that git revision of it
instead, exported with `git archive` into a temporary folder that is removed after. The package is the three
folders installed as one: zarrfeed/ (zarrfeed), loader/ (zarrfeed.loader) and writer/ (zarrfeed.writer).

Rules (each measure reads the measured tree only: its files with `ast`, and its code run in a subprocess):

Names.
- A *stem word* is a word of a name (CamelCase parts of a class name, `_`-separated parts of a module's
  basename), lower-cased and reduced by `stem`: a plural's s (`ies` -> y, `ches`/`shes`/`xes`/`sses` lose
  `es`), then a past participle's `ed`, then an agent noun's `er` (a doubled last consonant made single), in
  that order, each only when at least three letters stay: Samples -> sample, Grouped -> group, committer ->
  commit, stores -> store.
- *Classes sharing a name*: a class name (any `class` statement, nested ones too) defined in more than one
  module; counted once per name.
- *Near collisions of classes* (one concept under several names): the distinct class names whose stem words
  form the same set (GroupedSamples, SampleGroups and SampleGroup are the set {group, sample}), one group per
  set that two or more names spell; and *one word apart* pairs, where one name's set is another's plus one
  word that is not a role word (`ROLE_WORDS`: error, options, ...), where the longer-named class neither
  derives from the other (WindowLoader is a Loader) nor is an exception: Samples and GroupedSamples.
- *Colliding module basenames*: modules (no `__init__`/`__main__`) whose basenames have the same stem words,
  in order (store.py and stores.py; commit.py, commits.py and committer.py; loader/kinds/source.py and
  writer/source.py), one group per stem.

Options (the loader's: the keys of the TypedDict `LoaderOptions`, wherever the package defines it).
- A *declaring place* of option `o` is a class with `o` as a class-level annotated name that is not a
  `ClassVar` (dataclass and NamedTuple fields, TypedDict keys, annotated attributes), or the function (or
  module) holding a dict display `{"o": ...}` or a call `dict(o=...)`; named module:Qualname. The measure is
  the number of (option, place) pairs.
- A *validating place* is the function holding either a `raise` whose message names `o` (its text, with
  each f-string value as `{}`, has `o` first, or in backticks, or followed by must, should, cannot, needs,
  may or a comparison: "prefetch must be >= 1 and num_workers >= 0" names both), or a call passing the
  string `"o"` to a *checker*: a package function that raises a message in which one of its parameters is
  followed by " must" (core.keywords' `count(value, "rank", 0)`).
  The measure is the number of (option, place) pairs.

Route of a chunk (dynamic: a `Loader` with `num_workers=0` reads its first batch of a small synthetic
dataset in a subprocess importing the measured tree, under `sys.setprofile`).
- Frames count when their module (`__name__` of their globals) is zarrfeed or under it; Python calls only.
- The route starts at the first call of the *fetch*: a method named `fetch` of a class whose name holds
  "fetch" (`ChunkFetcher.fetch`, which reads chunks' stored bytes for the reader worker); it ends when a
  zarrfeed frame with no zarrfeed frame under it returns (or yields) a mapping: the batch handed to the user.
- *Modules on the route*: the modules of the zarrfeed frames on the stack at the start, and of every
  zarrfeed frame entered until the end; the measure is how many distinct ones.
- A *turn back* is a pair (A, B) of modules where A calls into B and, while that frame of B is still on the
  stack, a frame of A is entered again: at each call of a frame of module A whose zarrfeed caller is in
  another module, B is the module of the frame just above the nearest earlier A on the zarrfeed stack. The
  stacks seen on the route count (those standing at its start too); the measure is the number of distinct
  pairs.
The dataset: 2 synthetic scenes of 20 frames (about 500 agents, chunks of 256 rows), written with
`DatasetWriter(workers=0)`; the loader: `Loader(path, "agents", batch_size=64, seed=0, num_workers=0)`, its
other options at their defaults. Only the public API is used, so that any revision since e966de5 runs it.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
FOLDERS = {"zarrfeed": "zarrfeed", "zarrfeed.loader": "loader", "zarrfeed.writer": "writer"}
ROLE_WORDS = frozenset({"error", "exception", "warning", "option", "setting", "config", "protocol", "base",
                        "mixin", "meta", "test", "stalled"})
FETCH = "fetch"  # the route starts at a method `fetch` of a class named for it (ChunkFetcher.fetch)
OPTION_CLASS = "LoaderOptions"
_JUDGED = r"(\s+(must|should|cannot|can't|needs?|may)\b|\s*(>=|<=|==|!=|>|<))"


# -- the tree ----------------------------------------------------------------------------------------------

def modules(root: Path) -> dict[str, Path]:
    """Every module of the package in `root`, by its installed name."""
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def parsed(root: Path) -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in modules(root).items()}


def scoped(tree: ast.AST, scope: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Every node of `tree` with the qualname of the function or class holding it ("" at module level)."""
    for child in ast.iter_child_nodes(tree):
        yield scope, child
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from scoped(child, f"{scope}.{child.name}" if scope else child.name)
        else:
            yield from scoped(child, scope)


def place(module: str, scope: str) -> str:
    return f"{module.removeprefix('zarrfeed.')}:{scope or '<module>'}"


# -- names -------------------------------------------------------------------------------------------------

def stem(word: str) -> str:
    """A word without its plural's s, past participle's ed and agent noun's er (see the module's rules)."""
    w = word.lower()
    if w.endswith("ies") and len(w) > 5:
        w = w[:-3] + "y"
    elif w.endswith(("ches", "shes", "xes", "sses")) and len(w) > 5:
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        w = w[:-1]
    for suffix in ("ed", "er"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[:-len(suffix)]
            if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "aeiousl":
                w = w[:-1]
            break
    return w


def camel_words(name: str) -> list[str]:
    return re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", name.strip("_"))


def class_names(trees: dict[str, ast.Module]) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """Class name -> the modules defining it, and class name -> the names of its bases (any definition's)."""
    where: dict[str, list[str]] = defaultdict(list)
    bases: dict[str, set[str]] = defaultdict(set)
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                if module not in where[node.name]:
                    where[node.name].append(module)
                bases[node.name] |= {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
    return dict(where), bases


def failure(name: str, bases: dict[str, set[str]]) -> bool:
    """Whether class `name` is an exception or warning (a base of it, by name, ends so)."""
    return any(derives(name, b, bases) for b in {n for ns in bases.values() for n in ns}
               if b.endswith(("Error", "Exception", "Warning")))


def derives(name: str, base: str, bases: dict[str, set[str]]) -> bool:
    """Whether class `name` is `base` or derives from it (by names, through the package's classes)."""
    seen, todo = set(), [name]
    while todo:
        if (n := todo.pop()) == base:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(bases.get(n, ()))
    return False


def names_measure(trees: dict[str, ast.Module]) -> dict[str, Any]:
    classes, bases = class_names(trees)
    shared = {name: sorted(ms) for name, ms in sorted(classes.items()) if len(ms) > 1}
    words = {name: frozenset(stem(w) for w in camel_words(name)) for name in classes}
    by_set: dict[frozenset, list[str]] = defaultdict(list)
    for name, ws in words.items():
        by_set[ws].append(name)
    same = sorted(sorted(ns) for ns in by_set.values() if len(ns) > 1)
    plus_one = sorted({(a, b) for a, wa in words.items() for b, wb in words.items()
                       if wa < wb and len(wb - wa) == 1 and not (wb - wa) & ROLE_WORDS
                       and not derives(b, a, bases) and not failure(b, bases)})
    by_stem: dict[tuple, list[str]] = defaultdict(list)
    for module in trees:
        base = module.rsplit(".", 1)[-1]
        if base not in ("__init__", "__main__") and module not in FOLDERS:
            by_stem[tuple(stem(w) for w in base.strip("_").split("_"))].append(module)
    colliding = sorted(sorted(ms) for ms in by_stem.values() if len(ms) > 1)
    return {"classes": len(classes), "shared_names": shared, "same_stems": same,
            "stem_plus_one": [list(p) for p in plus_one], "module_collisions": colliding}


# -- options -----------------------------------------------------------------------------------------------

def option_names(trees: dict[str, ast.Module]) -> list[str]:
    """The keys of `LoaderOptions`, in declaration order."""
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == OPTION_CLASS:
                return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                        and isinstance(s.target, ast.Name)]
    raise SystemExit(f"house: no class {OPTION_CLASS} in the measured package")


def class_fields(node: ast.ClassDef) -> set[str]:
    return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            and "ClassVar" not in ast.unparse(s.annotation)}


def dict_keys(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {k.arg for k in node.keywords if k.arg}
    return set()


def message(node: ast.AST) -> str:
    """The text of the string parts of `node` (f-string values as {})."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return " ".join(message(child) for child in ast.iter_child_nodes(node))


def names_option(text: str, option: str) -> bool:
    return f"`{option}`" in text or text.lstrip().startswith(option + " ") \
        or bool(re.search(rf"(?<![\w.'`\"=]){re.escape(option)}{_JUDGED}", text))


def checkers(trees: dict[str, ast.Module]) -> set[str]:
    """Names of package functions raising a message where one of their parameters is followed by " must"."""
    found = set()
    for tree in trees.values():
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
            for node in ast.walk(fn):
                if isinstance(node, ast.JoinedStr):
                    for v, after in zip(node.values, node.values[1:], strict=False):
                        if isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) \
                                and v.value.id in params and isinstance(after, ast.Constant) \
                                and str(after.value).startswith(" must"):
                            found.add(fn.name)
    return found


def options_measure(trees: dict[str, ast.Module]) -> dict[str, Any]:
    options = option_names(trees)
    check = checkers(trees)
    declared: dict[str, set[str]] = {o: set() for o in options}
    validated: dict[str, set[str]] = {o: set() for o in options}
    for module, tree in trees.items():
        for scope, node in scoped(tree):
            if isinstance(node, ast.ClassDef):
                inner = f"{scope}.{node.name}" if scope else node.name
                for o in class_fields(node) & set(options):
                    declared[o].add(place(module, inner))
            for o in dict_keys(node) & set(options):
                declared[o].add(place(module, scope))
            if isinstance(node, ast.Raise) and node.exc is not None:
                text = message(node.exc)
                for o in options:
                    if names_option(text, o):
                        validated[o].add(place(module, scope))
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in check:
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and arg.value in declared:
                        validated[arg.value].add(place(module, scope))
    return {"options": options,
            "declared": {o: sorted(ps) for o, ps in declared.items()},
            "declarations": sum(len(ps) for ps in declared.values()),
            "validated": {o: sorted(ps) for o, ps in validated.items()},
            "validations": sum(len(ps) for ps in validated.values())}


def static_measures(root: Path) -> dict[str, Any]:
    trees = parsed(root)
    return {"modules": len(trees), "names": names_measure(trees), "options": options_measure(trees)}


# -- the route of a chunk ----------------------------------------------------------------------------------

def install_finder(root: Path) -> None:
    """Import zarrfeed, zarrfeed.loader and zarrfeed.writer from the folders of `root` (as the editable install
    maps them), ahead of whatever zarrfeed is installed."""
    import importlib.abc
    import importlib.util

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
            if fullname not in FOLDERS:
                return None
            init = root / FOLDERS[fullname] / "__init__.py"
            return importlib.util.spec_from_file_location(fullname, init,
                                                          submodule_search_locations=[str(init.parent)])

    sys.meta_path.insert(0, Finder())


class Route:
    """The profile hook: records the zarrfeed modules and turn backs from the fetch to the batch handed out."""

    def __init__(self) -> None:
        self.started = self.ended = False
        self.modules: list[str] = []
        self.turn_backs: set[tuple[str, str]] = set()

    @staticmethod
    def ours(frame: Any) -> str | None:
        name = frame.f_globals.get("__name__", "")
        return name if name == "zarrfeed" or name.startswith("zarrfeed.") else None

    def stack(self, frame: Any) -> list[str]:
        """The modules of the zarrfeed frames from the outermost to `frame`."""
        out = []
        while frame is not None:
            if (m := self.ours(frame)) is not None:
                out.append(m)
            frame = frame.f_back
        return out[::-1]

    def turn_back(self, stack: list[str]) -> None:
        a = stack[-1]
        if len(stack) < 2 or stack[-2] == a or a not in stack[:-1]:
            return
        i = len(stack) - 2 - stack[-2::-1].index(a)
        self.turn_backs.add((a, stack[i + 1]))

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.ended or event not in ("call", "return") or (module := self.ours(frame)) is None:
            return
        if event == "call":
            qualname = frame.f_code.co_qualname
            owner = qualname.rpartition(".")[0].lower()
            if not self.started and frame.f_code.co_name == FETCH and FETCH in owner:
                self.started = True
                stack = self.stack(frame)
                for depth in range(1, len(stack) + 1):
                    self.turn_back(stack[:depth])
                self.modules.extend(stack)
            elif self.started:
                self.modules.append(module)
                self.turn_back(self.stack(frame))
        elif self.started and len(self.stack(frame)) == 1 and hasattr(arg, "keys") and hasattr(arg, "__getitem__"):
            self.ended = True


def route_child(root: Path) -> dict[str, Any]:
    """Run in a subprocess: the route of a chunk through the package of `root` (see the module's rules)."""
    install_finder(root)
    import zarrfeed
    from zarrfeed import DatasetWriter, Loader, synthetic

    got = Path(zarrfeed.__file__).resolve().parents[1]
    if got != root.resolve() or not Path(sys.modules["zarrfeed.loader"].__file__ or "").is_relative_to(root):
        raise SystemExit(f"house: imported zarrfeed from {got}, not {root}")
    route = Route()
    with tempfile.TemporaryDirectory(prefix="zarrfeed-house-") as tmp:
        path = Path(tmp) / "d.zarr"
        with DatasetWriter(path, workers=0, chunks={"agents": 256}) as w:
            w.ingest(synthetic.episodes(2, seed=0, frames=20, agents_per_frame=12))
        sys.setprofile(route)
        try:
            with Loader(path, "agents", batch_size=64, seed=0, num_workers=0) as loader:
                next(iter(loader))
        finally:
            sys.setprofile(None)
    if not route.started:
        raise SystemExit("house: the loader never called a chunk fetcher's fetch method")
    distinct = list(dict.fromkeys(route.modules))
    return {"route_modules": len(distinct), "route": distinct,
            "turn_backs": len(route.turn_backs), "turn_back_pairs": sorted(map(list, route.turn_backs)),
            "ended_at_batch": route.ended}


def route_measures(root: Path) -> dict[str, Any]:
    """`route_child` in a subprocess importing the package of `root`, with caches of its own."""
    env = dict(os.environ, ZARRFEED_CACHE_NAMESPACE=f"house-{os.getpid()}", PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory(prefix="zarrfeed-house-") as cwd:  # no checkout's zarrfeed/ beside it
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--route-child", str(root)],
                              capture_output=True, text=True, cwd=cwd, env=env)
    if done.returncode:
        raise SystemExit(f"house: the route measure failed on {root}:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


# -- a revision --------------------------------------------------------------------------------------------

def export(repo: Path, rev: str, into: Path) -> None:
    """Revision `rev` of the git checkout `repo`, written into the folder `into`. A C extension of `repo`
    whose source is the same in `rev` is copied in beside it, so that both trees run the same kernels."""
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev], capture_output=True)
    if archive.returncode:
        raise SystemExit(f"house: git archive {rev} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for built in repo.glob("loader/_*.so"):
        source = repo / "loader" / (built.name.split(".")[0] + ".c")
        theirs = into / "loader" / source.name
        if source.exists() and theirs.exists() and theirs.read_bytes() == source.read_bytes():
            shutil.copy2(built, into / "loader" / built.name)


def measure(root: Path, rev: str | None) -> dict[str, Any]:
    if rev is None:
        return {"tree": str(root), "rev": None, **static_measures(root), **route_measures(root)}
    with tempfile.TemporaryDirectory(prefix="zarrfeed-house-rev-") as tmp:
        export(root, rev, Path(tmp))
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", rev], capture_output=True,
                              text=True).stdout.strip()
        return {"tree": str(root), "rev": head or rev, **static_measures(Path(tmp)), **route_measures(Path(tmp))}


# -- output ------------------------------------------------------------------------------------------------

def report(m: dict[str, Any]) -> str:
    names, options = m["names"], m["options"]
    rows = [
        ("modules in the package", m["modules"]),
        ("class names defined in more than one module", len(names["shared_names"])),
        ("class names with the same stem words (groups)", len(names["same_stems"])),
        ("class names one stem word apart (pairs)", len(names["stem_plus_one"])),
        ("module basenames with the same stem (groups)", len(names["module_collisions"])),
        (f"places declaring a loader option ({len(options['options'])} options)", options["declarations"]),
        ("places validating a loader option", options["validations"]),
        ("modules a chunk passes through into a batch", m["route_modules"]),
        ("turn backs on that route", m["turn_backs"]),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"zarrfeed house: {m['tree']}" + (f" at {m['rev']}" if m["rev"] else " (working tree)"), ""]
    lines += [f"  {label:<{width}}  {value:>4}" for label, value in rows]
    lines += ["", "classes sharing a name:"]
    lines += [f"  {n}: {', '.join(ms)}" for n, ms in names["shared_names"].items()] or ["  none"]
    lines += ["same stem words:"] + [f"  {', '.join(g)}" for g in names["same_stems"]]
    lines += ["one stem word apart:"] + [f"  {a} ~ {b}" for a, b in names["stem_plus_one"]]
    lines += ["module basenames:"] + [f"  {', '.join(g)}" for g in names["module_collisions"]]
    lines += ["option declared by (places):"]
    lines += [f"  {o} ({len(ps)}): {', '.join(ps)}" for o, ps in options["declared"].items()]
    lines += ["option validated in (places):"]
    lines += [f"  {o} ({len(ps)}): {', '.join(ps)}" for o, ps in options["validated"].items() if ps]
    lines += ["route of a chunk (first entered first):", "  " + " -> ".join(r.removeprefix("zarrfeed.")
                                                                          for r in m["route"])]
    lines += ["turn backs (A calls B, B calls back into A):"]
    lines += [f"  {a} <-> {b}" for a, b in m["turn_back_pairs"]] or ["  none"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=str(HERE.parent), help="a checkout (default: this one)")
    parser.add_argument("--rev", help="measure this git revision of the checkout instead of its working tree")
    parser.add_argument("--json", action="store_true", help="print the measures as JSON")
    parser.add_argument("--route-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.route_child:
        print(json.dumps(route_child(Path(args.route_child))))
        return
    m = measure(Path(args.folder).resolve(), args.rev)
    print(json.dumps(m, indent=2) if args.json else report(m))


if __name__ == "__main__":
    main()
