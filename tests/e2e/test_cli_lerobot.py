"""`zarrfeed info` and `zarrfeed validate` on a LeRobot v3 root, run as real processes: a description, "valid",
and for a damaged root one-line errors with the exit codes of every other dataset (1 invalid, 2 unreadable)."""
import os

from cli_process import zarrfeed
from lerobot_roots import CAM, VIDEO, copy_root, edit_info
from repo_paths import LEROBOT_ROOT


def test_info_describes_the_root_and_validate_finds_it_valid():
    out = zarrfeed("info", LEROBOT_ROOT)
    assert out.returncode == 0, out.stderr
    assert f"{LEROBOT_ROOT} (lerobot)\nLeRobot v3.0: 5 episodes, 153 frames, 2 tasks, 10 fps\n" in out.stdout
    assert "features: observation.state float32(6,), action float32(6,)" in out.stdout
    assert f"cameras: {CAM} 48x64" in out.stdout and f"{CAM}: {CAM} |u1(48, 64, 3)" in out.stdout
    out = zarrfeed("validate", "-q", LEROBOT_ROOT)
    assert out.returncode == 0 and out.stdout.startswith(f"{LEROBOT_ROOT}: valid (5 episodes"), out


def test_a_damaged_root_exits_1_or_2_with_one_line_each(tmp_path):
    root = copy_root(tmp_path / "root")
    os.unlink(root / VIDEO)
    out = zarrfeed("validate", "-q", root)
    assert out.returncode == 1 and out.stdout.splitlines()[1:] == [
        "1 violation:", f"  {VIDEO}: missing (the episodes' metadata names it)"], out
    edit_info(root, lambda info: info.pop("fps"))
    out = zarrfeed("validate", "-q", root)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out
    assert f"{root}/meta/info.json: key 'fps' missing" in out.stderr and len(out.stderr.strip().splitlines()) == 1
