"""Ways around the chunk check that an adversarial pass found (issue 35, after its first work): each reads a
changed chunk as data with no error unless closed. A checked reader must never use what an unchecked one
decoded, an append must not launder a changed tail chunk, a manifest or commit log edited to record nothing
must not turn the checks off, a `.zarray` must not add filters the schema does not know, and validate and
`Dataset.chunks` must check what they decode."""
from __future__ import annotations

import numpy as np
import pytest
from expected import expected_tables
from test_checked_reads import NAMED, SMALL, damage, episodes
from zarrfeed.loader import Loader, LoaderError
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

