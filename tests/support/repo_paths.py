"""Where the tests find the repository, their helpers and the shared data beside the repository."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository's root
TESTS = ROOT / "tests"
SUPPORT = TESTS / "support"  # the helpers (on sys.path: pyproject's `pythonpath`), scripts that tests run

REAL_SCENE = Path(os.environ.get("ZARRFEED_REAL_SCENE")
                  or ROOT.parent / "shared" / "data" / "l5kit_single_scene.zarr")
DP_BUFFER = REAL_SCENE.parent / "dp_replay_small.zarr"
DP_SAMPLES = REAL_SCENE.parent / "dp_samples_s16_b1_a7.npz"
LEROBOT_ROOT = REAL_SCENE.parent / "lerobot_v3_small" / "dataset"  # a LeRobot v3 dataset LeRobot 0.4.4 wrote
LEROBOT_SAMPLES = LEROBOT_ROOT.parent / "samples.npz"  # what its LeRobotDataset returned for every frame
