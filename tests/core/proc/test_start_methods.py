"""Workers under every start method: they stay while their parent lives (idle or not) and go when it dies.

Under "forkserver" a worker's parent process is the fork server, not the process that started it: workers
that compared os.getppid() with their starter's pid exited after half a second idle ("exited with code 0").
"""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from zarrfeed.loader import Loader, WindowLoader
from zarrfeed.writer import synthetic
from zarrfeed.writer.dataset_writer import DatasetWriter

from expected import running
from zarrfeed.core._proc.pool import context

from repo_paths import ROOT, SUPPORT
METHODS = ["fork", "forkserver", "spawn"]


HINT = "put its top-level code under `if __name__ == \"__main__\":`"


def small(n: int, seed: int = 0) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=20, agents_per_frame=30))


def run_script(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


@pytest.mark.parametrize("method", METHODS)
def test_writer_workers_outlive_an_idle_second(tmp_path, method):
    eps = small(4)
    with DatasetWriter(tmp_path / "d.zarr", workers=2, start_method=method) as w:
        w.ingest(eps[:2])
        time.sleep(1.2)  # idle: workers must not take this for their parent's death
        w.ingest(eps[2:])
    assert w.committed["scenes"] == 4


@pytest.mark.parametrize("method", METHODS)
def test_loader_workers_outlive_an_idle_second(tmp_path, method):
    with DatasetWriter(tmp_path / "d.zarr", workers=0) as w:
        w.ingest(small(3))
    with Loader(tmp_path / "d.zarr", "agents", batch_size=256, num_workers=2, start_method=method) as loader:
        first = sum(len(b["centroid"]) for b in loader)
        time.sleep(1.2)
        assert sum(len(b["centroid"]) for b in loader) == first == w.committed["agents"]
    with WindowLoader(tmp_path / "d.zarr", history=3, future=4, batch_size=16, num_workers=2,
                      start_method=method) as loader:
        first = sum(1 for _ in loader)
        time.sleep(1.2)
        assert sum(1 for _ in loader) == first > 0


def test_forkserver_workers_exit_when_their_parent_is_killed(tmp_path):
    child = subprocess.Popen([sys.executable, str(SUPPORT / "writer_child.py"), str(tmp_path / "d.zarr"), "200", "2",
                              "0.05", "--start-method", "forkserver"], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(x) for x in child.stdout.readline().split()[1:]]
        assert len(workers) == 2
        time.sleep(0.5)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 5
    alive = workers
    while alive and time.monotonic() < deadline:
        alive = running(workers)
        time.sleep(0.1)
    assert not alive, f"workers {alive} outlived their parent"


@pytest.mark.parametrize("method", [None, *METHODS])
@pytest.mark.parametrize("guarded", [True, False])
def test_a_guarded_script_works_and_an_unguarded_one_gets_one_line(tmp_path, method, guarded):
    """A script that starts workers from unguarded top-level code got about a hundred lines
    (multiprocessing's RuntimeError printed by every worker and the fork-server thread, then zarrfeed's hint).
    Under "forkserver" (the default) and "spawn" each worker runs the script again, so it cannot work: the
    workers now leave quietly and the script gets exactly one line saying how to fix it. Under "fork" it works."""
    with DatasetWriter(tmp_path / "d.zarr", workers=0) as w:
        w.ingest(small(1))
    body = (f"with Loader({str(tmp_path / 'd.zarr')!r}, 'agents', batch_size=64, num_workers=2, "
            f"start_method={method!r}, transform=lambda b: {{'x': b['centroid']}}) as l:\n"
            "    print(sum(len(b['x']) for b in l))\n")
    if guarded:
        body = "if __name__ == '__main__':\n" + "".join(f"    {line}\n" for line in body.splitlines())
    script = tmp_path / "script.py"
    script.write_text("from zarrfeed.loader import Loader\n" + body)
    out = run_script(script)
    if guarded or method == "fork":
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(w.committed["agents"])] and out.stderr == ""
    else:
        assert out.returncode == 1 and out.stdout == ""
        assert len(out.stderr.splitlines()) == 1, out.stderr
        assert out.stderr.startswith("zarrfeed.WorkerError: transform probe 0 (pid ")  # the first pool started
        assert f"ran {script} again while starting, as start method '{method or 'forkserver'}' does" in out.stderr
        assert HINT in out.stderr
    assert context(None).get_start_method() == "forkserver"


@pytest.mark.parametrize("method", [None, *METHODS])
def test_an_unguarded_writer_script_gets_one_line_and_leaves_nothing(tmp_path, method):
    """A writer whose workers fail to start gets the same line, and the dataset the run created is removed
    (nothing was written); under "fork" the same script works."""
    target = tmp_path / "w.zarr"
    script = tmp_path / "unguarded_writer.py"
    script.write_text("from zarrfeed.writer import synthetic, write_dataset\n"
                      f"write_dataset({str(target)!r}, synthetic.episodes(3, seed=1, frames=20, agents_per_frame=5), "
                      f"workers=2, start_method={method!r})\n")
    out = run_script(script)
    if method == "fork":
        assert out.returncode == 0 and out.stderr == "" and target.exists()
        return
    assert out.returncode == 1
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("zarrfeed.WorkerError: writer worker") and HINT in out.stderr
    assert not target.exists()


def test_the_fork_server_preloads_every_worker_module_whichever_pool_starts_it():
    """A Loader's workers forked from a server that a writer started imported the loader themselves (40 ms of CPU
    each before the first batch): the preload list names the modules of both, and numpy.random."""
    from multiprocess import forkserver
    from zarrfeed.writer import write_worker

    ctx = context("forkserver", write_worker.setup)  # as a DatasetWriter made first would
    assert ctx.get_start_method() == "forkserver"
    wanted = {"zarrfeed.loader.engine.read_worker", "zarrfeed.loader.kinds.windows", "zarrfeed.writer.write_worker",
              "numpy.random", "numcodecs", "fsspec", "zarrfeed.core.zarr_array"}
    assert wanted <= set(forkserver._forkserver._preload_modules)
