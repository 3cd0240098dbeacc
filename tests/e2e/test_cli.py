"""The `zarrfeed` command, run as a real process."""
import json
import os
import re
import shutil
import subprocess
import sys

import numcodecs
import numpy as np
import pytest
from cli_process import zarrfeed
from expected import session, shared_memory_held

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array, Group
from zarrfeed.core.zarr_meta import ArrayMeta


def test_info_table_and_json(real_scene):
    out = zarrfeed("info", real_scene)
    assert out.returncode == 0, out.stderr
    assert "agents" in out.stdout and "20,802" in out.stdout and "centroid <f8(2,)" in out.stdout
    doc = json.loads(zarrfeed("info", real_scene, "--json").stdout)
    assert doc["frames"]["rows"] == 248 and doc["traffic_light_faces"]["rows"] == 3216


@pytest.mark.parametrize("entry", ["python -m zarrfeed", "console script"])
def test_the_entry_points_users_run_keep_the_exit_codes(real_copy, tmp_path, entry):
    """Every CLI test ran `zarrfeed.cli`, so `python -m zarrfeed` exiting 0 whatever happened went
    unseen. The commands users run exit 0 (valid), 1 (invalid) and 2 (unreadable)."""
    from pathlib import Path
    command = [sys.executable, "-m", "zarrfeed"] if entry == "python -m zarrfeed" else \
        [str(Path(sys.executable).parent / "zarrfeed")]

    def run(path) -> int:
        return subprocess.run([*command, "validate", "-q", str(path)], capture_output=True, text=True,
                              timeout=120).returncode

    assert run(real_copy) == 0
    assert run(tmp_path / "missing.zarr") == 2
    frames = Array.open(DirectoryStore(real_copy), "frames")
    row = frames[10]
    row["agent_index_interval"][0] -= 1
    frames[10] = row
    assert run(real_copy) == 1


def test_validate_exit_codes(real_copy, tmp_path):
    ok = zarrfeed("validate", "-q", real_copy)
    assert ok.returncode == 0 and "valid" in ok.stdout
    frames = Array.open(DirectoryStore(real_copy), "frames")
    row = frames[10]
    row["agent_index_interval"][0] -= 1
    frames[10] = row
    bad = zarrfeed("validate", "-q", real_copy)
    assert bad.returncode == 1
    assert "INVALID" in bad.stdout and "frames.agent_index_interval row 10" in bad.stdout


@pytest.mark.parametrize("breakage", ["missing", "not_zarr", "wrong_dtype", "truncated"])
def test_unreadable_input_exits_2_with_one_line_and_no_traceback(real_copy, tmp_path, breakage):
    path = real_copy
    if breakage == "missing":
        path = tmp_path / "nope"
    elif breakage == "not_zarr":
        path = tmp_path
    elif breakage == "wrong_dtype":
        shutil.rmtree(real_copy / "frames")
        shutil.copytree(real_copy / "scenes", real_copy / "frames")
    else:
        chunk = real_copy / "agents" / "0"
        chunk.write_bytes(chunk.read_bytes()[:100])
    if breakage == "truncated":  # a dataset, and an invalid one: validate names the chunk, exit 1
        out = zarrfeed("validate", "-q", path)
        assert out.returncode == 1 and "INVALID" in out.stdout, out
        assert "chunk 'agents/0' cannot be decoded" in out.stdout and "Traceback" not in out.stderr, out
        return
    for cmd in (["validate", "-q"], ["info"]):
        out = zarrfeed(*cmd, path)
        assert out.returncode == 2, out
        assert out.stderr.startswith("zarrfeed: error: ") and out.stderr.count("\n") == 1
        assert "Traceback" not in out.stderr


def test_demo_writes_describes_and_validates(tmp_path):
    out = zarrfeed("demo", "--scenes", "3", "--out", tmp_path / "demo.zarr")
    assert out.returncode == 0, out.stderr
    assert "wrote 3 episodes" in out.stdout and "valid (3 scenes, 744 frames" in out.stdout
    assert "with 2 writer processes" in out.stdout and out.stderr == ""  # progress bars only on a terminal
    assert "in shuffled batches of 4096 with 2 loader workers" in out.stdout
    assert Group.open(DirectoryStore(tmp_path / "demo.zarr"))["scenes"].shape == (3,)


def test_ingest_from_real_scene_reproduces_it(real_scene, tmp_path):
    out = zarrfeed("ingest", tmp_path / "copy.zarr", "--from", real_scene, "--workers", "2", "--chunks",
                   "agents=5000")
    assert out.returncode == 0, out.stderr
    a, b = Group.open(DirectoryStore(real_scene)), Group.open(DirectoryStore(tmp_path / "copy.zarr"))
    assert b["agents"].chunks == (5000,)
    for name in a.array_keys():
        assert (a[name][:] == b[name][:]).all()
    assert zarrfeed("validate", "-q", tmp_path / "copy.zarr").returncode == 0


def test_ingest_refuses_to_overwrite_and_resumes(tmp_path):
    assert zarrfeed("ingest", tmp_path / "d.zarr", "--synthetic", "2", "-q").returncode == 0
    again = zarrfeed("ingest", tmp_path / "d.zarr", "--synthetic", "2", "-q")
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
    # what to type here, not Python's keywords
    assert "(--append)" in again.stderr and "(--resume)" in again.stderr and "(--overwrite)" in again.stderr
    assert "mode=" not in again.stderr and "=True" not in again.stderr
    resumed = zarrfeed("ingest", tmp_path / "d.zarr", "--synthetic", "3", "--resume", "-q")
    assert resumed.returncode == 0 and "wrote 1 episode (" in resumed.stdout


def test_load_prints_a_summary(real_scene):
    out = zarrfeed("load", real_scene, "--table", "agents", "--batch-size", "1000", "--epochs", "2", "-q")
    assert out.returncode == 0, out.stderr
    assert "loaded 41,604 rows of agents in 42 shuffled batches of 1000 over 2 epochs" in out.stdout
    # the start-up said apart from the speed after it (on a small dataset it is most of the time)
    assert re.search(r"the first batch after \d+ ms \(start-up\), then [\d,]+ rows/s, [\d.]+ [kMG]?B/s$",
                     out.stdout.strip()), out.stdout
    bad = zarrfeed("load", real_scene, "--table", "lidar")
    assert bad.returncode == 2 and "table 'lidar' is not in" in bad.stderr


def test_ctrl_c_keeps_what_is_committed_and_resume_finishes(tmp_path):
    import signal
    import time
    out = tmp_path / "d.zarr"
    child = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "ingest", str(out), "--synthetic", "400", "-q"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # interrupt once something is committed
        try:
            if json.loads((out / "zarrfeed.json").read_text())["committed"]["scenes"] > 0:
                break
        except (FileNotFoundError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 130 and "--resume" in err
    assert re.search(r"interrupted; committed [0-9,]+ scenes?, [0-9,]+ frames?, ", err), err  # words, not a dict
    assert "Traceback" not in err
    deadline = time.monotonic() + 10  # its workers go with it: none of its processes holds zarrfeed's shared memory
    while shared_memory_held(session(child.pid)) and time.monotonic() < deadline:  # (its own: other jobs may run)
        time.sleep(0.1)
    assert shared_memory_held(session(child.pid)) == []
    done = zarrfeed("ingest", out, "--synthetic", "400", "--resume", "-q")
    assert done.returncode == 0, done.stderr
    ok = zarrfeed("validate", "-q", out)
    assert ok.returncode == 0 and "400 scenes" in ok.stdout


IMPORT_INTERRUPTED = """
import builtins, os, signal, sys
real = builtins.__import__

def interrupting(name, *args, **kwargs):  # Ctrl+C exactly while the command imports numpy
    if name == "numpy" and "numpy" not in sys.modules:
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *args, **kwargs)

builtins.__import__ = interrupting
sys.argv = ["zarrfeed", "info", {path!r}]
from zarrfeed.cli import main  # as the console script does
sys.exit(main())
"""


def test_ctrl_c_while_the_command_imports_is_one_line_and_exit_130(real_scene):
    """A Ctrl+C in the command's first half second (numpy, zarr and pyarrow being imported, by
    `from zarrfeed.cli import main` itself) printed KeyboardInterrupt's traceback through importlib."""
    out = subprocess.run([sys.executable, "-c", IMPORT_INTERRUPTED.format(path=str(real_scene))],
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stderr) == (130, "zarrfeed: interrupted\n"), out.stderr


@pytest.mark.parametrize("command", ["load", "mask"])
def test_ctrl_c_to_every_process_while_workers_start_is_one_line_and_exit_130(request, tmp_path, command):
    """A terminal's Ctrl+C reaches every process of the command (a process group), and a fork server
    or worker still importing its modules printed a KeyboardInterrupt traceback of its own. Sent at moments
    from the first process the command starts to well after, to the whole group; each run exits 130 with one
    line (or 0, having finished first), and leaves no process behind."""
    import contextlib
    import signal
    import time
    if command == "load":  # epochs no machine gets through: every Ctrl+C comes while it runs (a fast
        # machine loaded 500 epochs of this scene in about a second, and the last try finished first)
        args = ["load", request.getfixturevalue("real_scene"), "--epochs", str(10**9), "--workers", "2", "-q"]
    else:
        data = tmp_path / "d.zarr"
        assert zarrfeed("ingest", data, "--synthetic", 12, "--workers", 0, "-q").returncode == 0
        args = ["mask", data, "--workers", "2"]
    interrupted = 0
    for delay in (0.0, 0.1, 0.2, 0.3, 0.5, 0.8):
        child = subprocess.Popen([sys.executable, "-m", "zarrfeed", *map(str, args)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while len(session(child.pid)) < 2 and child.poll() is None:  # its first helper process started
                assert time.monotonic() < deadline, "the command started no process"
                time.sleep(0.01)
            time.sleep(delay)
            try:
                os.killpg(child.pid, signal.SIGINT)
            except ProcessLookupError:  # it finished
                pass
            _, err = child.communicate(timeout=60)
            # never -SIGINT: a Ctrl+C as the process exits, its command done, keeps the command's code (see
            # test_ctrl_c_while_the_process_exits_keeps_the_exit_code)
            assert "Traceback" not in err and child.returncode in (0, 130), (delay, child.returncode, err)
            if child.returncode == 130:
                interrupted += 1
                assert err.splitlines()[-1] == "zarrfeed: interrupted", (delay, err)
            deadline = time.monotonic() + 10
            while session(child.pid) and time.monotonic() < deadline:  # its workers and fork servers go too
                time.sleep(0.1)
            assert session(child.pid) == [], (delay, session(child.pid))
        finally:  # a check that failed leaves nothing running (the load would go on for ever)
            for pid in session(child.pid):  # the command's own processes
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if child.poll() is None:
                child.kill()
            child.communicate()
    assert interrupted >= (6 if command == "load" else 1)


EXITING = """
import os, sys, threading, time

class Late:  # freed as Python tears the interpreter down, once it has dropped its signal handlers
    def __del__(self, write=os.write, sleep=time.sleep):
        write(1, b"tearing down\\n")
        sleep(2)

if {where!r} == "teardown":
    late = Late()
else:  # Python's exit waits for this thread (not a daemon) before the atexit functions and the teardown
    def wait_for_exit():
        threading.main_thread().join()  # the main thread is done: Python's exit has begun
        os.write(1, b"waiting for a thread\\n")
        time.sleep(3600)
    threading.Thread(target=wait_for_exit).start()
sys.argv = ["zarrfeed", "info", {path!r}]
from zarrfeed.cli import main  # as the console script does
sys.exit(main())
"""


@pytest.mark.parametrize("where", ["teardown", "thread"])
def test_ctrl_c_while_the_process_exits_keeps_the_exit_code(tmp_path, where):
    """A Ctrl+C that came once the command was done, as Python tore the interpreter down, killed
    the process by SIGINT, silently (returncode -2; seen for `mask` under load): Python puts back the signal's
    default action before it frees the last objects and the modules. And one while Python's exit waited for a
    thread printed a KeyboardInterrupt traceback. The command is done: its exit code stands, at once."""
    import signal
    data = tmp_path / "d.zarr"
    assert zarrfeed("ingest", data, "--synthetic", 1, "--workers", 0, "-q").returncode == 0
    proc = subprocess.Popen([sys.executable, "-c", EXITING.format(where=where, path=str(data))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        while not lines or lines[-1] not in ("tearing down\n", "waiting for a thread\n"):
            lines.append(proc.stdout.readline())
            assert lines[-1], (lines, proc.wait(), proc.stderr.read())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert (proc.returncode, err) == (0, ""), (proc.returncode, err)


STUCK_AT_EXIT = """
import threading, time
threading.Thread(target=time.sleep, args=(3600,), name="a transform module's own thread").start()  # not a daemon

def speed(batch):
    return {"speed": batch["yaw"]}
"""
STUCK_IN_STOP = """
import time
from zarrfeed.flight.server import FeedServer
FeedServer.close_writer = lambda self: time.sleep(3600)  # a store that never answers the last commit

def speed(batch):
    return {"speed": batch["yaw"]}
"""


@pytest.mark.parametrize("stuck", ["at exit", "in stop"])
def test_serve_never_ignores_sigterm(tmp_path, stuck):
    """`zarrfeed serve` ignored two SIGTERMs for 10 minutes. Its handler only set an event, and stayed
    installed while Python's exit waited for a thread that never ended (an upload call, a thread of a
    --transforms module): every later SIGTERM went to it. A stopped server exits once its stop is done, and a
    second SIGTERM ends a stop that cannot finish."""
    import signal
    import time
    data = tmp_path / "d.zarr"
    assert zarrfeed("ingest", data, "--synthetic", 1, "--workers", 0, "-q").returncode == 0
    module = tmp_path / "stuck.py"
    module.write_text(STUCK_AT_EXIT if stuck == "at exit" else STUCK_IN_STOP)
    proc = subprocess.Popen([sys.executable, "-m", "zarrfeed", "serve", str(data), "--port", "0", "--ingest",
                             "--transforms", str(module)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().startswith("serving on grpc://127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        if stuck == "in stop":
            with pytest.raises(subprocess.TimeoutExpired):  # the stop waits for the store (as it must, a while)
                proc.wait(timeout=2)
            proc.send_signal(signal.SIGTERM)  # the second one ends it at once
            assert proc.wait(timeout=30) == -signal.SIGTERM
        else:
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0 and err.splitlines()[-1] == "zarrfeed: server stopped", err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 10
    while session(proc.pid) and time.monotonic() < deadline:  # its workers and fork server go too
        time.sleep(0.1)
    assert session(proc.pid) == []


@pytest.fixture
def corrupt(tmp_path):
    """A dataset whose first agents chunk is garbage (the other tables are fine)."""
    path = tmp_path / "corrupt.zarr"
    assert zarrfeed("ingest", path, "--synthetic", 2, "--workers", 0, "-q").returncode == 0
    (path / "agents" / "0").write_bytes(b"garbage")
    return path


def one_line_error(out, *needles):
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zarrfeed: error: "), out.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_export_of_a_corrupt_chunk_is_one_line_and_leaves_nothing(corrupt, tmp_path, workers):
    out = zarrfeed("export", corrupt, tmp_path / "pq", "--workers", workers, "-q")
    one_line_error(out, "table 'agents': chunk 'agents/0' ", "is not the chunk that was committed")  # checked first
    out = zarrfeed("export", corrupt, tmp_path / "pq", "--workers", workers, "--no-verify", "-q")
    one_line_error(out, "table 'agents': chunk 'agents/0' cannot be decoded")  # unchecked: the decoder refuses it
    assert not (tmp_path / "pq").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_ingest_from_a_corrupt_dataset_is_one_line_and_leaves_nothing(corrupt, tmp_path, workers):
    out = zarrfeed("ingest", tmp_path / "copy.zarr", "--from", corrupt, "--workers", workers, "-q")
    one_line_error(out, f"table 'agents': chunk 'agents/0' of {corrupt} is not the chunk that was committed")
    assert not (tmp_path / "copy.zarr").exists()
    (tmp_path / "empty").mkdir()  # a directory that was there stays, empty
    out = zarrfeed("ingest", tmp_path / "empty", "--from", corrupt, "--workers", workers, "-q")
    one_line_error(out, "chunk 'agents/0'")
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_reader_that_leaves_stops_the_output_quietly(real_scene):
    """`zarrfeed ... | head`: no "Broken pipe" message, the exit status of a process stopped by SIGPIPE."""
    cmd = f"{sys.executable} -m zarrfeed.cli export {real_scene} - --format arrow -q | head -c 100 > /dev/null; " \
          "exit ${PIPESTATUS[0]}"
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert out.returncode == 141 and out.stderr == ""


def test_an_unwritable_output_is_one_line(tmp_path):
    """A read-only file system (a read-only bind mount: real EROFS, even for root)."""
    src, ro, good = tmp_path / "src", tmp_path / "ro", tmp_path / "good.zarr"
    src.mkdir()
    ro.mkdir()
    assert zarrfeed("ingest", good, "--synthetic", 1, "--workers", 0, "-q").returncode == 0
    if subprocess.run(["mount", "--bind", src, ro], capture_output=True).returncode != 0:
        pytest.skip("no permission to mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", ro], capture_output=True).returncode != 0:
            pytest.skip("no permission to remount read-only here")
        for target in (ro / "new.zarr", ro):
            one_line_error(zarrfeed("ingest", target, "--synthetic", 1, "-q"), "(a read-only file system: ")
            one_line_error(zarrfeed("export", good, target, "-q"), "(a read-only file system: ")
    finally:
        subprocess.run(["umount", ro], capture_output=True)


def test_arrays_that_are_not_tables_are_skipped_with_one_warning_and_listed_by_validate(tmp_path):
    path = tmp_path / "d.zarr"
    assert zarrfeed("ingest", path, "--synthetic", 1, "--workers", 0, "-q").returncode == 0
    # a user's array, as zarr 2's create_dataset(data=...) writes it (its default chunks, compressor, fill value)
    blosc = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)
    mine = Group.open(DirectoryStore(path)).create_array("my_mask", ArrayMeta.new((5, 3), 5, np.float32, blosc,
                                                                                  fill_value=0.0))
    mine[:] = np.ones((5, 3), np.float32)
    for command in (["info"], ["load", "--table", "agents", "--workers", 0, "-q"], ["export", tmp_path / "pq", "-q"]):
        out = zarrfeed(command[0], path, *command[1:])
        assert out.returncode == 0, out.stderr
        warnings = [line for line in out.stderr.splitlines() if "my_mask" in line]
        assert len(warnings) == 1 and "not reading 'my_mask' (a 2-D array of <f4)" in warnings[0]
    out = zarrfeed("validate", path, "-q")
    assert out.returncode == 0 and "valid (1 scene, 248 frames" in out.stdout
    assert "not checked: 'my_mask' (a 2-D array of <f4) (not tables of this dataset)" in out.stdout
    out = zarrfeed("ingest", path, "--synthetic", 1, "--seed", 1, "--append", "--workers", 0, "-q")
    assert out.returncode == 0, out.stderr
    assert Group.open(DirectoryStore(path))["my_mask"].shape == (5, 3)  # left as it was


def test_cli_niceties(tmp_path):
    path = tmp_path / "d.zarr"
    out = zarrfeed("ingest", path, "--synthetic", 1, "--workers", 0)  # no -q: stderr is not a terminal
    assert out.returncode == 0 and out.stderr == ""  # so no progress bar
    assert out.stdout.startswith("wrote 1 episode (1 scene, 248 frames,")
    helptext = " ".join(zarrfeed("ingest", "--help").stdout.split())
    assert "(0: write in this process) (default: 2)" in helptext
    assert "seed of the synthetic scenes (default: 0)" in helptext  # a default of 0 is shown too
    out = zarrfeed("load", path, "--workers", 64, "-q")
    assert out.returncode == 0 and "--workers 64 is more than the" in out.stderr
    import zipfile
    with zipfile.ZipFile(tmp_path / "nested.zip", "w") as z:
        for f in path.rglob("*"):
            z.write(f, f.relative_to(tmp_path))
    one_line_error(zarrfeed("info", tmp_path / "nested.zip"), "the dataset is in the folder 'd.zarr' inside the zip")
    one_line_error(zarrfeed("info", f"file://{tmp_path}/missing.zarr"), "no such file or directory")


def test_interrupted_is_the_last_line_after_what_the_interrupted_frames_held(monkeypatch, capsys):
    """A progress bar interrupted while it was being made is closed only when its frame is collected, and
    wrote its last output after "zarrfeed: interrupted" (seen once as a failure of the Ctrl+C test above)."""
    from zarrfeed.cli import main
    from zarrfeed.commands import info

    class Bar:
        def __del__(self):
            sys.stderr.write("\r(a progress bar's last output)\n")

    def interrupted_command(args):
        bar = Bar()  # noqa: F841 (held by this frame until the exception is gone)
        raise KeyboardInterrupt

    monkeypatch.setattr(info, "run", interrupted_command)
    assert main(["info", "anything"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "zarrfeed: interrupted"


def test_a_misspelt_flag_is_named_under_the_commands_usage_with_the_close_one(tmp_path):
    """`--synthtic 2` was reported only as "one of --synthetic --from is required", and an
    unknown flag after a command printed the top-level usage."""
    r = zarrfeed("ingest", tmp_path / "d.zarr", "--synthtic", "2")
    assert r.returncode == 2 and r.stderr.startswith("usage: zarrfeed ingest ")
    assert r.stderr.strip().splitlines()[-1] == ("zarrfeed ingest: error: unrecognized argument --synthtic; did you "
                                                 "mean --synthetic?")
    r = zarrfeed("load", tmp_path / "d.zarr", "--batch_size=8")
    assert r.returncode == 2 and r.stderr.startswith("usage: zarrfeed load ")
    assert "unrecognized argument --batch_size; did you mean --batch-size?" in r.stderr
    r = zarrfeed("info", tmp_path / "d.zarr", "surplus")
    assert r.returncode == 2 and r.stderr.startswith("usage: zarrfeed info ") and "surplus" in r.stderr
    assert not (tmp_path / "d.zarr").exists()
    # abbreviations argparse accepts still work, and so do values that start with a dash
    assert zarrfeed("ingest", tmp_path / "d.zarr", "--synth", "1", "--work", "0", "-q").returncode == 0
    r = zarrfeed("mask", tmp_path / "d.zarr", "--threshold", "-1", "-q")
    assert "unrecognized" not in r.stderr, r.stderr


@pytest.mark.parametrize("args, said", [
    (["lod"], "zarrfeed: error: no command 'lod'; did you mean load? (commands: demo, ingest, convert, info, "
              "validate, load, export, mask, plot, serve, status)"),
    (["load", "D", "--batch-size", "0"], "zarrfeed load: error: argument --batch-size: expected a number >= 1, got 0"),
    (["ingest", "D", "--synthetic", "1", "--chunks", "agents=0"],
     "zarrfeed ingest: error: argument --chunks: 'agents=0': expected TABLE=ROWS, ROWS a whole number >= 1"),
    (["ingest", "D", "--synthetic", "1", "--chunks", "agents=20000,frames"],
     "zarrfeed ingest: error: argument --chunks: 'frames': expected TABLE=ROWS, ROWS a whole number >= 1"),
    (["ingest", "D", "--synthetic", "1", "--chunks", "nope=10"],
     "zarrfeed: error: --chunks: no table 'nope' in the synthetic scenes (tables: scenes, frames, agents, "
     "traffic_light_faces)"),
    (["ingest", "--synthetic", "1", "--out", "D"],
     "zarrfeed ingest: error: unrecognized argument --out; out is given without a flag: zarrfeed ingest [options] out"),
    (["mask", "D", "--threshold", "2"],
     "zarrfeed mask: error: argument --threshold: expected a number in [0, 1), got 2"),
    (["plot", "D", "--dpi", "0"], "zarrfeed plot: error: argument --dpi: expected a number >= 1, got 0"),
    (["serve", "D", "--metrics-port", "70000"],
     "zarrfeed serve: error: argument --metrics-port: expected a port 0-65535, got 70000"),
    (["load", "D", "--batch-size", "-5"],
     "zarrfeed load: error: argument --batch-size: expected a number >= 1, got -5"),
    (["ingest", "D", "--synthetic", "0"],
     "zarrfeed ingest: error: argument --synthetic: expected a number >= 1, got 0"),
    (["load", "D", "--epochs", "0"], "zarrfeed load: error: argument --epochs: expected a number >= 1, got 0"),
    (["ingest", "D", "--synthetic", "1", "--append", "--chunks", "agents=7"],
     "zarrfeed: error: --chunks: applies to a new dataset; one appended to or resumed keeps its own chunks"),
    (["ingest", "D", "--synthetic", "1", "--chunks", "agents=5,agents=6"],
     "zarrfeed ingest: error: argument --chunks: table 'agents' given twice"),
    (["serve", "D", "--token-file", "nothere"], "zarrfeed serve: error: argument --token-file: no such file: nothere"),
    (["status", "grpc://127.0.0.1:9", "--tls-root-certs", "NOTPEM"],
     "zarrfeed status: error: argument --tls-root-certs: <NOTPEM>: not a PEM file (no -----BEGIN line)"),
    (["demo", "D"], "zarrfeed demo: error: unrecognized arguments: <D>; did you mean --out <D>?"),
    (["plot", "D", "--scene", "0", "--summary"],
     "zarrfeed: error: plot: give one of --scene N (a scene from above) or --summary (the dataset at a glance)"),
])
def test_mistakes_are_said_in_the_command_lines_words(tmp_path, args, said):
    """`load --batch-size 0` said "batch_size must be >= 1", `--chunks agents=0` "chunk_rows",
    `--chunks nope=10` printed a list, `mask --threshold 2` drew its bar before refusing, `zarrfeed lod` got no
    suggestion, `ingest --out D` suggested --quiet. Each is one line in the flags' words, and nothing written."""
    (tmp_path / "notpem").write_text("not a certificate\n")
    named = {"D": str(tmp_path / "d.zarr"), "NOTPEM": str(tmp_path / "notpem")}
    r = zarrfeed(*[named.get(a, a) for a in args])
    for short, path in named.items():
        said = said.replace(f"<{short}>", path)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == said, r.stderr
    assert "Traceback" not in r.stderr and "%" not in r.stderr  # no progress bar was started
    assert not (tmp_path / "d.zarr").exists()


@pytest.mark.parametrize("command", ["ingest", "convert", "load", "mask", "export", "info", "validate", "demo",
                                     "status", "serve", "plot"])
def test_every_data_command_takes_quiet(command):
    """`zarrfeed mask ... -q` was refused while every other data command took it."""
    r = zarrfeed(command, "--help")
    assert r.returncode == 0 and ("-q, --quiet" in r.stdout) == (command not in ("status", "serve", "plot"))


def test_export_refuses_to_write_binary_to_a_terminal(small_dataset, tmp_path):
    """`export ... - --format arrow` wrote the binary stream to a terminal."""
    import pty

    small_dataset = small_dataset(2, 0)

    leader, follower = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "zarrfeed", "export", str(small_dataset), "-", "--format", "arrow",
                            "--tables", "scenes"], stdout=follower, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert r.returncode == 2 and r.stderr.startswith("zarrfeed: error: export to - writes a binary Arrow IPC stream")
    piped = subprocess.run([sys.executable, "-m", "zarrfeed", "export", str(small_dataset), "-", "--format", "arrow",
                            "--tables", "scenes"], capture_output=True, timeout=120)
    import pyarrow as pa

    assert piped.returncode == 0 and pa.ipc.open_stream(piped.stdout).read_all().num_rows > 0


def test_help_and_refusals_a_newcomer_meets(tmp_path):
    """`status --help` cut a sentence, `demo --help` omitted half of what the demo does,
    `demo --out plaindir` announced its work before refusing, `load grpc://` said "Protocol not known"."""
    status = zarrfeed("status", "--help").stdout
    assert "signed the server's certificate" in " ".join(status.split())
    demo = " ".join(zarrfeed("demo", "--help").stdout.split())
    for step in ("ingest", "info", "validate", "shuffled batches", "Parquet", "DuckDB"):
        assert step in demo, step
    plain = tmp_path / "plaindir"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    r = zarrfeed("demo", "--out", plain, "-q")
    assert r.returncode == 2 and r.stdout == "" and "refusing to overwrite it" in r.stderr
    assert (plain / "notes.txt").read_text() == "mine"
    for command in ("load", "export", "validate", "mask"):
        args = [command, "grpc://127.0.0.1:1"] + (["out.parquet"] if command == "export" else [])
        r = zarrfeed(*args, cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "a zarrfeed server, not a dataset's store" in r.stderr and "RemoteLoader" in r.stderr


def test_sizes_are_never_printed_as_zero(small_dataset, tmp_path):
    """A small table's export printed "0 MB of records ... (0 MB/s)"."""
    from zarrfeed.core.sizes import decimal_size

    assert [decimal_size(n) for n in (0, 87, 999, 1000, 12_500, 3.4e8, 2.2e9)] == \
        ["0 B", "87 B", "999 B", "1 kB", "12.5 kB", "340 MB", "2.2 GB"]
    r = zarrfeed("export", small_dataset(1, 3), tmp_path / "out", "--tables", "scenes", "-q")
    assert r.returncode == 0 and " 0 MB" not in r.stdout and re.search(r": \d+ B of records in .* \(\d", r.stdout), \
        r.stdout


@pytest.mark.parametrize("flags, fsyncs", [([], True), (["--no-fsync"], False)])
def test_ingest_fsyncs_its_commits_unless_told_not_to(tmp_path, monkeypatch, capsys, flags, fsyncs):
    """Commits are durable by default; `--no-fsync` (scratch data) writes the same dataset, syncing
    nothing."""
    from zarrfeed.cli import main

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    assert main(["ingest", str(tmp_path / "d.zarr"), "--synthetic", "2", "--workers", "0", "-q", *flags]) == 0
    assert bool(synced) == fsyncs
    from zarrfeed import Dataset

    assert Dataset.open(tmp_path / "d.zarr").validate().ok


def test_the_writers_bar_says_a_slow_rate_in_its_unit(tmp_path, capsys):
    """The ingest bar read "0.00 M rows/s, 0 MB/s" for small or slow ingests."""
    import time

    from zarrfeed.writer import synthetic, write_dataset

    def slowly():
        for episode in synthetic.episodes(3, seed=1, frames=2, agents_per_frame=2):
            time.sleep(0.3)
            yield episode

    write_dataset(tmp_path / "d.zarr", slowly(), progress=True)
    bar = capsys.readouterr().err
    assert re.search(r"[\d,]+ rows/s, [\d.]+ [kM]?B/s", bar) and " 0 MB/s" not in bar and "0.00 M rows/s" not in bar, \
        bar


def test_export_refuses_a_folder_inside_its_dataset_and_a_file(small_dataset, tmp_path):
    """`export D D` wrote part files among the dataset's chunks, with exit 0;
    an output that is a file was a bare "[Errno 20] Not a directory"."""
    path = small_dataset(1, 3)
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    (tmp_path / "a-file").write_text("x")
    for out, said in ((path, "inside the dataset exported"), (path / "agents" / "x", "inside the dataset exported"),
                      (tmp_path / "a-file", "a file; Parquet goes to a folder")):
        r = zarrfeed("export", path, out, "-q")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and said in r.stderr, r.stderr
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before


def test_summaries_go_to_stdout_and_progress_bars_only_to_a_terminal(tmp_path):
    """Every command prints its summary on standard output, and a progress bar only to a terminal (not into a
    redirected stderr)."""
    data = tmp_path / "d.zarr"
    assert zarrfeed("ingest", data, "--synthetic", 3, "--workers", 0, "-q").returncode == 0
    mask = zarrfeed("mask", data, "--workers", 0)  # no -q: stderr is a pipe, not a terminal
    assert mask.returncode == 0, mask.stderr
    assert "agents mask" not in mask.stderr and "agents_mask/0.5" in mask.stdout, (mask.stdout, mask.stderr)
    export = zarrfeed("export", data, tmp_path / "pq", "--workers", 0)
    assert export.returncode == 0, export.stderr
    assert export.stdout.startswith("exported ") and export.stderr == "", (export.stdout, export.stderr)
    arrow = zarrfeed("export", data, tmp_path / "a.arrows", "--format", "arrow", "--tables", "scenes")
    assert arrow.returncode == 0 and arrow.stdout.startswith("wrote 3 rows of scenes"), (arrow.stdout, arrow.stderr)
