"""Diffusion Policy's training samples: zarrfeed's SequenceLoader against Diffusion Policy's own two ways.

    python bench/bench_episodes.py [--episodes 500] [--repeat 3] [--image 96] [--json FILE]

On a replay buffer laid out as Diffusion Policy's `ReplayBuffer.add_episode` writes it (zarr 2, Blosc lz4
without shuffle, chunks along time sized as its `get_optimal_chunks` sizes them from the first episode: 73
steps of 96x96x3 images; `img`, `state` (5), `keypoint` (9, 2), `action` (2), `n_contacts` (1); 500 episodes
of 50 to 200 steps, as PushT's, images of a disc and a block moving on a flat background), the PushT sampling
(sequence_length 16, pad_before 1, pad_after 7), shuffled batches of 64 samples (DP's image configs):
  zarrfeed    SequenceLoader, 2 workers: the first epoch (start-up and decoding included; time to the first
              batch too) and the second (the decoded chunks kept: it only gathers)
  (z) DP zarr   what Diffusion Policy does reading straight from the store (`ReplayBuffer.create_from_path`):
              `SequenceSampler.sample_sequence` per sample, one zarr-python slice per key, the batch stacked
              as torch's default collate does (one process; DP's DataLoader workers each do the same)
  (m) DP memory the same after `ReplayBuffer.copy_from_path` read every array into numpy (its datasets' way;
              the copy's time is reported, and compared with zarrfeed's first batch)
The sampler here is written from Diffusion Policy's documented behaviour (`create_indices`, `sample_sequence`)
and checked against zarrfeed's samples on the same buffer before anything is timed (zarrfeed's own are checked
against samples DP's unmodified code made: tests/loader/kinds/test_sequences.py). Targets: zarrfeed >= 100x (z) and
>= 0.5x (m), first batch sooner than the copy. Medians of --repeat, runs alternating.
"""
from __future__ import annotations

import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from common import add_json_option, copy_bytes_per_s, machine, print_ratios, write_json
from zarrfeed import SequenceLoader

S, BEFORE, AFTER, BATCH = 16, 1, 7, 64
KEYS = {"img": (np.uint8, None), "state": (np.float32, (5,)), "keypoint": (np.float32, (9, 2)),
        "action": (np.float32, (2,)), "n_contacts": (np.float32, (1,))}


def optimal_chunk_length(step_shape: tuple[int, ...], itemsize: int, first_episode: int,
                         target: float = 2e6) -> int:
    """Steps per chunk as Diffusion Policy's `get_optimal_chunks` gives them for a (T, ...) array whose first
    episode has `first_episode` steps, when one step is under its 2 MB target: ceil(target / step bytes),
    at most the first episode's length."""
    return min(first_episode, math.ceil(target / (itemsize * math.prod(step_shape))))


def write_buffer(path: Path, episodes: int, image: int, seed: int = 0) -> np.ndarray:
    """A replay buffer of `episodes` episodes at `path`, written with zarr-python 2 in Diffusion Policy's layout;
    its episode ends."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 201, episodes)
    ends = np.cumsum(lengths)
    root = zarr.open_group(str(path), mode="w")
    data, meta = root.create_group("data"), root.create_group("meta")
    comp = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE)  # DP's default
    shapes = {k: ((image, image, 3) if k == "img" else shape) for k, (_, shape) in KEYS.items()}
    arrays = {k: data.zeros(k, shape=(int(ends[-1]), *shapes[k]), dtype=dt,
                            chunks=(optimal_chunk_length(shapes[k], np.dtype(dt).itemsize, int(lengths[0])),
                                    *shapes[k]), compressor=comp)
              for k, (dt, _) in KEYS.items()}
    yy, xx = np.mgrid[:image, :image]
    start = 0
    for i, n in enumerate(lengths.tolist()):  # one episode at a time, as add_episode writes
        t = np.arange(n)[:, None, None]
        cx, cy = (image * (0.2 + 0.6 * ((t * 0.01 + i * 0.37) % 1))), image * 0.5 + 0 * t
        disc = (xx - cx) ** 2 + (yy - cy) ** 2 < (image * 0.08) ** 2
        block = (abs(xx - image * 0.6) < image * 0.1) & (abs(yy - image * (0.3 + 0.002 * t)) < image * 0.05)
        img = np.full((n, image, image, 3), 230, np.uint8)
        img[disc] = (40, 60, 200)
        img[block & ~disc] = (120, 120, 120)
        steps = {"img": img}
        for k, (dt, shape) in KEYS.items():
            if k != "img":
                steps[k] = rng.normal(size=(n, *shape)).astype(dt)
        for k, v in steps.items():
            arrays[k][start:start + n] = v
        start += n
    meta.array("episode_ends", ends.astype(np.int64), chunks=(len(ends),), compressor=None)
    return ends


def dp_indices(ends: np.ndarray) -> np.ndarray:
    """Diffusion Policy's `create_indices` for every episode, as it documents them."""
    out = []
    before, after = min(max(BEFORE, 0), S - 1), min(max(AFTER, 0), S - 1)
    for i, end in enumerate(ends.tolist()):
        first = int(ends[i - 1]) if i else 0
        length = end - first
        for idx in range(-before, length - S + after + 1):
            lo, hi = max(idx, 0) + first, min(idx + S, length) + first
            out.append((lo, hi, lo - (idx + first), S - ((idx + S + first) - hi)))
    return np.array(out, np.int64)


def dp_sample(arrays: dict, index: np.ndarray) -> dict[str, np.ndarray]:
    """Diffusion Policy's `sample_sequence`: each key's steps, the first or last repeated into the padding."""
    lo, hi, s0, s1 = index.tolist()
    result = {}
    for key, arr in arrays.items():
        sample = arr[lo:hi]
        if s0 > 0 or s1 < S:
            data = np.zeros((S, *arr.shape[1:]), arr.dtype)
            if s0 > 0:
                data[:s0] = sample[0]
            if s1 < S:
                data[s1:] = sample[-1]
            data[s0:s1] = sample
            sample = data
        result[key] = sample
    return result


def dp_batches(arrays: dict, indices: np.ndarray, order: np.ndarray, limit_s: float) -> tuple[float, int]:
    """Samples in `order`, batch by batch, each batch stacked per key (torch's default collate), for at most
    `limit_s` seconds: (seconds, samples)."""
    t0 = time.perf_counter()
    n = 0
    for b in range(0, len(order), BATCH):
        samples = [dp_sample(arrays, indices[i]) for i in order[b:b + BATCH]]
        {k: np.stack([s[k] for s in samples]) for k in arrays}
        n += len(samples)
        if time.perf_counter() - t0 > limit_s:
            break
    return time.perf_counter() - t0, n


def copy_from_path(path: Path) -> tuple[float, dict]:
    """`ReplayBuffer.copy_from_path`'s numpy backend: every data array read whole into memory."""
    t0 = time.perf_counter()
    root = zarr.open_group(str(path), mode="r")
    arrays = {k: root["data"][k][:] for k in KEYS}
    root["meta"]["episode_ends"][:]
    return time.perf_counter() - t0, arrays


def zarrfeed_epochs(path: Path) -> dict:
    t0 = time.perf_counter()
    with SequenceLoader(path, S, BEFORE, AFTER, batch_size=BATCH, num_workers=2, seed=1) as loader:
        it = iter(loader)
        n = len(next(it)["sample"])
        ttfb = time.perf_counter() - t0
        for b in it:
            n += len(b["sample"])
        first = (time.perf_counter() - t0, n)
        t1 = time.perf_counter()
        n2 = sum(len(b["sample"]) for b in loader)
        return {"ttfb": ttfb, "epoch1": first, "epoch2": (time.perf_counter() - t1, n2)}


def copy_bound(sample_bytes: int) -> float:
    """Samples per second one process reaches copying each sample's bytes once (what a batch of samples costs at
    the least: both sides here copy every sample into its batch once)."""
    return copy_bytes_per_s() / sample_bytes


def check_equal(path: Path, arrays: dict, indices: np.ndarray) -> None:
    """The sampler here and zarrfeed's give the same samples (the first 500, unshuffled), before any timing."""
    with SequenceLoader(path, S, BEFORE, AFTER, batch_size=500, shuffle=False, num_workers=0) as loader:
        assert (loader.indices() == indices).all(), "indices differ"
        batch = next(iter(loader))
    for i in range(len(batch["sample"])):
        want = dp_sample(arrays, indices[i])
        for k in KEYS:
            assert (batch[k][i] == want[k]).all(), (i, k)


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=500)
    p.add_argument("--image", type=int, default=96, help="image side in pixels (PushT: 96)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--zarr-seconds", type=float, default=5.0, help="how long (z) samples per run")
    add_json_option(p)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zarrfeed-bench-episodes-"))
    try:
        path = tmp / "buffer.zarr"
        t0 = time.perf_counter()
        ends = write_buffer(path, args.episodes, args.image)
        wrote = time.perf_counter() - t0
        indices = dp_indices(ends)
        steps = int(ends[-1])
        copy_s, in_memory = copy_from_path(path)
        check_equal(path, in_memory, indices)
        del in_memory
        root = zarr.open_group(str(path), mode="r")
        on_disk = {k: root["data"][k] for k in KEYS}
        runs: dict[str, list[tuple[float, int]]] = {}
        ttfb, copies = [], []
        for rep in range(args.repeat):
            order = np.random.default_rng(rep).permutation(len(indices))
            steps_of = [("zarrfeed", None), ("dp", None)] if rep % 2 == 0 else [("dp", None), ("zarrfeed", None)]
            for who, _ in steps_of:
                if who == "zarrfeed":
                    r = zarrfeed_epochs(path)
                    runs.setdefault("zarrfeed epoch 2", []).append(r["epoch2"])
                    runs.setdefault("zarrfeed epoch 1", []).append(r["epoch1"])
                    ttfb.append(r["ttfb"])
                else:
                    s, arrays = copy_from_path(path)
                    copies.append(s)
                    runs.setdefault("(m) DP in memory", []).append(dp_batches(arrays, indices, order, 20.0))
                    del arrays
                    runs.setdefault("(z) DP from zarr", []).append(dp_batches(on_disk, indices, order,
                                                                             args.zarr_seconds))
        rate = {k: statistics.median(n / s for s, n in v) for k, v in runs.items()}
        sample_mb = sum(np.dtype(dt).itemsize * math.prod((args.image, args.image, 3) if k == "img" else sh)
                        for k, (dt, sh) in KEYS.items()) * S / 1e6
        print(machine())
        print(f"buffer: {args.episodes} episodes, {steps:,} steps, images {args.image}x{args.image}x3, "
              f"img chunks of {root['data']['img'].chunks[0]} steps; {len(indices):,} samples of {S} steps "
              f"({sample_mb:.2f} MB each); written in {wrote:.1f} s; median of {args.repeat} runs\n")
        rate["copy bound, 1 process"] = copy_bound(int(sample_mb * 1e6))
        for k, v in rate.items():
            print(f"{k:<22}{v:>12,.0f} samples/s{v * sample_mb:>10,.0f} MB/s")
        print(f"\nzarrfeed's first batch: {statistics.median(ttfb):.3f} s; DP's copy_from_path: "
              f"{statistics.median(copies):.2f} s before its first sample")
        rate["copy_from_path"] = 1 / statistics.median(copies)
        rate["zarrfeed first batch"] = 1 / statistics.median(ttfb)
        # with the copy bound, and the copy and the first batch as speeds (per second, higher is faster), as every
        # figure of --json is
        write_json(args.json, rate)
        print_ratios(rate, [("zarrfeed epoch 2", "copy bound, 1 process", None),
                            ("(z) DP from zarr", "copy bound, 1 process", None),
                            ("zarrfeed epoch 2", "(z) DP from zarr", 100),
                            ("zarrfeed epoch 1", "(z) DP from zarr", None),
                            ("zarrfeed epoch 2", "(m) DP in memory", 0.5),
                            ("zarrfeed epoch 1", "(m) DP in memory", None),
                            ("zarrfeed first batch", "copy_from_path", 1)])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
