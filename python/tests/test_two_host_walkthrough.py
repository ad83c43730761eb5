"""README's two-host torchrun walkthrough ("Across two hosts") on
loopback, without root: the lines README gives for host 0 and host 1 (read
by scripts/two_host_commands.py, as scripts/two_host_walkthrough.sh reads
them for the testbed), each run by bash in a directory of its own, with
127.0.0.1 and a free port in place of README's master address and port.
The job's certificates are made for README's job name into host 0's
directory, and the files README says to copy go to host 1's. The digits
example must reach its target accuracy and all 4 ranks end with the same
parameters.

docs/MULTIHOST.md, where README sends readers for the detail, must give
the same lines."""

import importlib.util
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh installs it)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (scripts/test.sh installs it)")

import gradlane  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = pathlib.Path(sys.executable).parent
# A run's limit: a hang becomes a failure, not a stuck CI.
LIMIT = 600


def _commands_module():
    spec = importlib.util.spec_from_file_location(
        "two_host_commands", ROOT / "scripts" / "two_host_commands.py"
    )
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up in sys.modules while it loads.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


commands = _commands_module()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_multihost_doc_gives_readmes_lines():
    """The walkthrough's commands in docs/MULTIHOST.md are README's, so
    that the run below checks both."""
    walk = commands.walkthrough()
    doc = commands.code_lines(
        (ROOT / "docs" / "MULTIHOST.md").read_text(), "A torchrun job on two hosts"
    )
    doc_lines = [text for _, text in doc]
    readme_lines = [walk.certs] + [text for _, text in walk.hosts.values()]
    for line in readme_lines:
        assert line in doc_lines, f"docs/MULTIHOST.md lacks README's line:\n    {line}"
    for line in doc_lines:
        if "torchrun" in line or "--bin certs" in line:
            assert line in readme_lines, f"docs/MULTIHOST.md has a line README lacks:\n    {line}"
    # Its install line is README's (which test_readme.py checks), with
    # what the example needs besides.
    readme_pip = [
        line.strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("    pip install ")
    ]
    doc_pip = [line for line in doc_lines if line.startswith("pip install ")]
    assert len(readme_pip) == 1 and doc_pip == [f"{readme_pip[0]} scikit-learn"], (
        f"docs/MULTIHOST.md installs {doc_pip}, README {readme_pip}"
    )


def run_hosts(walk, work, port):
    """Every host's line at once, each in its own session; returns each
    host's output. A host that fails stops the others (they would wait for
    it until torchrun's own timeout)."""
    env = {
        # What a user's shell has: no torchrun or gradlane variables but
        # those the line sets.
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": os.environ.get("HOME", str(work)),
        "PYTHONUNBUFFERED": "1",
    }
    procs = []
    for node in sorted(walk.hosts):
        line = walk.host_command(node, "127.0.0.1", port)
        out = open(work / f"host{node}.log", "w+")
        procs.append(
            (
                node,
                line,
                out,
                subprocess.Popen(
                    ["bash", "-c", line],
                    cwd=work / f"host{node}",
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                ),
            )
        )
    try:
        failed = None
        for node, line, _, proc in procs:
            try:
                status = proc.wait(timeout=LIMIT)
            except subprocess.TimeoutExpired:
                failed = f"host {node} still running after {LIMIT} s: {line}"
                break
            if status != 0:
                failed = f"host {node} exited with {status}: {line}"
                break
    finally:
        for _, _, _, proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    outputs = []
    for node, _, out, _ in procs:
        out.seek(0)
        outputs.append(out.read())
        out.close()
    if failed:
        shown = "\n".join(f"--- host {n}:\n{o[-3000:]}" for n, o in enumerate(outputs))
        pytest.fail(f"{failed}\n{shown}")
    return outputs


def test_two_hosts_on_loopback_reach_the_target_with_equal_parameters(tmp_path):
    walk = commands.walkthrough()
    for node in walk.hosts:
        shutil.copytree(ROOT / "examples", tmp_path / f"host{node}" / "examples")
    # README's certs command makes them in host 0's checkout; this is the
    # function its program calls (the Rust README check runs the program).
    cert_dir = walk.cert_dir()
    gradlane.generate_job_certs(str(tmp_path / "host0" / cert_dir), walk.job())
    for node in walk.hosts:
        if node != 0:
            (tmp_path / f"host{node}" / cert_dir).mkdir(parents=True)
            for f in commands.COPIED:
                shutil.copy(tmp_path / "host0" / cert_dir / f, tmp_path / f"host{node}" / cert_dir)

    outputs = run_hosts(walk, tmp_path, free_port())
    try:
        outcome = commands.check(outputs)
    except commands.WalkthroughError as e:
        shown = "\n".join(f"--- host {n}:\n{o[-3000:]}" for n, o in enumerate(outputs))
        pytest.fail(f"{e}\n{shown}")
    per_host = outcome.world // len(walk.hosts)
    assert per_host >= 2 and outcome.world == per_host * len(walk.hosts), outcome
    # Each host ran its own ranks (torchrun numbers them by node rank):
    # the job really spans both.
    for node, out in enumerate(outputs):
        for rank in range(node * per_host, (node + 1) * per_host):
            assert f"rank {rank} of {outcome.world}: parameters" in out, f"host {node}:\n{out}"
    print(outcome.summary(commands.TARGET_ACCURACY))
