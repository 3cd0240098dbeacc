"""Pictures of an L5Kit-shaped dataset: a scene from above (`scene_figure`) and the dataset at a glance
(`summary_figure`), as matplotlib figures; `zarrfeed plot` saves them as PNG files.

Needs matplotlib (`pip install 'zarrfeed[plot]'`). Rows are read below the committed counts, chunk by chunk,
so a missing or corrupt chunk is an error naming it, never drawn as zeros.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .core.schema import PERCEPTION_LABELS
from .loader import Dataset

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Scene", "Summary", "read_scene", "require_matplotlib", "scene_figure", "summarize", "summary_figure",
           "tracks"]

# a face's status in L5Kit: one-hot over these three
FACE_STATUS = ("active", "inactive", "unknown")
FACE_COLOURS = ("tab:orange", "0.6", "white")
NEEDS = {"scenes": ["frame_index_interval"],
         "frames": ["agent_index_interval", "traffic_light_faces_index_interval", "ego_translation"],
         "agents": ["centroid", "track_id", "label_probabilities"],
         "traffic_light_faces": ["face_id", "traffic_light_face_status"]}


def require_matplotlib() -> Any:
    """matplotlib's Figure; ImportError saying what to install when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("drawing needs matplotlib: pip install 'zarrfeed[plot]'") from None
    return Figure


def _check(dataset: Dataset) -> None:
    for table, fields in NEEDS.items():
        if table not in dataset.tables:
            raise ValueError(f"{dataset.location}: no table {table!r}; zarrfeed plot draws L5Kit-shaped datasets")
        names = dataset[table].dtype.names or ()
        for f in fields:
            if f not in names:
                raise ValueError(f"{dataset.location}: table {table!r} has no field {f!r}; zarrfeed plot draws "
                                 "L5Kit-shaped datasets")


def labels_of(dataset: Dataset) -> list[str]:
    """The dataset's label names (group attrs `labels`, else L5Kit's 17), without L5Kit's prefixes."""
    names = dataset.group.attrs.get("labels") or PERCEPTION_LABELS
    return [str(n).removeprefix("PERCEPTION_LABEL_").removeprefix("AVRESEARCH_LABEL_") for n in names]


UNLABELLED = {0, 1, 2, 16}  # L5Kit's NOT_SET, UNKNOWN, DONTCARE and AVRESEARCH_LABEL_DONTCARE: drawn in grey


def _colour(label: int) -> Any:
    """One colour per label index, the same in every figure."""
    from matplotlib import colormaps

    return (0.55, 0.6, 0.7, 1.0) if label in UNLABELLED else colormaps["tab10"](label % 10)


def _name(dataset: Dataset) -> str:
    return str(dataset.location).rstrip("/").rsplit("/", 1)[-1]


class Scene(NamedTuple):
    """The rows of one scene, as `scene_figure` draws them.

    Attributes:
        frames: The scene's frames (global rows first_frame ...).
        first_frame: Its first frame's global row.
        agents: Its agents' rows.
        agent_frame: Each agent row's frame (global index).
        faces: Its traffic-light faces' rows.
        face_frame: Each face row's frame (global index).
    """
    frames: np.ndarray            # the scene's frames (global rows first_frame ...)
    first_frame: int
    agents: np.ndarray            # its agents' rows
    agent_frame: np.ndarray       # each agent row's frame (global index)
    faces: np.ndarray             # its traffic-light faces' rows
    face_frame: np.ndarray        # each face row's frame (global index)


def read_scene(dataset: Dataset, scene: int) -> Scene:
    """Scene number `scene`'s frames, agents and faces, each agent and face row with its frame."""
    _check(dataset)
    n = dataset.rows["scenes"]
    if not 0 <= scene < n:
        raise ValueError(f"--scene {scene}: {dataset.location} has {n} scene{'s' if n != 1 else ''}"
                         + (f" (0 to {n - 1})" if n else ""))
    f0, f1 = (int(x) for x in dataset.read_rows("scenes", scene, scene + 1)["frame_index_interval"][0])
    frames = dataset.read_rows("frames", f0, f1)

    def children(field: str, table: str) -> tuple[np.ndarray, np.ndarray]:
        iv = frames[field]
        rows = dataset.read_rows(table, int(iv[0, 0]), int(iv[-1, 1])) if len(frames) else \
            np.zeros(0, dataset[table].dtype)
        return rows, np.repeat(np.arange(f0, f1), np.diff(iv, axis=1).ravel())

    agents, agent_frame = children("agent_index_interval", "agents")
    faces, face_frame = children("traffic_light_faces_index_interval", "traffic_light_faces")
    return Scene(frames, f0, agents, agent_frame, faces, face_frame)


def tracks(agents: np.ndarray, agent_frame: np.ndarray) -> dict[int, tuple[np.ndarray, int]]:
    """track id -> (its centroids in frame order, its label: the most probable label most often)."""
    order = np.lexsort((agent_frame, agents["track_id"]))
    ids = agents["track_id"][order]
    labels = agents["label_probabilities"][order].argmax(axis=1)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    out = {}
    for a, b in zip(starts, np.r_[starts[1:], len(ids)], strict=True):
        out[int(ids[a])] = (agents["centroid"][order[a:b]], int(np.bincount(labels[a:b]).argmax()))
    return out


def scene_figure(dataset: Dataset, scene: int = 0, frame: int | None = None, history: int = 10,
                 future: int = 50) -> Figure:
    """A scene from above: each agent's track coloured by its label, the ego's path, and frame `frame` (a
    global frame index; default the scene's middle) with the window `[frame - history, frame + future]` of
    a WindowLoader sample marked; below, the traffic-light faces of each frame by status (faces have no
    position in this format: their geometry is in L5Kit's semantic map)."""
    from matplotlib.collections import LineCollection

    Figure = require_matplotlib()
    s = read_scene(dataset, scene)
    f0, f1 = s.first_frame, s.first_frame + len(s.frames)
    t = (f0 + f1) // 2 if frame is None else frame
    if not f0 <= t < f1:
        raise ValueError(f"--frame {t}: scene {scene} holds frames {f0} to {f1 - 1}")
    names = labels_of(dataset)
    fig = Figure(figsize=(9, 10), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[4, 1])

    by_label: dict[int, list[np.ndarray]] = {}
    for xy, label in tracks(s.agents, s.agent_frame).values():
        by_label.setdefault(label, []).append(xy)
    for label in sorted(by_label):
        name = names[label] if label < len(names) else str(label)
        top.add_collection(LineCollection(by_label[label], colors=[_colour(label)], linewidths=0.8, alpha=0.8,
                                          label=f"{name} ({len(by_label[label])} tracks)"))
    ego = s.frames["ego_translation"][:, :2]
    top.plot(ego[:, 0], ego[:, 1], color="black", linewidth=1.0, label="ego path")
    w0, w1 = max(f0, t - history), min(f1, t + future + 1)
    top.plot(ego[w0 - f0:w1 - f0, 0], ego[w0 - f0:w1 - f0, 1], color="gold", linewidth=6, alpha=0.7,
             zorder=1,
             label=f"ego, frames {w0} to {w1 - 1} (window of frame {t})")
    now = s.agent_frame == t
    top.scatter(s.agents["centroid"][now, 0], s.agents["centroid"][now, 1], s=14, edgecolors="black",
                linewidths=0.4, c=[_colour(int(lab)) for lab in s.agents["label_probabilities"][now].argmax(1)],
                zorder=3, label=f"agents at frame {t}")
    top.scatter(ego[t - f0, 0], ego[t - f0, 1], marker="*", s=220, color="gold", edgecolors="black", zorder=4,
                label=f"ego at frame {t}")
    top.autoscale()
    top.set_aspect("equal", adjustable="datalim")
    top.set_xlabel("x (m, world frame)")
    top.set_ylabel("y (m)")
    top.legend(loc="best", fontsize="small")
    top.set_title(f"scene {scene} of {_name(dataset)}: frames {f0} to {f1 - 1}, {len(s.agents):,} agent rows")

    face_ids, first, row_of = np.unique(s.faces["face_id"], return_index=True, return_inverse=True)
    row_of = np.argsort(np.argsort(first))[row_of]  # faces in the order they first appear
    status = s.faces["traffic_light_face_status"].argmax(axis=1) if len(s.faces) else np.zeros(0, int)
    for k, (what, colour) in enumerate(zip(FACE_STATUS, FACE_COLOURS, strict=True)):
        mine = status == k
        bottom.scatter(s.face_frame[mine], row_of[mine], marker="s", s=6, color=colour, edgecolors="0.3",
                       linewidths=0.2, label=f"{what} ({int(mine.sum())})")
    bottom.axvspan(w0 - 0.5, w1 - 0.5, color="black", alpha=0.08)
    bottom.axvline(t, color="black", linewidth=1)
    bottom.set_xlim(f0 - 0.5, f1 - 0.5)
    bottom.set_xlabel("frame")
    bottom.set_ylabel(f"face ({len(face_ids)})")
    bottom.set_yticks([])
    bottom.invert_yaxis()
    bottom.legend(loc="lower right", bbox_to_anchor=(1, 1), fontsize="small", ncols=3, frameon=False)
    bottom.set_title("traffic-light faces per frame by status; the window shaded", fontsize="medium", loc="left")
    return fig


class Summary(NamedTuple):
    """What `summary_figure` draws, computed from the dataset.

    Attributes:
        frames_per_scene: Frames of each scene.
        agents_per_scene: Agent rows of each scene.
        faces_per_scene: Traffic-light face rows of each scene.
        agents_per_frame: Agent rows of each frame.
        label_rows: Agent rows per label (the most probable label of each row).
    """
    frames_per_scene: np.ndarray
    agents_per_scene: np.ndarray
    faces_per_scene: np.ndarray
    agents_per_frame: np.ndarray
    label_rows: np.ndarray        # agent rows per label (the most probable label of each row)


def summarize(dataset: Dataset) -> Summary:
    """Rows per scene and per frame, and agent rows per label, read below the committed counts."""
    _check(dataset)
    scenes = dataset.read_rows("scenes", 0, dataset.rows["scenes"], ["frame_index_interval"])
    frames = dataset.read_rows("frames", 0, dataset.rows["frames"],
                       ["agent_index_interval", "traffic_light_faces_index_interval"])

    def per_scene(counts: np.ndarray) -> np.ndarray:
        bounds = scenes["frame_index_interval"]
        cum = np.r_[0, np.cumsum(counts)]
        return cum[bounds[:, 1]] - cum[bounds[:, 0]]

    agents_per_frame = np.diff(frames["agent_index_interval"], axis=1).ravel()
    faces_per_frame = np.diff(frames["traffic_light_faces_index_interval"], axis=1).ravel()
    agents = dataset["agents"]
    width = len(labels_of(dataset))
    label_rows = np.zeros(max(width, agents.dtype["label_probabilities"].shape[0]), np.int64)
    step = agents.chunks[0]
    for a in range(0, dataset.rows["agents"], step):
        probs = dataset.read_rows("agents", a, min(a + step, dataset.rows["agents"]), ["label_probabilities"])
        label_rows += np.bincount(probs["label_probabilities"].argmax(axis=1), minlength=len(label_rows))
    return Summary(np.diff(scenes["frame_index_interval"], axis=1).ravel(), per_scene(agents_per_frame),
                   per_scene(faces_per_frame), agents_per_frame, label_rows)


def summary_figure(dataset: Dataset) -> Figure:
    """The dataset at a glance: frames, agents and faces per scene; agents per frame; the share of agent
    rows per label (each row counted under its most probable label)."""
    Figure = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    s = summarize(dataset)
    if not len(s.frames_per_scene):
        raise ValueError(f"--summary: {dataset.location} has no scenes to draw")
    names = labels_of(dataset)
    fig = Figure(figsize=(10, 9), layout="constrained")
    per_scene, per_frame, shares = fig.subplots(3, 1)
    x = np.arange(len(s.frames_per_scene))
    for k, (what, counts) in enumerate((("frames", s.frames_per_scene), ("agents", s.agents_per_scene),
                                        ("traffic-light faces", s.faces_per_scene))):
        per_scene.bar(x + (k - 1) * 0.27, counts, width=0.27, label=f"{what} ({int(counts.sum()):,})")
    per_scene.set_yscale("log")
    per_scene.set_xlabel("scene")
    per_scene.set_ylabel("rows (log)")
    per_scene.legend(fontsize="small")
    per_scene.set_title(f"{_name(dataset)}: rows per scene")
    if len(x) <= 20:  # a tick per scene (MaxNLocator puts ticks between scenes when there are few)
        per_scene.set_xticks(x)
    else:
        per_scene.xaxis.set_major_locator(MaxNLocator(integer=True))
    per_frame.plot(np.arange(len(s.agents_per_frame)), s.agents_per_frame, linewidth=0.8)
    mean = s.agents_per_frame.mean() if len(s.agents_per_frame) else 0.0
    per_frame.axhline(mean, color="black", linestyle="--", linewidth=0.8, label=f"mean {mean:.1f}")
    per_frame.set_xlabel("frame")
    per_frame.set_ylabel("agents")
    per_frame.legend(fontsize="small")
    per_frame.set_title("agents per frame")
    present = np.flatnonzero(s.label_rows)
    total = max(int(s.label_rows.sum()), 1)
    bars = shares.barh([names[i] if i < len(names) else str(i) for i in present], s.label_rows[present] / total,
                       color=[_colour(int(i)) for i in present])
    shares.bar_label(bars, labels=[f"{s.label_rows[i] / total:.1%} ({s.label_rows[i]:,})" for i in present],
                     fontsize="small", padding=2)
    shares.invert_yaxis()
    shares.set_xlim(0, 1.15)
    shares.set_xlabel("share of agent rows")
    shares.set_title("agent rows per label (most probable label); labels without rows left out")
    return fig
