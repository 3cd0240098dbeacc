"""Every loader's options are declared once (issue 39 item 8): `LoaderOptions` (names, types, docs) and `Options`
(defaults) hold the same names; every local loader takes all of them, keyword-only, checks them the same way
and refuses an unknown one in one line naming the close one."""
import dataclasses
import inspect
import typing

import pytest

from zarrfeed.loader import AgentSampleLoader, EgoSampleLoader, Loader, LoaderOptions, SequenceLoader, WindowLoader
from zarrfeed.loader.options import Options

LOADERS = (Loader, WindowLoader, AgentSampleLoader, EgoSampleLoader, SequenceLoader)


def test_the_options_are_declared_once():
    assert list(LoaderOptions.__annotations__) == [f.name for f in dataclasses.fields(Options)]
    hints = typing.get_type_hints(LoaderOptions)
    assert all(hints[f.name] == typing.get_type_hints(Options)[f.name] for f in dataclasses.fields(Options))


@pytest.mark.parametrize("cls", LOADERS, ids=lambda c: c.__name__)
def test_every_loader_takes_them_all_keyword_only(cls):
    sig = inspect.signature(cls)
    options = sig.parameters["options"]
    assert options.kind is inspect.Parameter.VAR_KEYWORD
    assert typing.get_args(typing.get_type_hints(cls.__init__)["options"]) == (LoaderOptions,)
    shared = set(LoaderOptions.__annotations__)
    assert not shared & set(sig.parameters), "an option is declared again"


def test_every_option_with_its_default_is_taken_and_an_unknown_one_is_one_line(small_dataset, dp_buffer):
    path = small_dataset(3, 2, chunks={"agents": 500})
    defaults = {f.name: f.default for f in dataclasses.fields(Options)} | {"num_workers": 0}
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

    assert list(RemoteOptions.__annotations__) == [f.name for f in dataclasses.fields(Remote)]
    for cls in (RemoteLoader, RemoteWindowLoader, RemoteAgentSampleLoader, RemoteEgoSampleLoader):
        assert typing.get_args(typing.get_type_hints(cls.__init__)["options"]) == (RemoteOptions,)
        assert not set(RemoteOptions.__annotations__) & set(inspect.signature(cls).parameters)
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
    for fn in (DatasetWriter.__init__, zdask.ingest):
        assert typing.get_args(typing.get_type_hints(fn)["options"]) == (WriteOptions,)
        assert not set(WriteOptions.__annotations__) & set(inspect.signature(fn).parameters)
    with pytest.raises(TypeError, match=r"^DatasetWriter.__init__\(\) got an unexpected keyword argument 'overwirte'. "
                                        r"Did you mean 'overwrite'\?$"):
        DatasetWriter(tmp_path / "d.zarr", overwirte=True)
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got 'ignore'"):
        DatasetWriter(tmp_path / "d.zarr", on_error="ignore")
    assert not (tmp_path / "d.zarr").exists()
