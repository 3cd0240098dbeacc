"""A moto S3 server for tests and benchmarks: a real HTTP server in its own process, on 127.0.0.1 only."""
import os
import subprocess


class S3Server:
    """A moto S3 server on 127.0.0.1 (a real HTTP server in its own process), and how to reach it."""

    def __init__(self) -> None:
        import socket
        import sys
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("the moto S3 server did not start")
                time.sleep(0.1)
        self.options = {"key": "testing", "secret": "testing", "endpoint_url": self.endpoint}
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
        self._buckets = 0

    def bucket(self) -> str:
        """A new, empty bucket (its name, as s3://NAME)."""
        import s3fs

        self._buckets += 1
        name = f"test-{os.getpid()}-{self._buckets}"
        s3fs.S3FileSystem(**self.options, skip_instance_cache=True).mkdir(name)
        return f"s3://{name}"

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(**self.options, skip_instance_cache=True)

    def stop(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGCONT)  # in case a test paused it
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
