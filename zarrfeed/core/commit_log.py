"""The commit log: what each commit adds that grows with the dataset's history, written once, never rewritten.

A commit's manifest holds only what stays small (row counts, the schema, index ranges per input, episodes in
flight). What grows with every episode and every chunk (the caller's episode keys, each chunk object's size
and digest) goes into immutable log segments that the manifest lists. Each commit writes one segment with
what it adds; segments are merged like a binary counter (two of the same level become one of the next), so a
dataset holds about log2(commits) segments, each entry is rewritten about log2(commits) times over its life
rather than at every commit, and a commit writes a bounded amount: merging stops at `MAX_ENTRIES` entries per
segment (about 2.5 MB of JSON), beyond which segments accumulate, one line of the manifest per 65,536 entries.

Written here because zarr v2 has no such thing and the format must stay plain zarr v2 for L5Kit's readers.
A segment is stored before the manifest that lists it; merged-away segments are deleted only after the new
manifest is published, so a reader that read the old manifest may find one gone and reads the manifest again.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from .keys import Key

LOG_PREFIX = "zarrfeed.log"
MAX_ENTRIES = 65_536

ChunkRecord = tuple[int, str]  # (stored size in bytes, digest of the stored bytes)


@dataclass
class Segment:
    """What a run of commits added: caller keys committed and skipped, and chunk records per table (index ->
    record, or None where a commit withdrew a chunk's record because the chunk is being rewritten)."""

    committed: list[Key] = field(default_factory=list)
    skipped: list[Key] = field(default_factory=list)
    chunks: dict[str, dict[int, ChunkRecord | None]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.committed) + len(self.skipped) + sum(len(c) for c in self.chunks.values())

    def then(self, later: "Segment") -> "Segment":
        """This segment followed by `later` (later chunk records replace earlier ones)."""
        chunks = {t: dict(c) for t, c in self.chunks.items()}
        for t, c in later.chunks.items():
            chunks.setdefault(t, {}).update(c)
        return Segment(self.committed + later.committed, self.skipped + later.skipped, chunks)

    def to_json(self) -> bytes:
        return json.dumps({"committed": self.committed, "skipped": self.skipped,
                           "chunks": {t: [[i, *(r or (None, None))] for i, r in sorted(c.items())]
                                      for t, c in self.chunks.items()}}).encode()

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "Segment":
        """The segment stored under `key`, its every entry checked as strictly as the manifest's fields (readers
        trust its sizes and digests to tell a changed chunk; `FormatError` naming the file and the entry)."""
        from .errors import FormatError

        try:
            doc = json.loads(bytes(raw))
            committed, skipped, tables = doc["committed"], doc["skipped"], doc["chunks"]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise FormatError(f"{key}: unreadable commit log segment ({type(exc).__name__}: {exc})") from None
        why = _segment_problem(committed, skipped, tables)
        if why:
            raise FormatError(f"{key}: {why}; the commit log segment is damaged (restore it from a copy)")
        chunks = {t: {i: (size, digest) if digest is not None else None for i, size, digest in rows}
                  for t, rows in tables.items()}
        return cls(list(committed), list(skipped), chunks)


DIGEST_HEX = re.compile(r"[0-9a-f]{16}")  # XXH3-64 as 16 hex digits (zarrfeed.core.chunks.digest)


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _segment_problem(committed: Any, skipped: Any, tables: Any) -> str | None:
    """What is wrong with a segment's contents, in a few words naming the field and the entry, or None."""
    for name, keys in (("committed", committed), ("skipped", skipped)):
        if not isinstance(keys, list):
            return f"field '{name}' is not a list of episode keys"
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys):
            return "an episode key that is not a str or an int"
    if not isinstance(tables, dict):
        return "field 'chunks' is not an object of tables"
    for table, rows in tables.items():
        if not isinstance(rows, list):
            return f"field 'chunks.{table}' is not a list of [index, size, digest] records"
        seen: set[int] = set()
        for j, row in enumerate(rows):
            where = f"field 'chunks.{table}' entry {j}"
            if not (isinstance(row, list) and len(row) == 3):
                return f"{where} is {row!r}, not [index, size, digest]"
            index, size, digest = row
            if not _whole(index, 0):
                return f"{where}: chunk index {index!r} is not a whole number >= 0"
            if index in seen:
                return f"{where}: chunk {index} is recorded twice"
            seen.add(index)
            if size is None and digest is None:
                continue  # a withdrawn record
            if not _whole(size, 1):
                return f"{where}: chunk {index}'s size {size!r} is not a size in bytes (a whole number >= 1)"
            if not (isinstance(digest, str) and DIGEST_HEX.fullmatch(digest)):
                return f"{where}: chunk {index}'s digest {digest!r} is not an XXH3-64 digest (16 hex digits)"
    return None


@dataclass(frozen=True)
class SegmentRef:
    """A stored segment as the manifest lists it."""

    key: str
    level: int
    entries: int

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "level": self.level, "entries": self.entries}

    @classmethod
    def from_json(cls, doc: Any) -> "SegmentRef":
        return cls(str(doc["key"]), int(doc["level"]), int(doc["entries"]))


class CommitLog:
    """The segments of a dataset's log and their contents (kept in memory by the one writer, to merge them)."""

    def __init__(self, refs: Iterable[SegmentRef] = (), contents: dict[str, Segment] | None = None) -> None:
        self.refs = list(refs)
        self.contents = dict(contents or {})

    def add(self, segment: Segment, commit: int) -> tuple[dict[str, bytes], list[str]]:
        """Append what commit `commit` adds. Returns the objects to store before publishing the manifest, and
        the keys of segments to delete after it (merged into the new one)."""
        if not len(segment):
            return {}, []
        level, doomed = 0, []
        while (self.refs and self.refs[-1].level == level
               and self.refs[-1].entries + len(segment) <= MAX_ENTRIES):
            older = self.refs.pop()
            segment = self.contents.pop(older.key).then(segment)
            doomed.append(older.key)
            level += 1
        key = f"{LOG_PREFIX}/{commit:010d}-{uuid.uuid4().hex[:8]}.json"
        self.refs.append(SegmentRef(key, level, len(segment)))
        self.contents[key] = segment
        return {key: segment.to_json()}, doomed

    def whole(self) -> Segment:
        """Every segment, in order, as one."""
        out = Segment()
        for ref in self.refs:
            out = out.then(self.contents[ref.key])
        return out

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.refs]
