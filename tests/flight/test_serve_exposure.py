"""FeedServer from Python refuses to serve beyond loopback without the tokens that keep it private,
as `zarrfeed serve` does, before anything is opened or listens. No test here binds another address than
loopback (127.0.0.1, and ::1 where the machine has it): a server that gets as far as listening is stopped at
that point by a class in its MRO (`NoListen`), so the tests see whether it would listen, and where, without a
socket."""
import socket

import pyarrow.flight as flight
import pytest
from zarrfeed.flight import FeedServer, RemoteLoader
from zarrfeed.flight.server import address
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic, write_dataset


class WouldListen(Exception):
    """Raised where FlightServerBase would bind (its __init__), with the location it was given."""


class NoListen(flight.FlightServerBase):
    def __init__(self, location, *args, **kwargs):
        raise WouldListen(location)


class Probe(FeedServer, NoListen):
    """FeedServer whose super().__init__ (FlightServerBase's, which binds) is NoListen's."""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("exposure") / "d.zarr"
    write_dataset(path, synthetic.episodes(2, seed=0, frames=12, agents_per_frame=4), workers=0)
    return path


def test_the_probe_stops_a_server_where_it_would_listen(data):
    with pytest.raises(WouldListen) as where:
        Probe(str(data), host="127.0.0.1", port=0, workers=1)
    assert str(where.value) == "grpc://127.0.0.1:0"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.invalid"])
def test_beyond_loopback_without_a_token_is_refused_before_it_listens(data, host):
    with pytest.raises(ValueError) as refused:
        Probe(str(data), host=host, port=0, workers=1)
    assert str(refused.value) == (f"serving on {host} without a token lets anyone who reaches the port read the "
                                  "data: give token=..., or insecure=True to serve it openly")


def test_the_refusal_comes_before_the_dataset_is_opened(tmp_path):
    """The location does not exist: the refusal is still the exposure's (nothing was opened before it)."""
    with pytest.raises(ValueError, match=r"^serving on 0\.0\.0\.0 without a token "):
        Probe(str(tmp_path / "nothing-here.zarr"), host="0.0.0.0", port=0, workers=1)


@pytest.mark.parametrize("tokens", [{"ingest": True}, {"ingest": True, "token": "r"}])
def test_ingesting_beyond_loopback_needs_an_ingest_token(data, tokens):
    with pytest.raises(ValueError) as refused:
        Probe(str(data), host="0.0.0.0", port=0, workers=1, **tokens)
    what = "reaches the port read the data" if "token" not in tokens else "every reader write into the dataset"
    assert what in str(refused.value) and "\n" not in str(refused.value)
    if "token" in tokens:
        assert str(refused.value) == ("ingesting on 0.0.0.0 without an ingest token lets every reader write into the "
                                      "dataset: give ingest_token=..., or insecure=True")


@pytest.mark.parametrize("kwargs", [{"token": "r"}, {"token": "r", "ingest_token": "w"}, {"insecure": True},
                                    {"insecure": True, "ingest": True}])
def test_with_the_tokens_or_insecure_it_would_listen_there(data, kwargs):
    with pytest.raises(WouldListen) as where:
        Probe(str(data), host="0.0.0.0", port=0, workers=1, **kwargs)
    assert str(where.value) == "grpc://0.0.0.0:0"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_without_tokens_serves(data, host):
    with FeedServer(str(data), host=host, port=0, workers=1, ingest=True) as server:
        client = flight.connect(f"grpc://127.0.0.1:{server.port}")
        try:
            assert {tuple(f.descriptor.path) for f in client.list_flights()} >= {(b"scenes",), (b"agents",)}
        finally:
            client.close()


@pytest.mark.parametrize("host, url", [("::", "grpc://[::]:0"), ("2001:db8::1", "grpc://[2001:db8::1]:0"),
                                       ("0.0.0.0", "grpc://0.0.0.0:0")])
def test_an_ipv6_address_is_bracketed_where_it_would_listen(data, host, url):
    """Bare, an IPv6 literal's colons run into the port's: grpc://:::0 does not parse."""
    with pytest.raises(WouldListen) as where:
        Probe(str(data), host=host, port=0, workers=1, insecure=True)
    assert str(where.value) == url


@pytest.mark.parametrize("host, url", [("::1", "grpc+tls://[::1]:8815"), ("[::1]", "grpc+tls://[::1]:8815"),
                                       ("example.org", "grpc+tls://example.org:8815")])
def test_address_brackets_ipv6_literals_only(host, url):
    assert address("grpc+tls", host, 8815) == url


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_serves_on_the_ipv6_loopback_at_a_bracketed_url(data):
    with FeedServer(str(data), host="::1", port=0, workers=1) as server:
        assert server.url == f"grpc://[::1]:{server.port}" and server.status()["url"] == server.url
        with RemoteLoader(server.url, "scenes", batch_size=10) as remote:
            assert sum(len(b["host"]) for b in remote) == Dataset.open(data).rows["scenes"]
