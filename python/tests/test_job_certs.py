"""Certificates that name the job, not the ranks' addresses
(gradlane.generate_job_certs, `certs --job`), through the torch backend:
two CPU ranks on 127.0.0.1, which the certificate does not name, form the
group with GRADLANE_CERT_DIR alone; a rank whose certificate is of
another CA, or of the same CA and another job, is refused, and the rank
that refuses it raises naming it and why (no collective runs with it).

Each rank is a process (from rank_processes.rank_context) with
torchrun's environment and a GRADLANE_CERT_DIR of its own; every wait is bounded.
"""

import datetime
import os
import socket
import traceback

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

import gradlane  # noqa: E402
from rank_processes import collect, free_port, rank_context  # noqa: E402

WORLD = 2
RESULT_TIMEOUT = 120.0
# The collectives' bound (joining has GRADLANE_JOIN_TIMEOUT).
JOIN_TIMEOUT = datetime.timedelta(seconds=5)


def rank_main(rank, env, stderr_path, results):
    # The rank's stderr (gradlane's warnings) into a file the test reads: a
    # rank forked by the fork server writes to the server's stderr, not to
    # the test's.
    os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), 2)
    try:
        os.environ.update(env)
        os.environ["RANK"] = str(rank)
        import torch.distributed as dist

        dist.init_process_group("gradlane", timeout=JOIN_TIMEOUT)
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        dist.destroy_process_group()
        results.put((rank, "ok", t.tolist()))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(cert_dirs, stderr_dir):
    """Rank r with GRADLANE_CERT_DIR=cert_dirs[r] and its stderr in
    stderr_dir/rank{r}.err; {rank: (status, out)}."""
    ctx = rank_context()
    results = ctx.Queue()
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(WORLD),
        "GRADLANE_PORT": str(free_port(socket.SOCK_DGRAM)),
        # The rank whose certificate is refused waits this long to join.
        "GRADLANE_JOIN_TIMEOUT": "5",
    }
    procs = [
        ctx.Process(
            target=rank_main,
            args=(
                r,
                {**env, "GRADLANE_CERT_DIR": cert_dirs[r]},
                os.path.join(stderr_dir, f"rank{r}.err"),
                results,
            ),
            daemon=True,
        )
        for r in range(WORLD)
    ]
    return collect(procs, results, WORLD, RESULT_TIMEOUT, check=False)


def test_a_job_certificate_forms_the_group_on_addresses_it_does_not_name(tmp_path):
    d = str(tmp_path / "job")
    files = gradlane.generate_job_certs(d, "train-7")
    assert set(files) == {"ca_cert", "ca_key", "server_cert", "server_key"}
    got = run_ranks([d, d], str(tmp_path))
    for rank in range(WORLD):
        status, out = got[rank]
        assert status == "ok", f"rank {rank} failed:\n{out}"
        assert out == [3.0] * 4


@pytest.mark.parametrize("other", ["ca", "job"])
def test_a_rank_of_another_ca_or_job_is_refused_naming_it(tmp_path, other):
    good = str(tmp_path / "good")
    bad = str(tmp_path / "bad")
    gradlane.generate_job_certs(good, "train-7")
    if other == "ca":
        gradlane.generate_job_certs(bad, "train-7")
        why, root_why = "unknown CA", "wrong CA: it does not trust this rank's certificate"
    else:
        gradlane.generate_job_certs(bad, "train-8", ca_dir=good)
        why = 'wrong job name "train-8", expected "train-7"'
        root_why = "wrong job name: it refused this rank's certificate"
    # Rank 0 presents the other certificate; rank 1 reaches it and refuses.
    got = run_ranks([bad, good], str(tmp_path))
    status, out = got[1]
    assert status == "error", f"rank 1 joined a group with the refused rank: {out}"
    assert "RankFailedError" in out, out
    assert "rank 0 at 127.0.0.1:" in out and why in out, out
    # Rank 0 warned on stderr as the handshake failed, naming the address
    # and the reason, and its join, when it timed out, says the same.
    status, out = got[0]
    assert status == "error", f"the refused rank joined: {out}"
    assert "JoinTimeoutError" in out and root_why in out, out
    err = (tmp_path / "rank0.err").read_text()
    warned = [line for line in err.splitlines() if "a connection to the group was refused" in line]
    assert warned, err
    assert "WARN" in warned[0] and "remote=127.0.0.1:" in warned[0] and root_why in warned[0], warned


def test_bad_job_names_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="bad job name"):
        gradlane.generate_job_certs(str(tmp_path), "no spaces")


def certs_cli(*args):
    """``python -m gradlane certs ARGS``: (exit status, stdout + stderr)."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "gradlane", "certs", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )
    return run.returncode, run.stdout + run.stderr


def test_python_m_gradlane_certs_makes_files_a_group_accepts(tmp_path):
    d = str(tmp_path / "job")
    status, out = certs_cli("--job", "train-7", "--out-dir", d)
    assert status == 0, out
    assert "the job 'train-7', on any address" in out, out
    for f in ("ca.pem", "ca.key", "server.pem", "server.key"):
        assert os.path.isfile(os.path.join(d, f)), f
    assert os.stat(os.path.join(d, "server.key")).st_mode & 0o077 == 0
    got = run_ranks([d, d], str(tmp_path))
    for rank in range(WORLD):
        status, out = got[rank]
        assert status == "ok", f"rank {rank} failed:\n{out}"
        assert out == [3.0] * 4
    # Files already there are not replaced without --force.
    status, out = certs_cli("--job", "train-7", "--out-dir", d)
    assert status == 1 and "not replacing them without --force" in out, out
    status, out = certs_cli("--job", "train-7", "--out-dir", d, "--force")
    assert status == 0, out
    # Signed by that CA for another job: ca.key stays where it is.
    other = str(tmp_path / "other")
    status, out = certs_cli("--job", "train-8", "--ca", d, "--out-dir", other)
    assert status == 0, out
    assert sorted(os.listdir(other)) == ["ca.pem", "server.key", "server.pem"]
    # Bad input is a clear error, not a traceback.
    for args, why in [
        (["--job", "no spaces", "--out-dir", str(tmp_path / "x")], "bad job name"),
        (["--job", "a", "--san", "10.0.0.1"], "exclude each other"),
        (["--ca", d], "--ca needs --job"),
    ]:
        status, out = certs_cli(*args)
        assert status != 0 and why in out and "Traceback" not in out, (args, out)
