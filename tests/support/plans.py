"""Plan configurations for tests, spelled as flat keywords (a `PlanConfig` holds them in option groups)."""
from zarrfeed.loader.options import ShardOptions, ShuffleOptions
from zarrfeed.loader.ordering.order import VERSION
from zarrfeed.loader.ordering.plan import PlanConfig


def plan_config(n_rows: int, chunk_rows: int, batch_size: int, shuffle: bool = True, seed: int = 0,
                shuffle_window: int = 8, rank: int = 0, world_size: int = 1, drop_last: bool = False,
                order: int = VERSION) -> PlanConfig:
    return PlanConfig(n_rows, chunk_rows, batch_size,
                      ShuffleOptions(shuffle=shuffle, seed=seed, shuffle_window=shuffle_window, order=order),
                      ShardOptions(rank=rank, world_size=world_size, drop_last=drop_last))
