"""Writing a LeRobot v3.0 dataset from any zarrfeed episode source (a Diffusion Policy replay buffer, a zarrfeed
dataset of episodes and steps), episode by episode, crash-safely.

Each key of the source's step tables becomes a feature (`lerobot_format`): uint8 (H, W, 3) frames a camera
(video, `lerobot_video`), the others Parquet columns; every frame is given `timestamp` = frame_index / fps and
one task. Statistics are LeRobot's (`lerobot_stats`).

Crash safety: everything is written under `<out>.partial/`, which is renamed to `<out>` once complete (so a
killed conversion leaves no `<out>`, or a complete one). Each episode is first written as pieces of its own
(`pieces/<episode>/`: its frames' Parquet table and one MP4 per camera), fsynced, then recorded as one line of
`journal.jsonl` (where it goes, its timestamps in its video files, its statistics). A data or video file is
assembled from its episodes' pieces when the next episode goes to another file (LeRobot's rollover by size) or at
the end, written beside and renamed into place, then recorded too. `resume=True` reads the journal back:
episodes recorded are not written again, a file not recorded as assembled (a partial one) is assembled again,
pieces of an episode not recorded are written again.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.errors import FormatError
from ..core.schema import ENDS, Schema
from . import lerobot_format as fmt
from . import lerobot_stats, lerobot_video
from .dataset_episodes import DatasetSource, root_table

DEFAULT_TASK = "default"
JOURNAL, PIECES = "journal.jsonl", "pieces"
_MB = 1024 ** 2


class StepSource:
    """A source's episodes as steps per key: from a zarrfeed `Dataset` (anything with `schema`, `row_count`
    and `read_rows(table, start, stop)`) or a location (a directory, .zip or URL, read with the writer's own
    reader). Only `keys` (default: all) are read."""

    def __init__(self, source: Any, keys: list[str] | None = None) -> None:
        if hasattr(source, "read_rows") and hasattr(source, "schema"):
            schema, read, rows = source.schema, source.read_rows, source.row_count
        else:
            episodes = DatasetSource(source)
            schema, read, rows = episodes.schema, episodes._rows, episodes.rows.__getitem__
        root = root_table(schema)
        links = [link for link in schema.links_from(root) if link.kind == ENDS]
        if not links or len({link.field for link in links}) != 1:
            raise FormatError(f"schema '{schema.name}': a LeRobot dataset is written from episodes of steps (a "
                              "replay buffer's layout: one table of episode ends, linked to the steps' tables)")
        self.ends = np.asarray(read(root, 0, rows(root))[links[0].field], dtype=np.int64)
        self.columns: dict[str, tuple[str, str]] = {}  # feature -> (table, field)
        self.features: list[fmt.Feature] = []
        for name in [link.child for link in links]:
            dtype = schema.tables[name].dtype
            for field in dtype.names or ():
                key = name if len(dtype.names or ()) == 1 else f"{name}.{field}"
                if keys is not None and key not in keys:
                    continue
                base, shape = dtype[field].base, dtype[field].shape
                self.features.append(fmt.check_feature(key, base, shape))
                self.columns[key] = (name, field)
        missing = sorted(set(keys or ()) - set(self.columns))
        if missing:
            raise ValueError(f"key {missing[0]!r}: not in the source (keys: {', '.join(self._all(schema, links))})")
        self._read = read

    @staticmethod
    def _all(schema: Schema, links: list) -> list[str]:
        return [t if len(schema.tables[t].dtype.names or ()) == 1 else f"{t}.{f}"
                for t in [x.child for x in links] for f in schema.tables[t].dtype.names or ()]

    def __len__(self) -> int:
        return len(self.ends)

    def episode(self, i: int) -> dict[str, np.ndarray]:
        """Episode i's steps, key -> (T, ...) array."""
        start, stop = (int(self.ends[i - 1]) if i else 0), int(self.ends[i])
        tables: dict[str, np.ndarray] = {}
        out = {}
        for key, (table, field) in self.columns.items():
            if table not in tables:
                tables[table] = self._read(table, start, stop)
            out[key] = np.asarray(tables[table][field])
        return out

    def identity(self) -> str:
        """What names this source across runs: its features and its episodes' ends."""
        h = hashlib.blake2b(digest_size=8)
        h.update(json.dumps([[f.name, f.dtype.str, list(f.shape)] for f in self.features]).encode())
        h.update(self.ends.tobytes())
        return h.hexdigest()


def to_lerobot(source: Any, out: str | os.PathLike, *, fps: int, task: str = DEFAULT_TASK,
               video_codec: str = "libsvtav1", keys: list[str] | None = None, resume: bool = False,
               robot_type: str | None = None, chunks_size: int = fmt.CHUNKS_SIZE,
               data_files_size_in_mb: int = fmt.DATA_FILE_MB, video_files_size_in_mb: int = fmt.VIDEO_FILE_MB,
               progress: bool = False, durable: bool = True) -> dict[str, Any]:
    """Write the episodes of `source` as a LeRobot v3.0 dataset at the directory `out`; return a summary
    (episodes, frames and seconds written by this call).

    Args:
        source: A zarrfeed `Dataset` (e.g. `Dataset.open` of a replay buffer), or where one lies.
        out: A new local directory (an existing one is refused).
        fps: Frames per second of the episodes (a replay buffer records none).
        task: The task of every episode (`meta/tasks.parquet`).
        video_codec: "libsvtav1" (LeRobot's default, lossy), "h264" or "lossless" (`lerobot_video.CODECS`).
        keys: The keys to write (default: all).
        resume: Finish an interrupted conversion of the same source with the same settings.
        robot_type, chunks_size, data_files_size_in_mb, video_files_size_in_mb: info.json's.
        progress: A progress bar on stderr.
        durable: fsync files and directories (False: scratch data).
    """
    out = _local(out)
    if out.exists() and not resume:
        raise FileExistsError(f"{out}: already exists; convert to another path, or remove it first")
    if int(fps) != fps or fps < 1:
        raise ValueError(f"fps={fps}: LeRobot's fps is a positive whole number of frames a second")
    own = getattr(getattr(source, "lerobot", None), "fps", None)  # a LeRobot dataset's frame rate
    if own is not None and own != fps:
        raise ValueError(f"fps={fps}: the source is a LeRobot dataset of {own:g} fps; its frames are written at that "
                         "rate")
    steps = StepSource(source, keys)
    if not len(steps):
        raise ValueError("the source holds no episode; LeRobot's datasets hold at least one")
    if not steps.features:
        raise ValueError("keys: none given; name at least one key to write (default: every key)")
    for feature in steps.features:
        if feature.video:
            lerobot_video.check_codec(video_codec)
            lerobot_video.check_size(video_codec, feature.shape[0], feature.shape[1], int(fps), feature.name)
    settings = {"identity": steps.identity(), "fps": int(fps), "task": task, "video_codec": video_codec,
                "keys": [f.name for f in steps.features], "robot_type": robot_type,
                "sizes": [chunks_size, data_files_size_in_mb, video_files_size_in_mb]}
    export = _Export(steps, out, settings, durable)
    try:
        if out.exists():  # resume: a conversion killed after its last step is finished
            if export.finished():
                return {"episodes": 0, "frames": 0, "seconds": 0.0, "path": str(out)}
            raise FileExistsError(f"{out}: already exists, and not as this conversion's output (its fps, episodes, "
                                  "frames, keys or task differ); convert to another path, or remove it first")
        export.start(resume)
        return export.run(progress)
    finally:
        export.unlock()


def _local(out: str | os.PathLike) -> Path:
    text = os.fspath(out)
    if "://" in text:
        raise ValueError(f"{text}: a LeRobot dataset is written to a local directory (then copy it where it goes)")
    return Path(text).absolute()


class _Export:
    """One conversion into `<out>.partial/`: its journal, its episodes' pieces, its files."""

    def __init__(self, steps: StepSource, out: Path, settings: dict[str, Any], durable: bool) -> None:
        self.steps, self.out, self.settings, self.durable = steps, out, settings, durable
        self.partial = out.with_name(out.name + ".partial")
        self.records: list[dict[str, Any]] = []
        self.filled: dict[str, list[int]] = {}  # a data or video file -> [bytes, frames] of its episodes' pieces
        self.assembled: set[str] = set()
        self.cameras = [f.name for f in steps.features if f.video]
        self.columns = [f for f in steps.features if not f.video]
        self.done = False
        self._lock: int | None = None  # the descriptor holding `<out>.partial/`'s lock

    # -- one conversion at a time ----------------------------------------------------------------------------

    def lock(self) -> None:
        """Hold `<out>.partial/` for this conversion alone (an exclusive `flock` on the folder, released by
        `unlock` or when the process ends, however it ends); `FormatError` if another conversion holds it."""
        import fcntl

        fd = os.open(self.partial, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise
            except OSError:  # a filesystem without locks (some network and FUSE ones): the conversion goes unguarded
                os.close(fd)
                return
            if not os.path.samestat(os.fstat(fd), os.stat(self.partial)):
                raise FileNotFoundError(self.partial)  # renamed to <out> by the conversion that held it
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            raise FormatError(f"{self.partial}: another conversion is writing into {self.out.name} now; wait for it "
                              "to end (or stop it), then resume") from None
        self._lock = fd

    def unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def finished(self) -> bool:
        """Whether `<out>` holds this conversion, complete: its info.json's fps, episodes, frames and features
        and its task are those this conversion writes (a conversion killed after renaming `<out>.partial/`)."""
        try:
            info = json.loads((self.out / fmt.INFO).read_text())
            tasks = pq.read_table(self.out / fmt.TASKS).to_pylist()
        except (OSError, ValueError, pa.ArrowException):
            return False
        features = [f.name for f in self.steps.features] + list(fmt.FRAME_COLUMNS)
        return (not self.partial.exists() and info.get("fps") == self.settings["fps"]
                and info.get("total_episodes") == len(self.steps)
                and info.get("total_frames") == int(self.steps.ends[-1])
                and sorted(info.get("features", {})) == sorted(features) and len(tasks) == 1
                and self.settings["task"] in tasks[0].values())

    # -- the journal -----------------------------------------------------------------------------------------

    def start(self, resume: bool) -> None:
        """Begin a new conversion, or with `resume` take up the one in `<out>.partial/`."""
        journal = self.partial / JOURNAL
        if self.partial.exists():
            self.lock()
            if not resume:
                said = f"{self.partial}: an interrupted conversion into {self.out.name}; finish it "
                raise FormatError(said + "(resume=True) or remove it", cli=said + "(--resume) or remove it")
            if not journal.exists() and (self.partial / fmt.INFO).exists():  # stopped between its last two steps
                self.done = True
                return
            if journal.exists() and self._read_journal(journal):
                self._clean()
                return
            shutil.rmtree(self.partial)  # stopped before its journal (or its first line) was written
            self.unlock()
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.partial.mkdir()
        except FileExistsError:
            raise FormatError(f"{self.partial}: another conversion into {self.out.name} began at the same time; "
                              "wait for it to end (or stop it), then resume") from None
        self.lock()
        self._append({"settings": self.settings})

    def _read_journal(self, journal: Path) -> bool:
        """Take up the journal's records; False if it does not even hold its settings."""
        lines = journal.read_bytes().split(b"\n")
        good = 0
        for n, line in enumerate(lines):
            try:
                entry = json.loads(line)
            except ValueError:  # the last line, cut short by the kill: not a record
                break
            good += len(line) + 1
            if n == 0:
                if entry.get("settings") != self.settings:
                    raise FormatError(f"{self.partial}: an interrupted conversion of another source or with other "
                                      "settings (fps, task, codec, keys, sizes); resume with those, or remove it")
            elif "assembled" in entry:
                self.assembled.add(entry["assembled"])
            else:
                self._recorded(entry)
        if not good:
            return False
        with open(journal, "r+b") as f:  # drop a line cut short, so that the next record starts a line
            f.truncate(good)
        return True

    def _append(self, entry: dict[str, Any]) -> None:
        with open(self.partial / JOURNAL, "ab") as f:
            f.write(json.dumps(entry).encode() + b"\n")
            f.flush()
            if self.durable:
                os.fsync(f.fileno())
        self._sync_dir(self.partial)

    def _clean(self) -> None:
        """Remove what a killed run left half done: files not recorded as assembled, pieces of episodes not
        recorded."""
        for folder in ("data", "videos"):
            for path in sorted((self.partial / folder).rglob("*")) if (self.partial / folder).exists() else []:
                if path.is_file() and str(path.relative_to(self.partial)) not in self.assembled:
                    path.unlink()
        pieces = self.partial / PIECES
        for path in sorted(pieces.iterdir()) if pieces.exists() else []:
            if int(path.name) >= len(self.records):
                shutil.rmtree(path)

    # -- the episodes ----------------------------------------------------------------------------------------

    def run(self, progress: bool) -> dict[str, Any]:
        begun, first = time.monotonic(), len(self.records)
        if not self.done:
            from tqdm import tqdm

            bar = tqdm(total=len(self.steps), initial=first, unit=" episodes", desc="lerobot",
                       disable=not progress, smoothing=0.1)
            with bar:
                for i in range(first, len(self.steps)):
                    self._episode(i)
                    bar.update(1)
            self._assemble_all()
            self._finish()
        self.partial.rename(self.out)
        self._sync_dir(self.out.parent)
        frames = int(self.steps.ends[-1]) - (int(self.steps.ends[first - 1]) if first else 0)
        return {"episodes": len(self.steps) - first, "frames": frames, "seconds": time.monotonic() - begun,
                "path": str(self.out)}

    def _episode(self, i: int) -> None:
        steps = self.steps.episode(i)
        length = len(next(iter(steps.values())))
        start = int(self.steps.ends[i - 1]) if i else 0
        folder = self.partial / PIECES / f"{i:06d}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        fps = self.settings["fps"]
        frame_columns = {"timestamp": np.array([n / fps for n in range(length)]),
                         "frame_index": np.arange(length, dtype=np.int64),
                         "episode_index": np.full(length, i, dtype=np.int64),
                         "index": np.arange(start, start + length, dtype=np.int64),
                         "task_index": np.zeros(length, dtype=np.int64)}
        columns = {f.name: steps[f.name].reshape(length, -1) if len(f.shape) > 1 else steps[f.name]
                   for f in self.columns}
        table = fmt.data_table(fmt.data_schema(self.columns, self._fingerprint(i)), columns, frame_columns)
        self._write_parquet(folder / "data.parquet", [table])
        record: dict[str, Any] = {"episode": i, "length": length, "from": start, "task": self.settings["task"],
                                  "sizes": {"data": (folder / "data.parquet").stat().st_size}}
        for key in self.cameras:
            piece = folder / f"{key}.mp4"
            lerobot_video.encode_episode(steps[key], piece, fps, self.settings["video_codec"])
            self._sync_file(piece)
            record["sizes"][key], record[f"duration/{key}"] = piece.stat().st_size, lerobot_video.duration(piece)
        self._sync_dir(folder)
        ordered = {f.name: f for f in self.steps.features}  # statistics in the features' order, then LeRobot's
        by_key = lerobot_stats.episode_stats(
            {k: columns[k] for k in ordered if k in columns} | frame_columns,
            {k: steps[k] for k in self.cameras})
        stats = {k: by_key[k] for k in [*ordered, *fmt.FRAME_COLUMNS]}
        record["stats"], record["dtypes"] = lerobot_stats.as_json(stats), lerobot_stats.dtypes_of(stats)
        self._place(record)
        closing = self._closed_by(record)
        self._recorded(record)
        self._append(record)
        for path in closing:
            self._assemble(path)

    def _recorded(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        for key, path in [("data", self._data_path(record["data"]))] + [
                (k, self._video_path(k, record["videos"][k][:2])) for k in self.cameras]:
            filled = self.filled.setdefault(path, [0, 0])
            filled[0] += record["sizes"][key]
            filled[1] += record["length"]

    def _place(self, record: dict[str, Any]) -> None:
        """Which data and video files the episode goes to, by LeRobot's rule: a new file when the current
        one, with this episode, would reach the size info.json gives (here measured on the episodes' pieces)."""
        chunks_size, data_mb, video_mb = self.settings["sizes"]
        if not self.records:
            record["data"] = [0, 0]
            record["videos"] = {k: [0, 0, 0.0, record[f"duration/{k}"]] for k in self.cameras}
            return
        last = self.records[-1]
        size, frames = self.filled[self._data_path(last["data"])]
        per_frame = size / _MB / max(1, frames)
        record["data"] = (list(fmt.next_file(last["data"][0], last["data"][1], chunks_size))
                          if size / _MB + per_frame * record["length"] >= data_mb else last["data"])
        record["videos"] = {}
        for key in self.cameras:
            chunk, file, _, stop = last["videos"][key]
            size = self.filled[self._video_path(key, [chunk, file])][0]
            if (size + record["sizes"][key]) / _MB >= video_mb:
                (chunk, file), stop = fmt.next_file(chunk, file, chunks_size), 0.0
            record["videos"][key] = [chunk, file, stop, stop + record[f"duration/{key}"]]

    def _closed_by(self, record: dict[str, Any]) -> list[str]:
        """The files the episode before `record` went to that `record` does not: complete now."""
        if not self.records:
            return []
        last, closing = self.records[-1], []
        if last["data"] != record["data"]:
            closing.append(self._data_path(last["data"]))
        for key in self.cameras:
            if last["videos"][key][:2] != record["videos"][key][:2]:
                closing.append(self._video_path(key, last["videos"][key][:2]))
        return closing

    # -- the files -------------------------------------------------------------------------------------------

    def _data_path(self, where: list[int]) -> str:
        return fmt.DATA_PATH.format(chunk_index=where[0], file_index=where[1])

    def _video_path(self, key: str, where: list[int]) -> str:
        return fmt.VIDEO_PATH.format(video_key=key, chunk_index=where[0], file_index=where[1])

    def _assemble(self, path: str) -> None:
        """Write the data or video file `path` from its episodes' pieces (beside it, then renamed), record it,
        and drop the pieces."""
        if path in self.assembled:
            return
        target = self.partial / path
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + ".tmp")
        if path.startswith("data/"):
            pieces = [self._piece(r, "data.parquet") for r in self.records if self._data_path(r["data"]) == path]
            self._write_parquet(temporary, (pq.read_table(p) for p in pieces))
        else:
            key = next(k for k in self.cameras if path.startswith(f"videos/{k}/"))
            pieces = [self._piece(r, f"{key}.mp4") for r in self.records
                      if self._video_path(key, r["videos"][key][:2]) == path]
            lerobot_video.concatenate(pieces, temporary)
            self._sync_file(temporary)
        temporary.rename(target)
        self._sync_dir(target.parent)
        self.assembled.add(path)
        self._append({"assembled": path})
        for piece in pieces:
            piece.unlink()

    def _piece(self, record: dict[str, Any], name: str) -> Path:
        return self.partial / PIECES / f"{record['episode']:06d}" / name

    def _assemble_all(self) -> None:
        paths = dict.fromkeys(self._data_path(r["data"]) for r in self.records)
        for key in self.cameras:
            paths.update(dict.fromkeys(self._video_path(key, r["videos"][key][:2]) for r in self.records))
        for path in paths:
            self._assemble(path)

    def _finish(self) -> None:
        """meta/: the episodes' rows, the task, the statistics and info.json, then the journal and pieces go."""
        rows = [fmt.episode_row(r, self.cameras, r["stats"]) for r in self.records]
        tables = [pa.Table.from_pylist(rows[i:i + 10]) for i in range(0, len(rows), 10)]  # LeRobot's flushes
        self._write_parquet(self.partial / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0), tables,
                            compression="snappy")
        self._write_parquet(self.partial / fmt.TASKS, [fmt.tasks_table([self.settings["task"]])], compression="snappy")
        total = None
        for r in self.records:
            total = lerobot_stats.aggregate(total, lerobot_stats.from_json(r["stats"], r["dtypes"]))
        assert total is not None
        self._write_json(fmt.STATS, lerobot_stats.as_json(total))
        first = {k: lerobot_video.video_info(self.partial / self._video_path(k, [0, 0])) for k in self.cameras}
        info = fmt.info_json(self.steps.features, first, fps=self.settings["fps"], episodes=len(self.records),
                             frames=sum(r["length"] for r in self.records), tasks=1,
                             robot_type=self.settings["robot_type"], sizes=tuple(self.settings["sizes"]))
        self._write_json(fmt.INFO, info)
        shutil.rmtree(self.partial / PIECES, ignore_errors=True)
        for folder in sorted(p for p in self.partial.rglob("*") if p.is_dir()):  # every entry made, durable
            self._sync_dir(folder)
        (self.partial / JOURNAL).unlink()
        self._sync_dir(self.partial)

    def _fingerprint(self, episode: int) -> str:
        """The `fingerprint` Hugging Face `datasets` puts in a table's metadata (random there; here derived from
        the source and the episode, so that a resumed conversion writes the same bytes)."""
        return hashlib.blake2b(f"{self.settings['identity']}/{episode}".encode(), digest_size=8).hexdigest()

    def _write_parquet(self, path: Path, tables: Any, compression: str = "snappy") -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = None
        for table in tables:
            if writer is None:
                writer = pq.ParquetWriter(path, schema=table.schema, compression=compression, use_dictionary=True)
            writer.write_table(table)
        if writer is not None:
            writer.close()
        self._sync_file(path)

    def _write_json(self, name: str, doc: dict[str, Any]) -> None:
        path = self.partial / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=4, ensure_ascii=False))
        self._sync_file(path)

    def _sync_file(self, path: Path) -> None:
        if self.durable:
            with open(path, "rb+") as f:
                os.fsync(f.fileno())

    def _sync_dir(self, path: Path) -> None:
        if self.durable:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

