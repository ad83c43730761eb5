"""Where the tests' rank processes start from.

Each rank is a process of its own, as under torchrun, started by
multiprocessing's fork server rather than by "spawn". The server imports
torch and numpy once and every rank is forked from it with them loaded;
under "spawn" each rank started an interpreter and imported torch again,
which was most of these tests' CPU time.

The server imports nothing of gradlane, so a rank imports gradlane (and
torch.distributed finds the backend through its entry point) as a
training script does. It initialises no CUDA, so a forked rank may. A
module the server cannot import (torch where it is not installed) is
left out, and the ranks import it themselves.
"""

import multiprocessing

PRELOADED = ["numpy", "torch", "torch.distributed", "torch.nn.functional"]


def rank_context():
    """The multiprocessing context to start ranks from."""
    ctx = multiprocessing.get_context("forkserver")
    # Takes effect when the server starts (at the first rank); later calls
    # name the same modules.
    ctx.set_forkserver_preload(PRELOADED)
    return ctx
