"""Ctrl+C while processes start is held until they are started (`_proc.pool.sigint_held`), whichever thread the
kernel gives the signal to: blocking SIGINT in the main thread alone would let the kernel give it to another
thread (a pool's), raise KeyboardInterrupt in the main thread mid-start all the same, and leave a child forked
meanwhile printing the fork server's "EOFError: Ran out of input" traceback."""
import signal
import threading
import time

import pytest

from zarrfeed.core._proc.pool import sigint_held


def test_a_sigint_taken_by_another_thread_is_held_until_the_block_ends():
    go = threading.Event()

    def interrupt():  # started before the block: SIGINT is not blocked in this thread
        go.wait(10)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # delivered to this thread, as the kernel may

    other = threading.Thread(target=interrupt)
    other.start()
    reached = False
    with pytest.raises(KeyboardInterrupt):
        with sigint_held(tracker=False):
            go.set()
            other.join(10)
            for _ in range(20):  # bytecode runs in the main thread: an interrupt not held would be raised here
                time.sleep(0.01)
            reached = True
    assert reached
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
