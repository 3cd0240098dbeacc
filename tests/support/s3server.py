"""A moto S3 server for tests and benchmarks: a real HTTP server in its own process, on 127.0.0.1 only."""
import contextlib
import os
import subprocess


class S3Server:
    """A moto S3 server on 127.0.0.1 (a real HTTP server in its own process), and how to reach it. With
    `recording` (a file outside the repository), `requests()` records the requests it answers (moto's recorder)."""

    def __init__(self, recording: str | None = None) -> None:
        import socket
        import sys
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.recording = recording
        env = {**os.environ, "MOTO_RECORDER_FILEPATH": recording} if recording else None
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
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

    @contextlib.contextmanager
    def requests(self):
        """Record the requests the server answers within the block: a list, filled as the block ends, of each
        request's method, path (below the endpoint, without the query) and Range header (None without one)."""
        import json
        import urllib.parse
        import urllib.request

        assert self.recording, "S3Server(recording=...) records requests"

        def recorder(action: str) -> None:
            urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}",
                                                          method="POST"), timeout=30)

        recorder("reset-recording")
        recorder("start-recording")
        seen: list[tuple[str, str, str | None]] = []
        try:
            yield seen
        finally:
            recorder("stop-recording")
            with open(self.recording) as f:
                for line in f:
                    entry = json.loads(line)
                    headers = {k.lower(): v for k, v in entry["headers"].items()}
                    seen.append((entry["method"], urllib.parse.urlsplit(entry["url"]).path, headers.get("range")))

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
