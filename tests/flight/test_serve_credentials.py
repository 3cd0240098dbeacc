"""Who may reach a `zarrfeed serve` process: tokens, TLS, separate credentials for reading and ingesting, tokens
required beyond loopback (or `--insecure`, with a warning), and one line for a busy port, a bad certificate or a
token that holds a newline."""
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.flight as flight
import pytest
from zarrfeed.loader import Dataset, Loader
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.flight import RemoteLoader
from repo_paths import ROOT, SUPPORT
from serve_process import Server, equal_batches, self_signed


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
        # a certificate the client does not trust read "no zarrfeed server answers"
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


def test_reading_and_ingesting_have_separate_credentials(data, tmp_path):
    """One token granted everything, so a trainer's token could ingest into the dataset. Now the
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
    says "serving on grpc://0.0.0.0:PORT" and warns. Nothing listens beyond loopback: tests/support/serve_loopback.py
    runs the command with the server's bind moved from 0.0.0.0 to 127.0.0.1 (and says it was asked for
    0.0.0.0, so the option did reach the server)."""
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "serve_loopback.py"), "serve", str(data),
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


def test_a_token_with_a_newline_is_refused_in_one_line_before_any_call():
    """RemoteWriter(token="x\\n") failed on the client's side with an invalid
    header, reported as "the server went away ... call again", and every call again repeated it."""
    from zarrfeed.flight import RemoteWriter

    for make in (lambda: RemoteWriter("grpc://127.0.0.1:1", token="x\n"),
                 lambda: RemoteLoader("grpc://127.0.0.1:1", "agents", token="x y")):
        with pytest.raises(ValueError, match="token: empty, or holds spaces, a newline"):
            make()
