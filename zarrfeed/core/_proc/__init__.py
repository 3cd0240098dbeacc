"""Process plumbing, private to zarrfeed (as PyTorch keeps `torch/utils/data/_utils`): the worker pool that
starts, watches and reports worker processes (`pool.py`) and the shared-memory blocks they share (`shm.py`)."""

# Whether importing a module that makes worker pools starts this process's fork server (see
# `pool.start_fork_server_early`). The command line sets it False before it imports anything: most of its
# commands make no pool, and those that do start the server when they make it. Kept here, where importing it
# costs nothing, since the command line must start without multiprocess and numpy.
early_fork_server = True
