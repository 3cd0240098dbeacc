"""The writer's segment buffers (zarrfeed.writer.segments): rows copied into shared memory a segment at a time,
segments that end on chunk boundaries, blocks used again once their segment is stored."""
import numpy as np
import pytest

from zarrfeed.core.schema import L5KIT_SCHEMA
from zarrfeed.writer import synthetic
from zarrfeed.writer.segments import SegmentBuffers


@pytest.fixture
def buffers():
    tables = L5KIT_SCHEMA.tables
    b = SegmentBuffers(tables, n_blocks=3, block_bytes=10 * tables["frames"].chunk_rows
                       * tables["frames"].dtype.itemsize // 4)  # room for 2.5 chunks of frames
    yield b
    b.close()


def test_a_segment_ends_on_a_chunk_boundary_and_holds_the_rows_copied(buffers):
    rows = synthetic.episode(0)["frames"]
    chunk = L5KIT_SCHEMA.tables["frames"].chunk_rows
    seg = buffers.begin("frames", start=chunk // 4)  # a quarter chunk in: the block holds 2.5 chunks
    assert seg.capacity == 2 * chunk - chunk // 4  # ends at the second boundary, not where the block is full
    many = np.concatenate([rows] * (seg.capacity // len(rows) + 2))
    taken = buffers.fill(seg, many)
    assert taken == seg.capacity and buffers.is_full(seg) and seg.end == 2 * chunk
    assert buffers.open_segment("frames") is seg
    sent = buffers.end("frames")
    assert sent is seg and buffers.open_segment("frames") is None and buffers.in_flight == {seg.id: seg}
    np.testing.assert_array_equal(buffers.rows(seg), many[:taken])


def test_blocks_are_used_again_once_stored_and_an_empty_segment_gives_its_block_back(buffers):
    rows = synthetic.episode(0)["scenes"]
    segs = []
    for table in ("scenes", "frames", "agents"):
        segs.append(buffers.begin(table, 0))
    assert not buffers.has_free_block()
    assert buffers.end("frames") is None and buffers.has_free_block()  # empty: nothing to send
    buffers.fill(segs[0], rows)
    sent = buffers.end("scenes")
    assert sent is segs[0] and sent.id in buffers.in_flight
    assert buffers.stored(sent.id) is sent and sent.id not in buffers.in_flight
    again = buffers.begin("scenes", sent.end)
    assert again.id != sent.id and again.start == len(rows)
