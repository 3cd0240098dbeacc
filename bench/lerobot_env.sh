#!/usr/bin/env bash
# bench/.venv-lerobot: the environment of bench_lerobot.py and make_lerobot_data.py (LeRobot 0.4.4 beside this
# checkout's zarrfeed), apart from zarrfeed's own: LeRobot and its heavy dependencies are never in zarrfeed's extras.
#
#     bash bench/lerobot_env.sh          # creates or completes bench/.venv-lerobot (gitignored), then checks it
#
# What is pinned, and why:
# - Python 3.11 ($PYTHON, default python3.11): LeRobot 0.4.x (dataset format v3.0) runs on it; 0.5 needs 3.12.
# - torch 2.13.0+cpu ($TORCH, default torch==2.13.0+cpu) from this machine's wheels (pip's find-links /opt/wheels),
#   against LeRobot's torch<2.11: PyPI's Linux torch is a CUDA build of several GB, and LeRobot's reading uses
#   torch only for tensors and its DataLoader.
# - lerobot==0.4.4 with --no-deps, so pip neither replaces that torch nor installs what reading and writing
#   datasets never imports (wandb, rerun-sdk, pynput, pyserial, diffusers, gymnasium, opencv, cmake,
#   imageio, torchcodec: its backend needs system FFmpeg libraries); the runtime dependencies the datasets code
#   imports are listed below within LeRobot's own ranges.
# - torchvision==0.25.0 (the newest LeRobot allows) with --no-deps: LeRobot's video_backend="pyav" decodes with
#   torchvision.io.VideoReader, which torchvision 0.28 (the one built for torch 2.13) no longer has. 0.25's
#   compiled ops are built for CUDA torch 2.10 and do not load here, and its import then fails registering fake
#   kernels of those ops (torchvision::nms); the .pth file below skips that registration (torchvision imports
#   with its ops absent, which LeRobot's datasets code never calls; VideoReader's pyav backend is pure Python).
# - av>=15,<16 (LeRobot's range; zarrfeed's video extra allows it): PyAV with FFmpeg, dav1d and SVT-AV1 in its
#   wheels, the same library on both sides of the benchmark.
# The check at the end: LeRobotDataset(root=shared/data/lerobot_v3_small/dataset, delta_timestamps=DT,
# video_backend="pyav")[i] equals samples.npz (LeRobot's own output, made elsewhere) for every frame i.
set -euo pipefail

bench=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$bench")
venv="$bench/.venv-lerobot"
golden=${GOLDEN:-$repo/../shared/data/lerobot_v3_small}

[ -x "$venv/bin/python" ] || "${PYTHON:-python3.11}" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)

"${pip[@]}" "${TORCH:-torch==2.13.0+cpu}"
"${pip[@]}" --no-deps "torchvision==0.25.0" "lerobot==0.4.4"
"${pip[@]}" -e "$repo[video]" "av>=15.0.0,<16.0.0" "pillow>=10" \
    "datasets>=4.0.0,<5.0.0" "huggingface-hub>=0.34.2,<0.36.0" "accelerate>=1.10.0,<2.0.0" \
    "draccus==0.10.0" "jsonlines>=4.0.0,<5.0.0" "packaging>=24.2,<26.0" "termcolor>=2.4.0,<4.0.0" \
    "deepdiff>=7.0.1,<9.0.0" "einops>=0.8.0,<0.9.0" "setuptools>=71.0.0,<81.0.0"

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cat > "$site/zz_torchvision_without_ops.pth" <<'EOF'
import sys, types; sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
EOF

"$venv/bin/python" -W ignore -c 'from importlib.metadata import version as v
print("bench/.venv-lerobot:", ", ".join(f"{p} {v(p)}" for p in ("torch", "torchvision", "av", "lerobot", "zarrfeed")))'
echo "(pip's resolver reports lerobot's torch, torchvision and optional packages as conflicts: chosen above)"

if [ ! -d "$golden" ]; then
    echo "no golden at $golden (set GOLDEN): the environment is not checked" >&2
    exit 0
fi
HF_HUB_OFFLINE=1 "$venv/bin/python" -W ignore - "$golden" <<'EOF'
import json
import sys

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

golden = sys.argv[1]
z = np.load(f"{golden}/samples.npz")
dt = json.loads(str(z["delta_timestamps"]))
ds = LeRobotDataset("golden/lerobot_v3_small", root=f"{golden}/dataset", delta_timestamps=dt, video_backend="pyav")
for i in range(len(ds)):
    item = ds[i]
    for key in z.files:
        if key == "delta_timestamps":
            continue
        value = item[key].numpy()
        if key in ds.meta.video_keys:
            value = np.round(value * 255).astype(np.uint8)
        if value.shape != z[key][i].shape or not np.array_equal(value, z[key][i]):
            sys.exit(f"LeRobot in bench/.venv-lerobot does not reproduce samples.npz: item {i}, {key}")
print(f"checked: LeRobotDataset(..., video_backend='pyav')[i] equals samples.npz for all {len(ds)} frames")
EOF
