"""Every loader's options are declared once: `LoaderOptions` (names, types, docs) and the groups of `Options`
(defaults, checks) hold the same names; every local loader takes all of them, keyword-only, checks them the same
way and refuses an unknown one in one line naming the close one."""
import dataclasses
import inspect
import types
import typing

import pytest

from zarrfeed.loader import AgentSampleLoader, EgoSampleLoader, Loader, LoaderOptions, SequenceLoader, WindowLoader
from zarrfeed.core.keywords import option_names
from zarrfeed.loader.options import Options

LOADERS = (Loader, WindowLoader, AgentSampleLoader, EgoSampleLoader, SequenceLoader)


def group_hints(options) -> dict:
    """Option name -> its type, as the groups of `options` declare them."""
    return {name: kind for group in options.GROUPS.values() for name, kind in typing.get_type_hints(group).items()}


def test_the_options_are_declared_once():
    assert sorted(LoaderOptions.__annotations__) == sorted(option_names(Options))
    names = [name for group in Options.GROUPS.values() for name in group.__dataclass_fields__]
    assert len(names) == len(set(names)), "an option in two groups"
    hints, declared = typing.get_type_hints(LoaderOptions), group_hints(Options)
    assert all(hints[name] == declared[name] for name in hints)


def as_coded(function) -> inspect.Signature:
    """`function`'s signature as its code declares it (`spelled_out` gives it one that lists the options)."""
    bare = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)
    bare.__kwdefaults__, bare.__annotations__ = function.__kwdefaults__, function.__annotations__
    return inspect.signature(bare)


@pytest.mark.parametrize("cls", LOADERS, ids=lambda c: c.__name__)
def test_every_loader_takes_them_all_keyword_only(cls):
    sig = as_coded(cls.__init__)
    options = sig.parameters["options"]
    assert options.kind is inspect.Parameter.VAR_KEYWORD
    assert typing.get_args(typing.get_type_hints(cls.__init__)["options"]) == (LoaderOptions,)
    shared = set(LoaderOptions.__annotations__)
    assert not shared & set(sig.parameters), "an option is declared again"


def test_every_option_with_its_default_is_taken_and_an_unknown_one_is_one_line(small_dataset, dp_buffer):
    path = small_dataset(3, 2, chunks={"agents": 500})
    defaults = option_names(Options) | {"num_workers": 0}
    for cls, args in ((Loader, (path,)), (WindowLoader, (path, 2, 3)), (AgentSampleLoader, (path, 2, 3)),
                      (EgoSampleLoader, (path, 2, 3)), (SequenceLoader, (dp_buffer, 4))):
        with cls(*args, **defaults) as loader:
            next(iter(loader))
        with pytest.raises(TypeError, match=rf"^{cls.__name__}.__init__\(\) got an unexpected keyword argument "
                                            r"'num_worker'. Did you mean 'num_workers'\?$"):
            cls(*args, num_worker=2)


def test_remote_loaders_declare_theirs_once_and_refuse_the_servers(small_dataset):
    from zarrfeed.flight import (RemoteAgentSampleLoader, RemoteEgoSampleLoader, RemoteLoader, RemoteOptions,
                                 RemoteWindowLoader)
    from zarrfeed.flight.remote_options import Remote

    assert sorted(RemoteOptions.__annotations__) == sorted(option_names(Remote))
    hints, declared = typing.get_type_hints(RemoteOptions), group_hints(Remote)
    assert all(hints[name] == declared[name] for name in hints)
    for cls in (RemoteLoader, RemoteWindowLoader, RemoteAgentSampleLoader, RemoteEgoSampleLoader):
        assert typing.get_args(typing.get_type_hints(cls.__init__)["options"]) == (RemoteOptions,)
        assert not set(RemoteOptions.__annotations__) & set(as_coded(cls.__init__).parameters)
        # refused before anything connects (no server at this address)
        with pytest.raises(TypeError, match=rf"^{cls.__name__}.__init__\(\): 'num_workers' is the server's to "
                                            "decide"):
            cls("grpc://127.0.0.1:9", num_workers=2)
        with pytest.raises(TypeError, match=rf"^{cls.__name__}.__init__\(\) got an unexpected keyword argument "
                                            r"'sead'. Did you mean 'seed'\?$"):
            cls("grpc://127.0.0.1:9", sead=2)


def test_writers_declare_theirs_once(tmp_path):
    """DatasetWriter and the Dask ingest take the same write options (WriteOptions), keyword-only, checked in
    one place."""
    from zarrfeed.writer import DatasetWriter, WriteOptions
    from zarrfeed.writer import dask as zdask
    from zarrfeed.writer.options import Writes

    assert list(WriteOptions.__annotations__) == [f.name for f in dataclasses.fields(Writes)]
    from zarrfeed.writer import ingest_parquet, write_dataset
    for fn in (DatasetWriter.__init__, zdask.ingest, write_dataset, ingest_parquet):
        assert typing.get_args(typing.get_type_hints(fn)["options"]) == (WriteOptions,)
        code = fn.__code__  # the parameters the code declares (its __signature__ spells the options out)
        assert not set(WriteOptions.__annotations__) & set(code.co_varnames[:code.co_argcount +
                                                                           code.co_kwonlyargcount])
    with pytest.raises(TypeError, match=r"^DatasetWriter.__init__\(\) got an unexpected keyword argument 'overwirte'. "
                                        r"Did you mean 'overwrite'\?$"):
        DatasetWriter(tmp_path / "d.zarr", overwirte=True)
    with pytest.raises(ValueError, match="on_error must be one of 'raise', 'skip', got 'ignore'"):
        DatasetWriter(tmp_path / "d.zarr", on_error="ignore")
    with pytest.raises(ValueError, match=r"^chunks: no table 'nope' in schema 'l5kit' \(its tables: scenes, frames, "
                                        r"agents, traffic_light_faces\)$"):  # (it printed a Python list)
        DatasetWriter(tmp_path / "d.zarr", chunks={"nope": 10}, workers=0)
    with pytest.raises(TypeError, match=r"^schema must be a zarrfeed Schema \(such as L5KIT_SCHEMA\) or None, got 2$"):
        write_dataset(tmp_path / "d.zarr", [], 2)  # (not an AttributeError deep inside)
    assert not (tmp_path / "d.zarr").exists()
    assert not (tmp_path / "d.zarr").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": "2"}, "num_workers must be an integer >= 0, got '2'"),
    ({"num_workers": 1.5}, "num_workers must be an integer >= 0, got 1.5"),
    ({"prefetch": 0}, "prefetch must be an integer >= 1, got 0"),
    ({"stall_timeout": "5"}, "stall_timeout must be a number of seconds > 0"),
    ({"cache_bytes": "1G"}, "cache_bytes must be an integer >= 0"),
    ({"cache": "x"}, "cache must be one of 'host', 'process', 'off', got 'x'"),
    ({"storage_options": "x"}, r"storage_options must be a dict \(or None\), got 'x'"),
    ({"cache_dir": 5}, "cache_dir must be a path"),
    ({"cache_dir_bytes": -1}, "cache_dir_bytes must be an integer >= 0"),
    ({"transform": 5}, "transform must be a function of a batch"),
    ({"world_size": 0}, "world_size must be an integer >= 1, got 0"),
    ({"shuffle": "no"}, "shuffle must be True or False, got 'no'"),
    ({"verify_chunks": "no"}, "verify_chunks must be True or False, got 'no'"),
    ({"start_method": "thread"}, "start_method must be one of None, 'fork', 'spawn', 'forkserver'"),
    ({"commit": "3"}, "commit must be an integer >= 0"),
])
def test_bad_option_values_are_one_line_at_construction(small_dataset, kwargs, message):
    """Strings taken as True, types failing deep inside or at the
    first batch; each option is checked once, for every loader."""
    path = small_dataset(3, 2, chunks={"agents": 500})
    for cls, args in ((Loader, (path,)), (WindowLoader, (path, 2, 3)), (EgoSampleLoader, (path, 2, 3))):
        with pytest.raises(ValueError, match=message):
            cls(*args, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"overwrite": "no"}, "overwrite must be True or False, got 'no'"),
    ({"durable": "no"}, "durable must be True or False, got 'no'"),
    ({"progress": "x"}, "progress must be True or False"),
    ({"commit_interval": -1}, "commit_interval must be a number of seconds >= 0"),
    ({"chunks": 5}, "chunks must be a dict"),
    ({"compressor": "lz4"}, "compressor must be a numcodecs codec"),
    ({"mode": "x"}, "mode must be one of 'w', 'a', got 'x'"),
    ({"workers": 1.5}, r"workers \(0: write in this process\) must be an integer >= 0, got 1.5"),
    ({"lease_timeout": -1}, "lease_timeout must be a number of seconds > 0"),
    ({"segment_bytes": -1}, "segment_bytes must be an integer >= 1"),
])
def test_bad_write_options_are_one_line_before_anything_changes(small_dataset, tmp_path, kwargs, message):
    """`overwrite="no"` replaced a 3-scene dataset with a 1-scene
    one (a string is true to Python)."""
    from zarrfeed.loader import Dataset
    from zarrfeed.writer import DatasetWriter, synthetic, write_dataset

    path = tmp_path / "d.zarr"
    write_dataset(path, synthetic.episodes(3, seed=1, frames=10, agents_per_frame=5), workers=0)
    with pytest.raises(ValueError, match=message):
        if {"lease_timeout", "segment_bytes"} & set(kwargs):  # DatasetWriter's own: write_dataset does not take them
            DatasetWriter(path, **{"overwrite": True, **kwargs})
        else:
            write_dataset(path, synthetic.episodes(1, seed=2, frames=10, agents_per_frame=5),
                          **{"overwrite": True, **kwargs})
    assert Dataset.open(path).rows["scenes"] == 3


def _spelled_out():
    from zarrfeed.flight import (RemoteAgentSampleLoader, RemoteEgoSampleLoader, RemoteLoader, RemoteOptions,
                                 RemoteWindowLoader)
    from zarrfeed.flight.remote_options import Remote
    from zarrfeed.writer import DatasetWriter, WriteOptions, ingest_parquet, write_dataset
    from zarrfeed.writer import dask
    from zarrfeed.writer.options import Writes
    return ([(cls, LoaderOptions, Options) for cls in LOADERS]
            + [(cls, RemoteOptions, Remote) for cls in (RemoteLoader, RemoteWindowLoader, RemoteAgentSampleLoader,
                                                         RemoteEgoSampleLoader)]
            + [(f, WriteOptions, Writes) for f in (DatasetWriter, write_dataset, ingest_parquet, dask.ingest)])


@pytest.mark.parametrize("target, declared, defaults", _spelled_out(), ids=lambda t: getattr(t, "__name__", ""))
def test_help_and_signature_list_every_option_with_its_default(target, declared, defaults):
    """`help()` and `inspect.signature` list every option with its default, not `**options`."""
    import pydoc

    sig = inspect.signature(target)
    assert all(p.kind is not p.VAR_KEYWORD for p in sig.parameters.values())
    for name, default in option_names(defaults).items():
        p = sig.parameters[name]
        shown = "<not given>" if name in getattr(defaults, "NOT_GIVEN", ()) else repr(default)
        assert p.kind is p.KEYWORD_ONLY and repr(p.default) == shown, name
        assert p.annotation == declared.__annotations__[name].__forward_arg__
    own = inspect.signature(target.__init__ if isinstance(target, type) else target).parameters
    assert [n for n in sig.parameters if n in own] == [n for n in own if n not in ("self", "options")]
    text = pydoc.render_doc(target, renderer=pydoc.plaintext)
    assert all(f"{name}: " in text for name in option_names(defaults))


def test_a_users_subclass_shows_its_own_signature():
    """A subclass with an `__init__` of its own showed its parent's spelled-out signature (the decorator put it
    on the class, where subclasses inherit it); one without keeps its parent's, which is then its own."""

    class Mine(Loader):
        def __init__(self, path: str, *, scale: float = 1.0) -> None:
            super().__init__(path)

    class Same(Loader):
        pass

    assert list(inspect.signature(Mine).parameters) == ["path", "scale"]
    assert list(inspect.signature(Same).parameters) == list(inspect.signature(Loader).parameters)
    assert "shuffle_window" in inspect.signature(Loader).parameters
