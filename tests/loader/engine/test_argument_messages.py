"""What a user sees when an argument or a transform is wrong: one line naming the parameter, the
transform, the field, the shapes; never zarrfeed's own traceback, never a message about something else."""
import functools
import re
import subprocess
import sys

import numpy as np
import pytest
from zarrfeed.loader import Dataset, Loader, LoaderError


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(2, 12, chunks={"agents": 700, "frames": 50}, frames=40, agents_per_frame=30)


def test_fields_takes_one_name_as_a_list_of_one(data):
    """`fields="centroid"` read as its letters: "no field 'c'" (Loader) or KeyError "Field named 'c' not found"
    (to_arrow, to_batches, to_dask)."""
    with Loader(data, "agents", batch_size=100, fields="centroid", num_workers=0) as loader:
        batch = next(iter(loader))
    assert list(batch) == ["centroid"] and batch["centroid"].shape == (100, 2)
    with Dataset.open(data) as ds:
        table = ds.to_arrow("agents", fields="centroid")
        assert table.column_names == ["centroid"] and table.num_rows == ds.rows["agents"]
        assert ds.to_arrow("agents", fields="track_id").equals(ds.to_arrow("agents", fields=["track_id"]))
        assert next(iter(ds.to_batches("agents", fields="yaw"))).schema.names == ["yaw"]
        assert list(ds.to_dask("agents", fields="yaw").columns) == ["yaw"]


@pytest.mark.parametrize("fields, message", [
    (5, "fields: expected a field name or a list of field names, got 5"),
    ([b"yaw"], "fields: expected a field name or a list of field names, got [b'yaw']"),
    ("speed", "fields: no field 'speed' (fields: centroid, extent, yaw, velocity, track_id, label_probabilities)"),
    (["yaw", "yaw"], "fields: 'yaw' is named more than once"),
])
def test_fields_that_are_not_field_names_are_refused_naming_the_parameter(data, fields, message):
    with pytest.raises(ValueError) as caught:
        Loader(data, "agents", fields=fields, num_workers=0)
    assert str(caught.value) == message
    with Dataset.open(data) as ds:
        for read in (ds.to_arrow, ds.to_batches, ds.to_dask):
            with pytest.raises(ValueError) as caught:
                read("agents", fields=fields)
            assert str(caught.value) == message, read


def test_a_negative_seed_is_refused_naming_the_option(tmp_path):
    for command in (["ingest", str(tmp_path / "d.zarr"), "--synthetic", "1"], ["demo", "--out", str(tmp_path / "e")]):
        out = subprocess.run([sys.executable, "-m", "zarrfeed", *command, "--seed", "-1"], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.splitlines()[-1] == \
            f"zarrfeed {command[0]}: error: argument --seed: expected a number >= 0, got -1", out.stderr
    assert not (tmp_path / "d.zarr").exists() and not (tmp_path / "e").exists()


def wider_later(batch):
    """A transform whose output changes shape: (n, 3) for the first batch, (n, 4) once a batch holds a high
    track id."""
    n = len(batch["yaw"])
    return {"x": np.zeros((n, 4 if batch["track_id"].max() > 60 else 3), np.float32)}


def short_first(batch):
    """A transform whose output is not batch-shaped from the first batch on."""
    return {"x": np.zeros((5, 3), np.float32)}


def scaled(batch, scale):
    return {"x": np.zeros((len(batch["yaw"]) * scale, 3), np.float32)}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("transform, name, got, want", [
    (wider_later, "wider_later", r"float32\(\d+, 4\)", r"float32\(\d+, 3\)"),
    (short_first, "short_first", r"float32\(5, 3\)", r"float32\(100, 3\)"),
    (functools.partial(scaled, scale=2), "scaled", r"float32\(200, 3\)", r"float32\(100, 3\)"),
])
def test_a_transforms_wrong_shape_is_one_line_naming_it_the_field_and_both_shapes(data, workers, transform, name,
                                                                                    got, want):
    """The message carried zarrfeed's internal traceback (read_worker.py, layout.py) although the
    transform raised nothing: it is zarrfeed's check of the output, and its one line says it all."""
    with pytest.raises(LoaderError) as caught:
        with Loader(data, batch_size=100, shuffle=False, transform=transform, num_workers=workers) as loader:
            list(loader)
    msg = str(caught.value)
    assert "\n" not in msg and "Traceback" not in msg and ".py" not in msg, msg
    assert re.fullmatch(rf"transform '{name}': transform output 'x' of batch \d+ is {got}, expected {want} like "
                        r"the first batch's \(first axis: the batch's rows\) \(epoch 0, table 'agents'\)", msg), msg


def test_a_transform_that_returns_no_dict_is_one_line_too(data):
    with pytest.raises(LoaderError) as caught:
        with Loader(data, batch_size=100, transform=lambda batch: [1], num_workers=0) as loader:
            next(iter(loader))
    assert str(caught.value) == ("transform '<lambda>': transform must return a dict of numpy arrays whose first "
                                 "axis is the batch's rows, got list (epoch 0, table 'agents')")


def test_a_transform_that_raises_still_carries_its_own_traceback(data):
    """The user's own exception keeps what helps: which batch, the exception, the worker's traceback."""
    def bad(batch):
        raise ZeroDivisionError("boom")

    with pytest.raises(LoaderError, match=r"transform failed on batch 0 of epoch 0 (.|\n)*ZeroDivisionError: boom"
                                          r"(.|\n)*traceback"):
        with Loader(data, batch_size=100, shuffle=False, transform=bad, num_workers=0) as loader:
            list(loader)
