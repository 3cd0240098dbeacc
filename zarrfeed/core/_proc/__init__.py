"""Process plumbing, private to zarrfeed (as PyTorch keeps `torch/utils/data/_utils`): the worker pool that
starts, watches and reports worker processes (`pool.py`) and the shared-memory blocks they share (`shm.py`)."""
