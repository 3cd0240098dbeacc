"""Ingestion through `zarrfeed serve --ingest` (do_put, RemoteWriter): what a local writer would write, refusals
by name, every episode exactly once with many producers, across server kills and restarts and dead writer
workers, and no commit lag for episodes passed over."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic

from zarrfeed.flight import RemoteLoader
from repo_paths import ROOT
from serve_process import Server, content_key, episodes_in


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


def test_episodes_passed_over_leave_no_commit_lag(target):
    """The status counted every episode uploaded as accepted, so
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


@pytest.mark.parametrize("sync_first", [True, False])
def test_a_sync_after_a_server_restart_sends_again_what_the_old_one_never_committed(target, sync_first):
    """3 episodes acknowledged, the server SIGKILLed before its commit and
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
