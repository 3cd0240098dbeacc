"""bench/house.py, the newcomer's measures of the package (classes sharing a name, places declaring an option,
the route of a chunk into a batch): they run on this checkout and report structures that make sense."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def house():
    spec = importlib.util.spec_from_file_location("bench_house", ROOT / "bench" / "house.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def static(house):
    return house.static_measures(ROOT)


def test_modules_of_the_three_folders(house):
    found = house.modules(ROOT)
    assert {"zarrfeed", "zarrfeed.loader", "zarrfeed.writer", "zarrfeed.loader.options"} <= set(found)
    assert all(path.is_file() and path.suffix == ".py" for path in found.values())


def test_stems(house):
    assert {house.stem(w) for w in ("Samples", "Sample", "samples")} == {"sample"}
    assert house.stem("Grouped") == house.stem("groups") == "group"
    assert house.stem("committer") == house.stem("commits") == "commit"
    assert house.stem("stores") == "store" and house.stem("batches") == "batch"
    assert house.camel_words("GroupedSamples") == ["Grouped", "Samples"]


def test_names(static):
    names = static["names"]
    assert names["classes"] > 10
    for name, modules in names["shared_names"].items():
        assert len(modules) > 1 and all(m.startswith("zarrfeed") for m in modules), name
    for group in names["same_stems"] + names["module_collisions"]:
        assert len(group) > 1 and len(set(group)) == len(group)
    assert all(len(pair) == 2 and pair[0] != pair[1] for pair in names["stem_plus_one"])


def test_options(static):
    options = static["options"]
    assert {"shuffle", "seed", "num_workers", "prefetch", "transform"} <= set(options["options"])
    assert options["declarations"] == sum(len(p) for p in options["declared"].values())
    assert options["validations"] == sum(len(p) for p in options["validated"].values())
    for option, places in options["declared"].items():
        assert "loader.options:LoaderOptions" in places, option  # where they are read from
        assert all(":" in p for p in places)
    assert options["validations"] > 0


def test_route_of_a_chunk(house):
    started = time.monotonic()
    route = house.route_measures(ROOT)
    assert time.monotonic() - started < 30
    assert route["ended_at_batch"]
    assert route["route_modules"] == len(route["route"]) >= 2
    assert all(m.startswith("zarrfeed.") for m in route["route"])
    assert "zarrfeed.loader.engine.fetch" in route["route"]
    assert route["turn_backs"] == len(route["turn_back_pairs"])
    for a, b in route["turn_back_pairs"]:
        assert a != b and {a, b} <= set(route["route"])


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_a_revision_is_measured_from_its_export(house, static):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        pytest.skip("no git revision here")
    measured = house.measure(ROOT, "HEAD")
    assert measured["rev"] and measured["modules"] > 0 and measured["route_modules"] > 0
    assert measured["options"]["options"] == static["options"]["options"]
