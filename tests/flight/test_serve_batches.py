"""`zarrfeed serve` and RemoteLoader: a real server process on 127.0.0.1 (a free port), real Flight clients.

RemoteLoader batches equal a local Loader's, field for field and byte for byte, for every rank; resume across
remote and local; tokens; discovery with a plain pyarrow.flight client; a trainer that leaves mid-epoch frees
its stream; SIGTERM stops the server within 2 s."""
import contextlib
import functools
import json
import re
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest
from zarrfeed.core._proc.pool import process_state
from zarrfeed.loader import Dataset, Loader, LoaderError, WindowLoader
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.flight import RemoteLoader, RemoteWindowLoader

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(small_dataset):
    return small_dataset(3, 9, chunks={"agents": 900}, frames=60, agents_per_frame=40)


class Server:
    """`zarrfeed serve` in its own process; `url` once it listens. Its stderr (the server's log) is read as it
    comes, so that a long-lived server never blocks on a full pipe: `err()` is what it wrote so far."""

    def __init__(self, path, *args: str, scheme: str = "grpc") -> None:
        paths = [str(p) for p in path] if isinstance(path, list) else [str(path)]  # a list: several, NAME=PATH
        self.proc = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "serve", *paths, "--port", "0",
                                      "--workers", "1", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=ROOT)
        self._err: list[str] = []
        self._drain = threading.Thread(target=lambda: self._err.extend(self.proc.stderr), daemon=True)
        self._drain.start()
        try:
            line = self.first_line = self.proc.stdout.readline()
            assert line.startswith("serving on "), line + self.err()
            self.url = line.split()[2]
            self.port = self.url.rsplit(":", 1)[1]
            assert self.url.startswith(f"{scheme}://127.0.0.1:")
        except BaseException:  # never leave a server behind
            self.kill()
            raise

    def err(self) -> str:
        """What the server wrote to stderr so far (all of it once it has exited)."""
        if self.proc.poll() is not None:
            self._drain.join(10)
        return "".join(self._err)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def descendants(self) -> list[int]:
        """The server's running descendants: the fork server and the loader workers it starts."""
        parent = {}
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    stat = (p / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if stat[0] != "Z":
                    parent[int(p.name)] = int(stat[1])
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            kids = [c for c, pp in parent.items() if pp == pid]
            found += kids
            todo += kids
        return found

    def rss(self) -> int:
        """The server process's resident memory in bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
        raise AssertionError("no VmRSS")

    def stop(self) -> float:
        """SIGTERM; the seconds it took to exit (tests that hold it to a time assert it; the wait is long for a
        machine running two copies of the suite, where one stop once took over 10 s)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return time.monotonic() - t0


TRANSFORMS = ROOT / "tests" / "serve_transforms.py"


@pytest.fixture(scope="module")
def server(data):
    s = Server(data, "--transforms", str(TRANSFORMS))
    yield s
    s.stop()


def equal_batches(remote, local):
    n = 0
    for a, b in zip(remote, local, strict=True):
        assert list(a) == list(b)
        for name in a:
            assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
            assert a[name].tobytes() == b[name].tobytes()
        n += 1
    return n


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
    """Found by the adversarial pass: a RemoteLoader refused an order-1 state a local Loader resumes; and a
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
    from zarrfeed.loader.plan import PlanSettings

    client = flight.connect(server.url)
    listed = {a.type: a.description for a in client.list_actions()}
    assert listed == {name: a.description for name, a in ACTIONS.items()}
    bodies = {"describe": b"", "plan": Ticket("agents", PlanSettings(100)).to_json(), "status": b"", "sync": b"",
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


def test_a_trainer_that_leaves_mid_epoch_frees_its_stream(server):
    with RemoteLoader(server.url, "agents", batch_size=1000) as warm:  # starts the fork server, which stays
        list(warm)
    time.sleep(1)
    base = len(server.descendants())
    fds, rss = len(os.listdir(f"/proc/{server.proc.pid}/fd")), server.rss()
    for i in range(100):  # bounded: 100 connects, each leaving mid-epoch after 2 batches
        with RemoteLoader(server.url, "agents", batch_size=100, seed=i) as remote:
            it = iter(remote)
            next(it)
            next(it)
            if i % 25 == 0:
                assert len(server.descendants()) > 1  # the fork server and this stream's loader workers
            it.close()
    # the server may run to an epoch's end ahead of a trainer that leaves (gRPC buffers what it sends, and this
    # table is small); a finished epoch's loader is kept for that ticket's next stream: at most IdleLoaders'
    # limit of them, one worker and a few descriptors each. Anything more is a stream that was not freed.
    from zarrfeed.flight.feeding import IdleLoaders
    parked = IdleLoaders().limit
    deadline = time.monotonic() + 10
    while len(server.descendants()) > base + parked and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(server.descendants()) <= base + parked  # every other stream's loader workers are gone
    time.sleep(1)
    assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) <= fds + 4 + 8 * parked  # no growth with connections
    assert server.rss() < rss + (32 << 20) + parked * (16 << 20), (rss, server.rss())  # a kept one: its ring


def test_tokens(data, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o644)
    bad = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(data), "--port", "0",
                          "--token-file", str(token)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "readable by its owner only" in bad.stderr
    token.chmod(0o600)
    s = Server(data, "--token-file", str(token))
    try:
        with pytest.raises(PermissionError, match="wants a token"):
            RemoteLoader(s.url, "agents")
        with pytest.raises(PermissionError, match="wants a token"):
            RemoteLoader(s.url, "agents", token="wrong")
        client = flight.connect(s.url)
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_flights())
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.do_get(flight.Ticket(b"{}")).read_all()
        with RemoteLoader(s.url, "agents", batch_size=1000, token="s3cret-token") as remote:
            assert sum(len(b["centroid"]) for b in remote) == Dataset.open(data).rows["agents"]
    finally:
        assert s.stop() < 2.0 and s.proc.returncode == 0


def self_signed(tmp_path):
    """A certificate for 127.0.0.1 and its key (PEM files), made with `cryptography`."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "zarrfeed test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return tmp_path / "cert.pem", tmp_path / "key.pem"


def test_tls(tmp_path):
    data = tmp_path / "tls.zarr"
    write_dataset(data, synthetic.episodes(2, seed=5, frames=40, agents_per_frame=20), workers=0)
    cert, key = self_signed(tmp_path)
    token = tmp_path / "token"
    token.write_text("tls-token")
    token.chmod(0o600)
    s = Server(data, "--tls-cert", str(cert), "--tls-key", str(key), "--token-file", str(token), "--ingest",
               scheme="grpc+tls")
    try:
        root = cert.read_bytes()
        with RemoteLoader(s.url, "agents", batch_size=500, seed=1, token="tls-token", tls_root_certs=root) as remote, \
                Loader(data, "agents", batch_size=500, seed=1, num_workers=0, copy=True) as local:
            assert equal_batches(remote, local) == len(local)
        # issue 21: a certificate the client does not trust read "no zarrfeed server answers"
        with pytest.raises(ConnectionError, match="the TLS handshake failed: certificate verify failed: "
                                                  "self-signed certificate .tls_root_certs= must hold"):
            RemoteLoader(s.url, "agents", token="tls-token")
        (tmp_path / "other").mkdir()
        other, _ = self_signed(tmp_path / "other")  # a certificate of another CA
        with pytest.raises(ConnectionError, match="the TLS handshake failed: certificate verify failed"):
            RemoteLoader(s.url, "agents", token="tls-token", tls_root_certs=other.read_bytes())
        from zarrfeed.flight import RemoteWriter
        with pytest.raises(ConnectionError, match="the TLS handshake failed"):
            RemoteWriter(s.url, token="tls-token")
        with pytest.raises(ConnectionError, match="is it a TLS server. then use grpc.tls://"):  # plain to TLS
            RemoteLoader(s.url.replace("grpc+tls", "grpc"), "agents", token="tls-token", timeout=5)
        from zarrfeed.flight import RemoteWriter
        with RemoteWriter(s.url, token="tls-token", tls_root_certs=root) as producer:
            assert producer.submit(next(iter(synthetic.episodes(1, seed=77, frames=20, agents_per_frame=5))))
    finally:
        assert s.stop() < 2.0 and s.proc.returncode == 0, s.err()
    assert Dataset.open(data).rows["scenes"] == 3  # committed at SIGTERM


def test_sigterm_stops_the_server_within_two_seconds_mid_stream(data):
    s = Server(data)
    remote = RemoteLoader(s.url, "agents", batch_size=50)
    it = iter(remote)
    next(it)  # a stream is open
    seconds = s.stop()
    assert seconds < 2.0 and s.proc.returncode == 0, s.err()


TRAINER = """
import os, signal, sys
from zarrfeed.flight import RemoteLoader
it = iter(RemoteLoader(sys.argv[1], "agents", batch_size=50))
next(it)
print("reading", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # a trainer that stopped reading mid-stream
"""


def test_sigterm_stops_within_two_seconds_whatever_the_clients_do(data, target):
    """Issue 21: with a trainer stopped mid-stream (SIGSTOP: it never reads again) the server kept serving
    after SIGTERM, and an idle producer held it until it left. Now it commits what it acknowledged, ends the
    streams it can, and exits within 2 s."""
    from zarrfeed.flight import RemoteWriter

    s = Server(target, "--ingest")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, s.url], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert trainer.stdout.readline() == "reading\n"
        with pytest.raises(ConnectionError, match="the server went away"), RemoteWriter(s.url) as producer:
            eps = list(synthetic.episodes(3, seed=31, frames=20, agents_per_frame=5))
            assert producer.submit(eps[0], key="a") and producer.submit(eps[1], key="b")  # acknowledged; idle
            seconds = s.stop()
            err = s.err()
            assert seconds < 2.0 and s.proc.returncode == 0, err
            assert "committed 3 scenes" in err and "Traceback" not in err, err
            producer.submit(eps[2], key="c")  # the producer hears of it at once, it does not hang
    finally:
        trainer.kill()
        trainer.wait()
    assert Dataset.open(target).rows["scenes"] == 3 and Dataset.open(target).validate().ok


def test_a_stream_ends_with_server_shutting_down(data):
    """A trainer still reading when the server stops gets "server shutting down", not a cut connection."""
    from zarrfeed.flight import FeedServer
    with FeedServer(data, port=0, workers=1) as server:
        remote = RemoteLoader(server.url, "agents", batch_size=20, reconnect_timeout=0)  # no waiting for it
        it = iter(remote)
        next(it)
        server.feeding.close()  # what stop() does first
        with pytest.raises(ConnectionError, match="server shutting down"):
            for _ in it:
                pass


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


# ---------------------------------------------------------------- ingestion (do_put, RemoteWriter)
def content_key(episode) -> str:
    """A digest of every byte of an episode (per table: name, dtype, records)."""
    import hashlib
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(episode):
        a = np.ascontiguousarray(episode[name])
        h.update(name.encode() + b"\0" + a.dtype.str.encode() + a.view(np.uint8).tobytes())
    return h.hexdigest()


def episodes_in(path) -> list[str]:
    """The content keys of a dataset's episodes, sorted: equal lists mean every episode exactly once."""
    from zarrfeed.writer.source import DatasetSource
    return sorted(content_key(ep) for ep in DatasetSource(path))


@pytest.fixture
def target(tmp_path):
    """A dataset holding one episode, to ingest into."""
    path = tmp_path / "t.zarr"
    write_dataset(path, synthetic.episodes(1, seed=100, frames=30, agents_per_frame=20), workers=0)
    return path


def test_remote_writer_writes_exactly_what_a_local_writer_would(target):
    from expected import expected_tables

    from zarrfeed.flight import RemoteWriter
    first = list(synthetic.episodes(1, seed=100, frames=30, agents_per_frame=20))
    eps = list(synthetic.episodes(5, seed=7, frames=30, agents_per_frame=20))
    s = Server(target, "--ingest")
    try:
        with RemoteWriter(s.url) as w:
            assert [w.submit(ep, key=f"log-{i}") for i, ep in enumerate(eps[:3])] == [True] * 3
            assert not w.submit(eps[0], key="log-0")  # a retry: passed over
            assert w.ingest(eps[3:], keys=["log-3", "log-4"]) == 2
            committed = w.sync()
        assert committed["scenes"] == 6
    finally:
        assert s.stop() < 2.0
    ds = Dataset.open(target)
    want = expected_tables(first + eps)
    for name, arr in want.items():
        np.testing.assert_array_equal(ds[name][: ds.rows[name]], arr)
    assert ds.validate().ok


def test_bad_input_is_refused_by_name_and_the_server_goes_on(target):
    from zarrfeed.flight import RemoteWriter
    eps = list(synthetic.episodes(2, seed=8, frames=30, agents_per_frame=20))
    bad = dict(eps[0])
    frames = bad["frames"].copy()
    frames["agent_index_interval"][3, 0] += 1
    bad["frames"] = frames
    s = Server(target, "--ingest")
    try:
        client = flight.connect(s.url)
        with pytest.raises(flight.FlightServerError, match="begin_input: bad request"):  # a body that is not JSON
            list(client.do_action(flight.Action("begin_input", b"{")))
        import pyarrow as pa
        schema = pa.schema([pa.field("key", pa.string()), pa.field("agents", pa.large_binary())],
                           metadata={b"zarrfeed.dtypes": b"[1, 2]"})  # upload metadata of the wrong shape
        put, _ = client.do_put(flight.FlightDescriptor.for_path("episodes"), schema)
        put.write_batch(pa.record_batch([pa.array(["k"]), pa.array([b""], pa.large_binary())], schema=schema))
        with pytest.raises(flight.FlightServerError, match="zarrfeed.dtypes metadata is not zarrfeed's") as err:
            put.close()
        assert "Traceback" not in str(err.value)
        with RemoteWriter(s.url) as w:
            with pytest.raises(ValueError, match=r"episode bad: frames.agent_index_interval row 3: .*a gap"):
                w.submit(bad, key="bad")
            wrong = {**eps[0], "agents": eps[0]["agents"].astype([(n, "<f8") if n == "yaw" else
                                                                  (n, eps[0]["agents"].dtype[n])
                                                                  for n in eps[0]["agents"].dtype.names])}
            with pytest.raises(ValueError, match="table 'agents': dtype"):
                w.submit(wrong, key="wrong")
            with pytest.raises(ValueError, match="table 'nope': not a table of this dataset"):
                w.submit({"nope": eps[0]["scenes"]}, key="nope")  # keyed: the server refuses it
            with pytest.raises(ValueError, match="table 'scenes': missing from the episode"):
                w.submit({"nope": eps[0]["scenes"]})  # key-less: refused before its input is begun
            client = flight.connect(s.url)  # garbage: a batch that is not episodes
            import pyarrow as pa
            put, _ = client.do_put(flight.FlightDescriptor.for_path("episodes"), pa.schema([("x", pa.int8())]))
            put.write_batch(pa.record_batch([pa.array([1], pa.int8())], names=["x"]))
            with pytest.raises(flight.FlightServerError, match="not a batch of zarrfeed episodes"):
                put.close()
            assert w.submit(eps[1], key="good")  # the server and this producer go on
            assert w.sync()["scenes"] == 2
            more = list(synthetic.episodes(6, seed=9, frames=30, agents_per_frame=20))
            keys = [f"more-{i}" for i in range(6)]
            with pytest.raises(ValueError, match=r"episode bad-2: frames.agent_index_interval row 3: .*a gap.*; "
                                                 r"nothing after it in this call was written$"):
                w.ingest(more[:2] + [bad] + more[2:5], keys=keys[:2] + ["bad-2"] + keys[2:5], window=8)
            assert w.sync()["scenes"] == 4  # the two before it
            assert w.ingest(more, keys=keys, window=3) == 4  # again: the first two are passed over
            assert w.sync()["scenes"] == 8
    finally:
        s.stop()
    assert Dataset.open(target).validate().ok


def test_a_refusal_seen_before_the_acks_of_earlier_episodes_blames_the_refused_one(target):
    """The server acknowledges the episodes before a bad one, then ends the call; a producer still writing sees
    that end on a write, before it has read those acknowledgements. The refused one is the one named (the
    server says how many it answered), the ones before it stay written and counted, the ones after it are
    counted right, and the next ingest reads no stale answers."""
    from zarrfeed.flight import RemoteWriter
    eps = list(synthetic.episodes(8, seed=12, frames=30, agents_per_frame=20))
    bad = dict(eps[2])
    frames = bad["frames"].copy()
    frames["agent_index_interval"][3, 0] += 1
    bad["frames"] = frames
    keys = [f"e-{i}" for i in range(8)]
    s = Server(target, "--ingest")
    try:
        with RemoteWriter(s.url) as w:
            write, sent = w._write, []

            def slow_write(batch):  # the server has answered and ended the call before the 5th goes out
                if len(sent) == 4:
                    time.sleep(0.5)
                sent.append(batch)
                write(batch)

            w._write = slow_write
            with pytest.raises(ValueError, match=r"episode e-2: frames.agent_index_interval row 3") as err:
                w.ingest(eps[:2] + [bad] + eps[3:], keys=keys, window=64)  # no ack read before the last is sent
            w._write = write
            assert str(err.value).endswith("; nothing after it in this call was written")
            assert w.unsynced == keys[:2]  # answered by the server, unread: still held until a sync
            assert w.sync()["scenes"] == 1 + 2
            assert w.ingest(eps[:2] + eps[3:], keys=keys[:2] + keys[3:], window=4) == 5  # the first two passed over
            assert w.ingest([eps[2]], keys=["e-2"]) == 1
            assert w.sync()["scenes"] == 1 + 8
    finally:
        s.stop()
    assert Dataset.open(target).validate().ok


def test_a_bad_key_or_episode_of_the_producer_leaves_no_answer_unread(target):
    """An ingest refused on the producer's side (a key that is not a key, an episode of the wrong tables) after
    episodes went out reads their answers first: they are written, and the next call is not off by them."""
    from zarrfeed.flight import RemoteWriter
    eps = list(synthetic.episodes(6, seed=13, frames=30, agents_per_frame=20))
    s = Server(target, "--ingest")
    try:
        with RemoteWriter(s.url) as w:
            with pytest.raises(TypeError, match="an episode key is a str or an int, got float 3.5"):
                w.ingest(eps[:4], keys=["a", "b", 3.5, "d"], window=8)
            with pytest.raises(ValueError, match="table 'nope'"):
                w.ingest([eps[3], {"nope": eps[4]["scenes"]}], keys=["c", "d"], window=8)
            assert w.ingest(eps[4:], keys=["e", "f"], window=8) == 2
            assert w.sync()["scenes"] == 1 + 5
    finally:
        s.stop()
    assert Dataset.open(target).validate().ok


def test_episodes_as_arrow_columns_from_a_plain_flight_client(target):
    """A producer in any language sends list<struct> columns (the bridge's form); records of the wrong size in
    the bytes form are refused by table, nothing written."""
    import pyarrow as pa

    from zarrfeed.flight.protocol import encode_episode, episode_schema, episodes_descriptor
    DESCRIPTOR = episodes_descriptor(None)
    eps = list(synthetic.episodes(3, seed=11, frames=30, agents_per_frame=20))
    dtypes = {t: a.dtype for t, a in eps[0].items()}
    s = Server(target, "--ingest")
    try:
        client = flight.connect(s.url)
        schema = episode_schema(dtypes, records=False)
        assert pa.types.is_list(schema.field("agents").type)
        put, acks = client.do_put(DESCRIPTOR, schema)
        for i, ep in enumerate(eps[:2]):
            put.write_batch(encode_episode(ep, f"col-{i}", schema))
            assert b'"accepted": true' in acks.read().to_pybytes()
        put.done_writing()
        put.close()
        raw = encode_episode(eps[2], "short", episode_schema(dtypes))
        agents = raw.column("agents")[0].as_buffer()
        cut = pa.Array.from_buffers(pa.large_binary(), 1, [None, pa.py_buffer(np.array([0, agents.size - 5],
                                                                                       np.int64)), agents])
        put, acks = client.do_put(DESCRIPTOR, raw.schema)
        put.write_batch(raw.set_column(raw.schema.get_field_index("agents"), raw.schema.field("agents"), cut))
        with pytest.raises(flight.FlightServerError, match="table 'agents': .* not a whole number of 116-byte"):
            put.close()
        committed = json.loads(list(client.do_action(flight.Action("sync", b"")))[0].body.to_pybytes())
        assert committed["committed"]["scenes"] == 3
    finally:
        s.stop()
    ds = Dataset.open(target)
    assert ds.validate().ok
    np.testing.assert_array_equal(ds["agents"][ds.rows["agents"] - len(eps[1]["agents"]):ds.rows["agents"]]
                                  ["track_id"], eps[1]["agents"]["track_id"])


PRODUCER = """
import sys, time
from zarrfeed.writer import synthetic
from zarrfeed.flight import RemoteWriter
if __name__ == "__main__":
    url, seed, n, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    eps = list(synthetic.episodes(n, seed=seed, frames=30, agents_per_frame=20))
    w, i, deadline = RemoteWriter(url), 0, time.monotonic() + 60
    while time.monotonic() < deadline:  # bounded: retries until the server is back, 60 s at most
        try:
            if i < n:
                w.submit(eps[i], key=f"{seed}-{i}")
                print("acked", i, flush=True)
                i += 1
                time.sleep(pause)
            else:
                w.close()  # every accepted episode committed (re-sent after a restart if need be)
                break
        except ConnectionError:
            time.sleep(0.2)
    print("done", i, flush=True)
"""


def test_many_producers_and_trainers_at_once_every_episode_exactly_once(target, tmp_path):
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER)
    s = Server(target, "--ingest")
    try:
        producers = [subprocess.Popen([sys.executable, str(script), s.url, str(seed), "4", "0"], cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for seed in (1, 2, 3, 4)]
        read = 0
        for rank in (0, 1):  # trainers read committed rows while producers write
            with RemoteLoader(s.url, "agents", batch_size=500, rank=rank, world_size=2) as remote:
                read += sum(len(b["centroid"]) for b in remote)
        outs = [p.communicate(timeout=120) for p in producers]
        assert all(p.returncode == 0 for p in producers), [o[1][-1500:] for o in outs]
        with RemoteLoader(s.url, "agents", batch_size=500) as after:  # a new commit: every row once
            rows = sum(len(b["centroid"]) for b in after)
    finally:
        s.stop()
    want = [synthetic.episodes(1, seed=100, frames=30, agents_per_frame=20)] + \
        [synthetic.episodes(4, seed=seed, frames=30, agents_per_frame=20) for seed in (1, 2, 3, 4)]
    assert episodes_in(target) == sorted(content_key(ep) for it in want for ep in it)
    assert rows == Dataset.open(target).rows["agents"] and read >= 0


def test_server_killed_during_ingest_then_restarted_every_episode_exactly_once(target, tmp_path):
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER)
    s = Server(target, "--ingest")
    producer = subprocess.Popen([sys.executable, str(script), s.url, "5", "12", "0.1"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(4):
        assert producer.stdout.readline().startswith("acked")
    s.kill()  # mid-ingest: accepted episodes may not be committed
    time.sleep(0.5)
    restarted = Server(target, "--ingest", "--port", s.port)
    try:
        out, err = producer.communicate(timeout=120)
        assert producer.returncode == 0 and "done 12" in out, err[-2000:]
    finally:
        restarted.stop()
    want = list(synthetic.episodes(1, seed=100, frames=30, agents_per_frame=20)) + \
        list(synthetic.episodes(12, seed=5, frames=30, agents_per_frame=20))
    assert episodes_in(target) == sorted(content_key(ep) for ep in want)
    assert Dataset.open(target).validate().ok


def test_reading_and_ingesting_have_separate_credentials(data, tmp_path):
    """Issue 21: one token granted everything, so a trainer's token could ingest into the dataset. Now the
    read token reads, only the ingest token uploads, and a server ingests only when told to."""
    import shutil

    import pyarrow as pa

    from zarrfeed.flight import RemoteWriter
    copy = tmp_path / "d.zarr"
    shutil.copytree(data, copy)
    scenes = Dataset.open(copy).rows["scenes"]
    tokens = {}
    for name, value in (("read", "r3ad"), ("ingest", "1ngest")):
        tokens[name] = tmp_path / name
        tokens[name].write_text(value + "\n")
        tokens[name].chmod(0o600)
    episode = next(synthetic.episodes(1, seed=50, frames=20, agents_per_frame=10))
    s = Server(copy, "--token-file", str(tokens["read"]), "--ingest-token-file", str(tokens["ingest"]))
    try:
        with pytest.raises(PermissionError, match="wants a token"):
            RemoteWriter(s.url)
        client = flight.connect(s.url)
        with pytest.raises(flight.FlightUnauthenticatedError):
            put, _ = client.do_put(flight.FlightDescriptor.for_path("episodes"), pa.schema([("x", pa.int8())]))
            put.close()
        with pytest.raises(PermissionError, match="this token may read, not upload"), \
                RemoteWriter(s.url, token="r3ad") as trainer:  # a trainer's token reads but cannot write
            trainer.submit(episode, key="x")
        with RemoteLoader(s.url, "scenes", batch_size=10, token="1ngest") as producer_reads:
            assert sum(len(b["host"]) for b in producer_reads) == scenes
        with RemoteWriter(s.url, token="1ngest") as w:
            assert w.submit(episode, key="x")
    finally:
        assert s.stop() < 2.0
    assert Dataset.open(copy).rows["scenes"] == scenes + 1

    s = Server(copy)  # neither --ingest nor an ingest token: it only feeds
    try:
        with pytest.raises(PermissionError, match="does not take uploads"), RemoteWriter(s.url) as w:
            w.submit(episode, key="y")
        with RemoteLoader(s.url, "scenes", batch_size=10) as remote:
            assert sum(len(b["host"]) for b in remote) == scenes + 1
    finally:
        s.stop()


@pytest.mark.parametrize("flags, refused", [
    ([], "without --token-file lets anyone who reaches the port read"),
    (["--token-file", "{read}", "--ingest"], "without --ingest-token-file lets every reader write"),
    (["--token-file", "{read}", "--ingest-token-file", "{read}"], "must differ from the read token"),
])
def test_beyond_loopback_the_tokens_are_required(data, tmp_path, flags, refused):
    """A non-loopback address without the credentials that keep it private is refused in one line before
    anything listens, unless --insecure."""
    read = tmp_path / "read"
    read.write_text("r\n")
    read.chmod(0o600)
    args = [f.format(read=read) for f in flags]
    r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(data), "--host", "0.0.0.0", "--port", "0",
                        *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and refused in r.stderr, r.stderr


def listening(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on `port` on this machine (IPv4, IPv6; an IPv4-mapped
    IPv6 address as its IPv4 address, as gRPC binds 127.0.0.1)."""
    import ipaddress

    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            raw, _, hex_port = local.partition(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            # the kernel prints each 32-bit word of the address in host (little-endian) order
            packed = b"".join(bytes.fromhex(raw[i:i + 8])[::-1] for i in range(0, len(raw), 8))
            address = ipaddress.ip_address(packed)
            mapped = getattr(address, "ipv4_mapped", None)
            found.add(str(mapped or address))
    return found


def test_insecure_serves_beyond_loopback_with_a_warning(data):
    """--insecure is the operator saying so: `zarrfeed serve --host 0.0.0.0 --insecure` gets as far as serving,
    says "serving on grpc://0.0.0.0:PORT" and warns. Nothing listens beyond loopback: tests/serve_loopback.py
    runs the command with the server's bind moved from 0.0.0.0 to 127.0.0.1 (and says it was asked for
    0.0.0.0, so the option did reach the server)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "serve_loopback.py"), "serve", str(data),
                             "--host", "0.0.0.0", "--port", "0", "--workers", "1", "--insecure"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving on grpc://0.0.0.0:") and "anyone may read; no uploads" in line, \
            line + proc.stderr.read()
        port = int(line.split()[2].rsplit(":", 1)[1])
        assert listening(port) == {"127.0.0.1"}  # not 0.0.0.0 (nor ::)
        with RemoteLoader(f"grpc://127.0.0.1:{port}", "scenes", batch_size=10) as remote:
            assert sum(len(b["host"]) for b in remote) == Dataset.open(data).rows["scenes"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "serve_loopback: asked to listen on grpc://0.0.0.0:0; listening on 127.0.0.1" in err, err
    assert "zarrfeed: warning: serving on 0.0.0.0 with --insecure: anyone who reaches this port can read the " \
           "data\n" in err, err
    assert proc.returncode == 0, err


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


def test_serve_on_a_busy_port_or_with_a_bad_certificate_is_one_line(data, tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(data), "--port", str(port)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and r.stderr == f"zarrfeed: error: cannot serve on 127.0.0.1:{port}: the port is in " \
        "use (another server?)\n", r.stderr
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(data), "--port", "0", "--tls-cert",
                        str(bad), "--tls-key", str(bad)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "not a PEM certificate" in r.stderr, r.stderr


def test_streams_beyond_the_cap_are_told_busy_not_left_hanging(data):
    """Issue 21: every stream started its own loader processes, with no cap. Beyond --max-streams a trainer
    gets "busy, retry" in one line; once a stream ends its place is free again."""
    s = Server(data, "--max-streams", "1", "--transforms", str(TRANSFORMS))
    try:
        first = RemoteLoader(s.url, "agents", batch_size=50, transform="slow", transform_args={"seconds": 0.02})
        it = iter(first)
        next(it)  # one stream open (its 144 batches take 0.02 s each)
        second = RemoteLoader(s.url, "agents", batch_size=50, reconnect_timeout=0)  # one try
        with pytest.raises(ConnectionError, match=r"busy: 1 streams open \(the server's --max-streams is 1\); "
                                                  r"retry later$"):
            next(iter(second))
        third = RemoteLoader(s.url, "agents", batch_size=50, reconnect_timeout=30)  # waits for a place
        threading.Timer(0.5, it.close).start()  # the first trainer leaves: its stream ends at its next batch
        assert sum(len(b["centroid"]) for b in third) == Dataset.open(data).rows["agents"]
    finally:
        s.stop()


def test_uploads_are_capped_in_number_and_size(target):
    """Beyond --max-uploads a producer is told busy (its next call re-sends, exactly once); a message over
    --max-message-bytes is refused in one line before it is decoded, and the server goes on."""
    from zarrfeed.flight import RemoteWriter

    eps = list(synthetic.episodes(3, seed=60, frames=20, agents_per_frame=5))
    big = next(synthetic.episodes(1, seed=61, frames=200, agents_per_frame=50))  # about 1.2 MB
    s = Server(target, "--ingest", "--max-uploads", "1", "--max-message-bytes", "512K")
    try:
        with RemoteWriter(s.url) as a, RemoteWriter(s.url) as b:
            assert a.submit(eps[0], key="a0")  # a's upload call stays open
            with pytest.raises(ConnectionError, match=r"busy: 1 uploads open \(the server's --max-uploads is 1\)"):
                b.submit(eps[1], key="b0")
            a.close()  # a's call ends
            assert b.submit(eps[1], key="b0")
            with pytest.raises(ValueError, match=r"an uploaded message of 1\.\d MiB is over the server's "
                                                 r"--max-message-bytes of 0\.5 MiB"):
                b.submit(big, key="big")
            assert b.submit(eps[2], key="b1")  # the server goes on
    finally:
        assert s.stop() < 2.0
    assert Dataset.open(target).rows["scenes"] == 4  # the first, a0, b0 and b1: each once


def test_tickets_over_the_servers_limits_are_refused(data):
    s = Server(data, "--max-batch-bytes", "1M", "--max-transform-args-bytes", "100", "--transforms", str(TRANSFORMS))
    try:
        with pytest.raises(ValueError, match=r"a batch of 20000 is at least 2 MiB of agents, over the server's "
                                             r"--max-batch-bytes of 1 MiB"):
            RemoteLoader(s.url, "agents", batch_size=20_000)
        with pytest.raises(ValueError, match=r"transform_args are \d+ bytes of JSON, over the server's "
                                             r"--max-transform-args-bytes of 100"):
            RemoteLoader(s.url, "agents", transform="speed", transform_args={"scale": 1.0, "pad": "x" * 200})
        with RemoteLoader(s.url, "agents", batch_size=5_000) as remote:  # within them: served
            assert sum(len(b["centroid"]) for b in remote) == Dataset.open(data).rows["agents"]
        # found by an adversarial pass: a window batch was counted as one row per frame (its agents not at all:
        # 150 MiB batches under a 2 MiB cap), a field named 200 times sized the ring 200 times over, and a
        # 10 MB ticket was parsed (and a 200 MB one took the server to 21 GB)
        with pytest.raises(ValueError, match=r"a batch of 64 takes up to \d+ MiB, over the server's "
                                             r"--max-batch-bytes of 1 MiB"):
            RemoteWindowLoader(s.url, history=10, future=10, batch_size=64)
        with pytest.raises(ValueError, match="fields: 'centroid' is named more than once"):
            RemoteLoader(s.url, "agents", fields=["centroid"] * 200)
        from zarrfeed.flight.protocol import Ticket
        from zarrfeed.loader.plan import PlanSettings
        client = flight.connect(s.url)
        twice = Ticket("agents", PlanSettings(10), fields=["centroid"] * 200).to_json()
        with pytest.raises(flight.FlightServerError, match="fields: 'centroid' is named more than once"):
            client.do_get(flight.Ticket(twice)).read_all()
        huge = Ticket("agents", PlanSettings(10), fields=["centroid"] * 20_000).to_json()
        with pytest.raises(flight.FlightServerError, match=r"ticket: \d+ bytes, over the 65636 a ticket may take"):
            client.do_get(flight.Ticket(huge)).read_all()
        client.close()
    finally:
        s.stop()


def test_limits_are_sized_from_the_machine_and_refused_when_nonsense(data):
    from zarrfeed.flight.limits import Limits
    limits = Limits.for_machine(workers=2)
    assert limits.max_streams >= 4 and 2 <= limits.max_uploads <= 64
    assert 1 << 20 <= limits.max_message_bytes <= 256 << 20 and limits.max_batch_bytes <= 512 << 20
    for flag, value, said in (("--max-streams", "0", "max_streams must be at least 1, got 0"),
                              ("--max-message-bytes", "12X", "not a size: '12X'")):
        r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(data), "--port", "0", flag, value],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("windows", [False, True])
def test_a_trainer_survives_a_server_restart_mid_epoch(data, windows):
    """Issue 21: a server restarted mid-epoch ended the trainer's epoch with an error. Now RemoteLoader and
    RemoteWindowLoader reconnect and go on from the batch after the last one they yielded: the epoch is
    exactly the local loader's."""
    import serve_transforms

    from zarrfeed.flight import RemoteWindowLoader
    s = Server(data, "--transforms", str(TRANSFORMS))
    # batches made slowly (10 ms each), so that the server dies before it has sent the epoch
    args = dict(batch_size=4 if windows else 20, seed=3)
    slow = dict(transform="slow", transform_args={"seconds": 0.01}, reconnect_timeout=30)
    remote = RemoteWindowLoader(s.url, 2, 3, **args, **slow) if windows else \
        RemoteLoader(s.url, "agents", **args, **slow)
    restarted = None
    try:
        got = []
        for i, batch in enumerate(remote):
            got.append(batch)
            if i == 3:  # mid-epoch: the server dies and a new one starts on the same port a second later
                s.kill()
                time.sleep(1.0)
                restarted = Server(data, "--port", s.port, "--transforms", str(TRANSFORMS))
        local_cls = WindowLoader if windows else Loader
        local_args = (data, 2, 3) if windows else (data, "agents")
        with local_cls(*local_args, **args, num_workers=0, copy=True,
                       transform=functools.partial(serve_transforms.slow, seconds=0)) as local:
            want = list(local)
        assert remote.reconnects == 1 and len(got) == len(want) > 4
        for a, b in zip(got, want, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
    finally:
        remote.close()
        if restarted is not None:
            restarted.stop()


def test_status_and_the_access_log_show_who_is_connected(tmp_path):
    """Issue 21: an operator could not see who is connected, how fast batches go or how far ingestion lags.
    `zarrfeed status URL` (the action "status") says it; every stream and upload leaves one access-log line."""
    from zarrfeed.flight import RemoteWriter

    target, scenes = tmp_path / "d.zarr", 12  # windows of about 200 KB: more than gRPC buffers
    write_dataset(target, synthetic.episodes(scenes, seed=12, frames=100, agents_per_frame=60), workers=0)
    s = Server(target, "--ingest")
    try:
        # raw windows are large: the server's stream waits on the trainer, which stops reading after one batch
        trainer = RemoteWindowLoader(s.url, 10, 20, batch_size=16, rank=1, world_size=2)
        it = iter(trainer)
        next(it)
        with RemoteWriter(s.url) as producer:
            eps = list(synthetic.episodes(2, seed=70, frames=20, agents_per_frame=5))
            assert producer.submit(eps[0], key="s0") and producer.submit(eps[1], key="s1")
            out = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", s.url, "--json"],
                                 capture_output=True, text=True, timeout=60, cwd=ROOT)
            assert out.returncode == 0, out.stderr
            doc = json.loads(out.stdout)
            (stream,) = doc["streams"]
            assert (stream["table"], stream["kind"], stream["rank"], stream["world_size"], stream["epoch"]) == \
                ("frames", "windows", 1, 2, 0)
            assert stream["client"].startswith("ipv4:127.0.0.1:") and stream["rows"] > 0 and stream["rows_per_s"] > 0
            (upload,) = doc["uploads"]
            assert upload["accepted"] == 2 and doc["totals"]["episodes_accepted"] == 2
            ingestion = doc["datasets"][""]["ingestion"]  # the server's only dataset, unnamed
            assert doc["ingesting"] and ingestion["writer_open"] and 0 <= ingestion["commit_lag_episodes"] <= 2
            assert doc["processes"]["workers"] >= 1 and doc["memory"]["server_rss"] > 0 and doc["uptime_s"] > 0
            assert doc["limits"]["max_streams"] >= 4
            producer.sync()
            text = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", s.url], capture_output=True,
                                  text=True, timeout=60, cwd=ROOT).stdout
            assert "streams: 1 open" in text and "rank 1/2 epoch 0" in text, text
            assert f"committed {scenes + 2} scenes" in text and "commit lag 0 episodes" in text, text
        it.close()
        trainer.close()
    finally:
        s.stop()
    log = s.err()
    assert re.search(r"stream \d+ client=ipv4:127\.0\.0\.1:\d+ kind=windows table=frames rank=1/2 epoch=0 batches=\d+ "
                     r"rows=\d+ decoded=\d+ seconds=[\d.]+ outcome=(cancelled|ok)", log), log
    assert re.search(r"upload \d+ client=ipv4:127\.0\.0\.1:\d+ accepted=2 passed_over=0 bytes=\d+ seconds=[\d.]+ "
                     r"outcome=ok", log), log


def test_kept_loaders_are_an_option_and_shown_by_status(data):
    """Issue 39 item 5: an idle server kept up to 8 loaders' workers for 120 s (755 MiB in one run) and neither
    `status` nor the guide said so. `--kept-loaders` and `--kept-loader-seconds` set both; `status` shows them."""
    def status() -> dict:
        out = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", s.url, "--json"], capture_output=True,
                             text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    s = Server(data, "--kept-loaders", "1", "--kept-loader-seconds", "3")
    try:
        for seed in (1, 2):  # two trainers' epochs end: the second's loader takes the first's place
            with RemoteLoader(s.url, "agents", batch_size=4096, seed=seed) as remote:
                assert sum(len(b["centroid"]) for b in remote) == Dataset.open(data).rows["agents"]
        doc = status()
        assert doc["limits"]["kept_loaders"] == 1 and doc["limits"]["kept_loader_seconds"] == 3
        assert doc["kept_loaders"] == {"loaders": 1, "worker_processes": 1}
        text = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", s.url], capture_output=True,
                              text=True, timeout=60, cwd=ROOT).stdout
        assert "loaders kept for a next epoch: 1 (at most 1, each for 3 s), holding 1 worker process" in text, text
        deadline = time.monotonic() + 20
        while status()["kept_loaders"]["loaders"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status()["kept_loaders"] == {"loaders": 0, "worker_processes": 0}
    finally:
        s.stop()
    s = Server(data, "--kept-loaders", "0")
    try:
        with RemoteLoader(s.url, "agents", batch_size=4096) as remote:
            list(remote)
        assert status()["kept_loaders"]["loaders"] == 0
    finally:
        s.stop()
    bad = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(data), "--kept-loaders", "-1"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--kept-loaders" in bad.stderr


def test_episodes_passed_over_leave_no_commit_lag(target):
    """Issue 26 (a planted bug the suite missed): the status counted every episode uploaded as accepted, so
    episodes passed over (their keys committed) showed as a commit lag that never went away: an operator
    waits for commits that will never come. Two producers send the same keys: once all is synced the lag is
    0 and the second producer's episodes were passed over, not written again."""
    from zarrfeed.flight import RemoteWriter

    eps = list(synthetic.episodes(3, seed=90, frames=20, agents_per_frame=5))
    s = Server(target, "--ingest")
    try:
        with RemoteWriter(s.url) as first:
            assert all(first.submit(ep, key=f"p{i}") for i, ep in enumerate(eps))
        with RemoteWriter(s.url) as again:
            assert not any(again.submit(ep, key=f"p{i}") for i, ep in enumerate(eps))  # committed: passed over
            again.sync()
            out = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", s.url, "--json"],
                                 capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        ingestion = json.loads(out.stdout)["datasets"][""]["ingestion"]
        assert ingestion["writer_open"] and ingestion["committed_rows"]["scenes"] == 4, ingestion
        assert ingestion["commit_lag_episodes"] == 0, ingestion
    finally:
        s.stop()


def test_prometheus_metrics_on_their_own_port(target):
    """--metrics-port serves the status figures as Prometheus metrics (prometheus_client, an optional extra)."""
    import urllib.request

    from zarrfeed.flight import RemoteWriter

    s = Server(target, "--ingest", "--metrics-port", "0")
    try:
        url = re.search(r"metrics: (http://127\.0\.0\.1:\d+/metrics)", s.first_line).group(1)
        with RemoteWriter(s.url) as w:
            assert w.submit(next(synthetic.episodes(1, seed=80, frames=20, agents_per_frame=5)), key="m")
        with RemoteLoader(s.url, "scenes", batch_size=1) as remote:
            assert len(list(remote)) == 2
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        metrics = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                   if line.startswith("zarrfeed_")}
        assert metrics["zarrfeed_episodes_accepted_total"] == 1 and metrics["zarrfeed_streams_total"] == 1
        assert metrics["zarrfeed_rows_sent_total"] == 2 and metrics['zarrfeed_commit_lag_episodes{dataset=""}'] == 0
        assert metrics['zarrfeed_committed_rows{dataset="",table="scenes"}'] == 2
        assert metrics["zarrfeed_uptime_seconds"] > 0
        assert metrics['zarrfeed_memory_rss_bytes{process="server"}'] > 0
    finally:
        s.stop()


def test_several_datasets_by_name(tmp_path):
    """Issue 21: one dataset per server. `serve train=A val=B` serves both: tickets, descriptors and actions
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
    # found by an adversarial pass: only the same spelling was refused
    for other in (val, f"{val}/", val.parent / ".." / val.parent.name / val.name, link):
        r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", f"a={val}", f"b={other}",
                            "--port", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and "datasets 'a' and 'b' are the same dataset" in r.stderr, (other, r.stderr)


@pytest.mark.parametrize("sync_first", [True, False])
def test_a_sync_after_a_server_restart_sends_again_what_the_old_one_never_committed(target, sync_first):
    """Found by an adversarial pass: 3 episodes acknowledged, the server SIGKILLed before its commit and
    restarted on the same port; gRPC reconnected by itself, the new server answered sync with its committed
    rows, and the producer dropped the 3 episodes and exited 0. A sync is confirmed only by the server
    instance that accepted them; otherwise they are sent again (the committed ones passed over by key)."""
    from zarrfeed.flight import RemoteWriter

    s = Server(target, "--ingest")
    eps = list(synthetic.episodes(3, seed=7, frames=30, agents_per_frame=20))
    w = RemoteWriter(s.url)
    restarted = None
    try:
        for i, ep in enumerate(eps):
            assert w.submit(ep, key=f"ep-{i}")
        s.kill()  # before the commit that follows a second's pause
        restarted = Server(target, "--ingest", "--port", s.port)
        if sync_first:
            w.sync()
        w.close()  # alone, it does the same
    finally:
        (restarted or s).stop()
    want = list(synthetic.episodes(1, seed=100, frames=30, agents_per_frame=20)) + eps
    assert episodes_in(target) == sorted(content_key(ep) for ep in want)


def test_sigterm_ends_the_server_even_when_a_writer_worker_died(target):
    """Found by an adversarial pass: with a producer connected and a writer worker SIGKILLed (as the OOM
    killer might), the last commit at SIGTERM raised, the shutdown after it never ran, and the server served
    on. Now it stops within seconds all the same, says in one line that the last commit failed, exits 1."""
    from zarrfeed.flight import RemoteWriter

    s = Server(target, "--ingest")
    w = RemoteWriter(s.url)
    try:
        for i, ep in enumerate(synthetic.episodes(2, seed=8, frames=30, agents_per_frame=20)):
            w.submit(ep, key=f"e{i}")
        stat = {pid: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] for pid in s.descendants()}
        workers = [pid for pid, parent in stat.items() if int(parent) != s.proc.pid]  # forked by the fork server
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        took = s.stop()  # the producer stays connected, idle
        assert took < 5 and s.proc.returncode == 1, (took, s.err()[-2000:])
        assert "the last commit failed" in s.err() and "Traceback" not in s.err()
    finally:
        if s.proc.poll() is None:
            s.kill()


def test_a_url_that_is_not_a_servers_is_one_line():
    """Found by an adversarial pass: `zarrfeed status s3://...` printed pyarrow's ArrowKeyError traceback."""
    from zarrfeed.flight import RemoteWriter

    for url in ("s3://bucket/x", "http://127.0.0.1:1"):
        r = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", url], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        assert r.returncode == 2 and "not a zarrfeed server's URL" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        for client in (lambda: RemoteLoader(url, "agents"), lambda: RemoteWriter(url)):  # noqa: B023
            with pytest.raises(ValueError, match="not a zarrfeed server's URL"):
                client()


def test_a_token_with_a_newline_is_refused_in_one_line_before_any_call():
    """Found by an adversarial pass: RemoteWriter(token="x\\n") failed on the client's side with an invalid
    header, reported as "the server went away ... call again", and every call again repeated it."""
    from zarrfeed.flight import RemoteWriter

    for make in (lambda: RemoteWriter("grpc://127.0.0.1:1", token="x\n"),
                 lambda: RemoteLoader("grpc://127.0.0.1:1", "agents", token="x y")):
        with pytest.raises(ValueError, match="token: empty, or holds spaces, a newline"):
            make()



def test_uploads_after_a_writer_worker_died_get_a_new_writer_and_nothing_acked_is_lost(target):
    """A writer worker SIGKILLed mid-service (as the OOM killer might): the server's writer stops; the producer
    is told once, in one line, and the uploads after that get a new writer (the dataset reopened, resumed)
    rather than the stopped writer's error for ever. The episode acknowledged before the kill, which the
    stopped writer never committed, is not lost: the producer's sync is answered by another instance than the
    one that accepted it, and sends it again. Every episode ends up in the dataset exactly once."""
    from zarrfeed.flight import RemoteWriter

    eps = list(synthetic.episodes(4, seed=11, frames=30, agents_per_frame=20))
    s = Server(target, "--ingest")
    w = RemoteWriter(s.url)
    told: list[str] = []

    def again_if_stopped(call):
        try:
            return call()
        except ValueError as exc:  # the writer stopped: one line; the same call again gets a new writer
            assert "the writer stopped" in str(exc) and "\n" not in str(exc), str(exc)
            told.append(str(exc))
            return call()

    try:
        assert w.submit(eps[0], key="e0")  # acknowledged; committed only after a second's pause
        stat = {pid: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] for pid in s.descendants()}
        workers = [pid for pid, parent in stat.items() if int(parent) != s.proc.pid]  # forked by the fork server
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        for pid in workers:  # reaped before the next upload, so that its writer sees it dead
            for _ in range(3000):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.01)
        for i, ep in enumerate(eps[1:], start=1):
            assert again_if_stopped(lambda: w.submit(ep, key=f"e{i}"))  # noqa: B023  # called now
        assert again_if_stopped(w.close)["scenes"] == 5
        assert len(told) == 1, told
    finally:
        s.stop()
    want = list(synthetic.episodes(1, seed=100, frames=30, agents_per_frame=20)) + eps
    assert episodes_in(target) == sorted(content_key(ep) for ep in want)
    assert Dataset.open(target).validate().ok


def stream_with_its_workers_signalled(s: "Server", sig: int) -> tuple:
    """A RemoteWindowLoader stream of batches of 1 from server `s`, one batch read, then `sig` sent to the
    loader processes the stream started: (the remote loader, its batches, their pids)."""
    before = set(s.descendants())
    remote = RemoteWindowLoader(s.url, 2, 3, batch_size=1, seed=1)
    batches = iter(remote)
    next(batches)
    hit = sorted(set(s.descendants()) - before)
    assert hit, "no loader workers seen"
    for pid in hit:
        os.kill(pid, sig)
    return remote, batches, hit


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_stopped_or_dead_server_worker_fails_the_stream_in_one_line_for_the_client(small_dataset, sig):
    """Adversarial pass (issue 38): a server's loader worker stopped (SIGSTOP) mid-stream left the remote client
    waiting for good with nothing raised (the server answered its probes; the server's loader waited as long as
    the worker was stopped, saying so only in the server's log). The stream now fails after the server's
    --stream-stall-timeout, and the client raises its one line, naming the stopped process. A worker killed
    was reported, but advised `restart_workers=True`, which a remote loader refuses (the server's to decide)."""
    data = small_dataset(8, 9, chunks={"agents": 900}, frames=100, agents_per_frame=40)  # 800 batches of 1
    s = Server(data, "--stream-stall-timeout", "2", "--kept-loaders", "0")
    hit: list[int] = []
    try:
        remote, batches, hit = stream_with_its_workers_signalled(s, sig)
        outcome: dict[str, BaseException | int] = {}

        def read() -> None:
            try:
                outcome["batches"] = sum(1 for _ in batches)
            except BaseException as exc:
                outcome["error"] = exc
        reader = threading.Thread(target=read, daemon=True)
        t0 = time.monotonic()
        reader.start()
        reader.join(60)
        assert "error" in outcome, f"after {time.monotonic() - t0:.0f} s: {outcome or 'still waiting'}"
        error = str(outcome["error"])
        assert isinstance(outcome["error"], LoaderError), repr(outcome["error"])
        assert any(f"(pid {p})" in error for p in hit), error
        if sig == signal.SIGSTOP:
            assert "--stream-stall-timeout of 2 s" in error and "kill -CONT" in error, error
        else:
            assert "loader worker" in error, error
        assert "restart_workers" not in error and "stall_timeout=None" not in error, error
        remote.close()
        status = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "status", s.url], capture_output=True,
                                text=True, timeout=60, cwd=ROOT).stdout
        assert "a stream waiting on a stopped process fails after 2 s" in status, status
    finally:
        for pid in hit:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        s.stop()
    assert "--stream-stall-timeout" in subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", "--help"],
                                                      capture_output=True, text=True, cwd=ROOT).stdout
    assert "stall_timeout=None" not in s.err()  # the server's log says its own option too
    bad = subprocess.run([sys.executable, "-m", "zarrfeed.cli", "serve", str(data), "--stream-stall-timeout", "inf"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "expected a finite number of seconds > 0, got 'inf'" in bad.stderr, bad.stderr


def test_a_server_stopped_with_a_stream_held_up_by_a_stopped_worker_leaves_no_process(small_dataset):
    """Adversarial pass (issue 38): SIGTERM while a stream waited on a stopped loader worker: the server exited,
    but the stopped worker stayed, and with it the fork server and resource tracker (they wait for it)."""
    data = small_dataset(8, 9, chunks={"agents": 900}, frames=100, agents_per_frame=40)
    s = Server(data, "--stream-stall-timeout", "60", "--kept-loaders", "0")
    hit: list[int] = []
    try:
        remote, batches, hit = stream_with_its_workers_signalled(s, signal.SIGSTOP)
        everything = s.descendants()

        def read() -> None:
            with contextlib.suppress(Exception):
                sum(1 for _ in batches)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(2)
        assert s.stop() < 10.0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and [p for p in everything if process_state(p) not in (None, "Z")]:
            time.sleep(0.1)
        assert [p for p in everything if process_state(p) not in (None, "Z")] == []
    finally:
        for pid in hit:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        s.stop()
