"""README's Python commands, run as a user types them: the Python half of
the README check (tools/tests/readme_commands.rs runs the rest, and names
this file for these lines).

README tells a user to install the package with pip, to export
GRADLANE_CERT_DIR, to add a few lines to a training script run under
torchrun, to read the examples' --help, and to time a DDP step with
scripts/ddp_step_bench.sh. Each is taken from README itself, so that an
edit there is checked, and run on loopback with short limits; a failure
names the README line. They need the venv of scripts/test.sh (torch,
scikit-learn, the package installed).
"""

import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys
import tomllib

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh installs it)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (scripts/test.sh installs it)")

import gradlane  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINES = README.read_text().splitlines()
VENV_BIN = pathlib.Path(sys.executable).parent
# A run's limit: a hang becomes a failure naming the line, not a stuck CI.
LIMIT = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def where(line_number):
    return f"README.md:{line_number}: {LINES[line_number - 1].strip()}"


def run(args, *, line, cwd, env=None):
    """Runs `args`, failing with the README line and the output's end if it
    does not exit 0 within LIMIT."""
    command = shlex.join(map(str, args))
    try:
        done = subprocess.run(
            args, cwd=cwd, env=env, capture_output=True, text=True, timeout=LIMIT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where(line)}\n    {command} still running after {LIMIT} s")
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        pytest.fail(f"{where(line)}\n    {command} failed ({done.returncode}):\n{tail}")
    return done


def code_lines(pattern):
    """(line number, text) of README's indented code lines matching
    `pattern`."""
    found = [
        (i + 1, line.strip())
        for i, line in enumerate(LINES)
        if line.startswith("    ") and re.match(pattern, line.strip())
    ]
    assert found, f"README has no code line matching {pattern!r}: did its form change?"
    return found


def prose():
    """README with its fenced blocks blanked (their backticks are no spans),
    line numbers kept."""
    kept, fenced = [], False
    for line in LINES:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            kept.append("")
        else:
            kept.append("" if fenced else line)
    return "\n".join(kept)


def spans(pattern):
    """(line number, text) of README's code spans matching `pattern`; a span
    may run across a line break."""
    text = prose()
    found = []
    for m in re.finditer(r"`([^`]+)`", text):
        span = " ".join(m.group(1).split())
        if re.match(pattern, span):
            found.append((text.count("\n", 0, m.start()) + 1, span))
    assert found, f"README has no code span matching {pattern!r}: did its form change?"
    return found


def python_blocks():
    """(line number of the first code line, code) of README's ```python
    blocks."""
    blocks, start = [], None
    for i, line in enumerate(LINES):
        if start is None and line.strip() == "```python":
            start = i + 1
        elif start is not None and line.strip() == "```":
            blocks.append((start + 1, "\n".join(LINES[start:i])))
            start = None
    assert blocks, "README has no ```python block: did its fence change?"
    return blocks


def test_pip_install_names_this_package_and_its_extra():
    """`pip install "./python[torch]"` is not run here: scripts/test.sh
    builds and installs the same package from python/ already. What the
    line names is checked: the directory holds this package, and it
    declares the extra."""
    for line, text in code_lines(r"pip install "):
        targets = [w for w in shlex.split(text)[2:] if not w.startswith("-")]
        assert targets, f"{where(line)}\n    names nothing to install"
        for target in targets:
            m = re.fullmatch(r"(\./[^\[]+)(?:\[([^\]]*)\])?", target)
            assert m, f"{where(line)}\n    {target!r} is not a local path with extras"
            project = ROOT / m.group(1) / "pyproject.toml"
            assert project.is_file(), f"{where(line)}\n    {project} does not exist"
            meta = tomllib.loads(project.read_text())["project"]
            assert meta["name"] == "gradlane", f"{where(line)}\n    {project} is {meta['name']!r}"
            extras = meta.get("optional-dependencies", {})
            for extra in filter(None, (m.group(2) or "").split(",")):
                assert extra in extras, (
                    f"{where(line)}\n    the package has no extra {extra!r} ({sorted(extras)})"
                )


def test_the_training_lines_run_under_torchrun(tmp_path):
    """README's lines for a training script, unchanged, in a script that
    defines the model before them and takes one step after them, under
    torchrun on two CPU ranks, with certificates where README's export
    line puts GRADLANE_CERT_DIR."""
    env = dict(os.environ)
    for line, text in spans(r"export "):
        name, _, value = shlex.split(text)[1].partition("=")
        env[name] = value.replace("$PWD", str(tmp_path))
    cert_dir = env.get("GRADLANE_CERT_DIR")
    assert cert_dir, f"{where(line)}\n    README exports no GRADLANE_CERT_DIR"
    gradlane.generate_certs(cert_dir, ["127.0.0.1"])
    for line, code in python_blocks():
        script = tmp_path / f"readme_line_{line}.py"
        script.write_text(
            "import torch\n"
            "torch.manual_seed(0)\n"
            "model = torch.nn.Sequential(\n"
            "    torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)\n"
            ")\n"
            f"{code}\n"
            "# One step, so that the hook runs.\n"
            "model(torch.randn(4, 8)).sum().backward()\n"
            "print(f'rank {dist.get_rank()}: one step done', flush=True)\n"
            "dist.destroy_process_group()\n"
        )
        torchrun = [VENV_BIN / "torchrun", "--nproc-per-node", "2"]
        done = run(
            [*torchrun, "--master-port", str(free_port()), script],
            line=line,
            cwd=tmp_path,
            env=env,
        )
        for rank in (0, 1):
            assert f"rank {rank}: one step done" in done.stdout, f"{where(line)}\n{done.stdout}"


def test_the_examples_named_take_help(tmp_path):
    """Each example README names exists, and its --help (which README points
    to) works."""
    for line, text in spans(r"examples/\S+\.py$"):
        example = ROOT / text
        assert example.is_file(), f"{where(line)}\n    {text} does not exist"
        done = run([sys.executable, example, "--help"], line=line, cwd=tmp_path)
        assert "usage" in done.stdout.lower(), f"{where(line)}\n{done.stdout}"


def test_the_ddp_step_bench_runs_short(tmp_path):
    """`bash scripts/ddp_step_bench.sh`, with its own settings made short:
    two ranks of a narrow ResNet-18, two steps, one run, and of its three
    transports only the hook (which runs over the gradlane backend too):
    each transport is another torchrun start of about 12 s, through the
    same loop of the script. On this venv and a free port."""
    for line, text in spans(r"bash scripts/ddp_step_bench\.sh"):
        gradlane.generate_certs(str(tmp_path), ["127.0.0.1"])
        env = dict(
            os.environ,
            RANKS="2",
            STEPS="2",
            REPS="1",
            WIDTH="4",
            TRANSPORTS="hook",
            PORT=str(free_port()),
            VENV=str(VENV_BIN.parent),
            GRADLANE_CERT_DIR=str(tmp_path),
        )
        done = run(shlex.split(text), line=line, cwd=ROOT, env=env)
        assert "| hook | 1 |" in done.stdout, f"{where(line)}\n{done.stdout}"
