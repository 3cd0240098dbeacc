"""The resume state's rules one by one (loader/ordering/state.py, in this process): the refusals of hand-made or edited
states and their lines, the stored digest's exact value; and the process chunk cache's room check."""
import numpy as np
import pytest
from zarrfeed.loader.ordering.state import LoaderState, selection_digest


def test_selection_digests_are_the_same_in_every_release():
    """Digests are stored in saved states: another way of computing them would refuse every state saved before."""
    parts = [np.array([1, 2]), np.array([], np.int64), np.array([7])]
    digest = "sha256:65f06d238346195892e4ee60bb6df4641358adf1a6fc3e787d30148602ea46c0"
    assert selection_digest(parts) == digest
    assert selection_digest([p.astype(np.int32) for p in parts]) == digest  # whatever integer type the rows had
    assert selection_digest(None) == "all"


def state(**changes) -> dict:
    return {**LoaderState("Loader", "id-1", 3, {"seed": 0, "rank": 0, "world_size": 1}).to_dict(), **changes}


@pytest.mark.parametrize("saved, line", [
    ([1, 2], "not a zarrfeed loader state (expected a dict with name 'zarrfeed.LoaderState'; got list); states "
             "from zarrfeed before 0.1 cannot be loaded, start the epoch again"),
    ({"epoch": 1, "batch": 2}, "not a zarrfeed loader state (expected a dict with name 'zarrfeed.LoaderState'; got "
                               "['batch', 'epoch']); states from zarrfeed before 0.1 cannot be loaded, start the epoch "
                               "again"),
])
def test_what_is_not_a_state_is_one_exact_line(saved, line):
    with pytest.raises(ValueError) as err:
        LoaderState.from_dict(saved)
    assert str(err.value) == line


def test_a_state_saved_before_the_epoch_order_was_numbers_reads_as_order_0():
    old = state()
    del old["order"]
    assert LoaderState.from_dict(old).order == 0
    with pytest.raises(ValueError, match=r"^loader state has unexpected fields: .*'extra'"):
        LoaderState.from_dict(state(extra=1))


@pytest.mark.parametrize("spans, ok", [
    ([[0, 0], [0, 5]], True), ([[3, 9]], True),
    ([[1]], False), ([[1, 2, 3]], False), ([(1, 2)], False), ([[-1, 2]], False), ([[2, 1]], False),
    ([[1.5, 2]], False), ([[True, 2]], False),
])
def test_spans_are_lists_of_start_end_positions(spans, ok):
    if ok:
        assert LoaderState.from_dict(state(spans=spans)).spans == spans
    else:
        with pytest.raises(ValueError) as err:
            LoaderState.from_dict(state(spans=spans))
        assert str(err.value) == "loader state field 'spans' is not a list of [start, end) positions"


def test_a_state_resumes_only_the_loader_it_was_made_for():
    here = LoaderState.from_dict(state())

    def refused(saved: LoaderState, **kwargs) -> str:
        with pytest.raises(ValueError) as err:
            saved.check_resumes(here, **kwargs)
        return str(err.value)
    assert refused(LoaderState.from_dict(state(kind="WindowLoader"))) == (
        "loader state is of a WindowLoader; this is a Loader")
    other_rank = LoaderState.from_dict(state(settings={"seed": 0, "rank": 1, "world_size": 2}))
    assert refused(other_rank) == "loader state has rank=1; this loader has rank=0"  # ranks are checked by default
    other_rank.check_resumes(here, ranks=False)
    other_seed = LoaderState.from_dict(state(settings={"seed": 5, "rank": 1, "world_size": 2}))
    assert refused(other_seed, ranks=False) == "loader state has seed=5; this loader has seed=0"
    tagged = LoaderState.from_dict(state(commit_tag="a"))
    LoaderState.from_dict(state(commit_tag="b")).check_resumes(LoaderState.from_dict(state()))  # here: no tag
    with pytest.raises(ValueError) as err:
        tagged.check_resumes(LoaderState.from_dict(state(commit_tag="b")))
    assert str(err.value) == ("loader state was made on another copy of this dataset: its commit 3 holds other "
                              "rows than this one's")
    assert refused(LoaderState.from_dict(state(selection="sha256:00"))) == (
        "loader state was made with another selection (rows=); pass the same rows")


@pytest.mark.parametrize("order, batch, refused", [(0, 0, False), (0, 1, True), (7, 2, True), (1, 5, False)])
def test_a_state_of_another_epoch_order_resumes_only_at_an_epochs_start(order, batch, refused):
    here = LoaderState.from_dict(state(order=1))
    saved = LoaderState.from_dict(state(order=order, batch=batch, epoch=4))
    if not refused:
        saved.check_resumes(here)
        return
    with pytest.raises(ValueError) as err:
        saved.check_resumes(here)
    name = {0: "numpy's Generator, zarrfeed before 2026-11"}.get(order, "unknown")
    assert str(err.value) == (f"loader state was saved mid-epoch (batch {batch} of epoch 4) with epoch order {order} "
                              f"({name}); this zarrfeed orders epochs with order 1: finish that epoch with the "
                              "release that saved the state, or resume from the start of epoch 5")


def test_a_process_chunk_cache_larger_than_memory_is_refused_before_it_is_made():
    from zarrfeed.core._proc.shm import ShmSpaceError, available_memory
    from zarrfeed.loader.caches.chunk_cache import ProcessCacheMemory
    n = 4
    slot = available_memory() // 2  # four of them: twice what there is
    with pytest.raises(ShmSpaceError) as err:
        ProcessCacheMemory(slot, n)
    assert str(err.value).startswith(f"the loader's chunk cache ({n} chunks) needs {slot * n / 2**20:.0f} MiB of "
                                     "shared memory but only ")
