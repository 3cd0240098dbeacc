"""zarrfeed.loader.shuffle against numpy's own Generator.shuffle: the same order and the same generator state after it,
so the loader's batch order (and saved resume states) do not depend on whether the C extension was built."""
import numpy as np
import pytest
from zarrfeed.loader import shuffle as shuffle_module
from zarrfeed.loader.shuffle import shuffle


def test_the_c_extension_was_built():
    assert shuffle_module._fast is not None  # else every test below compares numpy with itself


@pytest.mark.parametrize("n", [0, 1, 2, 3, 31, 1000, 160_000, 1_000_003])
@pytest.mark.parametrize("seed", [[0, 0, 0], [7, 3, 12], 123456789])
def test_same_order_and_state_as_numpy(n, seed):
    want, got = np.arange(n, dtype=np.int64) * 3 + 5, np.arange(n, dtype=np.int64) * 3 + 5
    a, b = np.random.default_rng(seed), np.random.default_rng(seed)
    a.shuffle(want)
    shuffle(b, got)
    np.testing.assert_array_equal(got, want)
    assert b.bit_generator.state == a.bit_generator.state
    assert b.integers(0, 2**62, 5).tolist() == a.integers(0, 2**62, 5).tolist()  # the stream goes on alike


def test_a_generator_mid_32_bit_pair_continues_alike():
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    a.integers(0, 100, dtype=np.uint32), b.integers(0, 100, dtype=np.uint32)  # has_uint32 is set now
    assert a.bit_generator.state["has_uint32"] == 1
    want, got = np.arange(5000, dtype=np.int64), np.arange(5000, dtype=np.int64)
    a.shuffle(want)
    shuffle(b, got)
    np.testing.assert_array_equal(got, want)
    assert b.bit_generator.state == a.bit_generator.state


@pytest.mark.parametrize("make", [
    lambda: np.arange(100, dtype=np.int32),            # another dtype
    lambda: np.arange(200, dtype=np.int64)[::2],       # not contiguous
    lambda: np.arange(100, dtype=np.int64).reshape(10, 10),  # 2-D: rows are shuffled
], ids=["int32", "strided", "2-D"])
def test_other_arrays_are_shuffled_by_numpy(make):
    want, got = make(), make()
    np.random.default_rng(1).shuffle(want)
    shuffle(np.random.default_rng(1), got)
    np.testing.assert_array_equal(got, want)


def test_other_generators_are_shuffled_by_numpy():
    want, got = np.arange(1000, dtype=np.int64), np.arange(1000, dtype=np.int64)
    np.random.Generator(np.random.Philox(3)).shuffle(want)
    shuffle(np.random.Generator(np.random.Philox(3)), got)
    np.testing.assert_array_equal(got, want)
