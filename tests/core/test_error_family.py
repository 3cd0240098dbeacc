"""One error family: every exception zarrfeed defines derives from `zarrfeed.Error` and keeps the built-in base
that says what kind of failure it is, is importable from `zarrfeed`, survives pickling (exceptions cross process
boundaries: worker pools, a torch DataLoader's workers), and `except zarrfeed.Error` catches real refusals from
the writing side and the reading side."""
from __future__ import annotations

import errno
import importlib
import inspect
import os
import pickle
import subprocess
import sys
import pkgutil

import pytest

import zarrfeed
from zarrfeed.core import errors

# each exception class of the package -> the bases it has besides `Error` (a new class must be listed here)
BASES: dict[str, tuple[type, ...]] = {
    "FormatError": (ValueError,), "MetaError": (ValueError,), "FieldError": (errors.MetaError, ValueError),
    "ChunkError": (ValueError,),
    "ChunkChanged": (errors.ChunkError, ValueError), "StoreUnreachable": (OSError,),
    "StoreTimeout": (errors.StoreUnreachable, OSError), "WriteRefused": (OSError, RuntimeError),
    "LeaseHeld": (errors.FormatError, ValueError), "LeaseLost": (RuntimeError,), "IngestError": (ValueError,),
    "WorkerError": (RuntimeError,), "RendezvousError": (OSError,), "ShmSpaceError": (MemoryError,),
    "LoaderError": (RuntimeError,), "LoaderStalledError": (errors.LoaderError, RuntimeError),
    "TransformOutputError": (TypeError,), "CacheInvariantError": (RuntimeError,),
    "Refused": (ValueError,),  # zarrfeed.flight.remote_writer: carries the protocol's `Answered`
    "Stalled": (),  # zarrfeed.flight.liveness: the clients' own, said to their callers as a ConnectionError
}
# a value for each constructor argument a class takes without a default
ARGS = {"message": "d.zarr: a line", "code": errno.ENOSPC, "failures": [], "answered": None, "waiting": "batch 3",
        "seconds": 2.0, "why": "is 7, not 8", "field": "level", "stopped": "loader worker 0 (pid 12) (stopped)",
        "pids": [12]}


def package_modules() -> list[str]:
    """Every module of the package: `zarrfeed`'s folder, and `zarrfeed.writer` and `zarrfeed.loader` from theirs
    (pyproject's package-dir), walked from where each is installed."""
    names = {"zarrfeed"}
    for package in ("zarrfeed", "zarrfeed.writer", "zarrfeed.loader"):
        names.add(package)
        path = importlib.import_module(package).__path__
        names |= {info.name for info in pkgutil.walk_packages(path, f"{package}.")}
    return sorted(names - {"zarrfeed.__main__"})  # (it runs the command line)


def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in the package, by name, found by importing each of its modules."""
    found: dict[str, type[BaseException]] = {}
    for name in package_modules():
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional extra that is not installed (torch)
            assert exc.name and not exc.name.startswith("zarrfeed"), (name, exc)
            continue
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.split(".")[0] == "zarrfeed":
                assert found.setdefault(obj.__name__, obj) is obj, f"two exception classes named {obj.__name__}"
    return found


def test_walking_the_package_finds_every_layer():
    modules = set(package_modules())
    assert {"zarrfeed.core.errors", "zarrfeed.writer.dask", "zarrfeed.loader.engine.scheduler",
            "zarrfeed.flight.remote_writer", "zarrfeed.core._proc.pool", "zarrfeed.commands.serve"} <= modules


def test_every_exception_of_the_package_is_a_zarrfeed_error_with_its_bases_kept():
    found = defined_exceptions()
    assert sorted(found) == sorted([*BASES, "Error"])
    assert found["Error"] is zarrfeed.Error and zarrfeed.Error.__bases__ == (Exception,)
    for name, cls in found.items():
        assert issubclass(cls, zarrfeed.Error), name
        for base in BASES.get(name, ()):
            assert issubclass(cls, base), (name, base)


def test_the_family_lives_in_one_module_and_is_importable_from_zarrfeed():
    """Every class of `core.errors` is `zarrfeed.<name>`, named there (tracebacks say `zarrfeed.FormatError`,
    pickle finds it there); only the flight clients' two, which carry flight's types, live elsewhere."""
    found = defined_exceptions()
    public = {n: c for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, BaseException)}
    assert sorted(public) == sorted(errors.__all__) == sorted(set(found) - {"Refused", "Stalled"})
    for name, cls in public.items():
        assert getattr(zarrfeed, name) is cls and name in zarrfeed.__all__, name
        assert cls.__module__ == "zarrfeed", name
    # the sides' own exports are the same classes
    from zarrfeed import loader, writer

    assert writer.FormatError is loader.FormatError is zarrfeed.FormatError
    assert loader.LoaderError is zarrfeed.LoaderError and writer.WorkerError is zarrfeed.WorkerError
    from zarrfeed.loader.engine.scheduler import LoaderError  # the old homes still name them
    from zarrfeed.writer.lease import LeaseLost

    assert (LoaderError, LeaseLost) == (zarrfeed.LoaderError, zarrfeed.LeaseLost)


def test_importing_the_family_imports_nothing_heavy():
    import subprocess
    import sys

    code = "import sys, zarrfeed; zarrfeed.Error, zarrfeed.LoaderError; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("name", sorted(BASES))
def test_each_exception_survives_pickling_with_its_fields(name):
    cls = defined_exceptions()[name]
    init = next((c.__init__ for c in cls.__mro__ if "__init__" in vars(c) and inspect.isfunction(c.__init__)), None)
    parameters = list(inspect.signature(init).parameters.values())[1:] if init else []
    exc = cls(*[ARGS[p.name] for p in parameters if p.default is p.empty]) if init else cls(ARGS["message"])
    back = pickle.loads(pickle.dumps(exc, pickle.HIGHEST_PROTOCOL))
    assert type(back) is cls and str(back) == str(exc) and vars(back) == vars(exc)


def test_fields_set_after_the_message_survive_pickling():
    exc = zarrfeed.FormatError("mode='a'", cli="--append")
    assert pickle.loads(pickle.dumps(exc)).cli == "--append"
    exc = zarrfeed.LoaderError("chunk 'agents/3' is missing", advice="validate it")
    back = pickle.loads(pickle.dumps(exc))
    assert (back.what, back.advice, str(back)) == (exc.what, exc.advice, "chunk 'agents/3' is missing; validate it")
    exc = zarrfeed.WriteRefused("d.zarr: cannot (no space)", errno.ENOSPC, cli="d.zarr: cannot --resume")
    back = pickle.loads(pickle.dumps(exc))
    assert (back.errno, back.strerror, back.cli, str(back)) == (exc.errno, exc.strerror, exc.cli, str(exc))


# ------------------------------------------------------------------ real refusals, caught as zarrfeed.Error
def _write(path, n: int = 3, **options) -> None:
    from zarrfeed.writer import DatasetWriter, synthetic

    with DatasetWriter(path, workers=0, **options) as w:
        w.ingest(synthetic.episodes(n, seed=0, frames=20, agents_per_frame=10))


def test_opening_a_folder_that_is_no_dataset_is_caught_as_an_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not a dataset")
    with pytest.raises(zarrfeed.Error) as caught:
        zarrfeed.Dataset.open(tmp_path)
    assert isinstance(caught.value, zarrfeed.FormatError) and isinstance(caught.value, ValueError)


def test_writing_over_a_dataset_is_caught_as_an_error(tmp_path):
    path = tmp_path / "d.zarr"
    _write(path)
    with pytest.raises(zarrfeed.Error, match="already exists and is not empty"):
        zarrfeed.DatasetWriter(path, workers=0)


def test_a_missing_chunk_stops_a_loader_with_an_error(tmp_path):
    path = tmp_path / "d.zarr"
    _write(path, n=6, chunks={"agents": 200, "frames": 20, "scenes": 2, "traffic_light_faces": 100})
    os.unlink(path / "agents" / "1")
    with pytest.raises(zarrfeed.Error, match=r"chunk 'agents/1'.* is missing"):
        with zarrfeed.Loader(zarrfeed.Dataset.open(path), "agents", batch_size=100, num_workers=0, seed=0) as loader:
            for _ in loader:
                pass


def test_a_write_the_system_refuses_is_caught_as_an_error(tmp_path, monkeypatch):
    """A full disk (every write of the store fails with ENOSPC): `WriteRefused`, an `OSError` and an `Error`."""
    from zarrfeed.core.files import Files
    from zarrfeed.core.stores import DirectoryStore

    class Full(Files):
        def write(self, path: str, data: bytes, sync: bool) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(DirectoryStore, "files", Full())
    with pytest.raises(zarrfeed.Error) as caught:
        _write(tmp_path / "d.zarr")
    assert isinstance(caught.value, zarrfeed.WriteRefused) and caught.value.errno == errno.ENOSPC


def test_each_exception_survives_pickling_where_tblib_pickles_exceptions():
    """Dask's distributed installs tblib's exception pickling in the processes it runs: a copy is then made with
    the class's own `__new__` (ShmSpaceError with `Error` first failed: MemoryError's `__new__` refuses it)."""
    code = ("import pickle, inspect, sys\n"
            "import zarrfeed, zarrfeed.core.errors\n"
            "from tblib import pickling_support\n"
            "pickling_support.install()  # (it takes the exception classes there are now)\n"
            f"for name in {sorted(BASES)!r}:\n"
            "    cls = getattr(zarrfeed, name, None)\n"
            "    if cls is None or name in ('WriteRefused',):\n"
            "        continue\n"
            "    try:\n"
            "        pickle.loads(pickle.dumps(cls('a line')))\n"
            "    except TypeError as exc:\n"
            "        if 'not safe' in str(exc):\n"
            "            sys.exit(f'{name}: {exc}')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
