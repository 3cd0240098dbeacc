"""The `zarrfeed` command run as a real process, for tests."""
import subprocess
import sys


def zarrfeed(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "zarrfeed.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=120)
