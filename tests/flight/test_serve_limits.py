"""The limits of a `zarrfeed serve` process: streams beyond the cap told busy, uploads capped in number and size,
tickets over the server's limits refused, limits sized from the machine and refused when nonsense."""
import subprocess
import sys
import threading

import pyarrow.flight as flight
import pytest
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic

from zarrfeed.flight import RemoteLoader, RemoteWindowLoader
from repo_paths import ROOT
from serve_process import TRANSFORMS, Server


def test_streams_beyond_the_cap_are_told_busy_not_left_hanging(data):
    """Every stream started its own loader processes, with no cap. Beyond --max-streams a trainer
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
        # a window batch was counted as one row per frame (its agents not at all:
        # 150 MiB batches under a 2 MiB cap), a field named 200 times sized the ring 200 times over, and a
        # 10 MB ticket was parsed (and a 200 MB one took the server to 21 GB)
        with pytest.raises(ValueError, match=r"a batch of 64 takes up to \d+ MiB, over the server's "
                                             r"--max-batch-bytes of 1 MiB"):
            RemoteWindowLoader(s.url, history=10, future=10, batch_size=64)
        with pytest.raises(ValueError, match="fields: 'centroid' is named more than once"):
            RemoteLoader(s.url, "agents", fields=["centroid"] * 200)
        from zarrfeed.flight.protocol import Ticket
        from zarrfeed.flight.protocol import TicketPlan
        client = flight.connect(s.url)
        twice = Ticket("agents", TicketPlan(10), fields=["centroid"] * 200).to_json()
        with pytest.raises(flight.FlightServerError, match="fields: 'centroid' is named more than once"):
            client.do_get(flight.Ticket(twice)).read_all()
        huge = Ticket("agents", TicketPlan(10), fields=["centroid"] * 20_000).to_json()
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
