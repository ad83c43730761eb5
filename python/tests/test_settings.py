"""Every GRADLANE_* variable is read and checked in one place: the torch
backend's in gradlane/torch/_environment.py, the native module's in
python/src/settings.rs. A read anywhere else fails here, so that a new
variable gets its check and its error message where the others have
theirs."""

import io
import re
import tokenize
from pathlib import Path

PYTHON = Path(__file__).resolve().parents[1]
ENVIRONMENT = PYTHON / "gradlane" / "torch" / "_environment.py"
SETTINGS = PYTHON / "src" / "settings.rs"
NAME = re.compile(r"""^[rbuf]*(['"])GRADLANE_[A-Z0-9_]+\1$""")


def names_in_code(path):
    """The string literals of `path` that are a GRADLANE_* name alone (a
    lookup or a constant; docstrings and messages say more)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [t.string for t in tokens if t.type == tokenize.STRING and NAME.match(t.string)]


def test_python_reads_gradlane_variables_in_environment_py_only():
    stray = {
        str(p.relative_to(PYTHON)): names_in_code(p)
        for p in (PYTHON / "gradlane").rglob("*.py")
        if p != ENVIRONMENT and names_in_code(p)
    }
    assert not stray, f"GRADLANE_* read outside {ENVIRONMENT.name}: {stray}"
    assert len(names_in_code(ENVIRONMENT)) >= 8


def test_the_native_module_reads_the_environment_in_settings_rs_only():
    stray = [
        f"{p.name}:{i + 1}"
        for p in (PYTHON / "src").glob("*.rs")
        if p != SETTINGS
        for i, line in enumerate(p.read_text().splitlines())
        if "env::var" in line or "from_env(" in line or '"GRADLANE_' in line
    ]
    assert not stray, f"the environment read outside settings.rs: {stray}"
    assert SETTINGS.read_text().count('"GRADLANE_') == 5


def test_the_port_range_has_one_parser(monkeypatch):
    import gradlane
    from gradlane.torch._environment import port_range_from_env

    for bad in ["x", "5-4", "0-10", "70000-70001", "50000"]:
        monkeypatch.setenv("GRADLANE_PORT_RANGE", bad)
        for parse in (port_range_from_env, gradlane._native.port_range_from_env):
            try:
                parse()
            except ValueError as e:
                assert "GRADLANE_PORT_RANGE" in str(e) and bad in str(e)
            else:
                raise AssertionError(f"{bad!r} was taken as a port range")
    monkeypatch.setenv("GRADLANE_PORT_RANGE", " 50000-50100 ")
    assert port_range_from_env() == (50000, 50100)
    monkeypatch.delenv("GRADLANE_PORT_RANGE")
    assert port_range_from_env() is None


def test_timeouts_from_the_environment_are_positive_seconds(monkeypatch):
    from gradlane.torch._environment import idle_timeout_from_env, join_timeout_from_env

    for name, read in [("GRADLANE_JOIN_TIMEOUT", join_timeout_from_env),
                       ("GRADLANE_IDLE_TIMEOUT", idle_timeout_from_env)]:
        monkeypatch.delenv(name, raising=False)
        assert read() is None
        monkeypatch.setenv(name, "2.5")
        assert read() == 2.5
        for bad in ["0", "-1", "nan", "inf", "soon"]:
            monkeypatch.setenv(name, bad)
            try:
                read()
            except ValueError as e:
                assert name in str(e) and "positive number of seconds" in str(e)
            else:
                raise AssertionError(f"{name}={bad!r} was taken")
