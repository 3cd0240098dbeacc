"""The folders of chunk locks: a writer removes its own when closed; those of writers killed before they could
are removed by the next writer on the machine, and nothing of a live one, so killed writers do not leave
thousands of them in the temporary directory."""
import os
import signal
import subprocess
import sys
import tempfile

from zarrfeed.writer import DatasetWriter, synthetic
from zarrfeed.writer.chunk_locks import PREFIX, private_folder, remove_abandoned

KILLED_WRITER = """
import os, sys, time
from zarrfeed.writer import DatasetWriter
w = DatasetWriter(sys.argv[1], workers=0)
print(w._lock_dir, flush=True)
time.sleep(60)
"""


def test_a_killed_writers_lock_folder_is_removed_by_the_next_writer(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "a.zarr")],
                             stdout=subprocess.PIPE, text=True)
    try:
        folder = child.stdout.readline().strip()
        assert os.path.basename(folder).startswith(f"{PREFIX}{child.pid}-") and os.path.isdir(folder)
        remove_abandoned()
        assert os.path.isdir(folder)  # its writer still runs
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert os.path.isdir(folder)  # killed: nothing removed it
    with DatasetWriter(tmp_path / "b.zarr", workers=0) as w:
        mine = w._lock_dir
        w.submit(synthetic.episode(0))
        assert not os.path.exists(folder) and os.path.isdir(mine)
    assert not os.path.exists(mine)  # closed: its own removed


def test_folders_not_named_after_a_process_are_left_alone():
    other = tempfile.mkdtemp(prefix=PREFIX)  # as an older zarrfeed named them
    digits = tempfile.mkdtemp(prefix=f"{PREFIX}12345678")
    try:
        mine = private_folder()
        assert os.path.isdir(other) and os.path.isdir(digits) and os.path.isdir(mine)
        remove_abandoned()
        assert os.path.isdir(mine)
        os.rmdir(mine)
    finally:
        os.rmdir(other)
        os.rmdir(digits)
