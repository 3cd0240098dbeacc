"""Ways around the chunk check that an adversarial pass found (issue 35, after its first work): each reads a
changed chunk as data with no error unless closed. A checked reader must never use what an unchecked one
decoded, an append must not launder a changed tail chunk, a manifest or commit log edited to record nothing
must not turn the checks off, a `.zarray` must not add filters the schema does not know, and validate and
`Dataset.chunks` must check what they decode."""
from __future__ import annotations

import numpy as np
import pytest
import zarr
from expected import expected_tables
from test_checked_reads import NAMED, SMALL, cli, damage, episodes, one_line_error
from zarrfeed.core.store import FormatError
from zarrfeed.loader import Dataset, Loader, LoaderError
from zarrfeed.writer.dataset_writer import DatasetWriter


@pytest.fixture
def written(tmp_path):
    out = tmp_path / "d.zarr"
    with DatasetWriter(out, workers=0, chunks=SMALL) as w:
        w.ingest(episodes(6, seed=0))
    return out


@pytest.mark.parametrize("workers", [0, 1])
def test_a_checked_loader_never_reads_what_an_unchecked_one_decoded_into_the_host_cache(written, workers):
    damage(written, "swap")
    want = expected_tables(episodes(6, seed=0))["agents"]["track_id"]
    with Loader(written, "agents", batch_size=500, num_workers=workers, cache="host", verify_chunks=False,
                copy=True) as unchecked:
        got = np.concatenate([b["track_id"] for b in unchecked])
        assert len(got) == len(want)  # the cache is filled with every chunk, the swapped ones too
        with pytest.raises(LoaderError, match=NAMED):
            with Loader(written, "agents", batch_size=500, num_workers=workers, cache="host", row_ids=True,
                        copy=True) as checked:
                for b in checked:
                    assert np.array_equal(b["track_id"], want[b["_row"]])


def snapshot(path) -> dict[str, bytes]:
    """Every file of the dataset but the lease's (a refused writer takes the lease and gives it back)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and "lease" not in p.name}


def last_chunk(path, table: str = "agents") -> tuple[int, int]:
    ds = Dataset.open(path)
    c, n = ds[table].chunks[0], ds.rows[table]
    assert n % c, "the test needs a partly filled last chunk"
    return (n - 1) // c, n


@pytest.mark.parametrize("how", ["rows", "swap", "missing"])
def test_an_append_refuses_a_last_chunk_that_is_not_the_committed_one(written, how):
    """The append rewrites the last, partly filled chunk with its rows read back: a changed one would be sealed
    again under a fresh digest (laundered) and a missing one filled with zeros; refused before anything changes."""
    last, n = last_chunk(written)
    key = written / "agents" / str(last)
    if how == "rows":  # the rows changed and stored again as zarr would (the file is another, valid chunk)
        a = zarr.open_group(str(written), mode="r+")["agents"]
        block = a[last * 2000:n]
        block["centroid"] += 1000.0
        a[last * 2000:n] = block
    elif how == "swap":
        key.write_bytes((written / "agents" / "0").read_bytes())
    else:
        key.unlink()
    before = snapshot(written)
    with pytest.raises(FormatError, match=rf"table 'agents': chunk 'agents/{last}' .*nothing is appended"):
        DatasetWriter(written, workers=0, mode="a", chunks=SMALL)
    assert snapshot(written) == before
    r = cli("ingest", str(written), "--append", "--synthetic", "1", "--workers", "0", "-q")
    assert f"agents/{last}" in one_line_error(r)
    assert snapshot(written) == before


def test_an_append_onto_an_unchanged_last_chunk_goes_on(written):
    last, n = last_chunk(written)
    with DatasetWriter(written, workers=0, mode="a", chunks=SMALL) as w:
        w.ingest(episodes(1, seed=7))
    ds = Dataset.open(written)
    assert ds.rows["agents"] > n and ds.verify().ok
    want = expected_tables(episodes(6, seed=0) + episodes(1, seed=7))["agents"]["track_id"]
    assert np.array_equal(ds.read_rows("agents", 0, ds.rows["agents"])["track_id"], want)
