"""Each refusal and log line names the option the user gave, as the user gave it: not an internal setting
(`partial_windows`), not an option the user never passed (`rows=`), not advice for an object that does not
exist yet ("call again: this writer reconnects"), not a size rounded to "0 MiB"."""
import logging
import socket

import pytest
from zarrfeed.flight import FeedServer, RemoteAgentSampleLoader, RemoteWindowLoader, RemoteWriter
from zarrfeed.loader import AgentSampleLoader, Loader, WindowLoader


@pytest.fixture(scope="module")
def scenes(small_dataset):
    """Two synthetic scenes: min_history=5 and min_future=3 each select other agents than the defaults."""
    return small_dataset(2, 3, frames=30, agents_per_frame=6)


def test_a_writer_that_reaches_no_server_says_so_without_calling_again():
    """`RemoteWriter(url)` with nothing listening said "the server went away ...; call again: this writer
    reconnects and re-sends what is not committed": no writer was made, nothing was sent."""
    with socket.socket() as held:  # bound, never listening: connections are refused, and no one else takes it
        held.bind(("127.0.0.1", 0))
        url = f"grpc://127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(ConnectionError) as err:
            RemoteWriter(url, timeout=30)
    message = str(err.value)
    assert message.startswith(f"{url}: no zarrfeed server answers (") and "\n" not in message, message
    assert "call again" not in message and "went away" not in message and "re-sends" not in message, message


@pytest.mark.parametrize("option, saved, given", [("min_history", 10, 5), ("min_future", 1, 3)])
def test_an_agent_state_resumed_with_other_minimums_names_them(scenes, option, saved, given):
    """The agents mask's minimums select the agents: a state resumed with another one was refused as "made with
    another selection (rows=); pass the same rows", an option the user never passed."""
    with AgentSampleLoader(scenes, 2, 3, batch_size=4, num_workers=0) as first:
        next(iter(first))
        state = first.state_dict()
    with AgentSampleLoader(scenes, 2, 3, batch_size=4, num_workers=0, **{option: given}) as other:
        assert len(other.samples) != len(first.samples)  # the option selects other agents here
        with pytest.raises(ValueError) as err:
            other.load_state_dict(state)
        assert str(err.value) == f"loader state has {option}={saved}; this loader has {option}={given}"
        assert other.state_dict()["epoch"] == 0 and other.state_dict()["batch"] == 0  # nothing changed
    with AgentSampleLoader(scenes, 2, 3, batch_size=4, num_workers=0, **{option: saved}) as same:
        same.load_state_dict(state)  # given as saved (here, explicitly): resumed
        assert same.state_dict()["batch"] == 1


def test_an_agent_state_of_the_mask_and_a_loader_of_rows_name_which_is_which(scenes):
    with AgentSampleLoader(scenes, 2, 3, batch_size=4, num_workers=0) as masked:
        state, agents = masked.state_dict(), masked.samples.items
    with AgentSampleLoader(scenes, 2, 3, batch_size=4, num_workers=0, rows=agents[:-1]) as given:
        with pytest.raises(ValueError, match=r"^loader state was made with the agents mask's agents \(min_history="
                                             r"10, min_future=1\); this loader was given rows=: leave rows= out"):
            given.load_state_dict(state)
        rows_state = given.state_dict()
        assert "min_history" not in rows_state["settings"]  # not used with rows=: not recorded
    with AgentSampleLoader(scenes, 2, 3, batch_size=4, num_workers=0, rows=agents) as same:
        same.load_state_dict(state)  # the mask's very agents, given as rows=: the same batches, resumed
    with AgentSampleLoader(scenes, 2, 3, batch_size=4, num_workers=0, min_history=5) as masked:
        with pytest.raises(ValueError, match=r"^loader state was made with other agents selected \(by rows=, or by "
                                             r"other min_history= or min_future= in a state that does not record"):
            masked.load_state_dict(rows_state)


@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_agent_minimums_are_whole_numbers(scenes, value):
    with pytest.raises(ValueError, match=rf"^min_future must be an integer >= 0, got {value!r}$"):
        AgentSampleLoader(scenes, 2, 3, min_future=value, num_workers=0)


def test_a_window_state_of_every_frame_resumed_with_whole_windows_names_whole_windows(scenes):
    """A state saved with partial windows (the default) and resumed with whole_windows=True named an internal
    setting: "loader state has partial_windows=True; this loader has partial_windows=None"."""
    with WindowLoader(scenes, 2, 3, batch_size=4, num_workers=0) as every:
        next(iter(every))
        state = every.state_dict()
    with WindowLoader(scenes, 2, 3, batch_size=4, num_workers=0, whole_windows=True) as whole:
        with pytest.raises(ValueError) as err:
            whole.load_state_dict(state)
        assert str(err.value) == "loader state has whole_windows=False; this loader has whole_windows=True"
        whole_state = whole.state_dict()
    with WindowLoader(scenes, 2, 3, batch_size=4, num_workers=0) as every:  # the other way: said as before
        with pytest.raises(ValueError, match=r"pass whole_windows=True to resume it"):
            every.load_state_dict(whole_state)
        every.load_state_dict(state)


def test_remote_loaders_name_the_same_options(scenes):
    """A remote loader checks a state against the server's loader: the same lines."""
    with FeedServer(scenes, port=0, workers=1) as server:
        with WindowLoader(scenes, 2, 3, batch_size=4, num_workers=0) as every, \
                RemoteWindowLoader(server.url, 2, 3, batch_size=4, whole_windows=True) as whole:
            with pytest.raises(ValueError, match=r"^loader state has whole_windows=False; this loader has "
                                                 r"whole_windows=True$"):
                whole.load_state_dict(every.state_dict())
        with AgentSampleLoader(scenes, 2, 3, batch_size=4, num_workers=0) as local, \
                RemoteAgentSampleLoader(server.url, 2, 3, batch_size=4, min_history=5) as remote:
            with pytest.raises(ValueError, match=r"^loader state has min_history=10; this loader has "
                                                 r"min_history=5$"):
                remote.load_state_dict(local.state_dict())


@pytest.fixture(scope="module")
def chunked(small_dataset):
    """Agents in several chunks, read as one window (the whole table fits the default shuffle_bytes)."""
    return small_dataset(2, 3, frames=30, agents_per_frame=6, chunks={"agents": 40})


@pytest.mark.parametrize("cache", ["process", "host"])
def test_a_one_byte_cache_says_what_it_keeps_and_why(chunked, caplog, cache):
    """With cache_bytes=1 the log said "within cache_bytes=0 MiB: 0 (later epochs decode the rest) of the N
    chunks", and then kept all N: the batches in flight need every chunk in memory at once (the whole table is
    one window), and what those slots hold stays decoded, in memory the loader takes anyway. The line now says
    that, and the budget as given."""
    with caplog.at_level(logging.INFO, logger="zarrfeed.loader"), \
            Loader(chunked, "agents", batch_size=16, num_workers=0, cache_bytes=1, cache=cache) as loader:
        plan = loader.plan()
        chunks = len({key for w in plan.window_batches() for key in loader.source.chunks_of(plan, w)})
        assert chunks > 1
        for epoch in range(2):
            list(loader)
            assert loader.chunks_decoded == (chunks if epoch == 0 else 0)  # all kept
    [line] = [r.getMessage() for r in caplog.records if "decoded chunks kept across epochs" in r.getMessage()]
    assert line.startswith(f"zarrfeed: decoded chunks kept across epochs: all of the {chunks} chunks ("), line
    assert "more than cache_bytes=1 B holds (0 chunks of " in line, line
    assert f"the batches in flight need {chunks} chunks in memory at once" in line, line
    assert "0 MiB" not in line and "later epochs decode the rest" not in line, line


def test_a_cache_that_holds_every_chunk_says_its_budget_as_given(chunked, caplog):
    with caplog.at_level(logging.INFO, logger="zarrfeed.loader"), \
            Loader(chunked, "agents", batch_size=16, num_workers=0, cache_bytes=3 << 20, cache="process") as loader:
        list(loader)
    assert "decoded chunks kept across epochs within cache_bytes=3 MiB: all of the " in caplog.text
