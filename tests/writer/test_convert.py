"""`zarrfeed.convert` and `zarrfeed convert`: a dataset written in the other zarr format, episode by episode
through the writer. v2 -> v3 -> v2 gives the source back (every table's rows byte for byte, its schema, its
attributes, its `.zarray` documents); the command shows a bar on a terminal only, refuses in one line with
nothing written, and a conversion killed mid-way finishes with `--resume`, each episode once."""
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import numcodecs
import numpy as np
import pytest
from cli_process import zarrfeed
from repo_paths import SUPPORT

import zarrfeed as zf
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array, Group
from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, synthetic

CHUNKS = {"agents": 700, "frames": 50, "scenes": 3, "traffic_light_faces": 90}  # last chunks partly filled
SHARD = 300_000  # decoded bytes of a shard: 3 agent chunks (700 rows of 116 bytes), 2 frames chunks, ...


def rows_bytes(path) -> dict[str, bytes]:
    """Every table's committed rows, as bytes."""
    ds = Dataset.open(path)
    return {t: ds.read_rows(t, 0, ds.rows[t]).tobytes() for t in ds.tables}


def v2_documents(path) -> dict[str, dict]:
    """The group's `.zattrs` and every table's `.zarray`, parsed."""
    docs = {".zattrs": json.loads((path / ".zattrs").read_text())}
    for table in Dataset.open(path).tables:
        docs[table] = json.loads((path / table / ".zarray").read_text())
    return docs


def listing(path) -> list[tuple[str, int, int]]:
    """Every file below `path`, with its size and modification time: to tell that nothing changed."""
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*")
                  if p.is_file())


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A v2 dataset of two inputs (the second appended: its first chunks rewritten), small chunks."""
    path = tmp_path_factory.mktemp("source") / "d.zarr"
    with DatasetWriter(path, workers=0, chunks=CHUNKS) as w:
        w.ingest(synthetic.episodes(7, seed=3, frames=40, agents_per_frame=30))
    with DatasetWriter(path, workers=0, mode="a") as w:
        w.ingest(synthetic.episodes(2, seed=4, frames=25, agents_per_frame=20))
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_v2_to_v3_to_v2_gives_the_source_back(source, tmp_path, workers):
    v3, v2 = tmp_path / "v3.zarr", tmp_path / "v2.zarr"
    summary = zf.convert(source, v3, zarr_format=3, shard_bytes=SHARD, workers=workers)
    assert summary["episodes"] == 9 and summary["rows"] == Dataset.open(source).rows
    zf.convert(v3, v2, zarr_format=2, workers=workers)
    # the middle is sharded v3: zarr.json documents only, several shards of several inner chunks
    assert (v3 / "zarr.json").is_file() and not [p for p in v3.rglob(".z*") if p.name != ".zarrfeed.lock"]
    agents = Array.open(DirectoryStore(v3), "agents")
    assert agents.zarr_format == 3 and agents.sharding is not None and agents.chunks == (700,)
    shards = len(list((v3 / "agents" / "c").iterdir()))
    assert agents.meta.shard_rows == 2100 and shards == -(-agents.shape[0] // 2100) > 1
    want = rows_bytes(source)
    assert rows_bytes(v3) == want and rows_bytes(v2) == want
    for path in (v3, v2):
        ds = Dataset.open(path)
        assert ds.schema == Dataset.open(source).schema and ds.schema.to_json() == Dataset.open(source).schema.to_json()
        assert dict(ds.group.attrs.items()) == dict(Dataset.open(source).group.attrs.items())
        assert ds.validate().ok
    assert v2_documents(v2) == v2_documents(source)  # the same arrays, as zarr 2 and L5Kit see them


def test_the_real_scene_comes_back_as_l5kit_wrote_it(real_scene, tmp_path):
    """The real L5Kit scene (written by L5Kit's zarr 2) through v3 and back: the same rows byte for byte and the
    same documents (the scene's `.zattrs`, each table's `.zarray`). L5Kit's numbers on the round trip:
    tests/loader/kinds/test_l5kit_samples.py runs its checks on it too."""
    zf.convert(real_scene, tmp_path / "v3.zarr", workers=0)
    zf.convert(tmp_path / "v3.zarr", tmp_path / "v2.zarr", zarr_format=2, workers=2)
    want = rows_bytes(real_scene)
    assert rows_bytes(tmp_path / "v3.zarr") == want and rows_bytes(tmp_path / "v2.zarr") == want
    assert v2_documents(tmp_path / "v2.zarr") == v2_documents(real_scene)
    group = Group.open(DirectoryStore(tmp_path / "v2.zarr"))
    for name in want:
        np.testing.assert_array_equal(group[name][:], Group.open(DirectoryStore(real_scene))[name][:])


def test_a_replay_buffer_comes_back_too(dp_buffer, tmp_path):
    """Diffusion Policy's buffer (its steps in `data/<key>`, `meta/episode_ends`): the same rows and schema; the
    source's tables read a chunk left out as fill values (another tool wrote it), the copies store every chunk."""
    zf.convert(dp_buffer, tmp_path / "v3.zarr", workers=0)
    zf.convert(tmp_path / "v3.zarr", tmp_path / "v2.zarr", zarr_format=2, workers=0)
    want = rows_bytes(dp_buffer)
    assert rows_bytes(tmp_path / "v3.zarr") == want and rows_bytes(tmp_path / "v2.zarr") == want
    written = Dataset.open(dp_buffer).schema.to_json()
    for table in written["tables"].values():
        assert table.pop("missing_is_fill") is True
    for path in (tmp_path / "v3.zarr", tmp_path / "v2.zarr"):
        ds = Dataset.open(path)
        assert ds.schema.to_json() == written and ds.validate().ok
    assert (tmp_path / "v3.zarr" / "data" / "img" / "zarr.json").is_file()
    assert (tmp_path / "v2.zarr" / "data" / "img" / ".zarray").is_file()


def test_the_command_converts_and_draws_its_bar_on_a_terminal_only(source, tmp_path):
    out = zarrfeed("convert", source, tmp_path / "v3.zarr", "--zarr-format", "3", "--shard-bytes", "300K")
    assert out.returncode == 0 and out.stderr == "", out.stderr  # no terminal: no bar
    assert out.stdout.startswith("wrote 9 episodes (") and "committed: 9 scenes" in out.stdout
    assert rows_bytes(tmp_path / "v3.zarr") == rows_bytes(source)
    assert Array.open(DirectoryStore(tmp_path / "v3.zarr"), "agents").meta.shard_rows == 700 * (300 * 1024 // 81200)
    for quiet in (False, True):
        err = _on_a_terminal("convert", tmp_path / "v3.zarr", tmp_path / f"v2-{quiet}.zarr", "--zarr-format", "2",
                             *(["-q"] if quiet else []))
        assert ("9/9" in err and "episodes" in err) != quiet, err
        assert rows_bytes(tmp_path / f"v2-{quiet}.zarr") == rows_bytes(source)


def _on_a_terminal(*args) -> str:
    """Run `zarrfeed ARGS` with its stderr on a pseudo-terminal of 120 columns; what it wrote there."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # (a new one has 0: no bar)
    got: list[bytes] = []

    def read():
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:  # the other end closed
                return
            if not data:
                return
            got.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        r = subprocess.run([sys.executable, "-m", "zarrfeed", *map(str, args)], stdout=subprocess.PIPE,
                           stderr=follower, text=True, timeout=120)
    finally:
        os.close(follower)
    reader.join(10)
    os.close(leader)
    assert r.returncode == 0, b"".join(got).decode(errors="replace")
    return b"".join(got).decode(errors="replace")


@pytest.fixture
def lz4_source(tmp_path):
    """A v2 dataset compressed with LZ4, for which zarr v3 has no codec."""
    path = tmp_path / "lz4.zarr"
    zf.write_dataset(path, synthetic.episodes(2, frames=20, agents_per_frame=10), compressor=numcodecs.LZ4(),
                     workers=0)
    return path


@pytest.mark.parametrize("case", ["itself", "itself by another name", "not a dataset", "nothing there",
                                  "a dataset there", "shards of v2", "lz4 to v3", "lz4 over a dataset",
                                  "shard size 0", "negative shard size", "shard size not a size", "shard size 3G"])
def test_refusals_are_one_line_exit_2_and_write_nothing(source, lz4_source, tmp_path, case):
    out = tmp_path / "out.zarr"
    if case in ("a dataset there", "lz4 over a dataset"):
        zf.convert(source, out, zarr_format=2, workers=0)
    (tmp_path / "empty").mkdir()
    args, said = {
        "itself": ([source, source], f"zarrfeed: error: {source}: the output is also the input; convert to another "
                   "path"),
        "itself by another name": ([source, f"{source}/../{source.name}/"], f"zarrfeed: error: {source}/../"
                                   f"{source.name}/: the output is also the input"),
        "not a dataset": ([tmp_path / "empty", out], f"zarrfeed: error: {tmp_path / 'empty'}: not a zarr group"),
        "nothing there": ([tmp_path / "nope", out], f"zarrfeed: error: {tmp_path / 'nope'}: no such file or directory"),
        "a dataset there": ([source, out], f"zarrfeed: error: {out}: already exists and is not empty; finish an "
                            "interrupted conversion into it (--resume), or replace it (--overwrite)"),
        "shards of v2": ([source, out, "--zarr-format", "2", "--shard-bytes", "1M"],
                         "zarrfeed: error: --shard-bytes: applies to --zarr-format 3"),
        "lz4 to v3": ([lz4_source, out], "zarrfeed: error: table 'scenes': compressor {'id': 'lz4', 'acceleration': "
                      "1}: zarr v3 has no codec for it (use Blosc, Zstd or GZip)"),
        "lz4 over a dataset": ([lz4_source, out, "--overwrite"], "zarrfeed: error: table 'scenes': compressor "
                               "{'id': 'lz4', 'acceleration': 1}: zarr v3 has no codec for it"),
        "shard size 0": ([source, out, "--shard-bytes", "0"], "zarrfeed convert: error: argument --shard-bytes: a "
                         "size must be at least 1 byte, got '0'"),
        "negative shard size": ([source, out, "--shard-bytes=-5"], "zarrfeed convert: error: argument --shard-bytes: "
                                "a size must be at least 1 byte, got '-5'"),
        "shard size not a size": ([source, out, "--shard-bytes", "12Q"], "zarrfeed convert: error: argument "
                                  "--shard-bytes: not a size: '12Q' (bytes, or with K, M or G)"),
        "shard size 3G": ([source, out, "--shard-bytes", "3G"], "zarrfeed convert: error: argument --shard-bytes: a "
                          "shard holds at most 2G (2,147,483,648 bytes), got '3G'"),
    }[case]
    before = {p: listing(p) for p in (source, lz4_source, tmp_path)}
    r = zarrfeed("convert", *args)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    if lines[0].startswith("usage:"):  # argparse's refusals: its usage, then the one line
        lines = lines[[i for i, line in enumerate(lines) if not line.startswith(" ")][-1]:]
    assert len(lines) == 1 and lines[0].startswith(said), r.stderr
    assert {p: listing(p) for p in before} == before  # nothing written, nothing removed


def test_the_functions_refusals(source, tmp_path):
    """What the command's parser refuses, the function refuses too, in Python's words, nothing written."""
    for kwargs, said in (({"resume": True, "overwrite": True}, "resume=True finishes the conversion at out, "
                          "overwrite=True replaces it: give one"),
                         ({"zarr_format": 2, "shard_bytes": 1 << 20}, "shard_bytes: applies to zarr_format=3"),
                         ({"shard_bytes": 0}, "shard_bytes must be a whole number of bytes from 1 to 2,147,483,648"),
                         ({"shard_bytes": 3 << 30}, "shard_bytes must be a whole number of bytes from 1"),
                         ({"zarr_format": 4}, "zarr_format must be 2 or 3, got 4")):
        with pytest.raises(ValueError, match="^" + re.escape(said)):
            zf.convert(source, tmp_path / "out.zarr", workers=0, **kwargs)
        assert not (tmp_path / "out.zarr").exists()
    zf.convert(source, tmp_path / "out.zarr", workers=0)
    with pytest.raises(ValueError, match="^" + re.escape(f"{tmp_path / 'out.zarr'}: already exists and is not empty; "
                                                         "finish an interrupted conversion into it (resume=True), or "
                                                         "replace it (overwrite=True)")):
        zf.convert(source, tmp_path / "out.zarr", workers=0)


def _committed(path) -> int:
    try:
        return json.loads((path / "zarrfeed.json").read_text())["committed"]["scenes"]
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def test_a_killed_conversion_resumes_to_exact_rows_each_episode_once(tmp_path):
    """`zarrfeed convert` killed (SIGKILL, its workers too) once it has committed some episodes; `--resume`
    writes the rest, each once, and the result is the source row for row. Resuming with another source, or
    into the other format, is refused in one line, with nothing written."""
    source = tmp_path / "src.zarr"
    zf.write_dataset(source, synthetic.episodes(40, seed=8, frames=30, agents_per_frame=20), chunks=CHUNKS, workers=0)
    out = tmp_path / "out.zarr"
    child = subprocess.Popen([sys.executable, str(SUPPORT / "convert_child.py"), "0.1", str(source), str(out),
                              "--shard-bytes", "300K", "--workers", "2", "-q"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while _committed(out) == 0 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.killpg(child.pid, signal.SIGKILL)  # the command and its writer workers
    finally:
        child.wait(30)
    before = _committed(out)
    assert child.returncode == -signal.SIGKILL and 0 < before < 40, (before, child.stderr.read())

    other = tmp_path / "other.zarr"
    zf.write_dataset(other, synthetic.episodes(3, seed=9), workers=0)
    kept = listing(out)
    for args, said in (([other, out, "--resume"], f"zarrfeed: error: {out}: was written from another source "),
                       ([source, out, "--resume", "--zarr-format", "2"], f"zarrfeed: error: {out}: is zarr v3, not "
                        "v2; resume with the format it was converted to (--zarr-format), or replace it (--overwrite)"),
                       ([source, out, "--resume", "--shard-bytes", "1M"], f"zarrfeed: error: {out}: table 'agents' "
                        "has shards of 2,100 rows (--shard-bytes 1048576 makes 8,400); resume with the --shard-bytes "
                        "it was converted with, or replace it (--overwrite)")):
        r = zarrfeed("convert", *args)
        assert r.returncode == 2 and r.stderr.startswith(said) and r.stderr.count("\n") == 1, r.stderr
        assert _committed(out) == before
    assert listing(out) == kept  # the refusals read only: not even the lease was taken

    done = zarrfeed("convert", source, out, "--resume", "--shard-bytes", "300K", "-q")
    assert done.returncode == 0, done.stderr
    assert re.match(rf"wrote {40 - before} episodes? \(", done.stdout), done.stdout  # only those not committed
    assert rows_bytes(out) == rows_bytes(source)  # exact rows: every episode once, in the source's order
    assert Dataset.open(out).validate().ok
    again = zarrfeed("convert", source, out, "--resume", "--shard-bytes", "300K", "-q")
    assert again.returncode == 0 and again.stdout.startswith("nothing to write: every episode of the input is "
                                                             "committed (") and rows_bytes(out) == rows_bytes(source)
