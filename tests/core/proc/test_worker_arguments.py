"""What a worker is started with travels through the C pickler (multiprocess's dill, a pure-Python pickler, took
58 ms a worker for a LeRobot loader's arguments); what only dill can pickle (a lambda) still travels, and so do
shared memory blocks, whose descriptors pass only while the worker starts."""
import pickle

import numpy as np
import pytest
from zarrfeed.core._proc.pool import WorkerPool, _CPickled, _packed
from zarrfeed.core._proc.shm import SharedBlock

import multiprocess as mp
from pool_echo import Carrier, echo_setup, forward_setup


def test_arguments_the_c_pickler_takes_are_pickled_by_it_and_the_others_left_to_dill():
    loads, (payload,) = _CPickled((1, np.arange(3))).__reduce__()
    assert loads is pickle.loads and isinstance(payload, bytes)
    for arg in ([lambda m: m], [Here()]):  # refused by the C pickler; a reference to the script's __main__
        again, (same,) = _CPickled(arg).__reduce__()
        assert again is not pickle.loads and same is arg
    double_ = double
    assert _packed((double_, 1))[0] is double_ and isinstance(_packed((double_, 1))[1], _CPickled)


class Here:
    """A class that a script would define in `__main__`."""


Here.__module__ = "__main__"


def double(m: int) -> int:
    return 2 * m


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
@pytest.mark.parametrize("make", [double, lambda m: m + 1], ids=["function", "lambda"])
def test_workers_get_their_arguments_with_every_start_method(method, make):
    block = SharedBlock(64)
    block.buf[:1] = b"z"
    pool = WorkerPool(1, echo_setup, (make, block), "echo worker", start_method=method)
    try:
        pool.send(0, 5)
        replies = []
        for _ in range(200):
            replies += pool.poll(0.1)
            if replies:
                break
        assert replies == [(make(5), b"z")]
    finally:
        pool.stop()
        block.close()


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_connection_inside_an_argument_reaches_the_worker_as_a_connection(method):
    """The C pickler alone sent a `multiprocess` connection as its descriptor's number: the worker's sends failed
    (or went to whatever file had that number there)."""
    mine, theirs = mp.Pipe()
    pool = WorkerPool(1, forward_setup, (Carrier(theirs),), "forward worker", start_method=method)
    try:
        pool.send(0, 7)
        assert mine.poll(30), "nothing came through the connection"
        assert mine.recv() == ("forwarded", 7)
    finally:
        pool.stop()
