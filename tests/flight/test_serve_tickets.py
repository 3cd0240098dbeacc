"""Raw Flight tickets (any client, any language) ask for nothing the server would ignore: the agents mask's
options (threshold, min_history, min_future) are AgentSampleLoader's, and a ticket of another kind that gives
them another value than their default is refused in one line naming the option, as EgoSampleLoader and
RemoteEgoSampleLoader refuse them. A FeedServer in this process on 127.0.0.1, a plain pyarrow client."""
import json

import numpy as np
import pyarrow.flight as flight
import pytest
from zarrfeed.flight import FeedServer, RemoteEgoSampleLoader
from zarrfeed.flight.protocol import ORDER, PROTOCOL, Ticket
from zarrfeed.loader import EgoSampleLoader


@pytest.fixture(scope="module")
def server(small_dataset):
    path = small_dataset(2, 4, frames=30, agents_per_frame=6)
    with FeedServer(str(path), port=0, workers=1) as s:
        s.path = path
        yield s


def _ticket(kind: str, table: str, **options) -> flight.Ticket:
    doc = {"table": table, "kind": kind, "plan": {"batch_size": 16, "shuffle": False}, "history": 2, "future": 3,
           "version": PROTOCOL, "order": ORDER, **options}
    return flight.Ticket(json.dumps(doc).encode())


@pytest.mark.parametrize("kind, table", [("ego", "frames"), ("windows", "frames"), ("batches", "agents")])
@pytest.mark.parametrize("name, value", [("threshold", 0.3), ("threshold", 0.9), ("min_history", 0),
                                         ("min_future", 3)])
def test_an_agents_mask_option_on_another_kind_is_refused_by_name(server, kind, table, name, value):
    client = flight.connect(server.url)
    try:
        with pytest.raises(flight.FlightServerError) as refused:
            client.do_get(_ticket(kind, table, **{name: value})).read_all()
    finally:
        client.close()
    line = str(refused.value).split(". Detail:")[0]
    assert line == (f"zarrfeed: ticket: {name} is an option of kind 'agents' (the agents mask), not of kind "
                    f"{kind!r}, got {value!r}"), line


def test_the_decoder_refuses_it_too():
    raw = json.dumps({"table": "frames", "kind": "ego", "threshold": 0.7, "version": PROTOCOL,
                      "order": ORDER}).encode()
    with pytest.raises(ValueError, match=r"^ticket: threshold is an option of kind 'agents' \(the agents mask\), "
                                         r"not of kind 'ego', got 0\.7$"):
        Ticket.decode(raw)


def test_at_their_defaults_an_ego_ticket_streams_what_ego_sample_loader_yields(server):
    """The defaults are what every client sends in every ticket (RemoteEgoSampleLoader's, a 0.2 client's):
    taken, and the stream is EgoSampleLoader's (whose label threshold is 0.5 as well)."""
    client = flight.connect(server.url)
    try:
        got = client.do_get(_ticket("ego", "frames", threshold=0.5, min_history=10, min_future=1)).read_all()
    finally:
        client.close()
    with EgoSampleLoader(server.path, 2, 3, batch_size=16, shuffle=False, num_workers=0) as local:
        want = np.concatenate([b["centroid"] for b in local])
    assert got.num_rows == len(want) > 0
    with RemoteEgoSampleLoader(server.url, 2, 3, batch_size=16, shuffle=False) as remote:
        assert np.array_equal(np.concatenate([b["centroid"] for b in remote]), want)
