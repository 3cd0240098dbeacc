"""Which rows a batch holds (issue 22): `row_ids=True` adds `_row`, each row's index in its table, computed
from the plan; it names exactly the rows the batch holds, every row of an epoch once, across a resume, with a
transform, as Arrow, and through the server."""
import numpy as np
import pytest
from zarrfeed.loader import Dataset, Loader


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(6, 31, chunks={"agents": 700, "frames": 100, "traffic_light_faces": 300}, frames=60,
                         agents_per_frame=25)


def rows_of(loader):
    return [b["_row"].copy() for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_batch_names_its_rows_and_an_epoch_names_every_row_once(data, workers):
    table = Dataset.open(data)["agents"][:]
    with Loader(data, batch_size=333, num_workers=workers, seed=4, shuffle_window=3, row_ids=True) as loader:
        for epoch in range(2):
            seen = []
            for b in loader:
                np.testing.assert_array_equal(b["track_id"], table["track_id"][b["_row"]])
                np.testing.assert_array_equal(b["centroid"], table["centroid"][b["_row"]])
                seen.append(b["_row"].copy())
            assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(len(table)))


def test_ranks_rows_and_a_resume_read_each_row_once(data):
    n = Dataset.open(data).rows["agents"]
    with Loader(data, batch_size=200, num_workers=0, seed=2, rank=0, world_size=2, row_ids=True) as r0, \
            Loader(data, batch_size=200, num_workers=0, seed=2, rank=1, world_size=2, row_ids=True) as r1:
        first = rows_of(r0)
        it = iter(r1)
        part = [next(it)["_row"].copy() for _ in range(3)]
        state = r1.state_dict()
    with Loader(data, batch_size=200, num_workers=0, seed=2, rank=1, world_size=2, row_ids=True) as resumed:
        resumed.load_state_dict(state)
        rest = rows_of(resumed)
    every = np.concatenate(first + part + rest)
    assert set(every.tolist()) == set(range(n)) and len(every) - n <= 1  # ranks even out with one repeated row


def test_row_ids_with_a_transform_and_as_arrow(data):
    table = Dataset.open(data)["agents"][:]

    def speed(batch):
        return {"speed": np.linalg.norm(batch["velocity"], axis=1)}

    with Loader(data, batch_size=500, num_workers=1, seed=1, transform=speed, row_ids=True) as loader:
        for b in loader:
            np.testing.assert_allclose(b["speed"], np.linalg.norm(table["velocity"][b["_row"]], axis=1))
    with Loader(data, batch_size=500, num_workers=0, seed=1, output="arrow", row_ids=True) as loader:
        rb = next(iter(loader))
        np.testing.assert_array_equal(rb.column("track_id").to_numpy(),
                                      table["track_id"][rb.column("_row").to_numpy()])


def test_remote_batches_carry_their_rows(data):
    from test_serve import Server
    from zarrfeed.flight import RemoteLoader

    s = Server(data)
    try:
        with RemoteLoader(s.url, "agents", batch_size=400, seed=5, row_ids=True) as remote, \
                Loader(data, batch_size=400, num_workers=0, seed=5, row_ids=True) as local:
            got, want = rows_of(remote), rows_of(local)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        with pytest.raises(ValueError, match="row_ids is for batches of rows"):
            from zarrfeed.flight.protocol import Ticket
            from zarrfeed.loader.plan import PlanSettings
            Ticket("frames", PlanSettings(8), kind="windows", row_ids=True).check()
    finally:
        s.stop()
