"""A dataset's metadata is checked as strictly as its manifest, and nothing is appended onto a dataset that does
not validate (issue 35, items 4-5: each of these was accepted, read as data, or built on, with exit 0)."""
import json
from pathlib import Path
from typing import Any, Callable

import pytest
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.cli import main
from zarrfeed.core.store import FormatError

CHUNKS = {"agents": 500, "frames": 20, "scenes": 2, "traffic_light_faces": 100}
LEASE_FILES = ("zarrfeed.lease", ".zarrfeed.lock")


def make(path: Path, scenes: int = 3) -> Path:
    write_dataset(path, synthetic.episodes(scenes, seed=1, frames=20, agents_per_frame=30), chunks=CHUNKS,
                  workers=0)
    return path


@pytest.fixture
def ds_path(tmp_path) -> Path:
    return make(tmp_path / "d.zarr")


def edit(path: Path, change: Callable[[Any], Any]) -> None:
    """Change a JSON document in place (`change` edits it; what it returns is ignored)."""
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def stored(path: Path) -> dict[str, bytes]:
    """Every file of the dataset but the lease's, with its bytes: what an append that is refused must leave."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name not in LEASE_FILES}


def append(path: Path, capsys) -> tuple[int, str]:
    """`zarrfeed ingest --append` of one synthetic scene: (exit code, stderr)."""
    capsys.readouterr()
    code = main(["ingest", "--synthetic", "1", "--seed", "9", "--append", "--workers", "0", "-q", str(path)])
    return code, capsys.readouterr().err


def test_a_manifest_that_leaves_out_a_table_is_refused_and_nothing_is_appended(ds_path, capsys):
    """`committed` without agents read agents as 0 rows, and `ingest --append` wrote new agents from row 0 over
    the old ones."""
    edit(ds_path / "zarrfeed.json", lambda d: d["committed"].pop("agents"))
    before = stored(ds_path)
    line = ("zarrfeed.json: field 'committed' has no row count for table 'agents'; the manifest is damaged "
            "(restore it from a copy, or rewrite the dataset)")
    with pytest.raises(FormatError) as err:
        Dataset.open(ds_path)
    assert str(err.value) == line
    assert append(ds_path, capsys) == (2, f"zarrfeed: error: {line}\n")
    assert stored(ds_path) == before


def test_a_manifest_must_count_only_its_tables_and_hold_its_schema(ds_path):
    manifest = ds_path / "zarrfeed.json"
    edit(manifest, lambda d: d["committed"].update(lanes=4))
    with pytest.raises(FormatError, match=r"^zarrfeed.json: field 'committed.lanes' counts the rows of a table "
                                          "the schema does not have;"):
        Dataset.open(ds_path)
    edit(manifest, lambda d: (d["committed"].pop("lanes"), d.pop("schema")))
    with pytest.raises(FormatError, match=r"^zarrfeed.json: field 'schema' is missing; the manifest is damaged"):
        Dataset.open(ds_path)  # was a KeyError from deep inside


def test_a_pinned_commit_must_count_every_table(ds_path):
    first = ds_path / "zarrfeed.commits" / "0000000001.json"
    edit(first, lambda d: d["committed"].pop("frames"))
    with pytest.raises(FormatError) as err:
        Dataset.open(ds_path, commit=1)
    assert str(err.value).startswith("zarrfeed.commits/0000000001.json: field 'committed' has no row count for "
                                     "table 'frames'; ")
    edit(first, lambda d: d.update(commit=2, committed={t: 0 for t in CHUNKS}))
    with pytest.raises(FormatError, match=r"^zarrfeed.commits/0000000001.json: field 'commit' is 2, not the number"):
        Dataset.open(ds_path, commit=1)


def test_a_negative_chunk_size_in_a_zarray_is_refused_by_every_command(ds_path, capsys):
    """`chunks: [-500]` in agents/.zarray passed `validate` and loaded 0 rows with exit 0 (the same value in the
    manifest was refused)."""
    edit(ds_path / "agents" / ".zarray", lambda d: d.update(chunks=[-500]))
    before = stored(ds_path)
    line = ("table 'agents': agents/.zarray: field 'chunks' is [-500], not [rows per chunk] (one whole number "
            ">= 1); the array's metadata is damaged (restore it from a copy)")
    with pytest.raises(FormatError) as err:
        Dataset.open(ds_path)
    assert str(err.value) == line
    for command in (["validate", "-q"], ["load", "-q"], ["info"]):
        capsys.readouterr()
        assert main([*command, str(ds_path)]) == 2, command
        assert capsys.readouterr().err == f"zarrfeed: error: {line}\n"
    assert append(ds_path, capsys) == (2, f"zarrfeed: error: {line}\n")
    assert stored(ds_path) == before


@pytest.mark.parametrize("field, value, why", [
    ("chunks", [0], "field 'chunks' is [0], not [rows per chunk] (one whole number >= 1)"),
    ("chunks", [500.5], "field 'chunks' is [500.5], not [rows per chunk]"),
    ("chunks", [True], "field 'chunks' is [True], not [rows per chunk]"),
    ("chunks", [500, 1], "field 'chunks' is [500, 1], not [rows per chunk]"),
    ("chunks", [1000], "field 'chunks' is [1000], but the manifest's schema has 500 rows per chunk"),
    ("shape", [-5], "field 'shape' is [-5], not [rows] (one whole number >= 0)"),
    ("shape", ["1810"], "field 'shape' is ['1810'], not [rows]"),
    ("order", "X", "field 'order' is 'X', not 'C' or 'F'"),
    ("dimension_separator", "x", "field 'dimension_separator' is 'x', not '.' or '/'"),
    ("zarr_format", 3, "field 'zarr_format' is 3, not 2"),
    ("compressor", 5, "field 'compressor' is 5, not a codec"),
    ("compressor", {"id": "blosc", "cname": "zz", "clevel": 5, "shuffle": 1},
     "field 'compressor' is {'id': 'blosc', 'cname': 'zz', 'clevel': 5, 'shuffle': 1}, a codec that cannot be used"),
    ("filters", 5, "field 'filters' is 5, not a list of codecs"),
    ("filters", [{"id": "delta", "dtype": "<i8"}], "field 'filters' is {'id': 'delta', 'dtype': '<i8'}, a codec "
                                                   "that cannot be used"),
    ("fill_value", "AAAA", "field 'fill_value' holds 3 bytes, not one record of 116"),
    ("fill_value", 7, "field 'fill_value' is 7, not base64 of one record, or null"),
    ("fill_value", "A!!A", "field 'fill_value' is 'A!!A', not base64 of one record, or null"),
])
def test_each_field_of_a_zarray_that_zarrfeed_relies_on_is_checked_on_open(ds_path, field, value, why):
    """Each of these opened (and most read as rows, or failed later as a bare ValueError/TypeError or a chunk
    "truncated or corrupt")."""
    edit(ds_path / "agents" / ".zarray", lambda d: d.update({field: value}))
    with pytest.raises(FormatError) as err:
        Dataset.open(ds_path)
    assert str(err.value).startswith(f"table 'agents': agents/.zarray: {why}"), str(err.value)
    assert str(err.value).endswith("; the array's metadata is damaged (restore it from a copy)")


def test_what_zarrfeed_does_not_rely_on_stays_readable(ds_path, real_scene):
    """Strictness is for what zarrfeed relies on: the real scene, written by L5Kit (no manifest), opens and
    validates; so does a table stored with '/' as its separator or with no fill value."""
    ds = Dataset.open(real_scene)
    assert ds.rows["agents"] == 20_802 and ds.validate().ok
    edit(ds_path / "agents" / ".zarray", lambda d: d.update(dimension_separator="/", fill_value=None))
    assert Dataset.open(ds_path).validate().ok
