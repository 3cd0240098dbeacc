"""The Arrow bridge: exact round trips, zero copy, streams, joins, Parquet both ways, real interop."""
import json
import subprocess
import sys

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zarrfeed.loader import Dataset, Loader, export_parquet, from_arrow, to_arrow
from zarrfeed.writer import (
    AGENT_DTYPE,
    FRAME_DTYPE,
    SCENE_DTYPE,
    TL_FACE_DTYPE,
    ingest_parquet,
    synthetic,
)

from zarrfeed.core.arrow_records import arrow_schema, records_to_arrow
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group


def test_type_mapping():
    s = arrow_schema(FRAME_DTYPE)
    assert s.field("timestamp").type == pa.int64()
    assert s.field("agent_index_interval").type == pa.list_(pa.int64(), 2)
    assert s.field("ego_rotation").type == pa.list_(pa.list_(pa.float64(), 3), 3)
    assert arrow_schema(SCENE_DTYPE).field("host").type == pa.string()
    assert arrow_schema(np.dtype([("b", "S4"), ("f", "?")])).types == [pa.binary(), pa.bool_()]
    for bad, kind in [("O", "object"), ("M8[s]", "datetime"), ("c8", "complex"), ([("x", "i4")], "nested")]:
        with pytest.raises(TypeError, match="field 'bad'"):
            arrow_schema(np.dtype([("ok", "i4"), ("bad", bad)]))


def test_l5kit_round_trip_is_bit_exact_with_nans():
    ep = synthetic.episode(3)
    ep["agents"]["yaw"][::7] = np.nan
    ep["agents"]["centroid"][5] = [np.inf, -np.nan]
    ep["frames"]["ego_rotation"][2, 1, 1] = np.float64(np.frombuffer(b"\x01\x00\x00\x00\x00\x00\xf8\x7f", "<f8")[0])
    for name, dtype in [("scenes", SCENE_DTYPE), ("frames", FRAME_DTYPE), ("agents", AGENT_DTYPE),
                        ("traffic_light_faces", TL_FACE_DTYPE)]:
        back = from_arrow(to_arrow(ep[name]))
        assert back.dtype == dtype and back.tobytes() == ep[name].tobytes()


BASES = ["<i1", "<u2", ">i4", "<u8", "<f2", ">f4", "<f8", ">f8", "?", "<U5", "S3"]


@st.composite
def structured(draw):
    n_fields = draw(st.integers(1, 5))
    fields = []
    for i in range(n_fields):
        shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        fields.append((f"f{i}", draw(st.sampled_from(BASES)), shape))
    dtype = np.dtype(fields)
    n = draw(st.integers(0, 20))
    raw = np.frombuffer(draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize)), np.uint8)
    arr = raw.view(dtype).copy() if n else np.zeros(0, dtype)
    for name in dtype.names:  # keep bools 0/1 and strings free of NULs before their end: numpy's own semantics
        base = dtype.fields[name][0].base
        if base.kind == "b":
            arr[name] = draw(st.booleans())
        elif base.kind in "US":
            text = draw(st.text(alphabet="abcé中", max_size=base.itemsize // (4 if base.kind == "U" else 1)))
            arr[name] = text if base.kind == "U" else text.encode("ascii", "ignore")[: base.itemsize]
    return arr


@settings(max_examples=150, deadline=None)
@given(structured())
def test_random_structured_round_trip(arr):
    back = from_arrow(to_arrow(arr))
    assert back.dtype == arr.dtype and back.tobytes() == arr.tobytes()


def test_every_kind_of_column_the_same_as_records_or_columns():
    """Each kind of field (either byte order, bools, strings, bytes, subarrays of each) gives the same Arrow data
    from a columnar batch (strided views here, so every column is converted) as from the records, and comes back
    bit-exact; `fields` keeps just those columns, in that order, with their dtype in the metadata."""
    rng = np.random.default_rng(11)
    dtype = np.dtype([(f"f{i}{'x' if shape else ''}", base, shape) for i, base in enumerate(BASES)
                      for shape in ((), (2, 3))])
    arr = np.frombuffer(rng.bytes(dtype.itemsize * 9), dtype).copy()
    for name in dtype.names:
        base = dtype[name].base
        if base.kind == "b":
            arr[name] = rng.integers(0, 2, arr[name].shape).astype(bool)
        elif base.kind in "US":
            arr[name] = rng.choice(["", "a", "bc", "xyz"], arr[name].shape)
    records = to_arrow(arr)
    columns = to_arrow({n: arr[n] for n in dtype.names})
    assert not arr["f2"].flags.c_contiguous and columns.schema.equals(records.schema, check_metadata=True)
    assert from_arrow(records).tobytes() == arr.tobytes() and from_arrow(columns).tobytes() == arr.tobytes()
    assert records.column("f2").to_pylist() == arr["f2"].astype("<i4").tolist()  # a big-endian field's values
    assert records.column("f9x").to_pylist() == arr["f9x"].tolist()  # strings in a (2, 3) subarray
    some = records_to_arrow(arr, ["f5x", "f0"])
    assert some.schema.names == ["f5x", "f0"] and some.schema.equals(arrow_schema(arr[["f5x", "f0"]].dtype), True)
    back = from_arrow(some)
    assert back.dtype.names == ("f5x", "f0") and all(back[n].tobytes() == arr[n].tobytes() for n in ("f5x", "f0"))


def test_columnar_batches_are_shared_not_copied(real_scene):
    with Loader(real_scene, batch_size=512, num_workers=1) as loader:
        batch = next(iter(loader))
        rb = to_arrow(batch)
        for name in ("centroid", "yaw", "track_id", "label_probabilities"):
            col = rb.column(name)
            values = col.values if pa.types.is_fixed_size_list(col.type) else col
            assert values.buffers()[1].address == batch[name].ctypes.data, name
        np.testing.assert_array_equal(from_arrow(rb)["extent"], batch["extent"])


def test_loader_can_yield_record_batches(data_path):
    with Loader(data_path, batch_size=300, seed=4, copy=True) as a, \
         Loader(data_path, batch_size=300, seed=4, output="arrow", copy=True) as b:
        for x, rb in zip(a, b, strict=True):
            assert isinstance(rb, pa.RecordBatch)
            np.testing.assert_array_equal(from_arrow(rb)["centroid"], x["centroid"])


@pytest.fixture(scope="module")
def data_path(small_dataset):
    return small_dataset(5, 31, chunks={"agents": 4000, "frames": 100}, frames=60)


def test_streams_in_row_order_with_a_join(data_path):
    ds = Dataset.open(data_path)
    frames, agents = ds["frames"][:], ds["agents"][:]
    stream = ds.to_batches("frames", batch_size=70, join={"agents": "agent_index_interval"}, row_index="_row")
    table = stream.read_all()
    assert table.num_rows == len(frames) and table.column("_row").to_pylist() == list(range(len(frames)))
    np.testing.assert_array_equal(from_arrow(table, FRAME_DTYPE), frames)
    lists = table.column("agents").combine_chunks()
    for i in (0, 1, 150, len(frames) - 1):
        s, e = frames["agent_index_interval"][i]
        assert len(lists[i]) == e - s
        np.testing.assert_array_equal(np.array(lists[i].values.field("track_id")), agents["track_id"][s:e])
    # the C stream interface, read by three consumers
    assert pa.RecordBatchReader.from_stream(stream).read_all().num_rows == len(frames)
    assert pl.DataFrame(ds.to_batches("agents")).height == len(agents)
    s = ds.to_batches("agents")
    assert duckdb.sql("SELECT count(*) FROM s").fetchall()[0][0] == len(agents)
    np.testing.assert_array_equal(from_arrow(ds.to_arrow("agents")), agents)


def numpy_answers(path):
    g = Group.open(DirectoryStore(path))
    agents, frames, scenes = g["agents"][:], g["frames"][:], g["scenes"][:]
    labels = np.bincount(agents["label_probabilities"].argmax(1), minlength=17)
    speed = np.linalg.norm(agents["velocity"].astype(np.float64), axis=1)
    frame_of_agent = np.searchsorted(frames["agent_index_interval"][:, 0], np.arange(len(agents)), "right") - 1
    scene_of_frame = np.searchsorted(scenes["frame_index_interval"][:, 0], np.arange(len(frames)), "right") - 1
    scene = scene_of_frame[frame_of_agent]
    mean_speed = {s: speed[scene == s].mean() for s in np.unique(scene)}
    per_scene = np.diff(scenes["frame_index_interval"], axis=1).ravel()
    return {int(i): int(c) for i, c in enumerate(labels) if c}, mean_speed, per_scene.tolist()


def duckdb_answers(pq_dir):
    t = lambda name: f"read_parquet('{pq_dir}/{name}/*.parquet')"  # noqa: E731
    labels = dict(duckdb.sql(
        f"SELECT list_position(label_probabilities::FLOAT[], list_max(label_probabilities::FLOAT[])) - 1 AS l, "
        f"count(*) FROM {t('agents')} GROUP BY l").fetchall())
    speed = dict(duckdb.sql(
        f"SELECT s._row, avg(sqrt(a.velocity[1]::DOUBLE ^ 2 + a.velocity[2]::DOUBLE ^ 2)) FROM {t('agents')} a "
        f"JOIN {t('frames')} f ON a._row >= f.agent_index_interval[1] AND a._row < f.agent_index_interval[2] "
        f"JOIN {t('scenes')} s ON f._row >= s.frame_index_interval[1] AND f._row < s.frame_index_interval[2] "
        f"GROUP BY s._row").fetchall())
    frames = [r[0] for r in duckdb.sql(f"SELECT frame_index_interval[2] - frame_index_interval[1] FROM "
                                       f"{t('scenes')} ORDER BY _row").fetchall()]
    return labels, speed, frames


def polars_answers(pq_dir):
    agents = pl.read_parquet(f"{pq_dir}/agents/*.parquet")
    frames = pl.read_parquet(f"{pq_dir}/frames/*.parquet")
    scenes = pl.read_parquet(f"{pq_dir}/scenes/*.parquet")
    labels = agents.group_by(pl.col("label_probabilities").arr.arg_max().alias("l")).len()
    labels = dict(zip(labels["l"].to_list(), labels["len"].to_list(), strict=True))
    f = frames.select(pl.col("_row").alias("frame"), pl.col("agent_index_interval").arr.first().alias("start"))
    s = scenes.select(pl.col("_row").alias("scene"), pl.col("frame_index_interval").arr.first().alias("start"))
    a = agents.select("_row", (pl.col("velocity").arr.get(0).cast(pl.Float64) ** 2
                               + pl.col("velocity").arr.get(1).cast(pl.Float64) ** 2).sqrt().alias("speed"))
    a = a.join_asof(f, left_on="_row", right_on="start").join_asof(s, left_on="frame", right_on="start")
    speed = dict(a.group_by("scene").agg(pl.col("speed").mean()).iter_rows())
    per_scene = scenes.sort("_row").select(pl.col("frame_index_interval").arr.last()
                                           - pl.col("frame_index_interval").arr.first())
    return labels, speed, per_scene.to_series().to_list()


@pytest.mark.parametrize("which", ["real", "synthetic"])
def test_duckdb_and_polars_agree_with_numpy(which, real_scene, data_path, tmp_path):
    path = real_scene if which == "real" else data_path
    export_parquet(path, tmp_path / "pq", workers=2)
    want_labels, want_speed, want_frames = numpy_answers(path)
    for labels, speed, frames in (duckdb_answers(tmp_path / "pq"), polars_answers(tmp_path / "pq")):
        assert labels == want_labels and frames == want_frames
        assert speed.keys() == want_speed.keys()
        for k in speed:
            assert speed[k] == pytest.approx(want_speed[k], rel=1e-6)


@pytest.mark.parametrize("workers", [0, 2])
def test_zarr_parquet_zarr_round_trip(real_scene, data_path, tmp_path, workers):
    for i, path in enumerate([real_scene, data_path]):
        export_parquet(path, tmp_path / f"pq{i}", workers=workers, file_rows=5000)
        meta = pq.read_schema(next((tmp_path / f"pq{i}" / "agents").glob("*.parquet"))).metadata
        assert json.loads(meta[b"zarrfeed.attrs"])["format_version"] == 2
        ingest_parquet(tmp_path / f"pq{i}", tmp_path / f"back{i}.zarr", workers=workers)
        a, b = Dataset.open(path), Dataset.open(tmp_path / f"back{i}.zarr")
        assert b.validate().ok and a.rows == b.rows
        for t in a.tables:
            assert a[t][: a.rows[t]].tobytes() == b[t][:].tobytes()


def break_export(kind, pq_dir):
    f = sorted((pq_dir / "agents").glob("*.parquet"))[0]
    table = pq.read_table(f)
    if kind == "not parquet":
        f.write_bytes(b"this is not parquet")
        return f, None
    if kind == "missing column":
        table = table.drop_columns(["yaw"])
        col = "yaw"
    elif kind == "wrong type":
        i = table.schema.get_field_index("track_id")
        table = table.set_column(i, "track_id", table.column("track_id").cast(pa.float64()))
        col = "track_id"
    else:  # a variable-length list column with one list too long
        i = table.schema.get_field_index("velocity")
        values = [list(v) for v in table.column("velocity").to_pylist()]
        values[3] = values[3] + [0.0]
        table = table.set_column(i, "velocity", pa.array(values, pa.list_(pa.float32())))
        col = "velocity"
    pq.write_table(table, f)
    return f, col


@pytest.mark.parametrize("kind", ["not parquet", "missing column", "wrong type", "list length"])
def test_bad_parquet_is_refused_naming_file_and_column(real_scene, tmp_path, kind):
    export_parquet(real_scene, tmp_path / "pq", workers=0)
    f, col = break_export(kind, tmp_path / "pq")
    with pytest.raises(ValueError) as err:
        ingest_parquet(tmp_path / "pq", tmp_path / "out.zarr")
    msg = str(err.value)
    assert str(f) in msg and "\n" not in msg and (col is None or f"column {col!r}" in msg)
    if kind == "list length":
        assert "row 3 holds a list of 3 values, expected 2" in msg
    assert not (tmp_path / "out.zarr").exists()  # nothing written


def test_cli_export_parquet_and_arrow_stream(real_scene, tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "zarrfeed.cli", *map(str, a)],  # noqa: E731
                                    capture_output=True, timeout=120)
    out = run("export", real_scene, tmp_path / "pq", "--tables", "scenes,frames", "-q")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == ["frames", "scenes"]
    stream = run("export", real_scene, "-", "--format", "arrow", "--tables", "frames")
    assert stream.returncode == 0
    table = pa.ipc.open_stream(stream.stdout).read_all()
    np.testing.assert_array_equal(from_arrow(table), Group.open(DirectoryStore(real_scene))["frames"][:])
    bad = run("export", real_scene, tmp_path / "x", "--tables", "lidar")
    assert bad.returncode == 2 and b"no table 'lidar'" in bad.stderr and b"Traceback" not in bad.stderr
