"""GRADLANE_PORT_RANGE: every UDP socket of a rank (the backend's root,
every rank's listening socket and its further sockets) is bound inside
the range, so that a firewall can pass exactly it; a range with no free
port, or one that does not parse, is a clear error naming it.

Ranks run as in test_torch (processes, torchrun's environment).
"""

import socket

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from test_torch import WORLD, run_ranks  # noqa: E402


def scenario_ports(rank):
    """The backend under GRADLANE_PORT_RANGE, four sockets a rank: an
    allreduce, then the ports its Group's sockets are bound to."""
    import torch.distributed as dist

    dist.init_process_group("gradlane")
    t = torch.full((1 << 16,), float(rank + 1))
    dist.all_reduce(t)
    pg = dist.distributed_c10d._get_default_group()
    out = {"ports": pg.group.local_ports(), "sum": float(t[0])}
    dist.destroy_process_group()
    return out


def test_every_socket_of_every_rank_is_bound_inside_the_range(cert_dir):
    # A UDP port free a moment ago starts the range; 64 ports leave room
    # for ones other programs hold.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        lo = s.getsockname()[1]
    hi = min(lo + 63, 65535)
    got = run_ranks(
        scenario_ports,
        cert_dir,
        extra_env={"GRADLANE_PORT_RANGE": f"{lo}-{hi}", "GRADLANE_SOCKETS": "4"},
    )
    ports = [p for r in range(WORLD) for p in got[r]["ports"]]
    assert len(ports) == 4 * WORLD, got
    assert all(lo <= p <= hi for p in ports), (ports, lo, hi)
    assert len(set(ports)) == len(ports), ports
    assert all(got[r]["sum"] == 3.0 for r in range(WORLD)), got


def test_an_exhausted_or_bad_range_is_a_clear_error(cert_dir, monkeypatch):
    import gradlane
    from gradlane.torch._environment import _free_udp_port, port_range_from_env

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        # The backend's root port, chosen in Python.
        monkeypatch.setenv("GRADLANE_PORT_RANGE", f"{port}-{port}")
        with pytest.raises(ValueError, match=rf"no free UDP port on 127.0.0.1 in GRADLANE_PORT_RANGE {port}-{port}"):
            _free_udp_port("127.0.0.1")
        # A Group's own sockets, bound in Rust: a rank other than 0, whose
        # listening socket takes any port of the range.
        with pytest.raises(gradlane.GroupSetupError, match=rf"no free UDP port on 127.0.0.1 in the port range {port}-{port}"):
            gradlane.Group(1, 2, root="127.0.0.1:9", listen="127.0.0.1:0", cert_dir=cert_dir, join_timeout=5)
    for bad in ("50000", "10-5", "0-10", "a-b", "1-70000"):
        monkeypatch.setenv("GRADLANE_PORT_RANGE", bad)
        with pytest.raises(ValueError, match="GRADLANE_PORT_RANGE.*is not a port range"):
            port_range_from_env()
        with pytest.raises(ValueError, match="GRADLANE_PORT_RANGE.*is not a port range"):
            gradlane.Group(0, 1, root="127.0.0.1:9", cert_dir=cert_dir)
    monkeypatch.setenv("GRADLANE_PORT_RANGE", "50000-50100")
    assert port_range_from_env() == (50000, 50100)
