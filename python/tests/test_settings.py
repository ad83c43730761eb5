"""gradlane.Settings, every knob of a Group, its buckets and the torch
hook, with the library's defaults and checks; and the environment: every
GRADLANE_* variable is read and checked in one place, the torch
backend's in gradlane/torch/_environment.py, the native module's in
python/src/environment.rs. A read anywhere else fails here, so that a new
variable gets its check and its error message where the others have
theirs."""

import io
import re
import tokenize
from pathlib import Path

PYTHON = Path(__file__).resolve().parents[1]
ENVIRONMENT = PYTHON / "gradlane" / "torch" / "_environment.py"
ENVIRONMENT_RS = PYTHON / "src" / "environment.rs"
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


def test_the_native_module_reads_the_environment_in_environment_rs_only():
    stray = [
        f"{p.name}:{i + 1}"
        for p in (PYTHON / "src").glob("*.rs")
        if p != ENVIRONMENT_RS
        for i, line in enumerate(p.read_text().splitlines())
        if "env::var" in line or "from_env(" in line or '"GRADLANE_' in line
    ]
    assert not stray, f"the environment read outside environment.rs: {stray}"
    assert ENVIRONMENT_RS.read_text().count('"GRADLANE_') == 4


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


def test_settings_hold_the_librarys_defaults_and_python_repeats_none():
    import gradlane
    import gradlane.torch as gl

    s = gradlane.Settings()
    assert (s.loss_tolerance, s.recovery, s.lossy_carrier) == (0.2, "zero_fill", "adaptive")
    assert (s.important_format, s.lossy_format, s.deadline, s.deadline_factor) == (
        "f32", "f32", None, 1.25)
    assert s.join_timeout == 60.0 and s.on_rank_failure == "fail"
    # The hook's defaults are the Settings' own, read through.
    state = gl.HookState()
    assert state.loss_tolerance == s.loss_tolerance and state.deadline_factor == 1.25
    # No knob's default is written again in the hook's Python.
    hook = (PYTHON / "gradlane" / "torch" / "_hook.py").read_text()
    assert "= 0.2" not in hook


def test_a_knob_changed_keeps_the_others_and_its_name():
    import gradlane
    import gradlane.torch as gl

    s = gradlane.Settings(loss_tolerance=0.3, deadline="adaptive")
    t = s.replace(deadline=0.05, lossy_format="log8")
    assert (t.loss_tolerance, t.deadline, t.lossy_format) == (0.3, 0.05, "log8")
    assert s.deadline == "adaptive", "replace makes a copy"
    state = gl.HookState(0.1, settings=t, overlap=True)
    assert (state.loss_tolerance, state.deadline, state.overlap) == (0.1, 0.05, True)
    assert state.settings.lossy_format == "log8"


def test_bad_knobs_are_refused_naming_them():
    import gradlane

    for knobs, message in [
        (dict(loss_tolerance=-0.5), "loss_tolerance -0.5 is not in [0, 1]"),
        (dict(sockets=0), "sockets 0"),
        (dict(port_range="9-1"), "port_range"),
        (dict(on_rank_failure="retry"), "unknown on_rank_failure 'retry'"),
        (dict(join_timeout=0), "join_timeout"),
        (dict(collective_timeout=-1.0), "collective_timeout"),
        (dict(rotation="fourier"), "unknown rotation"),
    ]:
        try:
            gradlane.Settings(**knobs)
        except ValueError as e:
            assert message in str(e), (knobs, str(e))
        else:
            raise AssertionError(f"{knobs} was taken")
    try:
        gradlane.Settings(loss_tolerence=0.3)
    except TypeError as e:
        assert "loss_tolerence" in str(e)
    else:
        raise AssertionError("a misspelt knob was taken")


def test_the_hook_shares_a_group_whose_links_match_its_own():
    import gradlane

    default = gradlane.Settings()
    assert default.links_match(gradlane.Settings(recovery="rescale", overlap=True))
    assert not default.links_match(gradlane.Settings(loss_tolerance=0.3))
    assert not gradlane.Settings(injected_loss=0.1).links_match(default)
    assert not default.links_match(gradlane.Settings(injected_loss=0.1))
    assert gradlane.Settings(lossy_carrier="datagrams").needs_own_group
    assert not gradlane.Settings(loss_tolerance=0.5).needs_own_group
