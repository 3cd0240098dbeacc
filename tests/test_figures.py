"""Every measured figure the docs quote comes from one place, docs/figures.json (issue 39 item 7): a number
marked in a page is the recorded one, every marker names a figure, every figure is quoted somewhere, and a
bench run's --json output computes the figures its script records (bench/figures.py)."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures_module():
    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def figures_of_page(text, tmp_path, monkeypatch):
    """bench/figures.py reading one page of `text` (in tmp_path) instead of the repository's."""
    figures = figures_module()
    page = tmp_path / "page.md"
    page.write_text(text)
    monkeypatch.setattr(figures, "PAGES", [page])
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    return figures, page


def test_every_quoted_figure_is_the_recorded_one():
    figures = figures_module()
    assert figures.check() == []
    assert len(figures.quotes()) >= 30  # README, home page and performance page quote them


def test_a_drifted_number_and_an_unknown_marker_are_named(tmp_path, monkeypatch):
    figures, page = figures_of_page("at 12.5<!--fig:loader.cached_4096--> M rows/s; 3<!--fig:nope-->x\n", tmp_path,
                                    monkeypatch)
    problems = figures.check()
    value = figures.load()["loader.cached_4096"]["value"]
    assert f"page.md:1: loader.cached_4096 is quoted as 12.5, recorded as {value} (python bench/figures.py sync)" \
        in problems
    assert "page.md:1: no figure 'nope' in docs/figures.json" in problems
    assert any("is quoted in no page" in p for p in problems)
    figures.sync()
    assert page.read_text().startswith(f"at {value}<!--fig:loader.cached_4096--> M rows/s")


def test_a_bench_run_computes_its_figures(tmp_path, monkeypatch):
    figures = figures_module()
    store = tmp_path / "figures.json"
    store.write_text((ROOT / "docs" / "figures.json").read_text())
    monkeypatch.setattr(figures, "FIGURES", store)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"zarrfeed batch 4096": 33.51e6, "(c) decode bound": 30e6, "zarrfeed batch 256": 2e7,
                               "(a) pool batch 256": 2.5e5, "first batches/s 4096": 1 / 0.312}))
    data = json.loads(store.read_text())
    assert figures.computed(data["loader.cached_4096"], json.loads(run.read_text())) == "33.5"
    assert figures.computed(data["loader.cached_4096_vs_decode"], json.loads(run.read_text())) == "1.12"
    assert figures.computed(data["loader.cached_256_vs_pool"], json.loads(run.read_text())) == "80"
    assert figures.computed(data["loader.first_batch_4096"], json.loads(run.read_text())) == "0.31"
    every = {fig["speed"]: 1.0 for fig in data.values()} | {fig.get("over", ""): 1.0 for fig in data.values()}
    run.write_text(json.dumps(every))
    assert set(figures.record("bench_windows.py", run)) == {k for k in data if k.startswith("samples.")}
    assert json.loads(store.read_text())["samples.agents_vs_l5kit"]["value"] == "1"


def test_set_refuses_what_a_page_cannot_quote_and_record_says_what_a_run_misses(tmp_path, monkeypatch):
    """Found by the adversarial pass: `set NAME "~0.2"` then `sync` grew a '~' per sync; `record` of a run
    without the speeds its figures need was a KeyError traceback, and `record bench/bench_loader.py` (a path)
    recorded nothing with exit 0."""
    import subprocess
    import sys

    store = tmp_path / "figures.json"
    store.write_text((ROOT / "docs" / "figures.json").read_text())
    script = ROOT / "bench" / "figures.py"
    figures = figures_module()
    monkeypatch.setattr(figures, "FIGURES", store)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"zarrfeed batch 4096": 1.0}))
    import pytest

    with pytest.raises(SystemExit, match=r"has no '\(a\) pool batch 256'.*run bench_loader.py in full"):
        figures.record("bench/bench_loader.py", run)
    with pytest.raises(SystemExit, match="no figure comes from bench_nothing.py"):
        figures.record("bench_nothing.py", run)
    r = subprocess.run([sys.executable, str(script), "set", "loader.first_batch_256", "~0.2"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 2 and "a figure is a number as a page quotes it" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_marker_in_a_code_block_is_named(tmp_path, monkeypatch):
    figures, _ = figures_of_page("```console\nspeed 12.5<!--fig:loader.cached_4096-->\n```\n", tmp_path, monkeypatch)
    assert any("a marker in a code block" in p for p in figures.check())
