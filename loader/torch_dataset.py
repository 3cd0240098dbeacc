"""A Loader's batches for PyTorch: an `IterableDataset` to give `DataLoader(ds, batch_size=None)`.

zarrfeed's own worker processes decode and gather, so the DataLoader needs none (`num_workers=0`); it would
pickle the loader into each of its workers, which then read the same batches, so that is refused with one
line. Batches are dicts of tensors sharing memory with the ring slot (`torch.from_numpy`: valid as long as the
Loader's views, docs/architecture.md#views; `copy=True` on the Loader gives owned tensors). Under `torch.distributed`,
a Loader made with the default rank 0 of 1 takes its rank and world size from the process group.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # torch is an optional extra: to_torch() says how to install it
    torch = None  # type: ignore[assignment]
    IterableDataset = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from .loader import Loader


def require_torch() -> None:
    if torch is None:
        raise ImportError("to_torch() needs PyTorch: pip install 'zarrfeed[torch]' (or any torch >= 2.1)")


class TorchBatches(IterableDataset):
    """Iterate for dicts of tensors (one epoch per iteration, as the Loader); `len()` is the batches per epoch.
    `state_dict`/`load_state_dict` are the Loader's, for checkpoints."""

    def __init__(self, loader: "Loader") -> None:
        require_torch()
        self.loader = loader
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            loader.use_ranks(torch.distributed.get_rank(), torch.distributed.get_world_size())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if get_worker_info() is not None:
            raise RuntimeError("zarrfeed's Loader has worker processes of its own: give the DataLoader "
                               "num_workers=0 (its workers would each read every batch)")
        for batch in self.loader:
            yield {name: torch.from_numpy(array) for name, array in batch.items()}

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
