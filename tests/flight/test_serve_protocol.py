"""What a `zarrfeed serve` process answers: discovery with a plain pyarrow.flight client, every action the protocol
lists, `zarrfeed info` of a server, several datasets by name, and one line (never a traceback) for a bad request
or a URL that is no zarrfeed server."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest
from zarrfeed.loader import Dataset, Loader
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.flight import RemoteLoader
from repo_paths import ROOT
from serve_process import Server, equal_batches


def test_discovery_with_a_plain_flight_client(server, data):
    ds = Dataset.open(data)
    client = flight.connect(server.url)
    infos = {i.descriptor.path[0].decode(): i for i in client.list_flights()}
    assert set(infos) == set(ds.tables) and infos["agents"].total_records == ds.rows["agents"]
    info = client.get_flight_info(flight.FlightDescriptor.for_path("scenes"))
    table = client.do_get(info.endpoints[0].ticket).read_all()  # any Flight client: the table in row order
    assert table.num_rows == ds.rows["scenes"]
    np.testing.assert_array_equal(table.column("frame_index_interval").to_pylist(),
                                  ds["scenes"][:]["frame_index_interval"].tolist())
    with pytest.raises(flight.FlightServerError, match="no table 'nope'"):
        client.get_flight_info(flight.FlightDescriptor.for_path("nope"))
    with pytest.raises(ValueError, match="table 'nope' is not served"):
        RemoteLoader(server.url, "nope")


def test_the_actions_listed_are_the_protocols_and_each_is_answered(server, data):
    """list_actions is the protocol's table; each action in it has a handler; another name is refused in one
    line that lists them."""
    import json

    from zarrfeed.flight.protocol import ACTIONS, Ticket
    from zarrfeed.flight.protocol import TicketPlan

    client = flight.connect(server.url)
    listed = {a.type: a.description for a in client.list_actions()}
    assert listed == {name: a.description for name, a in ACTIONS.items()}
    bodies = {"describe": b"", "plan": Ticket("agents", TicketPlan(100)).to_json(), "status": b"", "sync": b"",
              "begin_input": b"{"}
    assert bodies.keys() == ACTIONS.keys()
    for name, body in bodies.items():
        if ACTIONS[name].ingests:  # this server was not started to ingest: refused in one line, nothing taken
            with pytest.raises(flight.FlightUnauthorizedError, match="does not take uploads"):
                list(client.do_action(flight.Action(name, body)))
            continue
        (result,) = client.do_action(flight.Action(name, body))
        assert isinstance(json.loads(result.body.to_pybytes()), dict)
    with pytest.raises(flight.FlightServerError, match="unknown action 'nope' .actions: describe, plan, "):
        list(client.do_action(flight.Action("nope", b"")))


def test_info_of_a_server(server, data):
    out = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "info", server.url], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rows = Dataset.open(data).rows
    assert f"agents{'':<16}{rows['agents']:>14,} rows" in out.stdout
    assert "transform speed: Each agent's speed (times `scale`) and its track id." in out.stdout
    out = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "info", "grpc://127.0.0.1:1"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.startswith("zarrfeed: error: grpc://127.0.0.1:1: no zarrfeed server")


def test_clients_get_one_line_never_a_traceback(server, data):
    """Bad ticket values, a transform that raises, upload metadata of the wrong shape, get_schema and
    do_exchange: the client gets one line naming what was wrong, never the server's traceback or paths; the
    server goes on serving."""
    import pyarrow as pa

    from zarrfeed.flight.protocol import ORDER, PROTOCOL

    client = flight.connect(server.url)

    def refused(call, match: str, error=flight.FlightError) -> None:
        with pytest.raises(error) as err:
            call()
        text = str(err.value)
        assert "Traceback" not in text and str(ROOT) not in text and ".py" not in text, text
        assert re.search(match, text), text

    def ticket(**change):
        doc = {"table": "agents", "plan": {"batch_size": 100}, "version": PROTOCOL, "order": ORDER}
        for k, v in change.items():
            if k in ("batch_size", "seed", "shuffle"):
                doc["plan"][k] = v
            else:
                doc[k] = v
        return flight.Ticket(json.dumps(doc).encode())

    for change, match in (({"batch_size": 1.5}, r"plan.batch_size must be an integer in \[1, \d+\], got 1.5"),
                          ({"batch_size": 10**12}, r"plan.batch_size must be an integer .* got 1000000000000"),
                          ({"batch_size": 2**63}, r"plan.batch_size must be an integer"),
                          ({"seed": "x"}, r"plan.seed must be an integer .* got 'x'"),
                          ({"epoch": -3}, r"epoch must be an integer in \[0, \d+\], got -3"),
                          ({"shuffle": "no"}, r"plan.shuffle must be true or false, got 'no'"),
                          ({"transform": "fails"}, r"boom from the server's transform")):
        refused(lambda: client.do_get(ticket(**change)).read_all(), match)  # noqa: B023  # called at once
    # pyarrow's client raises get_schema's errors as ArrowException, with the exception's name in the detail
    refused(lambda: client.get_schema(flight.FlightDescriptor.for_path("nope")), r"no table 'nope'", pa.ArrowException)
    assert client.get_schema(flight.FlightDescriptor.for_path("scenes")).schema.names[0] == "frame_index_interval"
    refused(lambda: client.do_exchange(flight.FlightDescriptor.for_path("x"))[1].read_all(),
            r"do_exchange is not served")
    put, _ = client.do_put(flight.FlightDescriptor.for_path("episodes"), pa.schema([("x", pa.int8())]))
    refused(put.close, r"this server does not take uploads", flight.FlightUnauthorizedError)
    with RemoteLoader(server.url, "scenes", batch_size=10) as remote:  # still serving
        assert sum(len(b["frame_index_interval"]) for b in remote) == Dataset.open(data).rows["scenes"]


def test_several_datasets_by_name(tmp_path):
    """One dataset per server. `serve train=A val=B` serves both: tickets, descriptors and actions
    name one; each has its own commit pin and writer lease; naming none, or one not served, is one line."""
    from zarrfeed.flight import RemoteWriter

    paths = {}
    for name, seed in (("train", 21), ("val", 22)):
        paths[name] = tmp_path / f"{name}.zarr"
        write_dataset(paths[name], synthetic.episodes(2, seed=seed, frames=30, agents_per_frame=10), workers=0)
    s = Server([f"train={paths['train']}", f"val={paths['val']}"], "--ingest")
    try:
        for name in ("train", "val"):
            with RemoteLoader(s.url, "agents", batch_size=64, seed=4, dataset=name) as remote, \
                    Loader(paths[name], "agents", batch_size=64, seed=4, num_workers=0, copy=True) as local:
                assert equal_batches(remote, local) == len(local)
        with pytest.raises(ValueError, match=r"serves several datasets \(train, val\): name one \(dataset=...\)"):
            RemoteLoader(s.url, "agents")
        with pytest.raises(ValueError, match=r"no dataset 'test' here \(datasets: train, val\)"):
            RemoteLoader(s.url, "agents", dataset="test")
        client = flight.connect(s.url)  # a plain Flight client: one flight per dataset and table
        flights = {tuple(p.decode() for p in f.descriptor.path): f for f in client.list_flights()}
        assert ("val", "scenes") in flights and ("train", "agents") in flights and len(flights) == 8
        table = client.do_get(flights[("val", "scenes")].endpoints[0].ticket).read_all()
        assert table.num_rows == 2
        with RemoteWriter(s.url, dataset="val") as into_val, RemoteWriter(s.url, dataset="train") as into_train:
            eps = list(synthetic.episodes(2, seed=23, frames=30, agents_per_frame=10))
            assert into_val.submit(eps[0], key="v") and into_train.submit(eps[1], key="t")  # two leases at once
        text = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", s.url], capture_output=True, text=True,
                              timeout=60, cwd=ROOT).stdout
        assert f"dataset train {paths['train']}: committed 3 scenes" in text, text
        assert f"dataset val {paths['val']}: committed 3 scenes" in text, text
    finally:
        assert s.stop() < 2.0
    assert "committed train: 3 scenes" in s.err() and "committed val: 3 scenes" in s.err(), s.err()
    r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(paths["train"]), str(paths["val"]),
                        "--port", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "several datasets are served by name: NAME=PATH each" in r.stderr, r.stderr
    link = Path(paths["val"]).parent / "link.zarr"
    link.symlink_to(paths["val"])
    val = Path(paths["val"])
    # only the same spelling was refused
    for other in (val, f"{val}/", val.parent / ".." / val.parent.name / val.name, link):
        r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", f"a={val}", f"b={other}",
                            "--port", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and "datasets 'a' and 'b' are the same dataset" in r.stderr, (other, r.stderr)


def test_a_url_that_is_not_a_servers_is_one_line():
    """`zarrfeed status s3://...` printed pyarrow's ArrowKeyError traceback."""
    from zarrfeed.flight import RemoteWriter

    for url in ("s3://bucket/x", "http://127.0.0.1:1"):
        r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", url], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        assert r.returncode == 2 and "not a zarrfeed server's URL" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        for client in (lambda: RemoteLoader(url, "agents"), lambda: RemoteWriter(url)):  # noqa: B023
            with pytest.raises(ValueError, match="not a zarrfeed server's URL"):
                client()
