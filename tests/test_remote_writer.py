"""RemoteWriter against a FeedServer in this process (issue 26): every call's path, quickly: keys and retries,
keyless inputs, refusals and what stays usable after them, syncing by size, a server stopped and started again
on the same port, tokens, several datasets. tests/test_serve.py does the same end to end with `zarrfeed serve`
in its own process; a wrong line here drops or duplicates a producer's episodes."""
import socket

import pytest
from expected import assert_holds
from zarrfeed.flight import FeedServer, RemoteWriter
from zarrfeed.loader import Dataset
from zarrfeed.writer import synthetic, write_dataset

from zarrfeed.core.keys import fingerprint


def eps(n: int, seed: int) -> list[dict]:
    return list(synthetic.episodes(n, seed=seed, frames=12, agents_per_frame=4))


FIRST = eps(1, seed=100)


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
        with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3.*; the 2 sent after it were "
                                             r"not written$"):
            w.ingest([good[0], bad, good[2], good[3]], keys=["g0", "bad", "g2", "g3"], window=8)
        with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3") as one:
            w.submit(bad, key="bad")
        assert "sent after it" not in str(one.value)
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
