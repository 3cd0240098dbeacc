"""Importing DatasetWriter or the loaders starts the process's fork server in the background (its new
interpreter imports numpy and zarrfeed while the script goes on), once: not again in the fork server or a
worker, which import the same modules, and not in the command line, whose commands mostly make no pool."""
import os
import subprocess
import sys
import textwrap

import pytest

SERVER = "multiprocess.forkserver import main"


def descendants(pid: int) -> list[tuple[int, str]]:
    """The processes under `pid` (from /proc), with their command lines."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                out.append((p, f.read().replace(b"\0", b" ").decode()))
        except OSError:
            continue
        todo.extend(children.get(p, []))
    return out


def run(code: str, tmp_path) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("module", ["zarrfeed.writer.dataset_writer", "zarrfeed.loader"])
def test_importing_a_module_that_makes_pools_starts_one_fork_server(module, tmp_path):
    out = run(f"""
        import os, sys, time
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import {module}
        import multiprocess.forkserver as fs
        print(fs._forkserver._forkserver_pid is not None)
        from zarrfeed.writer import DatasetWriter, synthetic
        with DatasetWriter("d.zarr", workers=2) as w:
            w.ingest(synthetic.episodes(3, seed=1, frames=10, agents_per_frame=5))
            from test_early_fork_server import descendants
            under = [p for p, cmd in descendants(os.getpid()) if "{SERVER}" in cmd]  # (forked workers too)
            mine = [p for p, cmd in descendants(os.getpid()) if "{SERVER}" in cmd
                    and int(open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()]
            print(len(mine), len(under))
        """, tmp_path)
    assert out.split() == ["True", "1", "3"]  # one server, and its two workers


def test_the_command_line_starts_none_for_a_command_without_workers(tmp_path):
    run("""
        from zarrfeed.writer import DatasetWriter, synthetic
        with DatasetWriter("d.zarr", workers=0) as w:
            w.ingest(synthetic.episodes(2, seed=1, frames=10, agents_per_frame=5))
        """, tmp_path)
    out = run("""
        from zarrfeed.cli import main
        assert main(["info", "d.zarr"]) == 0
        import multiprocess.forkserver as fs
        print("server", fs._forkserver._forkserver_pid)
        """, tmp_path)
    assert out.splitlines()[-1] == "server None"


def test_a_worker_of_the_standard_librarys_pools_starts_none(tmp_path):
    """A standard library pool's worker that imports zarrfeed (a data-prep task that opens a dataset) makes no pool
    of ours: it starts no fork server (an interpreter importing numpy, per worker)."""
    (tmp_path / "task.py").write_text(textwrap.dedent("""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        def task(i):
            import zarrfeed.loader
            import multiprocess.forkserver as fs
            return fs._forkserver._forkserver_pid

        if __name__ == "__main__":
            with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as ex:
                print(list(ex.map(task, range(2))))
        """))
    result = subprocess.run([sys.executable, "task.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "[None, None]"


def test_workers_get_the_environment_and_umask_set_after_the_import(tmp_path):
    """The fork server starts when the script imports zarrfeed; what the script sets afterwards (an environment
    variable such as CUDA_VISIBLE_DEVICES or S3 credentials, a private umask) still reaches the workers of a pool
    it starts later, as it did when the server started with the first pool."""
    (tmp_path / "probe_env.py").write_text(textwrap.dedent("""
        import os

        def setup(wid):
            def handle(msg):
                with open("/proc/self/status") as f:
                    umask = next(line.split()[1] for line in f if line.startswith("Umask:"))
                return os.environ.get("ZF_SET_AFTER_IMPORT"), umask
            return handle
        """))
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import os
        import zarrfeed.loader  # starts the fork server, with the environment and umask of now
        import multiprocess.forkserver as fs
        from zarrfeed.core._proc.pool import WorkerPool
        import probe_env

        if __name__ == "__main__":
            assert fs._forkserver._forkserver_pid is not None
            os.environ["ZF_SET_AFTER_IMPORT"] = "yes"
            os.umask(0o077)
            pool = WorkerPool(1, probe_env.setup, (), "probe")
            try:
                pool.send(0, "go")
                replies = []
                for _ in range(120):
                    replies += pool.poll(1.0)
                    if replies:
                        break
                print(replies)
            finally:
                pool.stop()
        """))
    result = subprocess.run([sys.executable, "script.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={**os.environ, "ZF_SET_AFTER_IMPORT": "no"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[('yes', '0077')]"
