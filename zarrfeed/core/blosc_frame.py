"""The sizes a Blosc frame's 16-byte header states, checked against the bytes at hand before Blosc reads them.

c-blosc trusts the header: a frame cut short (a chunk file truncated by a crash or a partial copy) whose header
still claims its full compressed size is read past its end, which can crash the process (SIGSEGV) rather than
raise. Every Blosc decode in zarrfeed checks the frame here first, so a truncated chunk is a `ValueError` (a
`ChunkError` naming the chunk, further up), never a dead worker or CLI.
"""

from __future__ import annotations

HEADER_BYTES = 16


def blosc_decoded_size(data: bytes | memoryview) -> int:
    """The size the frame decodes to (header bytes 4-8), after checking the frame is whole: `ValueError` if
    `data` is shorter than a header or than the compressed size the header states (bytes 12-16)."""
    view = memoryview(data).cast("B")
    if len(view) < HEADER_BYTES:
        raise ValueError(f"it is {len(view)} bytes, shorter than a Blosc header ({HEADER_BYTES})")
    header = bytes(view[:HEADER_BYTES])
    stated = int.from_bytes(header[12:16], "little")
    if stated > len(view) or stated < HEADER_BYTES:
        raise ValueError(f"its Blosc header says {stated:,} compressed bytes, it holds {len(view):,} (truncated)")
    return int.from_bytes(header[4:8], "little")
