"""The package layout holds: one package, `zarrfeed`, in layers. `zarrfeed.core` imports no other part;
`zarrfeed.writer` and `zarrfeed.loader` import the core and never each other; `zarrfeed.flight` composes them;
the command line composes everything. No two modules import each other, directly or through others (imports
inside functions count too, type annotations under `if TYPE_CHECKING:` do not)."""
import ast
import subprocess
import sys

import pytest

import zarrfeed

from repo_paths import ROOT
# folder -> the package it installs as (pyproject's package-dir)
FOLDERS = {"zarrfeed": "zarrfeed", "zarrfeed/core": "zarrfeed.core", "zarrfeed/flight": "zarrfeed.flight",
           "zarrfeed/commands": "zarrfeed.commands",
           "writer": "zarrfeed.writer", "loader": "zarrfeed.loader", "loader/kinds": "zarrfeed.loader.kinds",
           "loader/ordering": "zarrfeed.loader.ordering", "loader/engine": "zarrfeed.loader.engine",
           "loader/caches": "zarrfeed.loader.caches"}
# part -> the parts it may import
ALLOWED = {
    "core": {"core"},
    "transforms": set(),  # the server's named transforms: numpy only
    "writer": {"core", "writer"},
    "loader": {"core", "loader"},
    "flight": {"core", "writer", "loader", "flight", "transforms"},
    "top": {"core", "writer", "loader", "flight", "transforms", "top"},
}


def part(module: str) -> str:
    """Which layer a module (or package) belongs to."""
    if module == "zarrfeed.transforms":
        return "transforms"
    bits = module.split(".")
    return bits[1] if len(bits) > 1 and bits[1] in ("core", "writer", "loader", "flight") else "top"


def imports() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports, anywhere in its body."""
    graph: dict[str, set[str]] = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).glob("*.py"):
            name = f"{package}.{path.stem}" if path.stem != "__init__" else package
            found = set()
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):  # annotations only (`if TYPE_CHECKING:`) are not imports at run time
                if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                    node.body = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:  # relative: from the module's package (a package's __init__ is its own)
                        here = package.split(".")
                        up = here[: len(here) - node.level + 1]
                        assert up, f"{name}: relative import above the package"
                        base = ".".join(up + ([base] if base else []))
                    found.add(base)
                    found |= {f"{base}.{a.name}" for a in node.names}
            graph[name] = {m for m in found if m.split(".")[0] == "zarrfeed"}
    return {name: {m for m in deps if m in graph and m != name} for name, deps in graph.items()}


def test_each_layer_imports_only_the_layers_below_it():
    graph = imports()
    assert {"zarrfeed.core.location", "zarrfeed.writer.dataset_writer", "zarrfeed.loader.loader",
            "zarrfeed.flight.server", "zarrfeed.cli"} <= set(graph)  # the walk sees every layer
    for name, deps in graph.items():
        if name == "zarrfeed":  # the package's __init__ names both sides lazily
            continue
        assert {part(d) for d in deps} <= ALLOWED[part(name)], (name, sorted(deps))


def test_no_import_cycles_between_modules():
    graph = imports()
    packages = set(FOLDERS.values())
    for name in graph:
        if name in packages:  # a package's __init__ gathers its modules' names; modules must not need it back
            continue
        seen, todo = set(), [d for d in graph[name] if d not in packages]
        while todo:
            m = todo.pop()
            assert m != name, f"{name} imports itself through {sorted(seen)}"
            if m not in seen:
                seen.add(m)
                todo.extend(d for d in graph[m] if d not in packages)


def test_the_folders_are_not_packages_of_their_own():
    """`writer/` and `loader/` install as `zarrfeed.writer` and `zarrfeed.loader`: from the checkout's root
    `import loader` must not load a second copy of the code under another name."""
    for folder in ("writer", "loader"):
        r = subprocess.run([sys.executable, "-c", f"import {folder}"], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        assert r.returncode == 1 and "attempted relative import beyond top-level package" in r.stderr, r.stderr


def test_version_and_entry_points():
    assert zarrfeed.__version__.count(".") == 2
    for module in ("zarrfeed", "zarrfeed.cli"):
        command = [sys.executable, "-m", module, "--version"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 0 and out.stdout.strip() == f"zarrfeed {zarrfeed.__version__}"
    from zarrfeed.loader import Loader as L
    from zarrfeed.writer import DatasetWriter as W

    from zarrfeed import DatasetWriter, Loader
    assert (DatasetWriter, Loader) == (W, L)


def test_only_the_store_module_asks_what_kind_of_place_a_dataset_is():
    """Per-store choices (segment size, growth step, timeouts, read-ahead, the lease's backend) are
    settings of each kind of store (`Location.settings`), not checks of the location's kind spread over the
    package: none outside zarrfeed/core/location.py and stores.py."""
    asks = ("is_local", "is_zip", "protocol in", "FSStore", "DirectoryStore", "ZipStore", "FsspecStore")
    found = []
    for folder in FOLDERS:
        for path in (ROOT / folder).glob("*.py"):
            if path.relative_to(ROOT).as_posix() in ("zarrfeed/core/location.py", "zarrfeed/core/stores.py"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if any(a in line for a in asks) and not line.lstrip().startswith("#"):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_each_command_is_a_module_with_its_parser_and_run_side_by_side():
    """Ten commands, the server's start-up checks and the shared helpers were one module of
    765 lines; each command is now a module of `zarrfeed.commands` with `add` (its parser) and `run`, listed
    by `zarrfeed --help` in the order of `COMMANDS`."""
    import argparse

    from zarrfeed import commands

    names = [m.__name__.rsplit(".", 1)[1] for m in commands.COMMANDS]
    assert sorted(p.stem for p in (ROOT / "zarrfeed/commands").glob("*.py")) == sorted(names + ["__init__",
                                                                                              "common"])
    for module in commands.COMMANDS:
        assert callable(module.add) and callable(module.run), module.__name__
    sub = next(a for a in commands.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == names
    assert all(sub.choices[n].get_default("func") is m.run for n, m in zip(names, commands.COMMANDS, strict=True))


def test_worker_modules_load_only_what_workers_use():
    """A writer worker process imports its own module, not the whole side: `zarrfeed.writer` names its exports
    lazily, so the fork server starts without pyarrow or the parent's classes."""
    code = ("import sys, zarrfeed.writer.write_worker; "
            "print(sorted(m for m in ('pyarrow', 'zarrfeed.writer.dataset_writer', 'zarrfeed.writer.parquet_ingest')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_importing_the_api_leaves_out_arrow_and_progress_bars():
    """A script that writes or loads batches imports neither pyarrow nor tqdm until it uses them (a tenth of a
    second), and nor does the loaders' fork server, which imports `zarrfeed.loader`; the Arrow functions are
    there when asked for."""
    code = ("import sys, zarrfeed.core._proc as p; p.early_fork_server = False; "
            "import zarrfeed.loader, zarrfeed.writer.dataset_writer; "
            "print(sorted(m for m in ('pyarrow', 'tqdm') if m in sys.modules)); "
            "from zarrfeed.loader import to_arrow, from_arrow, export_parquet; print('pyarrow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "True"]
    import zarrfeed.loader

    assert {"Loader", "to_arrow", "export_parquet"} <= set(dir(zarrfeed.loader))


def test_dir_of_the_package_is_its_public_api():
    """`dir(zarrfeed)`, what tab completion in a REPL offers, lists the public names, not the module's imports."""
    import zarrfeed

    assert dir(zarrfeed) == sorted(zarrfeed.__all__)
    assert {"Loader", "DatasetWriter", "Dataset", "Error"} <= set(dir(zarrfeed))


def test_lazy_exports_are_all_there():
    import zarrfeed.writer

    module = zarrfeed.writer
    assert dir(module) == sorted(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        module.nothing  # noqa: B018
    namespace: dict = {}
    exec("from zarrfeed.writer import *", namespace)
    assert {"DatasetWriter", "synthetic", "L5KIT_SCHEMA"} <= set(namespace)
