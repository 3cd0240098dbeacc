"""Examples in examples/ run as documented."""
import os
import subprocess
import sys

import pytest

from repo_paths import ROOT
EXAMPLES = ROOT / "examples"


def test_quickstart(tmp_path):
    out = subprocess.run([sys.executable, EXAMPLES / "quickstart.py", tmp_path], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "valid: True" in out.stdout and "[[0, 10], [10, 30], [30, 35]]" in out.stdout


def test_parallel_ingest(tmp_path):
    out = subprocess.run([sys.executable, EXAMPLES / "parallel_ingest.py", tmp_path], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'scenes': 5," in out.stdout and "resumed: 7 episodes written" in out.stdout and "valid: True" in out.stdout


def test_training_loop(tmp_path):
    out = subprocess.run([sys.executable, EXAMPLES / "training_loop.py"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'batch': 3" in out.stdout and "epoch done" in out.stdout and "batches per rank:" in out.stdout


def test_arrow_interop():
    out = subprocess.run([sys.executable, EXAMPLES / "arrow_interop.py"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mean agent speed per scene: [(0," in out.stdout and "agents per label: [(1," in out.stdout


def test_object_store(s3_server):
    out = subprocess.run([sys.executable, EXAMPLES / "object_store.py", s3_server.bucket(), s3_server.endpoint],
                         capture_output=True, text=True, timeout=180,
                         env={**os.environ, **s3_server.env})
    assert out.returncode == 0, out.stderr
    assert "'scenes': 4" in out.stdout and "pinned rows: {'scenes': 2" in out.stdout and "valid: True" in out.stdout
    rows = [line.split()[-1] for line in out.stdout.splitlines() if line.startswith("epoch")]
    assert len(rows) == 2 and rows[0] == rows[1] != "0"


def test_scaling_out(s3_server):
    pytest.importorskip("distributed")
    out = subprocess.run([sys.executable, EXAMPLES / "scaling_out.py", s3_server.bucket(), s3_server.endpoint],
                         capture_output=True, text=True, timeout=240, env={**os.environ, **s3_server.env})
    assert out.returncode == 0, out.stderr
    assert "wrote 24 episodes from 8 sources" in out.stdout and "agents: " in out.stdout


@pytest.mark.parametrize("name", ["object_store.py", "scaling_out.py"])
def test_examples_without_their_arguments_print_their_usage(name):
    """They printed an IndexError traceback."""
    if name == "scaling_out.py":
        pytest.importorskip("distributed")
    out = subprocess.run([sys.executable, EXAMPLES / name], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr == f"usage: python {EXAMPLES / name} s3://BUCKET/PREFIX ENDPOINT_URL" \
        f"{' [SCHEDULER_ADDRESS]' if name == 'scaling_out.py' else ''}\n"
