"""Key-less RemoteWriter episodes exactly once across server restarts: a key-less episode's key is
its position in the input, and a submit that raised ConnectionError has not taken its position, so the same
episode submitted again lands there once (passed over if the server had committed it), whatever the producer
does next: another episode in its place is refused in one line, two identical episodes submitted on purpose
are both written, and an ingest that raised is finished by calling it again. The servers are real `zarrfeed
serve` processes SIGKILLed and restarted on the same port, or FeedServers in this process."""
import signal
import subprocess
import time

import numpy as np
import pyarrow.flight as flight
import pytest
from expected import assert_holds
from test_remote_writer import eps, free_port, serve, serve_process, writers_end  # noqa: F401 -- an autouse fixture
from zarrfeed.core.keys import fingerprint
from zarrfeed.flight import RemoteWriter
from zarrfeed.loader import Dataset
from zarrfeed.writer import DatasetWriter, synthetic, write_dataset

FIRST = eps(1, seed=400)


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "t.zarr"
    write_dataset(path, FIRST, workers=0)
    return path


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def submit_until_accepted(w: RemoteWriter, episode, tries: int = 20) -> bool:
    """A producer's retry loop: call again after ConnectionError, as the error says."""
    for _ in range(tries):
        try:
            return w.submit(episode)
        except ConnectionError:
            time.sleep(0.1)
    raise AssertionError(f"not accepted in {tries} tries")


def test_keyless_submits_retried_across_two_server_kills_land_once(target):
    """10 key-less episodes, the server SIGKILLed twice (before episodes 3 and 7) and restarted on the same port;
    each submit that raised is retried, twice while no server is there. Then the same input resumed: nothing
    more is written. (Before: each raised submit used up a position, the retry landed one later, and the resume
    wrote the episodes again: 17-18 scenes for 10.)"""
    port = free_port()
    url = f"grpc://127.0.0.1:{port}"
    more = eps(10, seed=401)
    proc = serve_process(target, port)
    try:
        w = RemoteWriter(url, timeout=30)
        for i, episode in enumerate(more):
            if i in (3, 7):
                kill(proc)
                for _ in range(2):  # the first notices the dead server; the second finds none there
                    with pytest.raises(ConnectionError):
                        w.submit(episode)
                proc = serve_process(target, port)
            assert submit_until_accepted(w, episode)
        assert w.close()["scenes"] == 1 + len(more)
        with RemoteWriter(url, timeout=30) as again:
            assert again.ingest(more, resume=True) == 0  # every position committed, each with its episode
    finally:
        kill(proc)
    assert_holds(Dataset.open(target), FIRST + more)


def test_another_episode_in_place_of_one_in_doubt_is_refused(target):
    """b's submit raised ConnectionError (the server went away before answering): b may or may not be committed.
    c in b's place is refused in one line (had the server committed b, c would be passed over as b's position);
    b again lands once, then c goes on."""
    port = free_port()
    a, b, c = eps(3, seed=402)
    proc = serve_process(target, port)
    try:
        w = RemoteWriter(f"grpc://127.0.0.1:{port}", timeout=30)
        assert w.submit(a)
        kill(proc)
        with pytest.raises(ConnectionError):
            w.submit(b)
        proc = serve_process(target, port)
        with pytest.raises(ValueError) as refused:
            w.submit(c)
        assert str(refused.value) == (
            f"episode 1 of this input (fingerprint {fingerprint(b)}) is in doubt: the server went away before "
            "answering; this is another episode: submit that one again first (it is written once), or give keys")
        assert w.submit(b) and w.submit(c)
        assert w.close()["scenes"] == 4
    finally:
        kill(proc)
    assert_holds(Dataset.open(target), FIRST + [a, b, c])


def test_two_identical_episodes_on_purpose_are_both_written_across_a_kill(target):
    """The same episode submitted twice on purpose is two episodes (two positions); the second's submit raised
    ConnectionError and was retried: still two, not one and not three."""
    port = free_port()
    a = eps(1, seed=403)[0]
    proc = serve_process(target, port)
    try:
        w = RemoteWriter(f"grpc://127.0.0.1:{port}", timeout=30)
        assert w.submit(a)
        kill(proc)
        with pytest.raises(ConnectionError):
            w.submit(a)  # the second copy
        proc = serve_process(target, port)
        assert submit_until_accepted(w, a)  # the second copy again: position 1
        assert w.close()["scenes"] == 3
        with RemoteWriter(f"grpc://127.0.0.1:{port}", timeout=30) as again:
            assert again.ingest([a, a], resume=True) == 0
    finally:
        kill(proc)
    assert_holds(Dataset.open(target), FIRST + [a, a])


def test_a_keyless_ingest_that_raised_is_finished_by_calling_it_again(target):
    """An ingest whose server went away mid-way raised ConnectionError; the same call made again (no resume=:
    the input is this writer's, interrupted) writes what is missing, each once."""
    port = free_port()
    more = eps(6, seed=404)
    box = {"proc": serve_process(target, port)}

    def produced():
        yield from more[:3]
        kill(box["proc"])
        yield from more[3:]
    try:
        w = RemoteWriter(f"grpc://127.0.0.1:{port}", timeout=30)
        with pytest.raises(ConnectionError):
            w.ingest(produced(), window=2)
        box["proc"] = serve_process(target, port)
        w.ingest(more)
        assert w.close()["scenes"] == 1 + len(more)
        with RemoteWriter(f"grpc://127.0.0.1:{port}", timeout=30) as other:  # another writer: refused, as before
            with pytest.raises(ValueError, match="this input was ingested before"):
                other.ingest(more)
    finally:
        kill(box["proc"])
    assert_holds(Dataset.open(target), FIRST + more)


def test_an_input_whose_beginning_went_unanswered_begins_when_submitted_again(target, monkeypatch):
    """The server recorded the input (a commit) and its answer was lost: the next submit of the same first
    episode is not refused as "ingested before", and the episode lands once."""
    a, b = eps(2, seed=405)
    with serve(target) as server:
        real = server.ingestion.begin_input

        def recorded_then_lost(body):
            real(body)
            monkeypatch.setattr(server.ingestion, "begin_input", real)
            raise flight.FlightUnavailableError("the connection dropped")
        monkeypatch.setattr(server.ingestion, "begin_input", recorded_then_lost)
        w = RemoteWriter(server.url)
        with pytest.raises(ConnectionError):
            w.submit(a)
        assert w.submit(a) and w.submit(b)
        assert w.close()["scenes"] == 3
    assert_holds(Dataset.open(target), FIRST + [a, b])


def test_a_keyless_submit_that_raised_then_a_sync_leaves_its_position_free(target):
    """A producer that does not retry: its episode may or may not be in, and a resume of the input settles it
    (the episode at its position once), never written twice."""
    port = free_port()
    a, b, c = eps(3, seed=406)
    proc = serve_process(target, port)
    try:
        w = RemoteWriter(f"grpc://127.0.0.1:{port}", timeout=30)
        assert w.submit(a)
        kill(proc)
        with pytest.raises(ConnectionError):
            w.submit(b)
        proc = serve_process(target, port)
        assert w.close()["scenes"] == 2  # a, sent again; b was not the writer's to send
        with RemoteWriter(f"grpc://127.0.0.1:{port}", timeout=30) as again:
            assert again.ingest([a, b, c], resume=True) == 2
    finally:
        kill(proc)
    assert_holds(Dataset.open(target), FIRST + [a, b, c])



def test_a_refused_keyless_episode_takes_no_position(target):
    """A refused episode is not written and leaves its position to the next one: fixed and submitted again it
    is the input's episode 1, so a resume of the input [a, fixed] writes nothing twice."""
    a, b = eps(2, seed=407)
    bad = {t: arr.copy() for t, arr in b.items()}
    bad["frames"]["agent_index_interval"][3] = [10**6, 10**6 + 1]
    with serve(target) as server:
        with RemoteWriter(server.url) as w:
            assert w.submit(a)
            with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3"):
                w.submit(bad)
            assert w.submit(b)
        with RemoteWriter(server.url) as again:
            assert again.ingest([a, b], resume=True) == 0
    assert_holds(Dataset.open(target), FIRST + [a, b])


@pytest.mark.parametrize("call", ["submit", "ingest"])
def test_a_refused_first_keyless_episode_begins_no_input(target, call):
    """A bad first episode was refused after its input had been begun on the server under the bad episode's
    fingerprint: the fixed input then sat in that input, and resuming the real one (here locally) was refused
    as "another input". Now it is refused before the input is begun, as DatasetWriter refuses it."""
    a, b = eps(2, seed=410)
    bad = {t: arr.copy() for t, arr in a.items()}
    bad["frames"]["agent_index_interval"][3] = [10**6, 10**6 + 1]
    with serve(target) as server:
        with RemoteWriter(server.url) as w:
            with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3"):
                w.submit(bad) if call == "submit" else w.ingest([bad, b])
            if call == "submit":
                assert w.submit(a) and w.submit(b)
            else:
                assert w.ingest([a, b]) == 2
    with DatasetWriter(target, mode="a", workers=0) as again:
        assert again.ingest([a, b], resume=True)["episodes"] == 0
    assert_holds(Dataset.open(target), FIRST + [a, b])


def went_away(w: RemoteWriter, episode) -> None:
    """Submit `episode` to a writer whose server has stopped: ConnectionError (the call that notices)."""
    with pytest.raises(ConnectionError):
        w.submit(episode)


def test_in_doubt_another_episode_is_told_apart_byte_for_byte(target):
    """An episode that differs from the one in doubt only in the middle of its agents (the same fingerprint,
    which samples each table's ends) is another episode: refused, not passed over as the first."""
    port = free_port()
    a = eps(1, seed=408)[0]
    b = next(synthetic.episodes(1, seed=409, frames=200, agents_per_frame=10))
    other = {t: arr.copy() for t, arr in b.items()}
    middle = len(other["agents"]) // 2
    other["agents"]["velocity"][middle] += np.float32(1.0)
    assert fingerprint(other) == fingerprint(b) and other["agents"].nbytes > 3 * 8192
    server = serve(target, port)
    try:
        w = RemoteWriter(server.url)
        assert w.submit(a)
        server.stop()
        went_away(w, b)
        server = serve(target, port)
        with pytest.raises(ValueError, match=rf"^episode 1 of this input \(fingerprint {fingerprint(b)}\) is in doubt"):
            w.submit(other)
        assert w.submit(b) and w.submit(other)
        assert w.close()["scenes"] == 4
    finally:
        server.stop()
    assert_holds(Dataset.open(target), FIRST + [a, b, other])


def test_an_episode_in_doubt_then_refused_is_no_longer_in_doubt(target):
    """bad's submit raised ConnectionError (no server); submitted again it is refused as bad input: so it was not
    written, and the next episode takes its place."""
    port = free_port()
    a, b = eps(2, seed=410)
    bad = {t: arr.copy() for t, arr in b.items()}
    bad["frames"]["agent_index_interval"][3] = [10**6, 10**6 + 1]
    server = serve(target, port)
    try:
        w = RemoteWriter(server.url)
        assert w.submit(a)
        server.stop()
        went_away(w, bad)
        server = serve(target, port)
        with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3"):
            w.submit(bad)
        assert w.submit(b)
        assert w.close()["scenes"] == 3
        with RemoteWriter(server.url) as again:
            assert again.ingest([a, b], resume=True) == 0
    finally:
        server.stop()
    assert_holds(Dataset.open(target), FIRST + [a, b])


def test_a_keyless_ingest_with_a_refused_episode_is_finished_by_calling_it_again(target):
    a, b, c = eps(3, seed=411)
    bad = {t: arr.copy() for t, arr in b.items()}
    bad["frames"]["agent_index_interval"][3] = [10**6, 10**6 + 1]
    with serve(target) as server, RemoteWriter(server.url) as w:
        with pytest.raises(ValueError, match=r"frames.*agent_index_interval.*row 3"):
            w.ingest([a, bad, c], window=1)
        assert w.ingest([a, b, c]) == 2  # the input resumed: a passed over
    assert_holds(Dataset.open(target), FIRST + [a, b, c])
