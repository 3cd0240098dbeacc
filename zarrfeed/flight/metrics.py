"""Prometheus metrics of `zarrfeed serve` (`--metrics-port`), with the well-kept `prometheus_client` (the
optional extra `zarrfeed[metrics]`): the same figures as the `status` action, read from it at each scrape, so
the two cannot disagree. Per-stream figures stay in `status` (a label per client would grow without bound).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

COUNTERS = {  # totals since the server started: name -> (key in status["totals"], help)
    "streams": ("streams", "streams started"),
    "batches_sent": ("batches", "batches sent to trainers"),
    "rows_sent": ("rows_sent", "rows (or window samples) sent to trainers"),
    "bytes_sent": ("bytes_sent", "bytes of record batches sent to trainers"),
    "chunks_decoded": ("chunks_decoded", "chunks the streams' loaders decoded (none if the host cache held them)"),
    "uploads": ("uploads", "upload calls started"),
    "episodes_accepted": ("episodes_accepted", "episodes accepted from producers"),
    "episodes_passed_over": ("episodes_passed_over", "episodes passed over (their key was committed)"),
    "bytes_received": ("bytes_received", "bytes of episodes received"),
}


class _Collector:
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        doc = self.status()
        yield GaugeMetricFamily("zarrfeed_uptime_seconds", "seconds since the server started", doc["uptime_s"])
        yield GaugeMetricFamily("zarrfeed_streams_open", "streams open now", len(doc["streams"]))
        yield GaugeMetricFamily("zarrfeed_uploads_open", "upload calls open now", len(doc["uploads"]))
        for name, (key, text) in COUNTERS.items():
            yield CounterMetricFamily(f"zarrfeed_{name}", text, doc["totals"][key])
        lag = GaugeMetricFamily("zarrfeed_commit_lag_episodes", "episodes accepted but not yet committed",
                                labels=["dataset"])
        rows = GaugeMetricFamily("zarrfeed_committed_rows", "committed rows per table", labels=["dataset", "table"])
        for name, served in doc["datasets"].items():
            lag.add_metric([name], served["ingestion"]["commit_lag_episodes"])
            for table, n in served["ingestion"]["committed_rows"].items():
                rows.add_metric([name, table], n)
        yield lag
        yield rows
        yield GaugeMetricFamily("zarrfeed_worker_processes", "loader and writer processes", doc["processes"]["workers"])
        memory = GaugeMetricFamily("zarrfeed_memory_rss_bytes", "resident memory (shared memory counted in each "
                                   "process)", labels=["process"])
        memory.add_metric(["server"], doc["memory"]["server_rss"])
        memory.add_metric(["workers"], doc["memory"]["workers_rss"])
        yield memory


def serve_metrics(status: Callable[[], dict[str, Any]], host: str, port: int) -> int:
    """Serve the metrics of `status()` at http://host:port/metrics from a thread; the port (0: a free one)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise ValueError("--metrics-port needs prometheus_client: pip install 'zarrfeed[metrics]'") from None
    registry = CollectorRegistry()
    registry.register(_Collector(status))  # type: ignore[arg-type]
    httpd, _ = start_http_server(port, addr=host, registry=registry)
    return int(httpd.server_port)
