"""Every measured figure the docs quote comes from one place, docs/figures.json: a number marked in a page is the
recorded one, every marker names a figure, every figure is quoted somewhere, a bench run's --json output
computes the figures its script records (bench/figures.py), and every figure's speeds are ones its script
writes."""
import importlib.util
import json
from pathlib import Path

import pytest

from repo_paths import LEROBOT_ROOT, ROOT


def figures_module():
    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def figures_of_copy(tmp_path, monkeypatch):
    """bench/figures.py recording into a copy of docs/figures.json in tmp_path; the module and the copy."""
    figures = figures_module()
    store = tmp_path / "figures.json"
    store.write_text((ROOT / "docs" / "figures.json").read_text())
    monkeypatch.setattr(figures, "FIGURES", store)
    return figures, store


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
    figures, store = figures_of_copy(tmp_path, monkeypatch)
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
    """`set NAME "~0.2"` then `sync` grew a '~' per sync; `record` of a run
    without the speeds its figures need was a KeyError traceback, and `record bench/bench_loader.py` (a path)
    recorded nothing with exit 0."""
    import subprocess
    import sys

    figures, store = figures_of_copy(tmp_path, monkeypatch)
    script = ROOT / "bench" / "figures.py"
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


@pytest.mark.parametrize("page", ["```console\nspeed 12.5<!--fig:loader.cached_4096-->\n```\n",
                                  "~~~\nspeed 12.5<!--fig:loader.cached_4096-->\n~~~\n",
                                  "the speed `12.5<!--fig:loader.cached_4096-->` here\n"])
def test_a_marker_in_a_code_block_is_named(tmp_path, monkeypatch, page):
    """A ~~~ fence and inline code are code too."""
    figures, _ = figures_of_page(page, tmp_path, monkeypatch)
    assert any("a marker in a code block" in p for p in figures.check())


# Every figure's speeds are ones its script's --json really writes (found by running the script, not by reading
# figures.json): scripts that run here in seconds run at their smallest sizes; the others' baselines need
# zarr-python 2 (the test extra holds zarr 3), so their main() runs with its measurements stubbed, down to the
# write_json call, whose keys are then the script's own.
BENCH = ROOT / "bench"
RUN = {  # the smallest sizes at which each runs (all together about 30 s on 2 shared cores)
    "bench_serve.py": ["--scenes", "10", "--repeat", "1"],  # fewer: an ingest of 0 CPU ticks (divides by zero)
    "bench_ranks.py": ["--scenes", "1", "--repeat", "1"],
    "bench_dask.py": ["--scenes", "2", "--sources", "2", "--repeat", "1"],
    "bench_shuffle.py": ["--scenes", "2", "--repeat", "1"],
    "bench_v3.py": ["--scenes", "1", "--repeat", "1"],
    "bench_startup.py": ["--scenes", "1", "--repeat", "1"],  # (3 processes, 2 of them after 1 s of work)
}


class Written(Exception):
    """Raised once a stubbed script's write_json has written: nothing after it is run."""


def _dataset_of(path):
    from contextlib import contextmanager

    @contextmanager
    def synthetic_dataset(scenes):
        yield path

    return synthetic_dataset


def _writer_variant(cmd, **kwargs):
    """bench_writer.py's run of one variant in its own process: a constant measurement of that variant."""
    from types import SimpleNamespace

    variant = cmd[cmd.index("--variant") + 1]
    return SimpleNamespace(stdout=json.dumps({
        "variant": variant, "seconds": 2.0, "steady_seconds": 1.0, "rows": 10, "bytes": 1000, "rss_data_mb": 1.0,
        "rss_peak_mb": 2.0, "worker_rss_peak_mb": 3.0}))


def _stubs(script, module, dataset, tmp_path):
    """What replaces `script`'s measurements (module attributes), and the arguments it needs besides."""
    from types import SimpleNamespace

    import numpy as np

    epochs = {"epoch1": (1.0, 3), "epoch2": (1.0, 4), "ttfb": 0.5}
    return {
        "bench_loader.py": ({
            "synthetic_dataset": _dataset_of(dataset), "zarrfeed": lambda ds, batch, **kw: epochs,
            "pool_baseline": lambda *a: (1.0, 1), "zarr_in_order": lambda *a: (1.0, 2),
            "decode_bound": lambda *a: (1.0, 5), "windows_zarrfeed": lambda *a: (1.0, 6, 7),
            "windows_l5kit": lambda *a: (1.0, 1, 2)}, []),
        "bench_windows.py": ({
            "synthetic_dataset": _dataset_of(dataset), "zarrfeed": lambda *a: epochs,
            "l5kit": lambda *a: (1.0, 1)}, []),
        "bench_writer.py": ({"subprocess": SimpleNamespace(run=_writer_variant)}, ["--out", str(tmp_path)]),
        "bench_episodes.py": ({
            "write_buffer": lambda *a: np.array([30, 60]), "copy_from_path": lambda path: (0.5, {}),
            "check_equal": lambda *a: None, "copy_bound": lambda sample_bytes: 100.0,
            "zarr": SimpleNamespace(open_group=lambda *a, **kw: {
                "data": {k: SimpleNamespace(chunks=(73,)) for k in module.KEYS}}),
            "zarrfeed_epochs": lambda path: epochs, "dp_batches": lambda *a: (1.0, 2)}, []),
        # LeRobot itself is in the bench's environment only: every variant is the golden root (its info.json)
        "bench_lerobot.py": ({
            "make": lambda variant, episodes, out=None: LEROBOT_ROOT, "video_pieces": lambda root: [],
            "timed": lambda *a: (1.0, 2.0), "timed_epoch": lambda *a: (100.0, 120.0, 0.5),
            "decode_bound": lambda *a: 50.0, "zarrfeed_loader_class": lambda: (object, "")}, []),
    }.get(script)


def bench_run(script, args, run, tmp_path, monkeypatch, dataset):
    """`script` run with `args` at its smallest sizes, or its main() with its measurements stubbed: its --json
    output written to `run`."""
    import shlex
    import subprocess
    import sys

    if script in RUN:
        r = subprocess.run([sys.executable, str(BENCH / script), *shlex.split(args), *RUN[script], "--json", str(run)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their `common`
    spec = importlib.util.spec_from_file_location(f"bench_under_test_{Path(script).stem}", BENCH / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stubs = _stubs(script, module, dataset(), tmp_path)
    assert stubs is not None, f"{script} has figures: run it in RUN or stub its measurements in _stubs"
    replace, extra = stubs
    real_write_json = module.write_json

    def write_json(path, speeds):
        real_write_json(path, speeds)
        raise Written

    for name, stub in {**replace, "write_json": write_json}.items():
        assert hasattr(module, name), f"{script} has no {name} to stub any more"
        monkeypatch.setattr(module, name, stub)
    monkeypatch.setattr("sys.argv", [script, *shlex.split(args), "--repeat", "1", *extra, "--json", str(run)])
    with pytest.raises(Written):
        module.main()


def _figure_runs():
    figures = json.loads((ROOT / "docs" / "figures.json").read_text())
    return sorted({(f["script"], f.get("args", "")) for f in figures.values() if "script" in f})


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    made = []

    def dataset():
        if not made:
            from zarrfeed.writer import synthetic, write_dataset

            made.append(tmp_path_factory.mktemp("bench") / "d.zarr")
            write_dataset(made[0], synthetic.episodes(1))
        return made[0]

    return dataset


@pytest.mark.parametrize("script,args", _figure_runs(), ids=lambda v: v or "defaults")
def test_every_figure_names_speeds_its_script_writes(script, args, tmp_path, monkeypatch, small_dataset):
    run = tmp_path / "run.json"
    bench_run(script, args, run, tmp_path, monkeypatch, small_dataset)
    speeds = json.loads(run.read_text())
    assert speeds and all(isinstance(v, (int, float)) and v > 0 for v in speeds.values()), speeds
    figures, store = figures_of_copy(tmp_path, monkeypatch)
    mine = {name for name, f in figures.load().items() if f.get("script") == script and f.get("args", "") == args}
    assert set(figures.record(script, run, args)) == mine  # SystemExit naming a speed the run does not have


def test_record_takes_the_figures_of_the_run_s_arguments(tmp_path, monkeypatch):
    figures, store = figures_of_copy(tmp_path, monkeypatch)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({k: 2.0 for k in ("zarrfeed epoch 2", "zarrfeed epoch 1", "(z) DP from zarr",
                                                "(m) DP in memory", "copy bound, 1 process", "copy_from_path",
                                                "zarrfeed first batch")}))
    before = figures.load()
    changed = figures.record("bench_episodes.py", run, "--image 12")
    assert changed and all(n.startswith("episodes_12.") for n in changed)
    after = figures.load()
    assert all(after[n] == before[n] for n in before if n not in changed)  # the run at defaults' kept
    with pytest.raises(SystemExit, match=r"no figure comes from bench_episodes.py --image 13; its figures' --args: "
                                         r"\(none\), '--image 12'"):
        figures.record("bench_episodes.py", run, "--image 13")


@pytest.mark.parametrize("bad", [float("nan"), -0.2, 0, "12", None, True, float("inf")])
def test_record_refuses_a_speed_that_is_not_a_positive_number(tmp_path, monkeypatch, bad):
    """nan and negative speeds were recorded (then `sync` grew a '-' per run, and
    'nan' broke every marker), a string or null was a TypeError traceback, 0 a ZeroDivisionError."""
    figures, store = figures_of_copy(tmp_path, monkeypatch)
    keys = {k for f in figures.load().values() if f.get("script") == "bench_loader.py" and not f.get("args")
            for k in (f["speed"], f.get("over")) if k}
    run = tmp_path / "run.json"
    run.write_text(json.dumps({**{k: 1e6 for k in keys}, "zarrfeed batch 256": bad}))
    before = store.read_text()
    with pytest.raises(SystemExit, match=r"'zarrfeed batch 256' is .*; a speed is a positive number"):
        figures.record("bench_loader.py", run)
    assert store.read_text() == before


def test_record_takes_args_that_start_with_a_dash(tmp_path, monkeypatch):
    """`record bench_episodes.py run.json --args "--image 12"` was argparse's "expected one argument"."""
    import sys

    figures, _ = figures_of_copy(tmp_path, monkeypatch)
    called = []
    monkeypatch.setattr(figures, "record", lambda script, run, args: called.append(args) or [])
    monkeypatch.setattr(figures, "check", lambda: [])
    monkeypatch.setattr(sys, "argv", ["figures.py", "record", "bench_episodes.py", "run.json", "--args", "--image 12"])
    assert figures.main() == 0 and called == ["--image 12"]
