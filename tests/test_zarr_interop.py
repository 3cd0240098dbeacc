"""Issue 36: interoperability of zarrfeed's own zarr v2 format layer with zarr-python 3 and the newest xarray,
each in an environment this test makes (`pip install`, from the package registry), so the suite's own
environment stays as it is.

- zarr-python 3 opens the plain-dtype arrays zarrfeed writes (the agents mask, an N-d replay-buffer-style
  array, with either chunk-key separator) with equal values, and zarrfeed opens v2 arrays and groups zarr 3
  writes;
- installing zarrfeed into an environment holding xarray and zarr 3 changes neither, and both still work.
(zarr-python 2, the suite's own, reads zarrfeed's tables in tests/test_zarr_format.py and across the suite.)
"""
import json
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group
from zarrfeed.core.zarr_meta import ArrayMeta
from zarrfeed.loader import Dataset, agents_mask
from zarrfeed.writer import DatasetWriter, synthetic

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 900


def _venv(where: Path, *packages: str) -> Path:
    """A fresh virtual environment with `packages` installed; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    out = subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], capture_output=True, text=True,
                         timeout=INSTALL_TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    return python


def _versions(python: Path) -> dict[str, str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                         check=True, timeout=120)
    return {p["name"].lower(): p["version"] for p in json.loads(out.stdout)}


@pytest.fixture(scope="module")
def zarr3(tmp_path_factory) -> Path:
    return _venv(tmp_path_factory.mktemp("zarr3") / "venv", "zarr>=3")


READ_WITH_ZARR3 = """
import sys, numpy as np, zarr
assert zarr.__version__.startswith("3"), zarr.__version__
out = {}
for path in sys.argv[3:]:  # by path: zarr 3 cannot parse the tables' record dtypes (in .zmetadata too)
    out[path.replace("/", "__")] = zarr.open_array(sys.argv[1], path=path, mode="r", zarr_format=2)[...]
np.savez(sys.argv[2], **out)
"""


def test_zarr_3_reads_what_zarrfeed_writes(tmp_path, zarr3):
    data = tmp_path / "d.zarr"
    with DatasetWriter(data, workers=0, chunks={"agents": 500}) as w:
        w.ingest(synthetic.episodes(3, seed=1, frames=40))
    mask = agents_mask.compute(Dataset.open(data), 0.5, workers=0)
    agents_mask.save(Dataset.open(data), mask)
    group = Group.open(DirectoryStore(data))
    rng = np.random.default_rng(3)
    img = rng.integers(0, 255, (203, 6, 5, 3), dtype=np.uint8)
    act = rng.random((203, 2)).astype("<f4")
    buffer = group.require_group("buffer")
    for name, values, separator in (("img", img, "."), ("action", act, "/")):
        arr = buffer.create_array(name, ArrayMeta.new((len(values), *values.shape[1:]), 50, values.dtype,
                                                      numcodecs.Blosc("zstd", 3), fill_value=0,
                                                      dimension_separator=separator))
        arr[:] = values
    out = tmp_path / "read.npz"
    got = subprocess.run([str(zarr3), "-c", READ_WITH_ZARR3, str(data), str(out), "agents_mask/0.5", "buffer/img",
                          "buffer/action"], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    read = np.load(out)
    np.testing.assert_array_equal(read["agents_mask__0.5"], mask)
    np.testing.assert_array_equal(read["buffer__img"], img)
    np.testing.assert_array_equal(read["buffer__action"], act)


WRITE_WITH_ZARR3 = """
import sys, numpy as np, zarr
from numcodecs import Blosc, Delta
root = zarr.open_group(sys.argv[1], mode="w", zarr_format=2, attributes={"made_by": "zarr 3"})
rng = np.random.default_rng(5)
img = root.create_array("data/img", shape=(130, 4, 4, 3), chunks=(40, 4, 4, 3), dtype="u1",
                        compressors=Blosc(cname="lz4", clevel=5), fill_value=0)
img[:] = rng.integers(0, 255, (130, 4, 4, 3), dtype="u1")
ends = root.create_array("meta/episode_ends", shape=(4,), chunks=(4,), dtype="<i8",
                         fill_value=0)
ends[:] = [30, 60, 100, 130]
x = root.create_array("x", shape=(100,), chunks=(32,), dtype="<f8", filters=[Delta(dtype="<f8")],
                      compressors=None, fill_value=float("nan"), chunk_key_encoding={"name": "v2", "separator": "/"})
x[:50] = np.arange(50, dtype="<f8")
np.savez(sys.argv[2], img=img[...], ends=ends[...], x=x[...])
"""


def test_zarrfeed_reads_v2_arrays_and_groups_zarr_3_writes(tmp_path, zarr3):
    made, want = tmp_path / "z3.zarr", tmp_path / "want.npz"
    got = subprocess.run([str(zarr3), "-c", WRITE_WITH_ZARR3, str(made), str(want)], capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    want_values = np.load(want)
    root = Group.open(DirectoryStore(made))
    assert root.attrs["made_by"] == "zarr 3"
    np.testing.assert_array_equal(root["data"]["img"][:], want_values["img"])
    np.testing.assert_array_equal(root["meta"]["episode_ends"][:], want_values["ends"])
    x = root["x"]
    assert x.meta.dimension_separator == "/" and x.filters and x.compressor is None
    np.testing.assert_array_equal(x[:], want_values["x"])  # never-written chunks read as NaN, as in zarr


def test_installing_zarrfeed_beside_xarray_and_zarr_3_changes_neither(tmp_path):
    python = _venv(tmp_path / "venv", "xarray", "zarr>=3")
    before = _versions(python)
    assert before["zarr"].startswith("3")
    out = subprocess.run([str(python), "-m", "pip", "install", "-q", str(ROOT)], capture_output=True, text=True,
                         timeout=INSTALL_TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    after = _versions(python)
    assert {k: after.get(k) for k in ("zarr", "xarray", "numcodecs", "numpy")} == \
        {k: before.get(k) for k in ("zarr", "xarray", "numcodecs", "numpy")}
    check = ("import xarray as xr, numpy as np, zarr, zarrfeed, zarrfeed.loader, zarrfeed.writer, sys; "
             "xr.Dataset({'v': ('t', np.arange(5))}).to_zarr(sys.argv[1], mode='w'); "
             "assert (xr.open_zarr(sys.argv[1])['v'].values == np.arange(5)).all()")
    works = subprocess.run([str(python), "-c", check, str(tmp_path / "x.zarr")], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)  # (not the repository: its folders are not the installed package)
    assert works.returncode == 0, works.stderr[-3000:]
