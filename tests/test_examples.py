"""Examples in examples/ run as documented."""
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


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
