"""The numpy gather kernel (for installs without a C compiler) against the C one: same bytes, same errors;
and the loaders give the same batches with either."""
import subprocess
import sys

import numpy as np
import pytest
from zarrfeed.loader import _gather as c
from zarrfeed.loader.engine import gather_numpy as py

from repo_paths import ROOT


def setup(rng):
    dtype = np.dtype([("a", "<i8"), ("b", "<f4", (3,)), ("c", "u1"), ("d", "<f8", (2,))])
    src = np.frombuffer(rng.bytes(dtype.itemsize * 1000), np.uint8).copy()
    fields = [(dtype.fields[n][1], dtype[n].itemsize, 0) for n in dtype.names]
    base, spec = 0, []
    for off, size, _ in fields:
        spec.append((off, size, base))
        base += size * 300
    return dtype, src, np.array(spec, np.int64).reshape(-1), base


def test_gather_and_gather_runs_are_byte_for_byte_equal():
    rng = np.random.default_rng(0)
    dtype, src, spec, out_bytes = setup(rng)
    rows = rng.integers(0, 1000, 200).astype(np.int64)
    outs = [np.zeros(out_bytes, np.uint8) for _ in range(2)]
    for kernel, out in zip((c, py), outs, strict=True):
        kernel.gather(src, dtype.itemsize, rows, out, spec, 7, dtype.itemsize)
    np.testing.assert_array_equal(*outs)
    assert outs[0].any()
    runs = np.array([[5 * dtype.itemsize, 10], [700 * dtype.itemsize, 0], [100 * dtype.itemsize, 90]], np.int64)
    outs = [np.zeros(out_bytes, np.uint8) for _ in range(2)]
    for kernel, out in zip((c, py), outs, strict=True):
        kernel.gather_runs(src, dtype.itemsize, runs.reshape(-1), out, spec, 3)
    np.testing.assert_array_equal(*outs)


@pytest.mark.parametrize("dtype", [
    np.dtype([("a", "<i2"), ("b", "<f4", (17,)), ("c", "u1"), ("d", "<f8", (5,)), ("e", "V3")]),
    np.dtype([("a", "<i8"), ("big", "<f4", (3000,)), ("c", "u1")]),  # rows larger than the C kernel's block
], ids=["odd sizes", "large rows"])
def test_gather_of_any_record_size_matches_numpy(dtype):
    rng = np.random.default_rng(2)
    n_src, n = 300, 77  # not a multiple of the C kernel's block of rows
    src = np.frombuffer(rng.bytes(dtype.itemsize * n_src), np.uint8).copy()
    spec, base = [], 0
    for name in dtype.names:
        spec.append((dtype.fields[name][1], dtype[name].itemsize, base))
        base += dtype[name].itemsize * (n + 5)
    spec_arr = np.array(spec, np.int64).reshape(-1)
    rows = rng.integers(0, n_src, n).astype(np.int64)
    for scale, index in ((dtype.itemsize, rows), (1, rows * dtype.itemsize)):  # row numbers, byte offsets
        outs = [np.zeros(base, np.uint8) for _ in range(2)]
        for kernel, out in zip((c, py), outs, strict=True):
            kernel.gather(src, dtype.itemsize, index, out, spec_arr, 5, scale)
        np.testing.assert_array_equal(*outs)
        first = spec[1][2] + 5 * dtype[1].itemsize  # field 1 of output row 5 is source row rows[0]'s
        start = int(rows[0]) * dtype.itemsize + spec[1][0]
        np.testing.assert_array_equal(outs[0][first:first + dtype[1].itemsize],
                                      src[start:start + dtype[1].itemsize])


@pytest.mark.parametrize("kernel", [c, py], ids=["c", "numpy"])
def test_both_refuse_out_of_bounds(kernel):
    rng = np.random.default_rng(1)
    dtype, src, spec, out_bytes = setup(rng)
    out = np.zeros(out_bytes, np.uint8)
    with pytest.raises(IndexError, match="row 1000 is outside the source"):
        kernel.gather(src, dtype.itemsize, np.array([1, 1000], np.int64), out, spec, 0, dtype.itemsize)
    with pytest.raises(ValueError, match="does not fit"):
        kernel.gather(src, dtype.itemsize, np.arange(10, dtype=np.int64), out, spec, 295, dtype.itemsize)
    with pytest.raises(IndexError, match="a run is outside the source"):
        kernel.gather_runs(src, dtype.itemsize, np.array([999 * dtype.itemsize, 2], np.int64), out, spec, 0)
    assert not out.any()  # nothing written before a refusal


@pytest.mark.parametrize("kernel", [c, py], ids=["c", "numpy"])
def test_both_refuse_index_arrays_that_are_not_int64(kernel):
    """A float64 or int32 index array is refused by its format, not reinterpreted as other row numbers."""
    rng = np.random.default_rng(3)
    dtype, src, spec, out_bytes = setup(rng)
    out = np.zeros(out_bytes, np.uint8)
    for bad in (np.array([1.0, 2.0]), np.array([1, 2, 3, 4], np.int32), np.arange(20, dtype=np.int64)[::2]):
        with pytest.raises((TypeError, ValueError), match="rows must be a C-contiguous int64 array"):
            kernel.gather(src, dtype.itemsize, bad, out, spec, 0, dtype.itemsize)
    with pytest.raises(TypeError, match="fields must be a C-contiguous int64 array"):
        kernel.gather(src, dtype.itemsize, np.array([1], np.int64), out, spec.astype(np.float64), 0, dtype.itemsize)
    with pytest.raises(TypeError, match="fields must be a C-contiguous int64 array of whole groups"):
        kernel.gather(src, dtype.itemsize, np.array([1], np.int64), out, spec[:-1], 0, dtype.itemsize)
    with pytest.raises(TypeError, match="runs must be a C-contiguous int64 array of whole groups"):
        kernel.gather_runs(src, dtype.itemsize, np.array([0, 1, 2], np.int64), out, spec, 0)
    with pytest.raises(TypeError, match="runs must be a C-contiguous int64 array"):
        kernel.gather_runs(src, dtype.itemsize, np.array([0.0, 1.0]), out, spec, 0)
    assert not out.any()


def test_loaders_give_the_same_batches_with_the_numpy_kernel(tmp_path):
    script = f"""
import hashlib, numpy as np
from zarrfeed.loader import Loader, WindowLoader
from zarrfeed.loader.engine import gather
from zarrfeed.writer import synthetic, write_dataset
if __name__ == "__main__":
    import os
    path = {str(tmp_path / 'd.zarr')!r}
    if not os.path.exists(path):
        write_dataset(path, synthetic.episodes(2, seed=5, frames=40, agents_per_frame=30), workers=0)
    h = hashlib.sha256()
    with Loader(path, batch_size=100, num_workers=1, seed=3) as loader:
        for b in loader:
            for v in b.values(): h.update(np.ascontiguousarray(v).tobytes())
    with WindowLoader(path, history=2, future=3, batch_size=8, num_workers=1) as loader:
        for b in loader:
            for v in b.values(): h.update(np.ascontiguousarray(v).tobytes())
    print(gather.KERNEL, h.hexdigest())
"""
    runs = {}
    for env in ("c", "numpy"):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                             cwd=ROOT, env={"ZARRFEED_GATHER": env, "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        kernel, digest = out.stdout.split()
        runs[kernel] = digest
    assert set(runs) == {"c", "numpy"} and runs["c"] == runs["numpy"]


def outcome(kernel, name, *args):
    """What a kernel call does: the error (type and message) or the output bytes."""
    out = args[3]
    try:
        getattr(kernel, name)(*args)
    except Exception as e:  # noqa: BLE001 -- compared as data between the kernels
        return type(e).__name__, str(e), bytes(out)
    return "ok", "", bytes(out)


def test_the_kernels_agree_at_every_bound():
    """Each argument at its bound and one past it, one fault at a time: the numpy kernel refuses exactly what the
    C kernel refuses, with the same error, and writes the same bytes where it accepts (nothing where it refuses)."""
    rng = np.random.default_rng(5)
    row, nsrc = 24, 10
    src = np.frombuffer(rng.bytes(row * nsrc + 5), np.uint8).copy()  # 5 bytes past the last whole row
    fields = [(0, 8, 0), (8, 4, 8 * 12), (12, 12, 8 * 12 + 4 * 12)]  # output room for 12 rows of each field
    out_len = 8 * 12 + 4 * 12 + 12 * 12

    def spec(fs):
        return np.array(fs, np.int64).reshape(-1)

    def rows(*r):
        return np.array(r, np.int64)

    last = (src.nbytes - row) // row  # the last row whose record fits (9; row 10 would be 5 bytes)
    gathers = [
        (row, rows(0, 3, last), spec(fields), 0, row), (row, rows(last + 1), spec(fields), 0, row),
        (row, rows(-1), spec(fields), 0, row), (row, rows(), spec(fields), 12, row),
        (row, rows(0, 1, 2, 3), spec(fields), 8, row), (row, rows(0, 1, 2, 3), spec(fields), 9, row),  # 12, 13 rows
        (row, rows(1), spec(fields), -1, row), (0, rows(1), spec(fields), 0, row), (-3, rows(1), spec(fields), 0, row),
        (row, rows(1), spec(fields), 0, 0), (row, rows(1), spec(fields), 0, -1),
        (row, rows(src.nbytes - row), spec(fields), 0, 1), (row, rows(src.nbytes - row + 1), spec(fields), 0, 1),
        (row, rows(7, 2), spec([(12, 12, 0)]), 0, row), (row, rows(7, 2), spec([(13, 12, 0)]), 0, row),
        (row, rows(7, 2), spec([(-1, 4, 0)]), 0, row), (row, rows(7, 2), spec([(0, -1, 0)]), 0, row),
        (row, rows(7, 2), spec([(0, 4, -1)]), 0, row), (row, rows(7, 2), spec([(0, 4, out_len - 8)]), 0, row),
        (row, rows(7, 2), spec([(0, 4, out_len - 7)]), 0, row), (row, rows(7, 2), spec([]), 0, row),
        (row, rows(7, 2), spec([(0, 0, out_len)]), 3, row), (row, rows(7, 2), spec([(0, 0, out_len + 1)]), 3, row),
    ]
    for r_bytes, r, f, first, scale in gathers:
        got = [outcome(k, "gather", src, r_bytes, r, np.zeros(out_len, np.uint8), f, first, scale) for k in (c, py)]
        assert got[0] == got[1], (r_bytes, r, f, first, scale)
    end = src.nbytes
    runs = [
        rows(0, 3, row * 7, 2), rows(end - 2 * row, 2), rows(end - 2 * row + 1, 2), rows(-1, 1), rows(0, -1),
        rows(end, 0), rows(end + 1, 0), rows(5, 3, 0, 0, 40, 7),
        rows(0, 10, 0, 2), rows(0, 10, 0, 3), rows(3, 1),  # 12 and 13 rows; a run need not start on a record
    ]
    for first in (0, 1, -1):
        for run in runs:
            for r_bytes in (row, 0, -1):
                got = [outcome(k, "gather_runs", src, r_bytes, run, np.zeros(out_len, np.uint8), spec(fields), first)
                       for k in (c, py)]
                assert got[0] == got[1], (r_bytes, run, first)
    accepted = [outcome(py, "gather", src, row, rows(0, 3, last), np.zeros(out_len, np.uint8), spec(fields), 0, row),
                outcome(py, "gather_runs", src, row, rows(0, 10, 0, 2), np.zeros(out_len, np.uint8), spec(fields), 0)]
    assert all(kind == "ok" and any(data) for kind, _, data in accepted)  # the cases compare real copies


def test_the_kernels_take_and_refuse_the_same_index_buffers():
    """Index arrays (rows, runs, fields) come as any buffer: int64 in any spelling of its format is taken
    ('l', 'q', '<q' from ctypes); unsigned, big-endian, 4-byte or float buffers are refused with the same
    message by both kernels, naming the call and the argument."""
    import array
    import ctypes

    def c_int64(*values):
        return (ctypes.c_int64 * len(values))(*values)

    src = np.arange(12 * 20, dtype=np.uint8)  # 20 records of 12 bytes: an int32 and a float64
    spec = [(0, 4, 0), (4, 8, 4 * 10)]
    good_fields = np.array(spec, np.int64).reshape(-1)
    spellings = [np.array([3, 1], np.int64), c_int64(3, 1), array.array("q", [3, 1]), array.array("l", [3, 1]),
                 memoryview(np.array([3, 1], np.int64)).cast("B").cast("@q"),
                 array.array("Q", [3, 1]), np.array([3, 1], ">i8"), np.array([3, 1], np.uint64),
                 np.array([3, 1], np.int32), np.array([3.0, 1.0]), np.array([3, 9, 1, 9], np.int64)[::2]]
    taken = 0
    for rows in spellings:
        got = [outcome(k, "gather", src, 12, rows, np.zeros(120, np.uint8), good_fields, 0, 12) for k in (c, py)]
        assert got[0] == got[1], memoryview(rows).format
        taken += got[0][0] == "ok"
        for f in (good_fields, rows):  # as a run (byte 3, one record), and as fields (not whole groups of 3)
            got = [outcome(k, "gather_runs", src, 12, rows, np.zeros(120, np.uint8), f, 0) for k in (c, py)]
            assert got[0] == got[1], memoryview(rows).format
            got = [outcome(k, "gather", src, 12, np.array([1], np.int64), np.zeros(120, np.uint8), f, 0, 12)
                   for k in (c, py)]
            assert got[0] == got[1], memoryview(rows).format
    assert taken == 5  # the five spellings of int64
    for row_bytes in (1, 12):  # a record of one byte is a record
        for k_out in [[outcome(k, "gather", src, row_bytes, np.array([5, 0], np.int64), np.zeros(120, np.uint8),
                               np.array([(0, 1, 0)], np.int64).reshape(-1), 0, row_bytes) for k in (c, py)],
                      [outcome(k, "gather_runs", src, row_bytes, np.array([5, 2], np.int64), np.zeros(120, np.uint8),
                               np.array([(0, 1, 0)], np.int64).reshape(-1), 0) for k in (c, py)]]:
            assert k_out[0] == k_out[1] and k_out[0][0] == "ok" and any(k_out[0][2])
