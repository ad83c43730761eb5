"""torch's own distributed test suite over one backend: the spawn driver
that torch's `test/distributed/test_distributed_spawn.py` is, rebuilt for
the installed torch (whose wheel ships the suite,
`torch.testing._internal.distributed.distributed_test`, but not the
driver), for any backend registered with torch.distributed.

The suite's decorators skip or keep each test by the backend named in the
environment variable BACKEND when the module is imported. They are
evaluated here as for gloo, so that every backend runs exactly the tests
gloo runs; the backend the ranks then use is GRADLANE_SUITE_BACKEND
(default gloo), which the tests' own `BACKEND == "gloo"` branches take for
gloo too. scripts/torch_suite.sh runs it at 2 and 3 ranks over gloo
and over gradlane and compares; python/tests/test_torch_suite.py runs a
subset.

Run it with pytest (one process a rank, started by torch's own
MultiProcessTestCase with "spawn"); WORLD_SIZE and TEMP_DIR must be set,
as upstream.
"""

import json
import os
import sys

SUITE_BACKEND = os.environ.get("GRADLANE_SUITE_BACKEND", "gloo")
# Read by the suite at import: its tests are chosen as gloo's.
os.environ["BACKEND"] = "gloo"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    print("torch.distributed is not available", file=sys.stderr)
    sys.exit(0)

torch.backends.cuda.matmul.allow_tf32 = False

if SUITE_BACKEND == "gradlane":
    # Registers it where torch has not loaded the entry point yet.
    import gradlane.torch  # noqa: E402,F401

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test as suite  # noqa: E402



class _AsGloo(str):
    """The backend under test's name, which the suite's tests also take
    for gloo: their `BACKEND == "gloo"` branches are those of a CPU
    backend (which model to build, which dtypes to try), while
    init_process_group, dist.Backend and the names the tests compare use
    the real one."""

    def __eq__(self, other):
        return str.__eq__(self, other) or other == "gloo"

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


# Each rank process imports this module again (from the fork server), so
# this runs there too: its init_process_group uses the backend under test.
suite.BACKEND = _AsGloo(SUITE_BACKEND)

#: What the parent sets for each test that its ranks read.
PER_TEST_ENV = ("TEMP_DIR", "INIT_METHOD", "MASTER_ADDR", "MASTER_PORT")


class TestDistBackendWithSpawn(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
    """The suite, each test in WORLD_SIZE fresh rank processes."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def _spawn_processes(self):
        # Upstream starts each rank with "spawn", which imports torch and
        # the suite again for every rank of every test (seconds each); a
        # fork server that has them loaded forks the ranks instead. It
        # initialises no CUDA, so a forked rank may.
        # The server's environment is the one it started with, so each
        # test's own (its TEMP_DIR for the suite's file barrier, its
        # INIT_METHOD) goes to its ranks beside the test's file.
        with open(self.file_name + ".env", "w") as f:
            json.dump({k: os.environ[k] for k in PER_TEST_ENV if k in os.environ}, f)
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        self._start_processes(ctx.Process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        with open(file_name + ".env") as f:
            os.environ.update(json.load(f))
        super()._run(rank, test_name, file_name, pipe, **kwargs)


if __name__ == "__main__":
    run_tests()
