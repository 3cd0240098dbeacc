"""`zarrfeed serve` in a process of its own for tests (`Server`), the named transforms it loads, and what tests of
serving compare: batches byte for byte, episodes by content, a self-signed certificate for TLS."""
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from repo_paths import ROOT, SUPPORT


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


TRANSFORMS = SUPPORT / "serve_transforms.py"


def equal_batches(remote, local):
    n = 0
    for a, b in zip(remote, local, strict=True):
        assert list(a) == list(b)
        for name in a:
            assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
            assert a[name].tobytes() == b[name].tobytes()
        n += 1
    return n


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
    from zarrfeed.writer.dataset_episodes import DatasetSource
    return sorted(content_key(ep) for ep in DatasetSource(path))
