"""L5Kit samples benchmark: AgentSampleLoader and EgoSampleLoader against the L5Kit way of making them.

    python bench/bench_windows.py [--scenes 100] [--repeat 3] [--quick]

On a synthetic L5Kit dataset (100 scenes = 2.1 M agents), history 10, future 50, batch 32, no raster:
  zarrfeed    AgentSampleLoader (the agents mask's rows) and EgoSampleLoader (every frame), 2 workers: the
              second epoch (decoded chunks kept) and the first (start-up included); time to the first batch
              from the start of the loop
  (l) L5Kit   per sample, what L5Kit 1.5.0's AgentDataset / EgoDataset do without a raster: read the scene's
              frames and the window's agents with zarr slices, then per frame in Python find the track
              (`filter_agents_by_track_id`), transform, difference (`generate_agent_sample`'s numerics), one
              process (L5Kit's DataLoader workers each do the same)
Targets on 2 cores: agent samples and ego samples >= 100x (l); first batch within 0.2 s. Medians of --repeat.
"""
from __future__ import annotations

import bisect
import statistics
import sys
import time

import numpy as np
import zarr
from common import add_json_option, parser, print_ratios, synthetic_dataset, write_json
from zarrfeed.loader import AgentSampleLoader, Dataset, EgoSampleLoader
from zarrfeed.loader.kinds import agents_mask

KEEP = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]


def zarrfeed(cls, ds: Dataset, mask_rows: np.ndarray | None) -> dict:
    kw = {"rows": mask_rows} if mask_rows is not None else {}
    with cls(ds, 10, 50, batch_size=32, num_workers=2, seed=0, **kw) as loader:
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        ttfb = time.perf_counter() - t0
        n = 32 + sum(len(b["frame_row"]) for b in it)
        epoch1 = time.perf_counter() - t0
        t = time.perf_counter()
        n2 = sum(len(b["frame_row"]) for b in loader)
        return {"epoch1": (epoch1, n), "epoch2": (time.perf_counter() - t, n2), "ttfb": ttfb}


def _yaw(rot: np.ndarray) -> float:
    import math
    return math.atan2(rot[1, 0], rot[0, 0])


def _poses(frames, agents_per_frame, track, af, cur_yaw, n):
    """L5Kit's get_relative_poses, transcribed: a Python loop over the frames, the track found per frame."""
    pos = np.zeros((n, 2))
    yaws = np.zeros((n, 1), np.float32)
    ext = np.zeros((n, 2), np.float32)
    av = np.zeros(n, np.float32)
    for i, (frame, fa) in enumerate(zip(frames, agents_per_frame, strict=True)):
        if track is None:
            c, y, e = frame["ego_translation"][:2], _yaw(frame["ego_rotation"]), (4.87, 1.85)
        else:
            hit = fa[fa["track_id"] == track]
            if not len(hit):
                continue
            c, y, e = hit[0]["centroid"], hit[0]["yaw"], hit[0]["extent"][:2]
        pos[i], yaws[i], ext[i], av[i] = c, y, e, 1.0
    m = af.T
    pos = (pos @ m[:2, :2] + m[-1:, :2]) * av[:, None]
    yaws = ((yaws - cur_yaw + np.pi) % (2 * np.pi) - np.pi) * av[:, None]
    return pos.astype(np.float32), yaws, ext, av


def l5kit_sample(g, bounds, starts, t: int, row: int | None) -> dict:
    """One sample the way L5Kit makes it: zarr slices of the scene's frames and the window's agents, then
    per-frame Python."""
    scene = bisect.bisect_right(starts, t) - 1
    s, e = bounds[scene]
    frames = g["frames"][s:e]  # EgoDataset.get_frame reads the scene's frames
    i = t - s
    hist, fut = frames[max(0, i - 10):i + 1][::-1].copy(), frames[i + 1:i + 51].copy()
    lo, hi = hist[-1]["agent_index_interval"][0], (fut if len(fut) else hist)[-1 if len(fut) else 0][
        "agent_index_interval"][1]
    agents = g["agents"][lo:hi]
    split = [agents[a - lo:b - lo] for a, b in np.concatenate([hist, fut])["agent_index_interval"].tolist()]
    if row is None:
        track, cur = None, frames[i]
        centroid, yaw = cur["ego_translation"][:2], _yaw(cur["ego_rotation"])
    else:
        me = g["agents"][row]
        track, centroid, yaw = me["track_id"], me["centroid"], float(me["yaw"])
    wfa = np.array([[np.cos(yaw), -np.sin(yaw), centroid[0]], [np.sin(yaw), np.cos(yaw), centroid[1]], [0, 0, 1]])
    afw = np.linalg.inv(wfa)
    fp, fy, fe, fa = _poses(fut, split[len(hist):], track, afw, yaw, 50)
    hp, hy, he, ha = _poses(hist, split[:len(hist)], track, afw, yaw, 11)
    fv = np.float32(np.concatenate((fp[:1], np.diff(fp, axis=0))) / 0.1)
    hv = np.float32(-np.diff(hp, axis=0) / 0.1)
    return {"target_positions": fp, "target_velocities": fv, "history_velocities": hv, "curr_speed":
            np.linalg.norm(hv[0]), "target_yaws": fy, "history_positions": hp, "history_yaws": hy}


def l5kit(path, items: np.ndarray, frames_of: np.ndarray, ego: bool, n: int) -> tuple[float, int]:
    g = zarr.open_group(str(path), mode="r")
    bounds = g["scenes"][:]["frame_index_interval"]
    starts = bounds[:, 0].tolist()
    pick = np.random.default_rng(0).choice(len(items), min(n, len(items)), replace=False)
    t0 = time.perf_counter()
    for j in pick.tolist():
        l5kit_sample(g, bounds, starts, int(frames_of[j]), None if ego else int(items[j]))
    return time.perf_counter() - t0, len(pick)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--quick", action="store_true", help="a smoke run: 4 scenes, one repeat, 100 L5Kit samples")
    p.add_argument("--l5kit-samples", type=int, default=400, help="samples the L5Kit way times per run")
    add_json_option(p)
    args = p.parse_args()
    if args.quick:
        args.scenes, args.repeat, args.l5kit_samples = 4, 1, 100
    with synthetic_dataset(args.scenes) as path:
        ds = Dataset.open(path)
        t = time.perf_counter()
        mask = agents_mask.compute(ds, 0.5)
        mask_s = time.perf_counter() - t
        rows = agents_mask.selected_rows(mask)
        iv = ds["frames"][:]["agent_index_interval"]
        frames_of_rows = np.searchsorted(iv[:, 1], rows, side="right")
        runs: dict[str, list[tuple[float, int]]] = {}
        ttfb: dict[str, list[float]] = {"agents": [], "ego": []}
        for _ in range(args.repeat):
            for name, cls, sel in (("agents", AgentSampleLoader, rows), ("ego", EgoSampleLoader, None)):
                r = zarrfeed(cls, ds, sel)
                runs.setdefault(f"zarrfeed {name}", []).append(r["epoch2"])
                runs.setdefault(f"zarrfeed {name} epoch 1", []).append(r["epoch1"])
                ttfb[name].append(r["ttfb"])
            runs.setdefault("(l) L5Kit agents", []).append(l5kit(path, rows, frames_of_rows, False,
                                                                 args.l5kit_samples))
            frames = np.arange(ds.rows["frames"])
            runs.setdefault("(l) L5Kit ego", []).append(l5kit(path, frames, frames, True, args.l5kit_samples))
        rate = {k: statistics.median(n / s for s, n in v) for k, v in runs.items()}
        # first batches as a speed (per second, higher is faster), as every figure of --json is
        write_json(args.json, {**rate, **{f"first batches/s {k}": 1 / statistics.median(v) for k, v in ttfb.items()}})
        print(f"{ds.rows['scenes']} scenes, {ds.rows['frames']:,} frames, {ds.rows['agents']:,} agents; agents mask "
              f"({len(rows):,} agent samples) computed in {mask_s:.2f} s; median of {args.repeat} runs\n")
        for k, v in rate.items():
            print(f"{k:<28}{v:>12,.0f} samples/s")
        print(f"\ntime to first batch: agents {statistics.median(ttfb['agents']):.3f} s, "
              f"ego {statistics.median(ttfb['ego']):.3f} s (target <= 0.2 s)")
        print_ratios(rate, [("zarrfeed agents", "(l) L5Kit agents", 100), ("zarrfeed ego", "(l) L5Kit ego", 100),
                            ("zarrfeed agents epoch 1", "(l) L5Kit agents", None),
                            ("zarrfeed ego epoch 1", "(l) L5Kit ego", None)])


if __name__ == "__main__":
    sys.exit(main())
