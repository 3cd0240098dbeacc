"""What a user installs: the sdist carries its tests' helpers, a wheel built without a C compiler installs and
falls back to the numpy kernel with one warning, the package is typed and licensed, and another OS is told
plainly."""
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

from repo_paths import ROOT


def run(command: list, env: dict | None = None) -> None:
    r = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr[-3000:]


def build(kind: str, out: Path, env: dict | None = None) -> Path:
    """An sdist or a wheel of this checkout, built with the setuptools already installed (no download). A wheel
    is built from a clean copy of the sources: an in-tree build leaves build/ behind, whose compiled kernels
    the next build would package (a no-compiler wheel then held them)."""
    if kind == "wheel":
        src = out.parent / f"{out.name}-src"
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.so", "__pycache__",
                                                                   "*.egg-info", ".pytest_cache", "site"))
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
             str(src)], env)
        return next(out.glob("*.whl"))
    run([sys.executable, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
         str(out)], env)
    return next(out.glob("*.tar.gz"))


def test_sdist_carries_what_its_tests_need(tmp_path):
    names = tarfile.open(build("sdist", tmp_path)).getnames()
    for need in ("tests/conftest.py", "tests/support/expected.py", "tests/support/s3server.py",
                 "tests/support/writer_child.py",
                 "loader/_gather.c", "loader/_order.c", "LICENSE", "examples/quickstart.py", "bench/common.py",
                 ".ci/run", "backend/zarrfeed_backend.py"):
        assert any(n.endswith("/" + need) for n in names), need


def test_a_wheel_without_a_c_compiler_installs_and_warns_once(tmp_path):
    wheel = build("wheel", tmp_path / "w", env={"CC": "/bin/false", "CXX": "/bin/false"})
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(n.endswith(".so") for n in names)  # the extensions were skipped, not fatal
    assert {"zarrfeed/writer/py.typed", "zarrfeed/loader/py.typed", "zarrfeed/py.typed"} <= set(names)
    # one top-level package and its metadata: nothing that another distribution could own or overwrite
    assert {n.split("/")[0] for n in names if not n.startswith("zarrfeed-")} == {"zarrfeed"}, names
    meta = next(n for n in names if n.endswith("/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text and "Operating System :: POSIX :: Linux" in text
    assert any(n.endswith("licenses/LICENSE") for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # as pip would install it, without the compiled kernel
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from zarrfeed.loader import Loader\n"
            "from zarrfeed.loader.engine import gather\n"
            "from zarrfeed.loader.ordering import order\n"
            "print(gather.KERNEL, order._order, order.permutation(5, 1, 0, 0))")
    # -S: without site, this checkout's editable install is not on the path; the dependencies are
    deps = sysconfig.get_paths()["purelib"]
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": f"{site}:{deps}"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # both fall back: the gather to numpy, the order to Python integers (the same order as the extension's)
    from zarrfeed.loader.ordering.order import permutation
    assert r.stdout.strip().split(maxsplit=2) == ["numpy", "None", str(permutation(5, 1, 0, 0))], r.stdout
    warned = [line for line in r.stderr.splitlines() if "C gather kernel was not built" in line]
    assert len(warned) == 1 and "10 times slower" in warned[0]


def test_another_os_is_told_plainly():
    code = "import os; del os.memfd_create; from zarrfeed.writer import DatasetWriter"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1 and "ImportError: zarrfeed runs on Linux" in r.stderr


def test_the_wheel_and_the_sdist_pass_twine_check(tmp_path):
    """What PyPI would be given: both distributions build, their metadata and the README (rendered as the
    long description) pass `twine check --strict`, and the version is the changelog's newest release."""
    wheel, sdist = build("wheel", tmp_path / "w"), build("sdist", tmp_path / "s")
    r = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.count("PASSED") == 2, r.stdout + r.stderr
    import re

    import zarrfeed
    assert re.fullmatch(r"\d+\.\d+\.\d+", zarrfeed.__version__)  # semantic versioning: MAJOR.MINOR.PATCH
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0] == zarrfeed.__version__, releases
    assert any(n.endswith("/CHANGELOG.md") for n in tarfile.open(sdist).getnames())


def test_the_test_extra_pulls_no_gpu_stack():
    """The test extra pinned torch==2.13.0 on every Python; on 3.12 and 3.13 no CPU build of it
    is at hand and pip took a CUDA build (19 packages, a 5.8 GB environment). torch comes with the test extra only
    where its CPU build is (3.11); the torch tests run wherever torch is installed."""
    import tomllib

    from packaging.requirements import Requirement

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    torch = [Requirement(r) for r in extra if Requirement(r).name == "torch"]
    for version in ("3.11", "3.12", "3.13", "3.14"):
        wanted = [r for r in torch if r.marker is None or r.marker.evaluate({"python_version": version})]
        assert (version == "3.11") == bool(wanted), (version, [str(r) for r in wanted])
        assert all(str(r.specifier).startswith("==") for r in wanted)  # a range would take a CUDA build
