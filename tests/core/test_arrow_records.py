"""The Arrow type map's rules one by one (zarrfeed/core/arrow_records.py, in this process): columns from the
metadata alone, zero copies of every numeric kind, the exact refusal lines. The round trips are in
loader/test_arrow_bridge.py."""
import numpy as np
import pyarrow as pa
import pytest
from zarrfeed.core.arrow_records import (arrow_schema, column_to_arrow, columns_from_arrow, dtype_of, from_arrow,
                                         records_to_arrow)

DTYPE = np.dtype([("i", "<i4"), ("u", "<u2", (2,)), ("f", "<f8"), ("b", "?", (3,)), ("s", "<U4", (2,)),
                  ("y", "S3")])


def records(n: int) -> np.ndarray:
    rec = np.zeros(n, DTYPE)
    rec["i"] = np.arange(n) - 2
    rec["u"] = np.arange(2 * n).reshape(n, 2)
    rec["f"] = np.arange(n) / 3
    rec["b"] = (np.arange(3 * n).reshape(n, 3) % 2).astype(bool)
    rec["s"] = ("ab", "ÿñ")
    rec["y"] = b"xyz"
    return rec


@pytest.mark.parametrize("n", [0, 1, 5])
def test_records_and_columns_come_back_from_the_metadata_alone(n):
    rec = records(n)
    batch = records_to_arrow(rec)
    assert dtype_of(batch.schema) == DTYPE
    back = from_arrow(batch)
    assert back.dtype == DTYPE and back.tobytes() == rec.tobytes()
    cols = columns_from_arrow(pa.Table.from_batches([batch]))
    assert list(cols) == list(DTYPE.names)
    for name in DTYPE.names:
        assert cols[name].dtype == DTYPE[name].base and cols[name].shape == rec[name].shape
        np.testing.assert_array_equal(cols[name], rec[name])
    assert all(not f.nullable for f in arrow_schema(DTYPE))
    assert dtype_of(pa.schema([])) is None


def test_a_dtype_given_reads_data_without_metadata():
    rec = records(3)
    plain = pa.table({name: records_to_arrow(rec).column(name) for name in DTYPE.names})  # no metadata
    assert dtype_of(plain.schema) is None
    assert from_arrow(plain, DTYPE).tobytes() == rec.tobytes()
    np.testing.assert_array_equal(columns_from_arrow(plain, DTYPE)["s"], rec["s"])
    with pytest.raises(ValueError) as err:
        from_arrow(plain)
    assert str(err.value) == "no numpy dtype given and none in the Arrow metadata"
    with pytest.raises(ValueError) as err:
        from_arrow(plain, where="part-0.parquet")
    assert str(err.value) == "no numpy dtype given and none in the Arrow metadata in part-0.parquet"


@pytest.mark.parametrize("kind", ["<i2", "<u4", "<u8", "<f4"])
def test_native_numeric_columns_are_not_copied(kind):
    col = np.arange(12, dtype=kind).reshape(6, 2)
    arr = column_to_arrow(col, arrow_schema(np.dtype([("x", kind, (2,))])).field("x").type)
    assert arr.values.buffers()[1].address == col.ctypes.data


def test_each_refusal_is_one_exact_line():
    rec = records(4)
    batch = records_to_arrow(rec)

    def refused(data, where="", dtype=None) -> str:
        with pytest.raises(ValueError) as err:
            columns_from_arrow(data, dtype, where)
        return str(err.value)
    assert refused(batch.drop_columns(["f"]), dtype=DTYPE) == "column 'f': missing"
    assert refused(batch.drop_columns(["f"]), "t.parquet", DTYPE) == "column 'f' in t.parquet: missing"
    nulls = pa.table({**{n: batch.column(n) for n in DTYPE.names}, "i": pa.array([1, None, 3, None], pa.int32())})
    assert refused(nulls, dtype=DTYPE) == "column 'i': 2 nulls; records have no nulls"
    long = pa.table({**{n: batch.column(n) for n in DTYPE.names},
                     "s": pa.array([["a", "b"], ["c", "d"], ["e", "fghij"], ["k", "l"]], pa.list_(pa.string(), 2))})
    assert refused(long, dtype=DTYPE) == "column 's': row 2 holds a value longer than 4, the width of <U4"
    wide = pa.table({**{n: batch.column(n) for n in DTYPE.names}, "y": pa.array([b"a", b"b", b"c", b"dddd"])})
    assert refused(wide, dtype=DTYPE) == "column 'y': row 3 holds a value longer than 3, the width of |S3"
    with pytest.raises(TypeError) as err:
        arrow_schema(np.dtype("<i4"))
    assert str(err.value) == "int32 is not a structured dtype"


def test_refusals_without_where_or_dtype_and_of_a_field_with_no_arrow_type():
    rec = records(2)
    batch = records_to_arrow(rec)
    with pytest.raises(ValueError) as err:
        columns_from_arrow(batch.drop_columns(["f"]), DTYPE)
    assert str(err.value) == "column 'f': missing"
    plain = pa.table({"i": pa.array([1, 2], pa.int32())})
    with pytest.raises(ValueError) as err:
        columns_from_arrow(plain, where="t.parquet")
    assert str(err.value) == "no numpy dtype given and none in the Arrow metadata in t.parquet"
    with pytest.raises(TypeError) as err:
        columns_from_arrow(pa.table({"t": pa.array([1, 2], pa.int64())}), np.dtype([("t", "M8[s]")]))
    assert str(err.value) == "field 't': datetime64[s] ('M' kind) has no Arrow mapping"
