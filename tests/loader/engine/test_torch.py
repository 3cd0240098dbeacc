"""PyTorch: Loader.to_torch() in a DataLoader, dtypes converted in the workers, ranks from torch.distributed,
the view-check debug mode; and what JAX does with a batch (shares through DLPack, copies through asarray)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from repo_paths import ROOT
from zarrfeed.loader import Dataset, Loader, WindowLoader

torch = pytest.importorskip("torch")


def in_shared_memory(address: int) -> bool:
    """Whether `address` lies in one of zarrfeed's shared-memory blocks mapped in this process."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "memfd:zarrfeed" in line:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(2, 3, chunks={"agents": 500}, frames=40, agents_per_frame=30)


def test_dataloader_gets_tensors_sharing_the_ring(data):
    loader = Loader(data, batch_size=128, num_workers=2, seed=1, dtypes={"centroid": "float32"})
    ds = loader.to_torch()
    assert isinstance(ds, torch.utils.data.IterableDataset) and len(ds) == len(loader)
    dl = torch.utils.data.DataLoader(ds, batch_size=None)
    model = torch.nn.Linear(2, 1)
    rows, pointers = 0, set()
    with loader:
        for batch in dl:
            assert batch["centroid"].dtype == torch.float32  # converted in the workers: nn.Linear takes it
            model(batch["centroid"])
            pointers.add(batch["centroid"].data_ptr())
            rows += len(batch["centroid"])
    assert rows == Dataset.open(data).rows["agents"]
    assert all(in_shared_memory(p) for p in pointers)  # tensors on the ring's slots: no copies
    with Loader(data, batch_size=128, num_workers=0, seed=1, copy=True) as plain:
        want = [b["centroid"].astype(np.float32) for b in plain]
    with Loader(data, batch_size=128, num_workers=2, seed=1, dtypes={"centroid": "float32"}, copy=True) as again:
        got = [b["centroid"].numpy() for b in torch.utils.data.DataLoader(again.to_torch(), batch_size=None)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_dataloader_workers_are_refused_with_one_line(data):
    with Loader(data, batch_size=128, num_workers=1) as loader:
        dl = torch.utils.data.DataLoader(loader.to_torch(), batch_size=None, num_workers=1)
        with pytest.raises(RuntimeError, match="give the DataLoader num_workers=0"):
            next(iter(dl))


def test_unknown_dtypes_field_is_one_line(data):
    with pytest.raises(ValueError, match="dtypes: no field 'speed'"):
        Loader(data, dtypes={"speed": "float32"})


def test_window_loader_to_torch(data):
    """Windows are ragged; a transform in the workers makes the fixed-shape float32 tensors a model eats."""
    def features(batch):
        return {"ego": batch["frames/ego_translation"][:, :, :2].astype(np.float32)}

    with WindowLoader(data, history=2, future=2, batch_size=8, num_workers=1, transform=features) as loader:
        batch = next(iter(torch.utils.data.DataLoader(loader.to_torch(), batch_size=None)))
    assert batch["ego"].dtype == torch.float32 and batch["ego"].shape == (8, 5, 2)


def test_ranks_come_from_torch_distributed(data, tmp_path):
    """Two real ranks (gloo on 127.0.0.1, a free port): each gets its own half of the epoch."""
    script = tmp_path / "rank.py"
    script.write_text(f"""
import sys, torch, torch.distributed as dist
from zarrfeed.loader import Loader
if __name__ == "__main__":
    dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2, init_method=sys.argv[2])
    with Loader({str(data)!r}, batch_size=64, num_workers=1, seed=2, drop_last=True) as loader:
        rows = sum(len(b["track_id"]) for b in loader.to_torch())
        print(loader.state().settings["rank"], rows)
    dist.destroy_process_group()
""")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), f"tcp://127.0.0.1:{port}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    ranks = sorted(o[0].split()[0] for o in outs)
    counts = {int(o[0].split()[1]) for o in outs}
    assert ranks == ["0", "1"] and len(counts) == 1  # each rank its half, equal in size
    with Loader(data, batch_size=64, num_workers=0, seed=2, drop_last=True, rank=0, world_size=2) as half:
        assert counts == {sum(len(b["track_id"]) for b in half)}


def test_a_view_kept_past_the_next_batch_faults_loudly(data, tmp_path):
    """check_views: using a stale view stops the process with a segmentation fault and the line that did it,
    instead of reading another batch's rows; without it the same code runs on (and reads wrong rows)."""
    script = tmp_path / "stale.py"
    script.write_text(f"""
import sys
from zarrfeed.loader import Loader
if __name__ == "__main__":
    with Loader({str(data)!r}, batch_size=64, num_workers=1, check_views=sys.argv[1] == "1") as loader:
        it = iter(loader)
        first = next(it)["centroid"]
        next(it)
        print("stale read", float(first.sum()), flush=True)  # the bug: `first` is no longer this batch
""")
    ok = subprocess.run([sys.executable, str(script), "0"], capture_output=True, text=True, timeout=120,
                        cwd=ROOT)
    assert ok.returncode == 0 and "stale read" in ok.stdout
    bad = subprocess.run([sys.executable, str(script), "1"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert bad.returncode == -11 and "stale read" not in bad.stdout
    assert "Segmentation fault" in bad.stderr and 'stale.py", line 9' in bad.stderr
    env = {**os.environ, "ZARRFEED_CHECK_VIEWS": "1"}  # the same from the environment, code unchanged
    script.write_text(script.read_text().replace('check_views=sys.argv[1] == "1"', "check_views=None"))
    bad = subprocess.run([sys.executable, str(script), "x"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=env)
    assert bad.returncode == -11


def test_view_check_hands_out_equal_batches(data):
    with Loader(data, batch_size=100, num_workers=1, check_views=True) as checked:
        a = [float(b["centroid"].sum()) for b in checked]
    with Loader(data, batch_size=100, num_workers=1) as plain:
        b = [float(b["centroid"].sum()) for b in plain]
    assert a == b


def test_jax_shares_through_dlpack_and_copies_through_asarray(data):
    jax = pytest.importorskip("jax")
    with Loader(data, batch_size=100, num_workers=0, fields=["centroid"], dtypes={"centroid": "float32"}) as loader:
        batch = next(iter(loader))
        xy = batch["centroid"]
        shared = jax.dlpack.from_dlpack(xy)
        copied = jax.numpy.asarray(xy)
        assert shared.unsafe_buffer_pointer() == xy.ctypes.data
        assert copied.unsafe_buffer_pointer() != xy.ctypes.data
