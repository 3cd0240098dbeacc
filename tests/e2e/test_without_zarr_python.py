"""zarr-python is not a run-time dependency. Every command runs, in every process it starts, where `import zarr`
fails (a `sitecustomize` on PYTHONPATH refuses it, so the fork server and workers refuse it too)."""
import os
import subprocess
import sys

BLOCK = '''
import sys

class NoZarr:
    """Refuses zarr-python, as an environment without it (or with zarr 3, which zarrfeed must not import)."""
    def find_spec(self, name, path=None, target=None):
        if name == "zarr" or name.startswith("zarr."):
            raise ImportError(f"{name} is blocked: zarrfeed must not import zarr-python")
        return None

sys.meta_path.insert(0, NoZarr())
'''


def _run(env, *args):
    return subprocess.run([sys.executable, "-m", "zarrfeed", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def test_every_command_runs_where_zarr_cannot_be_imported(tmp_path, real_scene):
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "block"), os.environ.get("PYTHONPATH", "")])}
    refused = subprocess.run([sys.executable, "-c", "import zarr"], capture_output=True, text=True, env=env)
    assert refused.returncode != 0 and "blocked" in refused.stderr  # the blocker works
    data = tmp_path / "d.zarr"
    for args in (["ingest", data, "--synthetic", 6, "--workers", 2, "-q"],
                 ["ingest", data, "--synthetic", 2, "--seed", 1, "--workers", 2, "--append", "-q"],
                 ["info", data], ["validate", data, "--deep"], ["validate", real_scene],
                 ["load", data, "--epochs", 1, "--workers", 2, "-q"],
                 ["mask", data, "--workers", 2],
                 ["export", data, tmp_path / "parquet"]):
        out = _run(env, *args)
        assert out.returncode == 0, (args, out.stderr)
        assert "blocked" not in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
    assert (data / "agents_mask" / "0.5" / ".zarray").is_file()
