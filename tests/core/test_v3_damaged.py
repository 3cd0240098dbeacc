"""A zarrfeed-written v3 dataset damaged by hand, as a hostile user would: each damage is refused in one line
that names the table, the document (or shard) and what is wrong, never read as other values.

- a missing inner chunk (its index entry marked left out) names its table, not the chunk's key (v2 as well);
- a stored inner chunk that differs from its commit names its table, not `agents/c`;
- an inner `bytes` codec turned big-endian in `zarr.json` decodes the same bytes to other values: refused, as a
  v2 `.zarray` whose dtype was changed is;
- a changed inner `chunk_shape` names `agents/zarr.json`, not a v2 `.zarray`;
- an `agents/zarr.json` that is not JSON, not an object, or not a v3 array is named as damaged, as v2 names a
  damaged `.zarray`, not "missing from the dataset";
- a shard index (valid crc32c) pointing past the shard's end says the index is corrupt, not that the shard was
  replaced while it was read.
"""
import json
import shutil

import numpy as np
import pytest

from zarrfeed.core.errors import ChunkError, FormatError
from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Array
from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, synthetic

CHUNKS = {"agents": 700, "frames": 50, "scenes": 3, "traffic_light_faces": 90}
SHARD = 300_000  # 3 agent chunks a shard


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("damaged")
    for fmt in (2, 3):
        extra = {"zarr_format": 3, "shard_bytes": SHARD} if fmt == 3 else {}
        with DatasetWriter(folder / f"v{fmt}.zarr", workers=0, chunks=CHUNKS, **extra) as w:
            w.ingest(synthetic.episodes(5, seed=2, frames=40, agents_per_frame=26))
    return folder


@pytest.fixture
def v3(made, tmp_path):
    shutil.copytree(made / "v3.zarr", tmp_path / "v3.zarr")
    return tmp_path / "v3.zarr"


@pytest.fixture
def v2(made, tmp_path):
    shutil.copytree(made / "v2.zarr", tmp_path / "v2.zarr")
    return tmp_path / "v2.zarr"


def _read_all(path):
    ds = Dataset.open(path)
    return {t: ds.read_rows(t, 0, ds.rows[t]) for t in ds.rows}


def _edit_doc(path, edit):
    doc_path = path / "agents" / "zarr.json"
    doc = json.loads(doc_path.read_text())
    edit(doc)
    doc_path.write_text(json.dumps(doc))


def _rewrite_index(path, edit):
    """Shard agents/c/0 with its index entries edited and re-encoded (a valid crc32c)."""
    spec = Array.open(DirectoryStore(path), "agents").sharding
    shard = path / "agents" / "c" / "0"
    raw = shard.read_bytes()
    entries = spec.decode_index(spec.index_bytes(raw)).copy()
    edit(entries, len(raw))
    lo, hi = spec.data_range(len(raw))
    shard.write_bytes(raw[lo:hi] + spec.encode_index(entries))


def test_a_missing_inner_chunk_names_its_table(v3):
    _rewrite_index(v3, lambda e, n: e.__setitem__(1, (2**64 - 1, 2**64 - 1)))
    with pytest.raises(ChunkError, match=r"^table 'agents': chunk 'agents/c/0#1' \(rows 700-1,400\) is missing"):
        _read_all(v3)


def test_a_missing_v2_chunk_names_its_table_as_before(v2):
    (v2 / "agents" / "1").unlink()
    with pytest.raises(ChunkError, match=r"^table 'agents': chunk 'agents/1' \(rows 700-1,400\) is missing"):
        _read_all(v2)


def test_a_changed_inner_chunk_found_by_verify_names_its_table(v3):
    _rewrite_index(v3, lambda e, n: e.__setitem__(1, e[0]))  # chunk 1 now reads chunk 0's bytes
    problems = Dataset.open(v3).verify().problems
    assert len(problems) == 1 and problems[0].startswith("table 'agents': chunk 'agents/c/0#1' is not"), problems


def test_an_inner_bytes_codec_turned_big_endian_is_refused_not_read_as_other_values(v3):
    want = _read_all(v3)["agents"]

    def big(doc):
        doc["codecs"][0]["configuration"]["codecs"][0]["configuration"] = {"endian": "big"}
    _edit_doc(v3, big)
    try:
        got = _read_all(v3)["agents"]
    except FormatError as exc:
        assert "agents/zarr.json" in str(exc) and "\n" not in str(exc)
        return
    assert got.tobytes() == want.tobytes(), "read as other values, silently"


def test_a_changed_inner_chunk_shape_names_the_v3_document(v3):
    _edit_doc(v3, lambda doc: doc["codecs"][0]["configuration"].__setitem__("chunk_shape", [350]))
    with pytest.raises(FormatError) as info:
        Dataset.open(v3)
    assert "agents/zarr.json" in str(info.value) and ".zarray" not in str(info.value), str(info.value)


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"", b'{"zarr_format": 3, "node_type": "group"}',
                                     b'{"zarr_format": 2, "node_type": "array"}'])
def test_a_damaged_array_document_is_named_not_called_missing(v3, v2, content):
    (v2 / "agents" / ".zarray").write_bytes(content)
    with pytest.raises(FormatError) as v2_info:
        Dataset.open(v2)
    (v3 / "agents" / "zarr.json").write_bytes(content)
    with pytest.raises(FormatError) as info:
        Dataset.open(v3)
    message = str(info.value)
    assert "agents/zarr.json" in message and "missing from the dataset" not in message, (message, str(v2_info.value))


@pytest.mark.parametrize("entry", ["past_the_end", "huge_nbytes"])
def test_a_shard_index_pointing_outside_its_shard_is_called_corrupt(v3, entry):
    def edit(entries, size):
        entries[1] = (size + 100, 50) if entry == "past_the_end" else (int(entries[1][0]), 2**62)
    _rewrite_index(v3, edit)
    with pytest.raises(ChunkError) as info:
        _read_all(v3)
    message = str(info.value)
    assert message.startswith("table 'agents': shard 'agents/c/0'") and "outside" in message, message
    assert "while it was read" not in message
    np.testing.assert_equal(len(message.splitlines()), 1)
