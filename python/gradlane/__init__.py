"""gradlane: gradient transport over QUIC, for Python.

A :class:`Group` is one rank of a job: a QUIC link (mutual TLS) to every
other rank, and the collectives among them on float32 buffers (numpy
arrays, ``tensor.numpy()`` of CPU tensors), used in place without copies,
with the GIL released while the network works:

- exact collectives: ``barrier``, ``broadcast``, ``allreduce``,
  ``allgather``, ``reduce_scatter``; every rank ends with the same bits;
- the differentiated allreduce: ``register_bucket`` once, then
  ``allreduce_differentiated`` each step; the important chunks of each
  gradient travel exactly, the rest lossy;
- ``sparse_allgather`` of rows of a matrix (embedding gradients).

Certificates come from files that :func:`generate_certs` makes::

    import numpy as np, gradlane
    gradlane.generate_certs("/tmp/job-certs", ["127.0.0.1"])
    with gradlane.Group(rank, world, root="127.0.0.1:29500",
                        cert_dir="/tmp/job-certs") as g:
        grad = np.ones(1000, dtype=np.float32)
        g.allreduce(grad, op="mean")

For a job whose addresses are known only when it runs,
``generate_job_certs(dir, "my-job")`` makes a certificate that names the
job instead: the ranks check each other by it, on any address.

Its knobs (loss tolerance, formats, timeouts, ...) are a
:class:`Settings`: ``Group(..., settings=Settings(loss_tolerance=0.3))``,
or the same knobs as keywords of ``Group``; their defaults are
``Settings()``'s.

Errors of the group are :class:`GroupError` (a rank gone, out of step,
never joined; ``err.rank`` names the rank); bad input from Python is a
``ValueError`` or ``TypeError``.

Processes that use gradlane should be started with multiprocessing's
"spawn" (or "forkserver"): a fork does not copy gradlane's runtime threads.
"""

import atexit as _atexit
import multiprocessing.util as _multiprocessing_util

from gradlane._native import (
    Group,
    Settings,
    CollectiveTimeoutError,
    GroupClosedError,
    GroupError,
    GroupSetupError,
    JoinTimeoutError,
    OutOfStepError,
    RankFailedError,
    RemovedError,
    __version__,
    generate_certs,
    generate_job_certs,
)
from gradlane._native import close_groups_at_exit as _close_groups_at_exit

# A rank's last messages may still sit in its QUIC send buffers, which
# live in this process (TCP's live in the kernel), when it returns from its
# last collective: every open group is closed, and so flushed, before the
# process ends. atexit covers a script; multiprocessing's children end with
# os._exit, which skips atexit but runs multiprocessing's finalizers.
_atexit.register(_close_groups_at_exit)
_multiprocessing_util.Finalize(None, _close_groups_at_exit, exitpriority=0)

__all__ = [
    "Group",
    "Settings",
    "CollectiveTimeoutError",
    "GroupClosedError",
    "GroupError",
    "GroupSetupError",
    "JoinTimeoutError",
    "OutOfStepError",
    "RankFailedError",
    "RemovedError",
    "generate_certs",
    "generate_job_certs",
    "__version__",
]
