"""Independent statements of what the writer must produce, for tests to compare against."""
import numpy as np

from writer import L5KIT_SCHEMA


def expected_tables(episodes, schema=L5KIT_SCHEMA):
    """Concatenate episodes, shifting each link's intervals by the child rows that came before."""
    out = {name: [] for name in schema.tables}
    offsets = {name: 0 for name in schema.tables}
    for ep in episodes:
        for name, arr in ep.items():
            arr = arr.copy()
            for link in schema.links_from(name):
                arr[link.field] += offsets[link.child]
            out[name].append(arr)
        for name, arr in ep.items():
            offsets[name] += len(arr)
    return {name: np.concatenate(parts) for name, parts in out.items()}


def wait_for_scenes(path, n: int, storage_options=None, timeout: float = 60, alive=None) -> int:
    """Wait until a writer has committed at least `n` scenes at `path` (while `alive()`, if given, is true);
    return the count seen. For tests that interrupt a writer mid-ingest."""
    import time

    from loader import Dataset

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (alive is None or alive()):
        try:
            seen = Dataset.open(path, storage_options=storage_options).rows["scenes"]
            if seen >= n:
                return seen
        except ValueError:  # not created yet
            pass
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} scenes committed at {path} within {timeout} s")
