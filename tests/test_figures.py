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


def test_every_quoted_figure_is_the_recorded_one():
    figures = figures_module()
    assert figures.check() == []
    assert len(figures.quotes()) >= 30  # README, home page and performance page quote them


def test_a_drifted_number_and_an_unknown_marker_are_named(tmp_path, monkeypatch):
    figures = figures_module()
    page = tmp_path / "page.md"
    page.write_text("at 12.5<!--fig:loader.cached_4096--> M rows/s; 3<!--fig:nope-->x\n")
    monkeypatch.setattr(figures, "PAGES", [page])
    monkeypatch.setattr(figures, "ROOT", tmp_path)
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
