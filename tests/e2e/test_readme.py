"""The README's Python examples run as written, in order, in a fresh folder (the README stays true); each
block on its own (its own imports), saved as a script and run as a reader who copies one would run it (so a
block that starts worker processes must guard its top-level code). The guides' examples run in test_docs.py."""
import re
import subprocess
import sys

from repo_paths import ROOT
README = ROOT / "README.md"


def test_readme_python_blocks_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 1
    for i, block in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(block)
        for run in ("first", "second"):  # a reader runs it again, after an edit: it must not fail then
            r = subprocess.run([sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True,
                               timeout=300)
            assert r.returncode == 0, f"README block {i}, {run} run:\n{block[:200]}\n{r.stderr[-3000:]}"
            assert r.stdout.strip(), f"README block {i} shows nothing"  # a first script shows a result
    assert (tmp_path / "scenes.zarr").is_dir()


def test_readme_links_lead_somewhere():
    """The README is the way into the documentation: every relative link and picture it has exists."""
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert len(local) >= 10
    for target in local:
        assert (README.parent / target).exists(), target
