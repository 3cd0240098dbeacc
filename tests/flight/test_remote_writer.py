"""RemoteWriter against a FeedServer in this process: every call's path, quickly: keys and retries,
keyless inputs, refusals and what stays usable after them, syncing by size, a server stopped and started again
on the same port, tokens, several datasets. flight/test_serve_ingest.py does the same end to end with
`zarrfeed serve` in its own process; a wrong line here drops or duplicates a producer's episodes."""
import socket
import time

import numpy as np

import pytest
from expected import assert_holds
from zarrfeed.flight import FeedServer, RemoteWriter
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.core.keys import fingerprint


def eps(n: int, seed: int) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=12, agents_per_frame=4))


FIRST = eps(1, seed=100)


@pytest.fixture(autouse=True)
def writers_end(monkeypatch):
    """Every RemoteWriter a test made is let go at its end, as a `with` block left by an exception does: one a
    failing test left open kept a gRPC thread alive, and pytest never exited."""
    made = []
    real = RemoteWriter.__init__

    def init(self, *args, **kwargs):
        made.append(self)
        real(self, *args, **kwargs)
    monkeypatch.setattr(RemoteWriter, "__init__", init)
    yield
    for w in made:
        try:
            w.__exit__(RuntimeError, None, None)
        except Exception:  # noqa: BLE001 -- a writer whose __init__ failed has nothing to let go
            pass


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "t.zarr"
    write_dataset(path, FIRST, workers=0)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(path, port: int = 0, **kw) -> FeedServer:
    return FeedServer(str(path), port=port, workers=1, ingest=True, **kw)


def test_keys_retries_windows_and_the_committed_rows(target):
    more = eps(7, seed=1)
    with serve(target) as server:
        w = RemoteWriter(server.url)
        assert w.schema.names[0] == "key" and set(w.schema.names[1:]) == set(FIRST[0])
        assert [w.submit(ep, key=f"k{i}") for i, ep in enumerate(more[:2])] == [True, True]
        assert w.submit(more[0], key="k0") is False  # a retry: passed over
        assert w.ingest(more[2:], keys=[f"k{i}" for i in range(2, 7)], window=2) == 5
        assert w.ingest(more[:3], keys=["k0", "k1", "k2"], window=1) == 0  # all passed over
        committed = w.sync()
        assert committed == {t: len(a) + sum(len(e[t]) for e in more) for t, a in FIRST[0].items()}
        assert w.close() == committed and w.close() == committed  # again: the same answer
    assert_holds(Dataset.open(target), FIRST + more)


def test_keyless_episodes_are_one_input_refused_again_unless_resumed(target):
    more = eps(4, seed=2)
    with serve(target) as server:
        with RemoteWriter(server.url) as w:
            assert w.submit(more[0]) and w.submit(more[1])  # positions 0 and 1 of the input more[0] begins
        with RemoteWriter(server.url) as w:
            with pytest.raises(ValueError, match=rf"this input was ingested before \(2 of its episodes are committed; "
                                                 rf"its first episode has fingerprint {fingerprint(more[0])}\)"):
                w.ingest(more)
            assert w.ingest(more, resume=True) == 2  # the first two passed over
            assert w.ingest(eps(2, seed=3)) == 2  # another input
    assert_holds(Dataset.open(target), FIRST + more + eps(2, seed=3))


def test_fewer_keys_than_episodes_names_the_episode(target):
    with serve(target) as server, RemoteWriter(server.url) as w:
        with pytest.raises(ValueError, match=r"^keys: fewer keys than episodes \(none for episode 1\)$"):
            w.ingest(eps(2, seed=4), keys=["a"])
        assert w.sync()["scenes"] == 2  # the one with a key was written


def test_a_refused_episode_is_named_and_the_writer_goes_on(target):
    good = eps(5, seed=5)
    bad = {t: a.copy() for t, a in good[1].items()}
    bad["frames"]["agent_index_interval"][3] = [10**6, 10**6 + 1]
    with serve(target) as server, RemoteWriter(server.url) as w:
        with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3.*; nothing after it in this "
                                             r"call was written$"):
            w.ingest([good[0], bad, good[2], good[3]], keys=["g0", "bad", "g2", "g3"], window=8)
        with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3") as one:
            w.submit(bad, key="bad")
        assert "after it" not in str(one.value)
        assert w.ingest([good[2], good[3], good[4]], keys=["g2", "g3", "g4"]) == 3
        w.close()
    assert_holds(Dataset.open(target), FIRST + [good[0], good[2], good[3], good[4]])


def test_beyond_its_unsynced_bytes_a_writer_syncs_by_itself(target):
    more = eps(3, seed=6)
    with serve(target) as server, RemoteWriter(server.url, max_unsynced_bytes=1) as w:
        w.submit(more[0], key="a")
        assert Dataset.open(target).rows["scenes"] == 2  # committed before submit returned
        w.ingest(more[1:], keys=["b", "c"], window=1)
        assert Dataset.open(target).rows["scenes"] == 4


def test_a_server_stopped_and_started_again_gets_every_episode_once(target):
    """Accepted by one server, which stops; the writer's next call says the server went away; a server on
    the same port then gets them again (by key: the committed ones passed over), whichever call comes next."""
    port = free_port()
    more = eps(6, seed=7)
    w = None
    server = serve(target, port)
    try:
        w = RemoteWriter(server.url)
        assert w.submit(more[0], key="a") and w.submit(more[1], key="b")
        server.stop()
        with pytest.raises(ConnectionError, match=r"(the server went away .*; call again: this writer reconnects"
                                                  r"|server shutting down: the episodes it acknowledged are "
                                                  r"committed)"):
            w.submit(more[2], key="c")
        with pytest.raises(ConnectionError):
            w.sync()
        server = serve(target, port)
        assert w.submit(more[2], key="c")  # reconnects, re-sends a and b (passed over), sends c
        assert w.ingest(more[3:5], keys=["d", "e"]) == 2
        t = totals(server)
        assert (t["episodes_accepted"], t["episodes_passed_over"]) == (3, 2)  # reconnected once, not per call
        server.stop()
        server = serve(target, port)
        try:
            w.submit(more[5], key="f")  # on the call the stopped server ended: this call may notice
        except ConnectionError:
            assert w.submit(more[5], key="f")  # call again, as it says: reconnects and re-sends the unsynced
        assert w.close()["scenes"] == 7
    finally:
        server.stop()
    assert_holds(Dataset.open(target), FIRST + more)


def test_a_sync_answered_by_a_new_server_sends_again(target):
    """gRPC reconnects by itself: a sync answered by a server instance that did not accept the episodes re-sends
    them (here the old one committed them at its stop: passed over, nothing duplicated)."""
    port = free_port()
    more = eps(3, seed=8)
    server = serve(target, port)
    try:
        w = RemoteWriter(server.url)
        for i, ep in enumerate(more):
            assert w.submit(ep, key=f"s{i}")
        server.stop()
        server = serve(target, port)
        for _ in range(2):
            try:
                committed = w.sync()
                break
            except ConnectionError:  # the first call on a dead channel may notice it instead
                continue
        assert committed["scenes"] == 4
        assert w.close() == committed
    finally:
        server.stop()
    assert_holds(Dataset.open(target), FIRST + more)


def test_tokens_and_read_only_tokens(target):
    more = eps(1, seed=9)
    with serve(target, token="read", ingest_token="write") as server:
        with pytest.raises(PermissionError, match=r"the server wants a token \(RemoteWriter\(\.\.\., token=\.\.\.\)\)"):
            RemoteWriter(server.url)
        reader = RemoteWriter(server.url, token="read")
        with pytest.raises(PermissionError, match=f"^{server.url}: "):
            reader.submit(more[0], key="x")
        with RemoteWriter(server.url, token="write") as w:
            assert w.submit(more[0], key="x")
    assert_holds(Dataset.open(target), FIRST + more)


def test_a_server_that_only_feeds_refuses_uploads(target):
    with FeedServer(str(target), port=0, workers=1) as server:
        with pytest.raises(PermissionError, match=f"^{server.url}: "):
            w = RemoteWriter(server.url)
            w.submit(eps(1, seed=10)[0], key="x")


def test_several_datasets_by_name(tmp_path):
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    write_dataset(a, FIRST, workers=0)
    write_dataset(b, FIRST, workers=0)
    more = eps(2, seed=11)
    with FeedServer({"a": str(a), "b": str(b)}, port=0, workers=1, ingest=True) as server:
        with pytest.raises(ValueError, match="serves several datasets"):
            RemoteWriter(server.url)
        with RemoteWriter(server.url, dataset="b") as w:
            assert w.ingest(more, keys=["x", "y"]) == 2
    assert Dataset.open(a).rows["scenes"] == 1
    assert_holds(Dataset.open(b), FIRST + more)


def test_no_server_there_is_one_line():
    with pytest.raises(ConnectionError, match=r"grpc://127\.0\.0\.1:\d+"):
        RemoteWriter(f"grpc://127.0.0.1:{free_port()}", timeout=5)


def totals(server: FeedServer) -> dict:
    return server.status()["totals"]


def test_a_writer_syncs_by_itself_exactly_past_its_bound(target):
    """max_unsynced_bytes bounds what a writer keeps for re-sending: it syncs when what it keeps goes beyond
    the bound, not at it; after a sync it keeps nothing."""
    ep = eps(1, seed=12)[0]
    size = sum(a.nbytes for a in ep.values())
    with serve(target) as server, RemoteWriter(server.url, max_unsynced_bytes=size) as w:
        syncs = []
        real = w.sync
        w.sync = lambda: syncs.append(1) or real()
        w.submit(ep, key="a")  # size: at the bound
        assert syncs == []
        w.submit(ep, key="b")  # 2 x size: beyond it
        assert syncs == [1]
        w.submit(ep, key="c")  # size again after the sync
        assert syncs == [1]
        w.ingest([ep] * 3, keys=["d", "e", "f"], window=1)  # after d: 2 x size (c and d); then e; then f
        assert len(syncs) == 1 + 2 + 1  # d, f, and ingest's own at its end
        assert totals(server)["episodes_accepted"] == 6 and totals(server)["episodes_passed_over"] == 0


def test_a_session_with_no_failure_sends_each_episode_once(target):
    more = eps(4, seed=13)
    with serve(target) as server:
        with RemoteWriter(server.url) as w:
            for i, ep in enumerate(more[:2]):
                w.submit(ep, key=f"k{i}")
            w.sync()
            w.ingest(more[2:], keys=["k2", "k3"])
            w.sync()
        t = totals(server)
        assert (t["episodes_accepted"], t["episodes_passed_over"], t["uploads"]) == (4, 0, 1)


def test_keyless_episodes_go_on_from_where_an_ingest_ended(target):
    more = eps(4, seed=14)
    with serve(target) as server:
        with RemoteWriter(server.url) as w:
            assert w.ingest(more[:2]) == 2
            assert w.submit(more[2])  # position 2 of the same input
            assert w.ingest(eps(1, seed=15), keys=["x"]) == 1
            assert w.submit(more[3])  # after a keyed ingest: a new input, whose first episode is more[3]
        with RemoteWriter(server.url) as w:
            assert w.ingest(more[:3], resume=True) == 0  # positions 0, 1, 2: all committed
            assert w.ingest(more[3:], resume=True) == 0  # the input more[3] began: committed too
    assert_holds(Dataset.open(target), FIRST + more[:3] + eps(1, seed=15) + more[3:])


@pytest.mark.parametrize("at", [0, 1, 2])
def test_a_refusal_says_nothing_after_it_was_written(target, at):
    good = eps(3, seed=16)
    bad = {t: a.copy() for t, a in good[at].items()}
    bad["frames"]["agent_index_interval"][3] = [10**6, 10**6 + 1]
    batch = [bad if i == at else ep for i, ep in enumerate(good)]
    with serve(target) as server, RemoteWriter(server.url) as w:
        with pytest.raises(ValueError) as refused:
            w.ingest(batch, keys=["a", "b", "c"], window=8)
        message = str(refused.value)
        assert message.startswith("zarrfeed: episode ") and message.endswith("); nothing after it in this call "
                                                                              "was written")
        assert w.unsynced == ["a", "b", "c"][:at]
        assert w.sync()["scenes"] == 1 + at  # those before it are written
    assert_holds(Dataset.open(target), FIRST + good[:at])


def test_episodes_refused_with_their_predecessor_are_not_sent_again_by_a_reconnect(target):
    port = free_port()
    good = eps(3, seed=17)
    bad = {t: a.copy() for t, a in good[0].items()}
    bad["frames"]["agent_index_interval"][3] = [10**6, 10**6 + 1]
    server = serve(target, port)
    try:
        w = RemoteWriter(server.url)
        with pytest.raises(ValueError, match="nothing after it in this call was written"):
            w.ingest([bad, good[1], good[2]], keys=["a", "b", "c"], window=8)
        assert w.submit(good[0], key="d")
        server.stop()
        server = serve(target, port)
        for _ in range(2):
            try:
                w.close()
                break
            except ConnectionError:
                continue
        t = totals(server)
        assert (t["episodes_accepted"], t["episodes_passed_over"]) == (0, 1)  # d again, passed over; not b, c
    finally:
        server.stop()
    assert_holds(Dataset.open(target), FIRST + [good[0]])


def test_read_tokens_cannot_upload_in_any_way(target):
    with serve(target, token="read", ingest_token="write") as server:
        w = RemoteWriter(server.url, token="read")
        refusal = f"{server.url}: zarrfeed: this token may read, not upload (uploads need the server's ingest token)"
        with pytest.raises(PermissionError) as keyless:
            w.submit(eps(1, seed=18)[0])  # begins an input: an action
        with pytest.raises(PermissionError) as keyed:
            w.submit(eps(1, seed=18)[0], key="k")  # an upload call
        assert str(keyless.value) == refusal and str(keyed.value) == refusal


def test_a_server_that_went_away_is_named_with_the_reason(target):
    server = serve(target)
    w = RemoteWriter(server.url)
    w.submit(eps(1, seed=19)[0], key="a")
    server.stop()
    with pytest.raises(ConnectionError) as gone:
        for i in range(3):  # the first write may still be taken by the socket's buffer
            w.submit(eps(1, seed=19)[0], key=f"b{i}")
    message = str(gone.value)
    assert message.startswith(f"{server.url}: ")
    if "went away" in message:
        reason = message.split("the server went away (", 1)[1].rsplit("); call again", 1)[0]
        assert reason and reason != "None" and message.endswith(
            "; call again: this writer reconnects and re-sends what is not committed")


def test_a_server_that_never_answers_is_given_up_after_the_timeout():
    import threading
    import time
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        held = []
        threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            RemoteWriter(f"grpc://127.0.0.1:{listener.getsockname()[1]}", timeout=1)
        assert time.monotonic() - started < 15


def test_over_tls(target, tmp_path):
    from serve_process import self_signed
    cert, key = self_signed(tmp_path)
    tls, port = (cert.read_bytes(), key.read_bytes()), free_port()
    server = serve(target, port, tls=tls)
    try:
        assert server.url.startswith("grpc+tls://")
        with pytest.raises(ConnectionError) as untrusted:
            RemoteWriter(server.url)
        assert str(untrusted.value).startswith(f"{server.url}: the TLS handshake failed")
        w = RemoteWriter(server.url, tls_root_certs=cert.read_bytes())
        assert w.submit(eps(2, seed=20)[0], key="a")
        server.stop()
        server = serve(target, port, tls=tls)
        for _ in range(2):  # the call that notices the restart raises; the next reconnects, over TLS
            try:
                assert w.submit(eps(2, seed=20)[1], key="b")
                break
            except ConnectionError:
                continue
        assert w.close()["scenes"] == 3
    finally:
        server.stop()


def test_a_server_stopped_in_the_middle_of_an_ingest(target):
    """The episodes an ingest sent before its server went away are sent again, under their keys, by the call
    after it: each once."""
    port = free_port()
    more = eps(5, seed=21)
    box = {"server": serve(target, port)}

    def produced():
        yield from more[:3]
        box["server"].stop()  # it commits what it accepted, then stops
        yield from more[3:]
    try:
        w = RemoteWriter(box["server"].url)
        with pytest.raises(ConnectionError):
            w.ingest(produced(), keys=[f"k{i}" for i in range(5)], window=8)
        box["server"] = serve(target, port)
        # k0..k2 passed over; k3 and k4 written by this call, each of them either sent by it or (when it went out
        # before the first call saw the server gone) re-sent by its reconnect, which is not counted: so 0, 1 (seen
        # beside a second copy of the suite) or 2; either way each once (assert_holds below)
        assert w.ingest(more, keys=[f"k{i}" for i in range(5)]) in (0, 1, 2)
        w.close()
    finally:
        box["server"].stop()
    assert_holds(Dataset.open(target), FIRST + more)


def test_a_server_killed_is_named_with_its_reason(target):
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "serve", str(target), "--port", "0", "--workers",
                             "1", "--ingest"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = proc.stdout.readline().split()[2]
        w = RemoteWriter(url)
        assert w.submit(eps(1, seed=22)[0], key="a")
        proc.kill()
        proc.wait()
        with pytest.raises(ConnectionError) as gone:
            for i in range(50):  # a write may still go to the socket's buffer
                w.submit(eps(1, seed=22)[0], key=f"b{i}")
        message = str(gone.value)
        reason = message.split(f"{url}: the server went away (", 1)[1].rsplit("); call again", 1)[0]
        assert reason.strip() and reason != "None", message
        assert message.endswith("; call again: this writer reconnects and re-sends what is not committed")
    finally:
        proc.kill()
        proc.wait()


def test_a_busy_server_says_so(target):
    import dataclasses

    from zarrfeed.flight.limits import Limits
    limits = dataclasses.replace(Limits.for_machine(workers=1), max_uploads=1)
    server = FeedServer(str(target), port=0, workers=1, ingest=True, limits=limits)
    with server, RemoteWriter(server.url) as a, RemoteWriter(server.url) as b:
        assert a.submit(eps(1, seed=23)[0], key="a")  # a's upload call stays open
        with pytest.raises(ConnectionError) as busy:
            b.submit(eps(2, seed=23)[1], key="b")
        assert str(busy.value).startswith(f"{server.url}: zarrfeed: ") and "busy" in str(busy.value)
        a.close()
        assert b.submit(eps(2, seed=23)[1], key="b")


def busy_server(target) -> FeedServer:
    import dataclasses

    from zarrfeed.flight.limits import Limits
    return FeedServer(str(target), port=0, workers=1, ingest=True,
                      limits=dataclasses.replace(Limits.for_machine(workers=1), max_uploads=1))


def test_episodes_a_busy_server_turned_away_are_sent_by_the_next_call(target):
    """A writer told busy must re-send what that call sent, or a
    sync that follows confirms episodes the server never got."""
    more = eps(4, seed=24)
    with busy_server(target) as server:
        b = RemoteWriter(server.url)
        assert b.submit(more[0], key="b0")
        bad = {**more[1], "frames": more[1]["frames"][:0]}
        with pytest.raises(ValueError):
            b.submit(bad, key="bad")  # refused: the server ends b's call
        a = RemoteWriter(server.url)
        assert a.submit(eps(1, seed=25)[0], key="a0")  # a's call holds the only upload slot
        with pytest.raises(ConnectionError, match="busy"):  # as b2 is written, or as its answer is read
            b.ingest(more[2:4], keys=["b2", "b3"])
        went_out = [k for k in b.unsynced if k in ("b2", "b3")]  # before the refusal came: b2, b3 or neither
        assert went_out == ["b2", "b3"][:len(went_out)]
        a.close()
        b.sync()  # what went out is sent again: the server that refused it never wrote it
        assert b.unsynced == []
        assert_holds(Dataset.open(target), FIRST + [more[0], eps(1, seed=25)[0]] + more[2:2 + len(went_out)])
        b.ingest(more[2:4], keys=["b2", "b3"])  # the call that raised, made again: what went out passed over
        b.close()
    assert_holds(Dataset.open(target), FIRST + [more[0], eps(1, seed=25)[0]] + more[2:4])


def test_a_writer_left_by_an_exception_frees_its_upload_call(target):
    import time
    with busy_server(target) as server:
        with pytest.raises(KeyboardInterrupt):
            with RemoteWriter(server.url) as a:
                a.submit(eps(1, seed=26)[0], key="a0")
                raise KeyboardInterrupt
        deadline = time.monotonic() + 10
        while server.status()["uploads"] and time.monotonic() < deadline:
            time.sleep(0.05)
        with RemoteWriter(server.url) as b:  # the only upload slot is free again
            assert b.submit(eps(1, seed=27)[0], key="b0")


def serve_process(path, port: int):
    """`zarrfeed serve --ingest` in its own process on 127.0.0.1:`port` (so that it can be SIGKILLed), once it
    listens."""
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "zarrfeed.cli", "serve", str(path), "--port", str(port),
                             "--workers", "1", "--ingest"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    line = proc.stdout.readline()
    if not line.startswith("serving on "):
        proc.kill()
        proc.wait()
        raise AssertionError(f"the server did not start: {line!r}")
    return proc


def test_a_sync_answered_by_an_instance_that_accepted_only_some_sends_the_others_again(target):
    """ep1 is accepted by server instance A; a refused episode ends the upload call (the writer is not
    broken); A is SIGKILLed before it commits ep1; a new server B on the same port accepts ep2 on a new call
    (gRPC reconnects by itself). B answers the sync and is among the instances that accepted the unsynced
    episodes, but not the only one: ep1 was accepted only by A, whose uncommitted episodes died with it, so
    the sync must send it again, or it is silently lost."""
    import signal

    port = free_port()
    ep1, ep2 = eps(2, seed=31)
    bad = {t: a.copy() for t, a in ep2.items()}
    bad["frames"]["agent_index_interval"][3] = [10**6, 10**6 + 1]
    a = serve_process(target, port)
    b = None
    try:
        w = RemoteWriter(f"grpc://127.0.0.1:{port}")
        assert w.submit(ep1, key="ep1")  # accepted by A, committed only after a second's pause
        with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3"):
            w.submit(bad, key="bad")  # A ends this call
        a.send_signal(signal.SIGKILL)
        a.wait()
        assert Dataset.open(target).rows["scenes"] == 1, "A committed ep1 before it was killed"
        b = serve_process(target, port)
        assert w.submit(ep2, key="ep2")  # accepted by B
        assert w.close()["scenes"] == 3
    finally:
        for proc in (a, b):
            if proc is not None:
                proc.kill()
                proc.wait()
    assert_holds(Dataset.open(target), FIRST + [ep2, ep1])  # ep1 sent again after B took ep2


def test_a_replay_buffer_is_ingested_exactly_once_through_the_server(tmp_path):
    """A robot's episodes as Diffusion Policy's dicts (key -> steps), through `zarrfeed serve`'s
    ingestion: keys and retries as for any dataset, Diffusion Policy's layout on disk, a bad episode one line
    naming its key; and the same episodes are one input whichever path wrote them."""
    import numpy as np
    import zarr
    from zarrfeed.writer import DatasetWriter, replay_buffer_schema

    rng = np.random.default_rng(5)
    robot = [{"img": rng.integers(0, 256, (t, 8, 8, 3), dtype=np.uint8),
              "action": rng.normal(size=(t, 2)).astype(np.float32)} for t in (3, 9, 1, 14)]
    path = tmp_path / "buffer.zarr"
    schema = replay_buffer_schema({"img": (np.uint8, (8, 8, 3)), "action": (np.float32, (2,))}, chunk_rows=8)
    with DatasetWriter(path, schema, workers=0) as w:
        w.submit(robot[0], key="a")
    with serve(path) as server, RemoteWriter(server.url) as w:
        assert not w.submit(robot[0], key="a")  # committed: passed over
        assert w.submit(robot[1], key="b") and w.submit(robot[2], key="c")
        with pytest.raises(ValueError, match="key 'action': 2 steps, but 'img' has 3"):
            w.submit({"img": robot[0]["img"], "action": robot[1]["action"][:2]}, key="d")
        w.ingest([robot[3]])
        w.sync()
    root = zarr.open_group(str(path), mode="r")
    assert (root["meta/episode_ends"][:] == np.cumsum([3, 9, 1, 14])).all()
    assert (root["data/img"][:] == np.concatenate([r["img"] for r in robot])).all()
    with DatasetWriter(path, mode="a", workers=0) as w:  # the input the server wrote is the local writer's too
        with pytest.raises(ValueError, match="this input was ingested before"):
            w.ingest([robot[3]])


@pytest.mark.parametrize("how", ["a table the dataset lacks", "the episodes' iterator fails"])
def test_a_sync_after_an_ingest_that_stopped_covers_every_episode_sent(target, monkeypatch, how):
    """An ingest that stops mid-window, here, with answers unread on the call (an episode this producer cannot
    encode, an iterator that raises): a sync that followed returned once the server had taken only the
    episodes it had read so far (3 of 14 tries) and forgot the others, which a server
    dying before they were committed would lose. The answers are read first (a refused episode) or the next
    call sends the unconfirmed episodes again (anything else): the sync covers all of them, once each."""
    from zarrfeed.writer.dataset_writer import DatasetWriter

    real = DatasetWriter.submit
    monkeypatch.setattr(DatasetWriter, "submit", lambda self, *a, **k: (time.sleep(0.05), real(self, *a, **k))[1])
    good = eps(14, seed=21)

    def episodes():
        for i, ep in enumerate(good):
            if i == 10:
                if how == "the episodes' iterator fails":
                    raise RuntimeError("the source failed")
                ep = {**ep, "lidar": np.zeros(3, [("x", "f4")])}
            yield ep

    with serve(target) as server, RemoteWriter(server.url) as w:
        with pytest.raises(ValueError if how.startswith("a table") else RuntimeError) as err:
            w.ingest(episodes(), keys=[f"e{i}" for i in range(14)], window=8)
        if how.startswith("a table"):
            assert str(err.value).startswith("episode 10 of this ingest: ") and "lidar" in str(err.value)
        assert w.unsynced == [f"e{i}" for i in range(10)]
        assert w.sync()["scenes"] == 1 + 10 and w.unsynced == []
        assert w.ingest(good[10:], keys=[f"e{i}" for i in range(10, 14)], window=8) == 4
    assert_holds(Dataset.open(target), FIRST + good)
