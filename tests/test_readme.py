"""The README's Python examples run as written, in order, in a fresh folder (the README stays true); each
block on its own (its own imports), as a reader who copies one would run it."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 6
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, f"README block:\n{block[:60]}", "exec"), {"__name__": "__main__"})
    assert (tmp_path / "scenes.zarr").is_dir() and (tmp_path / "copy.zarr").is_dir()
