"""Independent statements of what the writer must produce, for tests to compare against."""
import numpy as np
from zarrfeed.writer import L5KIT_SCHEMA


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


def assert_holds(ds, episodes) -> None:
    """The opened dataset `ds` is valid and holds exactly `episodes`, in order, each once."""
    assert ds.validate().ok
    for name, arr in expected_tables(episodes).items():
        assert ds.rows[name] == len(arr), name
        np.testing.assert_array_equal(ds[name][: ds.rows[name]], arr)


def wait_for_scenes(path, n: int, storage_options=None, timeout: float = 60, alive=None) -> int:
    """Wait until a writer has committed at least `n` scenes at `path` (while `alive()`, if given, is true);
    return the count seen. For tests that interrupt a writer mid-ingest."""
    import time

    from zarrfeed.loader import Dataset

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


def running(pids) -> list[int]:
    """The processes among `pids` still running: neither gone nor a zombie. A process may exit between
    any two reads of /proc, so a vanished entry counts as gone wherever it vanishes."""
    from pathlib import Path

    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
                out.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def shared_memory_held(pids=None) -> list[str]:
    """zarrfeed's shared-memory blocks still mapped or open, as "pid: what", in these processes (default:
    every process but this one). Blocks are anonymous memory files (memfd) that never appear in /dev/shm, so
    a check of /dev/shm cannot see them: this reads /proc/<pid>/maps and /proc/<pid>/fd instead."""
    import os
    from pathlib import Path

    if pids is None:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    held = []
    for pid in pids:
        proc = Path(f"/proc/{pid}")
        try:
            if proc.joinpath("stat").read_text().split()[2] == "Z":
                continue  # a zombie has released everything
            held += [f"{pid}: {line.split()[-2]}" for line in proc.joinpath("maps").read_text().splitlines()
                     if "memfd:zarrfeed" in line]
            for fd in proc.joinpath("fd").iterdir():
                try:
                    if os.readlink(fd).startswith("/memfd:zarrfeed"):
                        held.append(f"{pid}: fd {fd.name}")
                except OSError:  # closed meanwhile
                    pass
        except (FileNotFoundError, ProcessLookupError):  # exited meanwhile: holds nothing
            continue
        except PermissionError:  # not ours to read (the sandbox's init): not one of zarrfeed's processes
            continue
    return held


def own_shared_memory() -> int:
    """How many zarrfeed memfd mappings and descriptors this process holds."""
    import os
    return len(shared_memory_held([os.getpid()]))


def ticked(text: str, template: str, age: float, since: float) -> bool:
    """Whether `text` ends with `template`, whose "{}" is a count of seconds read from a clock while the test
    ran: `age` seconds when the test started timing at `since` (`time.monotonic()`), and up to the seconds
    since then more. No test asserts text that depends on when the clock ticks: on a busy machine (or after
    a round trip to a store) "no heartbeat for 90 s" is "91 s"."""
    import re
    import time

    found = re.search(re.escape(template).replace(r"\{\}", r"(\d+)") + "$", text)
    return found is not None and age - 1 <= int(found.group(1)) <= age + (time.monotonic() - since) + 1


def session(sid: int) -> list[int]:
    """The running processes (not zombies) of session `sid`: a test that starts a command with
    `start_new_session=True` finds every process the command started this way, workers and fork servers
    included, even once their parent has died and they were reparented. Other zarrfeed jobs on the machine
    are in sessions of their own, so a test that checks only these sees only what it made."""
    import os

    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(name))
    return pids


def dev_shm_held(pids) -> list[str]:
    """zarrfeed's files under /dev/shm mapped or open in these processes, as "pid: path" (its shared memory is
    in memfds: a /dev/shm file would outlive a crash; multiprocessing's semaphores are there too, and not
    zarrfeed's). Asked of the test's own processes while they run, not of /dev/shm's listing, which holds
    every user's files."""
    import os
    from pathlib import Path

    held = []
    for pid in pids:
        proc = Path(f"/proc/{pid}")
        try:
            held += [f"{pid}: {line.split(None, 5)[-1]}" for line in proc.joinpath("maps").read_text().splitlines()
                     if " /dev/shm/" in line and "zarrfeed" in line]
            for fd in proc.joinpath("fd").iterdir():
                try:
                    if os.readlink(fd).startswith("/dev/shm/") and "zarrfeed" in os.readlink(fd):
                        held.append(f"{pid}: {os.readlink(fd)}")
                except OSError:  # closed meanwhile
                    pass
        except (FileNotFoundError, ProcessLookupError, PermissionError):  # exited meanwhile
            continue
    return held


def recount(path, table: str, n: int) -> None:
    """Set the committed row count of `table` in the manifest at `path` to `n`, recording the rows of its last
    chunk as a writer would: a hand edit consistent in all but the count (as a damaged manifest could be)."""
    import json

    import numpy as np
    import xxhash

    from zarrfeed.core.stores import DirectoryStore
    from zarrfeed.core.zarr_array import Array

    doc = json.loads((path / "zarrfeed.json").read_text())
    doc["committed"][table] = n
    c = doc["schema"]["tables"][table]["chunk_rows"]
    doc.setdefault("tails", {}).pop(table, None)
    held = Array.open(DirectoryStore(path), table, read_only=True)
    if n % c and n <= held.shape[0]:
        doc["tails"][table] = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(held[n // c * c:n]).view(np.uint8))
    elif n % c:
        doc["tails"][table] = "0" * 16  # rows the array does not hold: refused for that before their digest
    (path / "zarrfeed.json").write_text(json.dumps(doc))
