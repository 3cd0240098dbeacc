import json

import numpy as np
import pytest
from zarrfeed.writer import (
    AGENT_DTYPE,
    FRAME_DTYPE,
    L5KIT_SCHEMA,
    PERCEPTION_LABELS,
    SCENE_DTYPE,
    TL_FACE_DTYPE,
    Schema,
)

from zarrfeed.core.schema import dtype_difference


def test_l5kit_dtypes_match_the_format():
    sizes = [SCENE_DTYPE.itemsize, FRAME_DTYPE.itemsize, AGENT_DTYPE.itemsize, TL_FACE_DTYPE.itemsize]
    assert sizes == [96, 136, 116, 140]
    assert FRAME_DTYPE["ego_rotation"].shape == (3, 3)
    assert AGENT_DTYPE["label_probabilities"].shape == (17,)
    assert {n: t.chunk_rows for n, t in L5KIT_SCHEMA.tables.items()} == {
        "scenes": 10_000, "frames": 10_000, "agents": 20_000, "traffic_light_faces": 10_000}
    assert L5KIT_SCHEMA.compressor.get_config() == {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1,
                                                    "blocksize": 0}
    assert L5KIT_SCHEMA.attrs == {"format_version": 2, "labels": PERCEPTION_LABELS} and len(PERCEPTION_LABELS) == 17
    assert [str(link) for link in L5KIT_SCHEMA.links] == [
        "scenes.frame_index_interval -> frames",
        "frames.agent_index_interval -> agents",
        "frames.traffic_light_faces_index_interval -> traffic_light_faces"]


def test_schema_json_round_trip_restores_dtypes_exactly():
    nested = np.dtype([("a", ">i2", (2, 3)), ("s", "S5"), ("iv", "<u4", (2,))])
    custom = Schema({"p": (np.dtype([("iv", "<i8", (2,)), ("x", "<f2")]), 7), "c": (nested, 3)}, {"p.iv": "c"})
    for schema in (L5KIT_SCHEMA, custom):
        back = Schema.from_json(json.loads(json.dumps(schema.to_json())))
        assert back == schema
        assert [t.dtype for t in back.tables.values()] == [t.dtype for t in schema.tables.values()]


@pytest.mark.parametrize("tables, links, message", [
    ({"p": ([("iv", "i8", (2,))], 10)}, {"p.iv": "c"}, "no table 'c'"),
    ({"p": ([("iv", "f8", (2,))], 10), "c": ([("x", "i4")], 10)}, {"p.iv": "c"}, "integer (2,) interval"),
    ({"p": ([("iv", "i8", (3,))], 10), "c": ([("x", "i4")], 10)}, {"p.iv": "c"}, "integer (2,) interval"),
    ({"p": ([("iv", "i8", (2,))], 10), "c": ([("x", "i4")], 10)}, {"p.nope": "c"}, "has no field 'nope'"),
    ({"c": ([("x", "i4")], 10), "p": ([("iv", "i8", (2,))], 10)}, {"p.iv": "c"}, "list parent table 'p' before 'c'"),
    ({"p": ([("a", "i8", (2,)), ("b", "i8", (2,))], 10), "c": ([("x", "i4")], 10)}, {"p.a": "c", "p.b": "c"},
     "already has parent"),
    ({"p": ("f8", 10)}, {}, "not a structured dtype"),
    ({"p": ([("x", "i4")], 0)}, {}, "chunk_rows must be >= 1"),
])
def test_schema_rejects_bad_declarations(tables, links, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Schema(tables, links)


def test_dtype_difference_names_the_field():
    a = np.dtype([("x", "<f4"), ("v", "<f4", (2,))])
    assert dtype_difference(a, a) is None
    assert "has no field 'v'" in dtype_difference(np.dtype([("x", "<f4")]), a)
    assert "unexpected field 'w'" in dtype_difference(np.dtype([("x", "<f4"), ("v", "<f4", (2,)), ("w", "u1")]), a)
    other = np.dtype([("x", "<f4"), ("v", "<f4", (3,))])
    assert "field 'v' has shape (3,), expected (2,)" in dtype_difference(other, a)
    assert "field 'x' is <f8, expected <f4" in dtype_difference(np.dtype([("x", "<f8"), ("v", "<f4", (2,))]), a)
    assert "not a structured dtype" in dtype_difference(np.dtype("f8"), a)
