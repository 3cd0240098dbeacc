"""Nothing that is not a dataset passes as one, and `validate --deep` says what it checked.

- A group with no table zarrfeed reads (an empty group, a replay buffer's `data/` or `meta/`, xarray's output)
  is one line saying what the folder is and what zarrfeed reads, exit 2, and the same `FormatError` from
  `Dataset.open` (not "valid ()", an empty `info` or an empty export with exit 0).
- `validate --deep` reads a replay buffer's chunks that zarr 3 leaves out when they hold only the fill value as
  that value, as every reader does (the manifest records such tables as `missing_is_fill`), not as INVALID.
- `validate --deep` on chunks with no recorded digest exits 3 unless `--allow-unverified`, so that
  `zarrfeed validate --deep && publish` never publishes a dataset whose chunks were not checked.
"""
import shlex
import subprocess
import sys

import numcodecs
import numpy as np
import pytest
import zarr
from cli_process import zarrfeed
from zarrfeed.core.chunks import ChunkError
from zarrfeed.core.dataset_format import FormatError
from zarrfeed.loader import Dataset, Loader
from zarrfeed.loader.loader import LoaderError
from zarrfeed.writer import DatasetWriter


def _buffer(path, keys: dict, ends, chunks: int = 10) -> None:
    """A replay buffer written by zarr-python 3 (zarr_format=2, which stores no chunk that is all fill)."""
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    for key, value in keys.items():
        root.create_array(f"data/{key}", shape=value.shape, chunks=(chunks, *value.shape[1:]), dtype=value.dtype,
                          compressors=numcodecs.Blosc("lz4", 5, 0), fill_value=0)[:] = value
    root.create_array("meta/episode_ends", shape=(len(ends),), chunks=(len(ends),), dtype="i8", compressors=None,
                      fill_value=0)[:] = ends


def _sparse_buffer(path):
    """30 steps in chunks of 10 whose key `contact` is 0 in its first two chunks: zarr stores neither."""
    contact = np.zeros((30, 1), np.float32)
    contact[20:] = 1
    _buffer(path, {"action": np.arange(60, dtype=np.float32).reshape(30, 2), "contact": contact}, [10, 30])
    assert not (path / "data" / "contact" / "0.0").exists() and not (path / "data" / "contact" / "1.0").exists()
    return contact


def _append(path, steps: int = 3) -> None:
    with DatasetWriter(path, mode="a", workers=0) as w:
        w.submit({"action": np.ones((steps, 2), np.float32), "contact": np.ones((steps, 1), np.float32)})


# ------------------------------------------------------------------ item 2: chunks zarr left out as fill values
def test_validate_deep_follows_the_manifests_record_of_chunks_left_out_as_fill(tmp_path):
    path = tmp_path / "b.zarr"
    contact = _sparse_buffer(path)
    r = zarrfeed("validate", path, "--deep", "-q")  # no digests at all: not verified, but nothing wrong
    assert "INVALID" not in r.stdout and "is missing" not in r.stdout, r.stdout
    assert r.returncode == 3 and "could not all be verified" in r.stdout, r
    _append(path)
    ds = Dataset.open(path)
    assert ds.commit is not None and ds.tables["contact"].missing_is_fill
    assert (ds.read_rows("contact", 0, 33)["contact"][:, 0] == np.r_[contact[:, 0], 1, 1, 1]).all()
    report = ds.verify()
    assert report.ok and report.problems == [] and report.left_out == 2, str(report)
    assert report.verified >= 3 and not report.all_verified  # zarr's chunks have no digest to check
    r = zarrfeed("validate", path, "--deep", "-q")
    assert "INVALID" not in r.stdout and "data/contact/0.0" not in r.stdout, r.stdout
    assert r.returncode == 3 and "2 of them not stored, read as the fill value" in r.stdout, r
    r = zarrfeed("validate", path, "--deep", "--allow-unverified", "-q")
    assert r.returncode == 0 and "accepted with those chunks unchecked" in r.stdout, r
    assert zarrfeed("validate", path, "-q").returncode == 0


def _lost_chunk(path):
    """A zarr 3 buffer appended to by zarrfeed, whose chunk data/contact/3.0 (rows 30-40, of the append: recorded)
    is then deleted."""
    _buffer(path, {"action": np.ones((30, 2), np.float32), "contact": np.ones((30, 1), np.float32)}, [10, 30])
    _append(path, steps=13)
    (path / "data" / "contact" / "3.0").unlink()
    return path


def test_a_chunk_zarrfeed_stored_and_lost_is_not_read_as_fill(tmp_path):
    """The other side of the record: a chunk the writer stored (its commit records its digest) that is gone is
    lost, even in a table whose unrecorded chunks read as fill; the readers read it as zeros, `validate` said
    valid."""
    path = _lost_chunk(tmp_path / "b.zarr")
    ds = Dataset.open(path)
    with pytest.raises(ChunkError, match=r"chunk 'data/contact/3.0' .*missing, though its commit recorded it"):
        ds.read_rows("contact", 0, 43)
    with pytest.raises(LoaderError, match=r"chunk 'data/contact/3.0' .*missing"):
        with Loader(path, "contact", batch_size=43, shuffle=False, num_workers=1, cache="off") as loader:
            for _ in loader:
                pass
    assert ds.verify().problems == ["table 'contact': chunk 'data/contact/3.0' is missing (its commit recorded it "
                                    "as stored)"]
    r = zarrfeed("validate", path, "-q")
    assert r.returncode == 1 and "chunk 'data/contact/3.0' (rows 30-40) is missing" in r.stdout, r


def test_a_loader_caching_an_object_stores_chunks_refuses_a_lost_one_too(s3, tmp_path):
    """With `cache_dir` on an object store, the fetcher checks recorded chunks itself, and let a missing one
    through to be read as fill."""
    bucket, server = s3
    url = f"{bucket}/b.zarr"
    server.fs().put(str(_lost_chunk(tmp_path / "b.zarr")), url, recursive=True)
    assert Dataset.open(url, storage_options=server.options).rows["contact"] == 43
    with pytest.raises(LoaderError, match=r"chunk 'data/contact/3.0' .*missing"):
        with Loader(url, "contact", batch_size=43, shuffle=False, num_workers=1, cache="off",
                    storage_options=server.options, cache_dir=tmp_path / "cache") as loader:
            for _ in loader:
                pass


# ------------------------------------------------------------------ item 3: what is not a dataset
def _empty(root):
    zarr.open_group(str(root), mode="w", zarr_format=2)
    return root


def _xarray_like(root):
    """What xarray's `Dataset.to_zarr` writes (zarr v2): arrays with their dimensions named in
    `_ARRAY_DIMENSIONS`, coordinates as arrays, consolidated metadata."""
    g = zarr.open_group(str(root), mode="w", zarr_format=2, attributes={"title": "air temperature"})
    for name, dims, value in (("air", ["time", "lat"], np.zeros((4, 3), np.float32)),
                              ("lat", ["lat"], np.linspace(10, 30, 3)), ("time", ["time"], np.arange(4))):
        g.create_array(name, shape=value.shape, dtype=value.dtype, fill_value=None,
                       attributes={"_ARRAY_DIMENSIONS": dims})[:] = value
    zarr.consolidate_metadata(str(root), zarr_format=2)
    return root


def _plain_arrays(root):
    g = zarr.open_group(str(root), mode="w", zarr_format=2)
    g.create_array("image", shape=(5, 8, 8), dtype="u1", fill_value=0)[:] = 1
    return root


def _groups_only(root):
    g = zarr.open_group(str(root), mode="w", zarr_format=2)
    g.create_group("data").create_array("action", shape=(5, 2), dtype="f4", fill_value=0)[:] = 1
    return root


KINDS = {  # how to make it -> what the line must say
    "empty group": (_empty, "an empty zarr group (no arrays), not a dataset"),
    "xarray": (_xarray_like, "a zarr group as xarray writes it (3 arrays with named dimensions: 'air' (time, lat)"),
    "other arrays": (_plain_arrays, "a zarr group of 1 array, none a table ('image' (a 3-D uint8 array))"),
    "groups only": (_groups_only, "a zarr group of groups only (data/), not a dataset; a replay buffer also needs "
                                  "meta/"),
}
READS = "zarrfeed reads a dataset it wrote, an L5Kit dataset, a Diffusion Policy replay buffer"


def _refused(args, says: str, out=None, cwd=None) -> str:
    r = zarrfeed(*args, cwd=cwd)
    assert r.returncode == 2 and r.stdout == "", (args, r)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert says in r.stderr, (args, r.stderr)
    assert out is None or not out.exists(), f"{args}: wrote {out}"
    return r.stderr.strip()


def _every_command(path, tmp_path, says: str, cwd=None) -> str:
    out = tmp_path / "out"
    lines = {_refused(args, says, out, cwd) for args in (["validate", path], ["validate", path, "--deep", "-q"],
                                                          ["info", path], ["info", path, "--json"],
                                                          ["export", path, out, "-q"])}
    assert len(lines) == 1, lines  # one line, whatever the command
    return lines.pop()


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_group_with_no_table_is_refused_in_one_line_by_every_command_and_in_python(tmp_path, kind):
    make, says = KINDS[kind]
    path = make(tmp_path / f"{kind.replace(' ', '_')}.zarr")
    line = _every_command(path, tmp_path, says)
    assert READS in line, line
    with pytest.raises(FormatError) as caught:
        Dataset.open(path)
    assert line == f"zarrfeed: error: {caught.value}"


@pytest.mark.parametrize("part, holds", [("data", "its steps, one array per key"), ("meta", "its episode ends")])
def test_a_replay_buffers_data_or_meta_says_to_open_the_folder_above(dp_buffer, tmp_path, part, holds):
    says = f"{dp_buffer}/{part}: the {part}/ group of the replay buffer {dp_buffer} ({holds}), not a dataset; " \
           f"zarrfeed reads the whole buffer: open {dp_buffer}"
    line = _every_command(dp_buffer / part, tmp_path, says)
    with pytest.raises(FormatError) as caught:
        Dataset.open(dp_buffer / part)
    assert line == f"zarrfeed: error: {caught.value}"
    _refused(["info", part], "open .", cwd=dp_buffer)  # from inside the buffer: the folder above is "."
    assert zarrfeed("validate", dp_buffer, "-q").returncode == 0  # the buffer itself is read as before


def test_the_zarr_v3_xarray_writes_by_default_is_refused_as_its_v2_is(tmp_path):
    """zarrfeed reads v3: a group of no tables is not a dataset in either format, said in the same line."""
    said = []
    for zarr_format in (3, 2):
        path = tmp_path / f"v{zarr_format}.zarr"
        zarr.open_group(str(path), mode="w", zarr_format=zarr_format).create_array("air", shape=(4,), dtype="f4")
        line = _refused(["validate", path], "a zarr group of 1 array, none a table ('air' (a 1-D float32 array))")
        said.append(line.replace(str(path), "PATH"))
    assert said[0] == said[1]


# ------------------------------------------------------------------ item 3: chunks that could not be verified
def test_validate_deep_exits_3_on_chunks_with_no_recorded_digest_unless_allowed(real_scene, small_dataset, tmp_path):
    r = zarrfeed("validate", real_scene, "--deep", "-q")  # L5Kit's: no digests
    assert r.returncode == 3 and "INVALID" not in r.stdout and ": valid" not in r.stdout, r
    assert "not verifiable: no chunk digests are recorded" in r.stdout, r
    assert "none of its 5 chunks could be checked" in r.stdout, r
    r = zarrfeed("validate", real_scene, "--deep", "--allow-unverified", "-q")
    assert r.returncode == 0 and "accepted with those chunks unchecked (--allow-unverified)" in r.stdout, r
    published = tmp_path / "published"  # what the exit status is for
    script = f"{shlex.join([sys.executable, '-m', 'zarrfeed', 'validate', '--deep', '-q'])} {{}} && touch {published}"
    subprocess.run(["bash", "-c", script.format(shlex.quote(str(real_scene)))], capture_output=True, timeout=120)
    assert not published.exists()
    written = small_dataset(2, 0)
    subprocess.run(["bash", "-c", script.format(shlex.quote(str(written)))], capture_output=True, timeout=120)
    assert published.exists()  # every chunk zarrfeed wrote is checked: exit 0
    r = zarrfeed("validate", real_scene, "--allow-unverified")
    assert r.returncode == 2 and "--allow-unverified goes with --deep" in r.stderr, r


def test_validates_help_documents_the_exit_status_and_the_option():
    r = zarrfeed("validate", "--help")
    text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "--allow-unverified" in text, r
    assert "3 with --deep when nothing is wrong but some chunks have no recorded digest" in text, text


def test_a_chunk_that_cannot_be_decoded_is_invalid_exit_1(small_dataset, tmp_path):
    """A corrupt chunk made `validate` (and `--deep`) stop with an error, exit 2,
    the status of "not a dataset"; it is a dataset, and an invalid one: INVALID, exit 1, the chunk named."""
    import shutil
    path = tmp_path / "c.zarr"
    shutil.copytree(small_dataset(2, 5, frames=20, agents_per_frame=5), path)
    chunk = path / "frames" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    for deep in ([], ["--deep"]):
        r = zarrfeed("validate", path, "-q", *deep)
        assert r.returncode == 1 and f"{path}: INVALID" in r.stdout, r
        assert "chunk 'frames/0' cannot be decoded" in r.stdout and "Traceback" not in r.stderr, r
