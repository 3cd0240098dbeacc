"""The package layout holds: `writer` never imports `loader` or `zarrfeed`, `loader` never imports `zarrfeed`,
and no two modules import each other, directly or through others (imports inside functions count too, type
annotations under `if TYPE_CHECKING:` do not)."""
import ast
import subprocess
import sys
from pathlib import Path

import zarrfeed

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("writer", "loader", "zarrfeed")


def imports() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports, anywhere in its body."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).glob("*.py"):
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
                    if node.level:  # relative: from the module's package
                        base = f"{package}.{base}" if base else package
                    found.add(base)
                    found |= {f"{base}.{a.name}" for a in node.names}
            graph[name] = {m for m in found if m.split(".")[0] in PACKAGES}
    return {name: {m for m in deps if m in graph and m != name} for name, deps in graph.items()}


def test_writer_never_imports_loader_and_neither_imports_zarrfeed():
    for name, deps in imports().items():
        top = name.split(".")[0]
        allowed = {"writer": {"writer"}, "loader": {"writer", "loader"}, "zarrfeed": set(PACKAGES)}[top]
        assert {d.split(".")[0] for d in deps} <= allowed, (name, deps)


def test_no_import_cycles_between_modules():
    graph = imports()
    for name in graph:
        if name in PACKAGES:  # a package's __init__ gathers its modules' names; modules must not need it back
            continue
        seen, todo = set(), [d for d in graph[name] if d not in PACKAGES]
        while todo:
            m = todo.pop()
            assert m != name, f"{name} imports itself through {sorted(seen)}"
            if m not in seen:
                seen.add(m)
                todo.extend(d for d in graph[m] if d not in PACKAGES)


def test_version_and_entry_points():
    assert zarrfeed.__version__.count(".") == 2
    for module in ("zarrfeed", "zarrfeed.cli"):
        command = [sys.executable, "-m", module, "--version"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 0 and out.stdout.strip() == f"zarrfeed {zarrfeed.__version__}"
    from zarrfeed import DatasetWriter, Loader

    from loader import Loader as L
    from writer import DatasetWriter as W
    assert (DatasetWriter, Loader) == (W, L)
