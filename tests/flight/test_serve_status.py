"""What a `zarrfeed serve` process shows about itself: `zarrfeed status` and the access log (who is connected),
the kept loaders, and Prometheus metrics on a port of their own."""
import json
import re
import subprocess
import sys
import time

from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.flight import RemoteLoader, RemoteWindowLoader
from repo_paths import ROOT
from serve_process import Server


def test_status_and_the_access_log_show_who_is_connected(tmp_path):
    """An operator could not see who is connected, how fast batches go or how far ingestion lags.
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
    """An idle server kept up to 8 loaders' workers for 120 s (755 MiB in one run) and neither
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
