"""`zarrfeed serve` and RemoteLoader: a real server process on 127.0.0.1 (a free port), real Flight clients.
RemoteLoader and RemoteWindowLoader batches equal a local loader's, field for field and byte for byte, for every
rank; as Arrow and through named transforms; resume across remote and local; a trainer's next epoch."""
import functools
import time

import pytest
from zarrfeed.loader import Dataset, Loader, LoaderError, WindowLoader

from zarrfeed.flight import RemoteLoader, RemoteWindowLoader
from serve_process import equal_batches


@pytest.mark.parametrize("args", [dict(batch_size=500, seed=1),
                                  dict(batch_size=333, seed=2, shuffle_window=2, fields=["centroid", "track_id"]),
                                  dict(batch_size=1000, shuffle=False, drop_last=True),
                                  dict(batch_size=256, seed=4, rank=1, world_size=3),
                                  dict(batch_size=300, seed=3, shuffle_bytes=1)])  # the window's floor, 8 chunks
def test_remote_batches_are_the_local_loaders(server, data, args):
    with RemoteLoader(server.url, "agents", **args) as remote, \
            Loader(data, "agents", num_workers=0, copy=True, **args) as local:
        assert len(remote) == len(local)
        for _ in range(2):  # two epochs: the second is another order
            assert equal_batches(remote, local) == len(local)


def test_arrow_output_and_other_tables(server, data):
    with RemoteLoader(server.url, "frames", batch_size=64, output="arrow") as remote:
        batches = list(remote)
    assert sum(b.num_rows for b in batches) == Dataset.open(data).rows["frames"]
    assert batches[0].schema.field("ego_translation").type.list_size == 3


def test_resume_across_remote_and_local(server, data):
    with RemoteLoader(server.url, "agents", batch_size=400, seed=5) as remote:
        it = iter(remote)
        head = [next(it) for _ in range(3)]
        state = remote.state_dict()
    with Loader(data, "agents", batch_size=400, seed=5, num_workers=0, copy=True) as local:
        full = list(local)
        local.load_state_dict(state)  # a remote state resumes a local loader: the same batches
        assert equal_batches(local, full[3:]) == len(full) - 3
    with RemoteLoader(server.url, "agents", batch_size=400, seed=5) as resumed:
        resumed.load_state_dict(state)
        assert equal_batches(head + list(resumed), full) == len(full)
        with pytest.raises(ValueError, match="loader state has seed=5; this loader has seed=6"):
            RemoteLoader(server.url, "agents", batch_size=400, seed=6).load_state_dict(state)


def test_a_state_of_order_1_resumes_remotely_in_order_1(server, data):
    """A RemoteLoader refused an order-1 state a local Loader resumes; and a
    refused state changes nothing."""
    with Loader(data, "agents", batch_size=400, seed=5, num_workers=0, copy=True, order=1, shuffle_window=8) as old:
        it = iter(old)
        for _ in range(2):
            next(it)
        state = old.state_dict()
        rest = list(it)
    with RemoteLoader(server.url, "agents", batch_size=400, seed=5) as remote:
        with pytest.raises(ValueError, match="loader state has seed=5; this loader has seed=6"):
            RemoteLoader(server.url, "agents", batch_size=400, seed=6).load_state_dict(state)
        remote.load_state_dict(state)
        assert remote.state().order == 1 and remote.state().settings["shuffle_window"] == 8
        assert equal_batches(remote, rest) == len(rest)
    with RemoteLoader(server.url, "agents", batch_size=400, seed=5, order=2) as given:
        with pytest.raises(ValueError, match=r"loader state has order=1 \(saved mid-epoch\); this loader has "
                                             "order=2: pass order=1, or leave order out"):
            given.load_state_dict(state)
        assert given.state().order == 2


def test_named_transforms_run_on_the_server(server, data):
    import serve_transforms
    with RemoteLoader(server.url, "agents", batch_size=500, seed=1, transform="speed",
                      transform_args={"scale": 2.0}) as remote, \
            Loader(data, "agents", batch_size=500, seed=1, num_workers=0, copy=True,
                   transform=functools.partial(serve_transforms.speed, scale=2.0)) as local:
        assert equal_batches(remote, local) == len(local)  # what the trainer receives: the compact arrays
    with pytest.raises(ValueError, match=r"unknown transform 'nope' \(transforms: fails, slow, speed, "
                                         r"window_summary\)"):
        RemoteLoader(server.url, "agents", transform="nope")
    with pytest.raises(ValueError, match="transform 'speed': transform_args do not fit it"):
        RemoteLoader(server.url, "agents", transform="speed", transform_args={"sacle": 2})
    with pytest.raises(ValueError, match="transform_args must be JSON"):
        RemoteLoader(server.url, "agents", transform="speed", transform_args={"scale": object()})
    with RemoteLoader(server.url, "agents", batch_size=500, transform="fails") as remote, \
            pytest.raises(LoaderError, match="boom from the server's transform"):
        next(iter(remote))
    with RemoteLoader(server.url, "agents", batch_size=500) as remote:  # the server goes on serving
        assert len(next(iter(remote))["centroid"]) == 500


@pytest.mark.parametrize("args", [dict(history=3, future=4, batch_size=8, seed=1),
                                  dict(history=0, future=10, batch_size=5, seed=2, rank=1, world_size=2,
                                       shuffle_window=2),
                                  dict(history=2, future=2, batch_size=16, shuffle=False, drop_last=True)])
def test_remote_windows_are_the_local_window_loaders(server, data, args):
    with RemoteWindowLoader(server.url, **args) as remote, \
            WindowLoader(data, num_workers=0, copy=True, **args) as local:
        assert len(remote) == len(local)
        for _ in range(2):
            assert equal_batches(remote, local) == len(local)
        assert remote.state_dict() == local.state_dict()


def test_remote_windows_resume_as_arrow_and_through_a_transform(server, data):
    import serve_transforms
    with WindowLoader(data, 3, 4, batch_size=8, seed=3, num_workers=0, copy=True) as local:
        full = list(local)
    with RemoteWindowLoader(server.url, 3, 4, batch_size=8, seed=3) as remote:
        it = iter(remote)
        head = [next(it) for _ in range(2)]
        state = remote.state_dict()
    with RemoteWindowLoader(server.url, 3, 4, batch_size=8, seed=3, output="arrow") as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
    assert all(rb.num_rows == len(b["frame_row"]) for rb, b in zip(rest, full[2:], strict=True))
    assert rest[0].schema.field("agents/centroid").type.value_type.list_size == 2  # one row per sample
    from zarrfeed.loader.arrow_bridge import window_batch_from_arrow
    assert equal_batches(head + [window_batch_from_arrow(rb) for rb in rest], full) == len(full)
    with RemoteWindowLoader(server.url, 3, 4, batch_size=8, seed=3, transform="window_summary") as remote, \
            WindowLoader(data, 3, 4, batch_size=8, seed=3, num_workers=0, copy=True,
                         transform=serve_transforms.window_summary) as local:
        assert equal_batches(remote, local) == len(local)


def test_a_trainers_next_epoch_goes_on_with_the_servers_loader(server, data):
    """The loader that finished epoch 0 is kept for the same ticket's epoch 1: no new worker processes (its
    decoded chunks stay cached), and the batches are still the local Loader's."""
    with RemoteLoader(server.url, "agents", batch_size=700, seed=11) as remote, \
            Loader(data, "agents", batch_size=700, seed=11, num_workers=0, copy=True) as local:
        assert equal_batches(remote, local) == len(local)
        time.sleep(0.3)
        kept = set(server.descendants())
        it = iter(remote)
        first = next(it)
        assert set(server.descendants()) <= kept  # epoch 1 runs on the processes epoch 0 left
        assert equal_batches([first, *it], local) == len(local)
