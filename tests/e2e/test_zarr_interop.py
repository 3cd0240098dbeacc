"""Interoperability of zarrfeed's own zarr v2 format layer with zarr-python 3, zarr-python 2 and the
newest xarray; zarr 2 and xarray each in an environment this test makes (`pip install`, from the registry).

- zarr-python 3, installed beside zarrfeed by the test extra, opens the plain-dtype arrays zarrfeed writes (the
  agents mask, an N-d replay-buffer-style array, with either chunk-key separator) with equal values, and
  zarrfeed opens v2 arrays and groups zarr 3 writes;
- zarr-python 2 (no longer maintained; L5Kit's own code reads with it) reads every table zarrfeed writes byte
  for byte as zarrfeed reads it, and the real scene converted to v3 and back as L5Kit wrote it; zarrfeed reads
  what zarr 2 writes;
- installing zarrfeed into an environment holding xarray and zarr 3 changes neither, and both still work.
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
from zarrfeed.loader import Dataset
from zarrfeed.loader.kinds import agents_mask
from zarrfeed.writer import L5KIT_SCHEMA, DatasetWriter, synthetic

from repo_paths import ROOT
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
def zarr3() -> Path:
    """This environment's python: the test extra installs zarr-python 3 beside zarrfeed."""
    import zarr

    assert zarr.__version__.startswith("3"), f"the test extra installs zarr 3, found {zarr.__version__}"
    return Path(sys.executable)


@pytest.fixture(scope="module")
def zarr2(tmp_path_factory) -> Path:
    return _venv(tmp_path_factory.mktemp("zarr2") / "venv", "zarr>=2.18,<3")


READ_WITH_ZARR2 = """
import json, sys, numpy as np, zarr
assert zarr.__version__.startswith("2"), zarr.__version__
root = zarr.open_group(sys.argv[1], mode="r")
out, attrs = {}, {"": dict(root.attrs)}
def walk(group, prefix):
    for name, arr in group.arrays():
        out[prefix + name] = np.frombuffer(arr[:].tobytes(), np.uint8)
        attrs[prefix + name] = {**arr.attrs, "dtype": str(arr.dtype.descr), "chunks": list(arr.chunks),
                                "compressor": arr.compressor.get_config() if arr.compressor else None}
    for name, sub in group.groups():
        attrs[prefix + name] = dict(sub.attrs)
        walk(sub, prefix + name + "/")
walk(root, "")
np.savez(sys.argv[2], **{k.replace("/", "__"): v for k, v in out.items()})
print(json.dumps(attrs))
"""


def _zarrfeed_arrays(path: Path) -> dict[str, bytes]:
    """Every array below the group at `path`, read by zarrfeed's format layer: name -> its bytes."""
    out = {}

    def walk(group: Group, prefix: str) -> None:
        for name in group.array_keys():
            out[prefix + name] = group[name][:].tobytes()
        for name in group.group_keys():
            walk(group[name], prefix + name + "/")
    walk(Group.open(DirectoryStore(path)), "")
    return out


def test_zarr_2_reads_every_table_zarrfeed_writes_byte_for_byte(tmp_path, zarr2):
    data = tmp_path / "d.zarr"
    with DatasetWriter(data, workers=2, chunks={"agents": 700, "frames": 50}) as w:  # partly filled last chunks
        w.ingest(synthetic.episodes(3, seed=2, frames=70))
    with DatasetWriter(data, mode="a", workers=0) as w:  # an append rewrites the last chunks
        w.ingest(synthetic.episodes(2, seed=5, frames=30))
    ds = Dataset.open(data)
    agents_mask.save(ds, agents_mask.compute(ds, 0.5, workers=0))
    out = tmp_path / "read.npz"
    got = subprocess.run([str(zarr2), "-c", READ_WITH_ZARR2, str(data), str(out)], capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    read = {k.replace("__", "/"): v.tobytes() for k, v in np.load(out).items()}
    mine = _zarrfeed_arrays(data)
    assert set(read) == set(mine) == {"scenes", "frames", "agents", "traffic_light_faces", "agents_mask/0.5"}
    for name in mine:
        assert read[name] == mine[name], name
    ds = Dataset.open(data)
    for table in ds.tables:  # and what zarr 2 reads is what zarrfeed's readers give
        assert read[table] == ds.read_rows(table, 0, ds.rows[table]).tobytes(), table
    attrs = json.loads(got.stdout)
    assert attrs[""] == dict(Group.open(DirectoryStore(data)).attrs.items()) == L5KIT_SCHEMA.attrs
    for name, table in L5KIT_SCHEMA.tables.items():  # as zarr 2 sees them: the schema's dtypes and compressor
        assert attrs[name]["dtype"] == str(table.dtype.descr), name
        assert attrs[name]["compressor"] == L5KIT_SCHEMA.compressor.get_config(), name
    assert attrs["agents"]["chunks"] == [700] and attrs["frames"]["chunks"] == [50]
    assert attrs["agents_mask/0.5"]["zarrfeed"]["complete"] is True


def test_zarr_2_reads_the_real_scene_through_v3_and_back_as_l5kit_wrote_it(real_scene, tmp_path, zarr2):
    """L5Kit's own code opens its datasets with zarr 2 (`zarr.open_group(path, mode="r")`, then each table): the
    real scene converted to sharded zarr v3 and back to v2 (`zarrfeed.convert`) reads there as the scene L5Kit
    wrote, byte for byte, with the same attributes, dtypes, chunks and compressor."""
    from zarrfeed import convert

    convert(real_scene, tmp_path / "v3.zarr", zarr_format=3, workers=0)
    convert(tmp_path / "v3.zarr", tmp_path / "v2.zarr", zarr_format=2, workers=0)
    seen = {}
    for name, path in (("stored", real_scene), ("round trip", tmp_path / "v2.zarr")):
        out = tmp_path / f"{name}.npz"
        got = subprocess.run([str(zarr2), "-c", READ_WITH_ZARR2, str(path), str(out)], capture_output=True,
                             text=True, timeout=300)
        assert got.returncode == 0, got.stderr[-3000:]
        seen[name] = ({k: v.tobytes() for k, v in np.load(out).items()}, json.loads(got.stdout))
    assert set(seen["stored"][0]) == {"scenes", "frames", "agents", "traffic_light_faces"}
    assert seen["round trip"] == seen["stored"]


WRITE_WITH_ZARR2 = """
import sys, numpy as np, zarr
from numcodecs import Blosc
root = zarr.open_group(sys.argv[1], mode="w")
root.attrs["made_by"] = "zarr 2"
rng = np.random.default_rng(7)
img = root.require_group("data").create_dataset("img", shape=(130, 4, 4, 3), chunks=(40, 4, 4, 3), dtype="u1",
                                               compressor=Blosc(cname="zstd", clevel=3))
img[:] = rng.integers(0, 255, (130, 4, 4, 3), dtype="u1")
rec = np.dtype([("a", "<f8", (2,)), ("b", "<i4")])
table = root.create_dataset("table", shape=(95,), chunks=(20,), dtype=rec, dimension_separator="/")
values = np.zeros(95, rec)
values["a"] = rng.random((95, 2))
values["b"] = np.arange(95)
table[:] = values
np.savez(sys.argv[2], img=img[:], table=table[:].view(np.uint8))
"""


def test_zarrfeed_reads_what_zarr_2_writes(tmp_path, zarr2):
    made, want = tmp_path / "z2.zarr", tmp_path / "want.npz"
    got = subprocess.run([str(zarr2), "-c", WRITE_WITH_ZARR2, str(made), str(want)], capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    want_values = np.load(want)
    root = Group.open(DirectoryStore(made))
    assert root.attrs["made_by"] == "zarr 2"
    np.testing.assert_array_equal(root["data"]["img"][:], want_values["img"])
    assert root["table"][:].tobytes() == want_values["table"].tobytes()
    for doc in made.rglob(".zarray"):  # and its documents are what zarrfeed would write back
        assert ArrayMeta.parse(json.loads(doc.read_bytes())).to_bytes() == doc.read_bytes()


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
