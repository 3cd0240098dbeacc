"""Datasets and places another tool made, met by zarrfeed's writer and stores: appending to tables another tool
compressed, table names that would be paths, URLs fsspec reads as patterns, fsspec's `local://` URLs."""
import numcodecs
import numpy as np
import pytest

from zarrfeed import Dataset, DatasetWriter
from zarrfeed.core.schema import Schema
from zarrfeed.core.errors import FormatError
from zarrfeed.core.location import Location
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array, Group
from zarrfeed.core.zarr_meta import ArrayMeta

RUN = np.dtype([("step_index_interval", "<i8", (2,)), ("seed", "<i8")])
STEP = np.dtype([("x", "<f8")])
SCHEMA = Schema(tables={"runs": (RUN, 4), "steps": (STEP, 8)}, links={"runs.step_index_interval": "steps"})
FOUND = Schema(tables={"runs": (RUN, 4), "steps": (STEP, 8)})  # what zarrfeed finds in them: another tool's
# dataset has no manifest to say which fields link tables


def foreign(path, compressor, filters=None):
    """A two-table dataset as another tool writes it (no manifest): 3 runs of 3 steps, each table compressed
    with `compressor` and filtered by `filters`."""
    store = DirectoryStore(path)
    Group.create(store)
    runs = np.zeros(3, RUN)
    runs["step_index_interval"] = [[0, 3], [3, 6], [6, 9]]
    for name, rows, chunk in (("runs", runs, 4), ("steps", np.arange(9).astype("<f8").view(STEP), 8)):
        arr = Array.create(store, name, ArrayMeta.new((len(rows),), chunk, rows.dtype, compressor, filters))
        arr.write(0, rows)


def episode(seed):
    run = np.zeros(1, RUN)
    run["step_index_interval"], run["seed"] = [[0, 2]], seed
    return {"runs": run, "steps": np.array([100.0, 101.0]).view(STEP)}


def test_appending_to_tables_another_tool_compressed_keeps_the_dataset_readable(tmp_path):
    """An append to a dataset whose tables share a compressor other than zarrfeed's (Zstd here) recorded
    zarrfeed's default in the manifest: every later open refused the dataset as damaged."""
    foreign(tmp_path / "d.zarr", numcodecs.Zstd(level=3))
    with DatasetWriter(tmp_path / "d.zarr", FOUND, mode="a", workers=0) as w:
        w.submit(episode(7))
    ds = Dataset.open(tmp_path / "d.zarr")
    assert ds.rows == {"runs": 4, "steps": 11} and ds.validate().ok
    assert ds.read_rows("steps", 9, 11)["x"].tolist() == [100.0, 101.0]
    with DatasetWriter(tmp_path / "d.zarr", FOUND, mode="a", workers=0) as w:  # and again
        w.submit(episode(8))
    assert Dataset.open(tmp_path / "d.zarr").rows == {"runs": 5, "steps": 13}


@pytest.mark.parametrize("codecs", [(None, None), (numcodecs.Blosc(), [numcodecs.Delta("<f8")])],
                         ids=["no compressor", "filters"])
def test_tables_whose_codecs_a_manifest_cannot_record_are_refused_before_anything_changes(tmp_path, codecs):
    foreign(tmp_path / "d.zarr", *codecs)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "d.zarr").rglob("*") if p.is_file()}
    with pytest.raises(FormatError, match=r"zarrfeed appends to a dataset whose tables share one compressor and "
                                          r"have no filters .* `zarrfeed ingest NEW --from "):
        DatasetWriter(tmp_path / "d.zarr", FOUND, mode="a", workers=0)
    after = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "d.zarr").rglob("*") if p.is_file()
             and p.name != ".zarrfeed.lock"}  # (the lease's lock file, empty: what a lease leaves by design)
    assert after == before
    assert Dataset.open(tmp_path / "d.zarr").rows == {"runs": 3, "steps": 9}


@pytest.mark.parametrize("name", ["../outside", "a/b", ".zattrs", "", "-x", "runs.v2", "scene[1]"])
def test_a_table_name_that_is_not_a_plain_folder_name_is_refused(tmp_path, name):
    """`../outside` wrote a table beside the dataset and `a/b` one without its parent group; the ingest said
    nothing and the dataset would not open."""
    with pytest.raises(ValueError, match="a table's name is its folder in the store"):
        Schema(tables={name: (STEP, 8)})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["memory://b/scene[1].zarr", "s3://bucket/runs-*.zarr", "memory://b/a?.zarr"])
def test_a_url_fsspec_would_read_as_a_pattern_is_refused(url):
    """fsspec reads `[`, `*` and `?` as a pattern in its calls that take several paths: `scene[1].zarr` read
    `scene1.zarr`'s keys, and deleting could have removed them."""
    with pytest.raises(FormatError, match="fsspec reads as a pattern"):
        Location.of(url)
    with pytest.raises(FormatError, match="fsspec reads as a pattern"):
        Dataset.open(url)


def test_a_local_url_is_a_directory(tmp_path):
    """fsspec's `local://` URLs: a valid dataset was refused ("Not a directory") and none could be written."""
    url = f"local://{tmp_path}/d.zarr"
    with DatasetWriter(url, SCHEMA, workers=0) as w:
        w.submit(episode(1))
    assert Location.of(url).is_local and Dataset.open(url).rows == {"runs": 1, "steps": 2}
    assert Dataset.open(tmp_path / "d.zarr").validate().ok
