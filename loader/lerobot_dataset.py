"""A LeRobot v3 root opened as a `Dataset` (`Dataset.open` of a location holding `meta/info.json`), read in
place: the tables of `core.lerobot_tables` (a replay buffer's shape: `episodes` and one step table per feature),
and `lerobot`, its parsed metadata.

It has no commits and no recorded digests (`digests()` is None, nothing is checked against records); its
`version_tag` is a digest of its files' names, sizes and times. `validate` checks what the format promises
(`core.lerobot_checks`), without decoding the videos.
"""
from __future__ import annotations

from typing import Any, Callable

from ..core import lerobot_checks
from ..core.errors import FormatError
from ..core.lerobot_meta import LeRobotMeta, is_lerobot
from ..core.lerobot_tables import open_lerobot
from ..core.links import Violation
from ..core.location import Location
from ..core.zarr_array import Group
from .dataset import OTHER_ROOTS, Dataset, ValidationReport, VerifyReport


class LeRobotDataset(Dataset):
    """A LeRobot v3 root as a zarrfeed dataset, read in place: the table `episodes` (per episode its `end`,
    `episode_index` and `length`) and one step table per feature, named as the feature, as a replay buffer's;
    `read_rows`, `to_arrow` and every loader work on it. It records no commits nor digests; `validate` checks
    what the format promises.

    Made by `Dataset.open` of such a root (the constructor takes what opening found):

    Args:
        location: Where the root is.
        group: Its store's root (a LeRobot root holds no zarr group).
        tables: Each table, read from the root's Parquet and video files where they lie.
        rows: Each table's rows.
        schema: Its schema (named "lerobot").
        commit: None (a LeRobot dataset has no commits).
        dataset_id: None.

    Attributes:
        lerobot: The parsed `meta/`: fps, features, cameras, tasks, the episodes' files and time ranges, stats.
    """

    lerobot: LeRobotMeta

    @classmethod
    def open_root(cls, location: Location, mode: str = "r", commit: int | None = None) -> "LeRobotDataset":
        """The LeRobot root at `location` (`FormatError` in one line naming the file and key or episode)."""
        if mode != "r":
            raise FormatError(f"{location}: a LeRobot dataset is read in place, read-only (mode 'r'); convert it to "
                              "write to it")
        if commit is not None:
            raise FormatError(f"{location}: a LeRobot dataset has no commits; open it without commit=")
        meta, schema, tables = open_lerobot(location)
        group = Group(location.store("r"), "", read_only=True)  # (no zarr group: its store, for `close`)
        # (external tables have the part of `Array`'s interface that tables are used through)
        ds = cls(location, group, tables, {n: t.shape[0] for n, t in tables.items()},  # type: ignore[arg-type]
                 schema)
        ds.lerobot = meta
        return ds

    def digests(self, tail: bool = True) -> None:
        """None: a LeRobot dataset records no digests of its chunks."""
        return None

    def commit_violations(self) -> list[Violation]:
        return []

    def info(self) -> dict[str, dict[str, Any]]:
        """Per table as `Dataset.info`; `bytes_stored` is the size of the files it is read from (every tabular
        feature is read from the same data files, a camera from its videos)."""
        fs, root = self.location.filesystem()
        sizes: dict[str, int] = {}

        def size(paths: list[str]) -> int:
            for p in paths:
                if p not in sizes:
                    try:
                        sizes[p] = int(fs.size(f"{root}/{p}"))
                    except FileNotFoundError:
                        sizes[p] = 0
            return sum(sizes[p] for p in paths)

        meta = self.lerobot
        out = {}
        for name, arr in self.tables.items():
            files = meta.video_files.get(name) or (meta.episodes.files if name == "episodes" else meta.data_files)
            nbytes, stored = self.rows[name] * arr.dtype.itemsize, size(files)
            out[name] = {
                "rows": self.rows[name],
                "dtype": [list(map(str, f)) if len(f) == 2 else [f[0], f[1], list(f[2])] for f in arr.dtype.descr],
                "chunk_rows": arr.chunks[0],
                "chunks_initialized": -(-self.rows[name] // arr.chunks[0]),
                "bytes": nbytes,
                "bytes_stored": stored,
                "ratio": round(nbytes / stored, 3) if stored else None,
            }
        return out

    def validate(self, limit: int = 20, progress: Callable[[int], None] | None = None) -> ValidationReport:
        """What the LeRobot format promises (see `core.lerobot_checks.validate`), each violation naming file,
        episode and key; the videos are not decoded (their packets are counted)."""
        report = ValidationReport()
        for where, what in lerobot_checks.validate(self.lerobot):
            report.count += 1
            if len(report.violations) < limit:
                report.violations.append(Violation(where, None, None, what))
        if progress:
            progress(sum(self.rows.values()))
        return report

    def verify(self, progress: Callable[[int], None] | None = None, batch: int = 16) -> VerifyReport:
        """Nothing to verify: a LeRobot dataset records no digests (every chunk is counted as not verifiable)."""
        chunks = sum(-(-self.rows[t] // a.chunks[0]) for t, a in self.tables.items())
        if progress:
            progress(chunks)
        return VerifyReport(unverifiable=chunks, recorded=False)


OTHER_ROOTS.append((is_lerobot, LeRobotDataset.open_root))  # `Dataset.open` reads such a root as this class
