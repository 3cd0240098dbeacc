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
