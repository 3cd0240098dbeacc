"""Reading and writing a dataset's manifest and numbered commits on its store: the commit point (one atomic
write of the manifest), and the numbered objects, created only if absent, that readers pin."""
from __future__ import annotations

import json
from typing import Any

from .manifest import COMMIT_TAG, COMMITS_PREFIX, KEEP_COMMITS, MANIFEST_KEY, TAILS, parse, commit_key
from .errors import FormatError
from .stores import Store


def read_manifest(store: Store, commit: int | None = None) -> dict[str, Any] | None:
    """The zarrfeed manifest (the latest commit, or commit number `commit`), or None for datasets written by
    other tools. A pinned commit gives its row counts; everything below them never changes."""
    try:
        raw = store[MANIFEST_KEY]
    except KeyError:
        if commit is not None:
            raise FormatError(f"commit {commit}: this dataset has no zarrfeed commits") from None
        return None
    doc = parse(raw, MANIFEST_KEY)
    if commit is None or commit == doc["commit"]:
        return doc
    if not isinstance(commit, int) or isinstance(commit, bool) or commit < 0:
        raise FormatError(f"commit {commit!r}: not a commit number (a whole number >= 0)")
    if commit > doc["commit"]:
        raise FormatError(f"commit {commit}: the latest commit is {doc['commit']}")
    try:
        chunk_rows = {t: int(tab["chunk_rows"]) for t, tab in doc["schema"]["tables"].items()}
        pinned = parse(store[commit_key(commit)], commit_key(commit), chunk_rows)
    except KeyError:
        raise FormatError(f"commit {commit}: no longer kept (the dataset keeps its last {KEEP_COMMITS} commits; "
                          f"the latest is {doc['commit']})") from None
    if pinned["commit"] != commit:
        raise FormatError(f"{commit_key(commit)}: field 'commit' is {pinned['commit']}, not the number its name says; "
                          "the commit is damaged (restore it from a copy)")
    pinned_doc = {k: v for k, v in doc.items() if k != TAILS}  # the latest commit's tails are not this one's
    tag = pinned.get(COMMIT_TAG)  # (None in commits recorded before tags were: that copy cannot be told)
    return {**pinned_doc, "commit": commit, "committed": pinned["committed"],
            COMMIT_TAG: tag if isinstance(tag, str) else None, **({TAILS: pinned[TAILS]} if TAILS in pinned else {})}


def commit_tag(doc: dict[str, Any] | None) -> str | None:
    """Which copy's commit `doc` (from `read_manifest`) is: its `COMMIT_TAG` (a pinned commit's as its object
    recorded it, None for one recorded before tags were), else its newest log segment's key."""
    if doc is None:
        return None
    return doc[COMMIT_TAG] if COMMIT_TAG in doc else _newest_segment(doc)


def write_manifest(store: Store, doc: dict[str, Any], log_objects: dict[str, bytes] | None = None,
                   retry: bool = False) -> None:
    """Publish commit `doc["commit"]`: the new commit log segments it lists, then the whole manifest as one
    object, then its row counts as an immutable numbered object. Each is one atomic write on every store (a
    PUT; a temporary file renamed on local disks), and readers only ever start from the manifest, so they see
    the old commit or the new one, never a mixture (docs/architecture.md#commits). The numbered object comes
    last and is created only if absent (`record_commit`): so every commit object has a number the manifest
    reached, an existing one is never rewritten, and one found above the manifest's number means the number went
    backwards. `retry`: this writer's earlier call for the same number may have landed (it timed out), so its
    object is replaced. Log segments merged into a new one are deleted by the writer only once this returned (a
    call that timed out may still land, and must not delete what the next attempt lists)."""
    number = int(doc["commit"])
    if log_objects:
        store.put_many(dict(log_objects))
    store.put(MANIFEST_KEY, json.dumps(doc).encode())
    record_commit(store, number, doc["committed"], doc.get(TAILS), replace=retry, tag=commit_tag(doc))
    if number >= KEEP_COMMITS:
        store.delete([commit_key(number - KEEP_COMMITS)])


def _newest_segment(doc: dict[str, Any]) -> str | None:
    """A manifest's tag before commits had their own (`COMMIT_TAG`): the key of its newest commit log segment,
    what readers and saved states of such commits took for it (None without a log)."""
    log = doc.get("log")
    return str(log[-1]["key"]) if isinstance(log, list) and log and isinstance(log[-1], dict) else None


def tag_latest_commit(store: Store, doc: dict[str, Any]) -> None:
    """Record in the latest commit's object the tag readers of it see, if a zarrfeed that kept no tags wrote it
    (its manifest's newest log segment): so that the commit keeps that tag once later ones are published, as a
    pinned commit is read, and states saved on it still tell the copies apart."""
    key, tag = commit_key(int(doc["commit"])), commit_tag(doc)
    if tag is None:
        return
    try:
        chunk_rows = {t: int(tab["chunk_rows"]) for t, tab in doc["schema"]["tables"].items()}
        recorded = parse(store[key], key, chunk_rows)
    except KeyError:
        recorded = None
    except FormatError:  # a damaged commit object: left as it is, for `validate` to report
        return
    if recorded is None or recorded.get(COMMIT_TAG) is None:
        record_commit(store, int(doc["commit"]), doc["committed"], doc.get(TAILS), replace=recorded is not None,
                      tag=tag)


def record_commit(store: Store, number: int, committed: dict[str, int],
                  tails: dict[str, str] | None = None, replace: bool = False, tag: str | None = None) -> None:
    """Store commit `number`'s row counts (and `TAILS`, its last chunks' digests; `COMMIT_TAG`, its
    `commit_tag`) as `zarrfeed.commits/<number>.json`, only if no such object exists (unless `replace`);
    `FormatError` if one does."""
    doc: dict[str, Any] = {"commit": number, "committed": committed}
    if tails is not None:
        doc[TAILS] = tails
    if tag is not None:
        doc[COMMIT_TAG] = tag
    key, raw = commit_key(number), json.dumps(doc).encode()
    if replace:
        store.put(key, raw)
    elif not store.put_new(key, raw):
        raise FormatError(f"{key}: already exists, so commit {number} was made before; {MANIFEST_KEY}'s commit "
                          "number went backwards (restore it from a copy); nothing more is committed")


def commit_numbers(store: Store) -> list[int]:
    """The numbers of the commit objects stored (`zarrfeed.commits/<number>.json`), in order."""
    try:
        names = store.listdir(COMMITS_PREFIX)
    except (KeyError, FileNotFoundError):
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
