import numcodecs
import numpy as np
from zarrfeed.writer import L5KIT_SCHEMA, check_episode, synthetic

from zarrfeed.core.stores import DirectoryStore
from zarrfeed.core.zarr_array import Group


def test_episodes_are_seeded_and_independent_of_count():
    a, b = list(synthetic.episodes(3, seed=7)), list(synthetic.episodes(2, seed=7))
    for x, y in zip(a[:2], b, strict=True):  # the first two of three are the two
        for name in x:
            np.testing.assert_array_equal(x[name], y[name])
    assert not np.array_equal(a[0]["agents"], next(synthetic.episodes(1, seed=8))["agents"])


def test_episodes_look_like_the_real_scene():
    for ep in synthetic.episodes(5, seed=1):
        check_episode(ep, L5KIT_SCHEMA)  # local intervals tile every child table
        frames, agents = ep["frames"], ep["agents"]
        assert len(ep["scenes"]) == 1 and len(frames) == 248
        assert 0.098e9 < np.diff(frames["timestamp"]).mean() < 0.102e9
        per_frame = np.diff(frames["agent_index_interval"], axis=1).ravel()
        assert 60 < per_frame.mean() < 110
        # persistent tracks: a track id seen in a frame is usually seen in the next one too
        s0, e0 = frames["agent_index_interval"][100]
        s1, e1 = frames["agent_index_interval"][101]
        assert np.isin(agents["track_id"][s0:e0], agents["track_id"][s1:e1]).mean() > 0.8
        # one-hot labels, plausible extents, smooth ego (under 3 m per 100 ms)
        assert (agents["label_probabilities"].sum(1) == 1).all()
        assert ((agents["extent"] > 0.2) & (agents["extent"] < 10)).all()
        assert np.linalg.norm(np.diff(frames["ego_translation"][:, :2], axis=0), axis=1).max() < 3
        np.testing.assert_allclose(np.linalg.det(frames["ego_rotation"]), 1, atol=1e-5)


def test_compression_ratio_within_25_percent_of_the_real_scene(real_scene):
    """Same measure on both: the table's rows compressed with L5Kit's default compressor."""
    codec = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)

    def ratio(rows: np.ndarray) -> float:
        return rows.nbytes / len(codec.encode(rows.tobytes()))

    real = Group.open(DirectoryStore(real_scene))
    eps = list(synthetic.episodes(4))
    for table in ("agents", "frames"):
        want = ratio(real[table][:])
        got = ratio(np.concatenate([e[table] for e in eps]))
        assert abs(got / want - 1) < 0.25, (table, got, want)
