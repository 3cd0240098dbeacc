"""Where workers import zarrfeed from: a folder named `zarrfeed` in the working directory, a script read from
standard input, and the install seen from the folder that holds the clone.

Workers start whatever the working directory holds (the fork server does not take a folder named zarrfeed there
for this package); a guarded script read from standard input starts its workers; the editable install imports
from the folder holding the clone; and a worker that cannot start says why: a folder that shadows the package, a
script that is in no file, a script whose top-level code is not guarded. Every test runs real processes, from
folders the test makes.
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from zarrfeed.loader import Dataset

from repo_paths import ROOT
GUARD = "put its top-level code under `if __name__ == \"__main__\":`"
NOT_A_FILE = "the script was read from standard input or given with -c, not from a file"


def loader_script(data: Path, method: str | None, guarded: bool = True, before: str = "") -> str:
    """A script (README style: `from zarrfeed import ...`) that reads every agent of `data` with 2 workers and
    prints how many rows it read."""
    body = (f"{before}with Loader({str(data)!r}, 'agents', batch_size=64, num_workers=2, "
            f"start_method={method!r}) as l:\n"
            "    print(sum(len(b['centroid']) for b in l))\n")
    if guarded:
        body = "if __name__ == '__main__':\n" + "".join(f"    {line}\n" for line in body.splitlines())
    return "import sys\nfrom zarrfeed import Loader\n" + body


def run(args: list[str], cwd: Path, stdin: str | None = None, python: str = sys.executable,
        env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], input=stdin, capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=env)


def agents(data: Path) -> int:
    return Dataset.open(data).rows["agents"]


def folder_named_zarrfeed(where: Path, kind: str) -> Path:
    """`where` holding a folder named zarrfeed: empty, a package of that name (with an `__init__.py`), or the
    layout of this project's clone (the checkout's own zarrfeed/ one level down)."""
    folder = where / "zarrfeed"
    folder.mkdir(parents=True)
    if kind == "package":
        (folder / "__init__.py").write_text("")
    elif kind == "clone":
        (folder / "zarrfeed").mkdir()
        (folder / "zarrfeed" / "__init__.py").write_text((ROOT / "zarrfeed" / "__init__.py").read_text())
        (folder / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    return where


@pytest.mark.parametrize("kind", ["empty", "package", "clone"])
@pytest.mark.parametrize("method", [None, "spawn"])
def test_workers_start_whatever_the_working_directory_holds(small_dataset, tmp_path, kind, method):
    """Run from a folder holding a folder named zarrfeed, a guarded script's loader read nothing: the fork server
    imported that folder as zarrfeed (`python -c` puts the working directory first on sys.path; the server ignored
    the sys.path it was handed), and every worker failed, with advice to guard the guarded script."""
    data = small_dataset(2, 50, frames=20, agents_per_frame=10)
    script = tmp_path / "script.py"
    script.write_text(loader_script(data, method))
    out = run([str(script)], cwd=folder_named_zarrfeed(tmp_path / "here", kind))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(agents(data))] and out.stderr == ""


def test_a_path_object_on_sys_path_does_not_stop_the_fork_server(small_dataset, tmp_path):
    """Found on the way: `sys.path.append(Path(...))` (an entry Python's import ignores) made the fork server's
    command invalid ("NameError: name 'PosixPath' is not defined"), and the loader died with "EOFError: unexpected
    EOF" from multiprocess."""
    data = small_dataset(2, 50, frames=20, agents_per_frame=10)
    script = tmp_path / "script.py"
    script.write_text("from pathlib import Path\n" + loader_script(
        data, None, before=f"sys.path.append(Path({str(tmp_path)!r}))\n"))
    out = run([str(script)], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(agents(data))] and out.stderr == ""


@pytest.mark.parametrize("method", [None, "spawn"])
@pytest.mark.parametrize("guarded", [True, False])
def test_a_script_read_from_standard_input_starts_its_workers(small_dataset, tmp_path, method, guarded):
    """`python - <<EOF`: every worker tried to run the script "<stdin>" again (no such file), and the script,
    guarded, was told to guard its code. Workers now start without it, as for `python -c`."""
    data = small_dataset(2, 50, frames=20, agents_per_frame=10)
    out = run(["-"], cwd=tmp_path, stdin=loader_script(data, method, guarded))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(agents(data))] and out.stderr == ""


def test_a_script_read_from_standard_input_exports_with_workers(small_dataset, tmp_path):
    """`export_parquet`'s workers (a multiprocess Pool) too: each failed on "<stdin>", and the pool started new
    ones for good (the script never ended, printing tracebacks)."""
    data = small_dataset(2, 50, frames=20, agents_per_frame=10)
    code = ("from zarrfeed import export_parquet\nif __name__ == '__main__':\n"
            f"    print(export_parquet({str(data)!r}, {str(tmp_path / 'out')!r}, workers=2)['rows']['agents'])\n")
    out = run(["-"], cwd=tmp_path, stdin=code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(agents(data))] and out.stderr == ""


@pytest.mark.parametrize("source", ["stdin", "-c"])
def test_a_script_not_in_a_file_whose_workers_miss_its_names_is_told_why(small_dataset, tmp_path, source):
    """Workers cannot run a script that is in no file, so a transform using one of its top-level names (here an
    import) fails in them with a NameError: the error says so and what to do, and does not ask for a guard."""
    data = small_dataset(2, 50, frames=20, agents_per_frame=10)
    code = ("import numpy as np\n" + "from zarrfeed import Loader\n"
            "def twice(b):\n    return {'x': np.asarray(b['centroid']) * 2}\n"
            "if __name__ == '__main__':\n"
            f"    with Loader({str(data)!r}, 'agents', batch_size=64, num_workers=2, transform=twice) as l:\n"
            "        print(sum(len(b['x']) for b in l))\n")
    out = run(["-"], cwd=tmp_path, stdin=code) if source == "stdin" else run(["-c", code], cwd=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    last = [line for line in out.stderr.splitlines() if line.startswith("zarrfeed.LoaderError: ")][-1]
    assert "NameError: name 'np' is not defined" in last and NOT_A_FILE in last, out.stderr
    assert "import what the function uses inside it" in last and GUARD not in out.stderr


@pytest.mark.parametrize("method", [None, "spawn"])
def test_a_folder_that_shadows_zarrfeed_for_the_workers_is_named(small_dataset, tmp_path, method):
    """A guarded script that puts a folder holding a package named zarrfeed on sys.path after importing zarrfeed
    (its workers then import that one): under "spawn" the line names the folder, not the guard, after each
    worker's own traceback (it fails before any of zarrfeed runs). Under the default, "forkserver", the script
    works: importing the loaders started the fork server, with this zarrfeed imported, before the script changed
    sys.path, and its workers are forked from it."""
    data = small_dataset(2, 50, frames=20, agents_per_frame=10)
    shadow = folder_named_zarrfeed(tmp_path / "other", "package")
    script = tmp_path / "script.py"
    script.write_text(loader_script(data, method, before=f"sys.path.insert(0, {str(shadow)!r})\n"))
    out = run([str(script)], cwd=tmp_path)
    if method is None:
        assert out.returncode == 0 and out.stdout.split() == [str(agents(data))], out.stderr
        return
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 or method == "spawn", out.stderr
    assert re.match(r"zarrfeed\.WorkerError: loader worker \d \(pid \d+\) could not start: ", lines[-1]), lines[-1]
    assert f"it imports the folder {shadow / 'zarrfeed'} as zarrfeed, in place of " in lines[-1]
    assert "rename that folder or take its parent off sys.path" in lines[-1] and GUARD not in out.stderr


def test_an_unguarded_script_beside_a_zarrfeed_folder_is_told_to_guard_it(small_dataset, tmp_path):
    """The real cause, not the folder: an unguarded script run from a folder holding an empty zarrfeed/ gets the
    guard advice in one line (its workers never look in the working directory)."""
    data = small_dataset(2, 50, frames=20, agents_per_frame=10)
    script = tmp_path / "script.py"
    script.write_text(loader_script(data, None, guarded=False))
    out = run([str(script)], cwd=folder_named_zarrfeed(tmp_path / "here", "empty"))
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert f"ran {script} again while starting" in out.stderr and GUARD in out.stderr


def dependencies_without_zarrfeed(out: Path) -> Path:
    """A folder of links to this environment's installed packages, except zarrfeed's own files (its editable
    install), so that a new environment pointed at it has zarrfeed's dependencies, pip and setuptools, without
    zarrfeed and without a download."""
    out.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("zarrfeed", "__editable__")) and not entry.name.endswith(".pth"):
            (out / entry.name).symlink_to(entry)
    return out


def test_the_editable_install_imports_from_the_folder_holding_the_clone(tmp_path):
    """README's install (`pip install -e .` in the clone) into a new environment: from the folder that holds the
    clone (named zarrfeed, as `git clone` names it), `from zarrfeed import Loader` failed with "cannot import name
    'Loader' from 'zarrfeed' (unknown location)": Python took the clone for a namespace package before asking
    setuptools' import hook. It now works there, beside an empty zarrfeed/, and in the clone itself."""
    holder = tmp_path / "home"
    clone = holder / "zarrfeed"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.so", "__pycache__",
                                                                "*.egg-info", ".pytest_cache", ".hypothesis", "site"))
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")
    site = run(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path, python=python)
    Path(site.stdout.strip(), "dependencies.pth").write_text(f"{dependencies_without_zarrfeed(tmp_path / 'deps')}\n")
    # README's command without its extra (the dependencies are there), the compiler off (the kernels are optional:
    # this is about imports) and no build isolation (no download)
    quiet = {**os.environ, "CC": "/bin/false", "CXX": "/bin/false", "PIP_NO_INDEX": "1"}
    installed = run(["-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."], cwd=clone,
                    python=python, env=quiet)
    assert installed.returncode == 0, installed.stderr[-3000:]
    code = ("import zarrfeed, zarrfeed.loader, zarrfeed.writer\nfrom zarrfeed import Loader, DatasetWriter\n"
            "print(zarrfeed.loader.__file__)")
    empty = folder_named_zarrfeed(tmp_path / "beside", "empty")
    for where in (holder, empty, clone):
        out = run(["-c", code], cwd=where, python=python)
        assert out.returncode == 0, f"from {where}: {out.stderr[-2000:]}"
        assert Path(out.stdout.strip()) == clone / "loader" / "__init__.py", where
