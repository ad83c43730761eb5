"""Every GRADLANE_* variable the torch backend and hook read: certificates,
the addresses and ports its ranks listen on, the failure policy,
asynchrony, staging. Each is read and checked here only, and a bad value
is a ValueError naming it and saying what it takes. The native module
reads its own (threads, sockets, log filter) in python/src/environment.rs,
and checks GRADLANE_PORT_RANGE and GRADLANE_CERT_DIR for both."""

from __future__ import annotations

import ipaddress
import math
import os
import socket

import gradlane


def _free_udp_port(host: str) -> int:
    """A UDP port on `host` that was free a moment ago (rank 0 listens
    there right after, and publishes it through the store): where
    GRADLANE_PORT_RANGE is set, the last free one of the range, so that a
    firewall can pass exactly the range, else any. From the top: every
    other socket takes the first free one from the bottom, and one of
    them could take this port between this probe and rank 0's bind."""
    lo, hi = port_range_from_env() or (0, 0)
    for port in range(hi, lo - 1, -1):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise ValueError(
        f"gradlane: no free UDP port on {host} in GRADLANE_PORT_RANGE {lo}-{hi}: "
        "every port of it is in use; widen it (a rank takes one port per socket)"
    )


def port_range_from_env() -> tuple[int, int] | None:
    """GRADLANE_PORT_RANGE as (lo, hi), or None where unset; anything but
    "lo-hi" with 1 <= lo <= hi <= 65535 is a ValueError naming it. Parsed
    by the native module, which reads the same variable for the Group's
    own sockets."""
    return gradlane._native.port_range_from_env()


def cert_dir_from_env() -> str:
    """GRADLANE_CERT_DIR, or a ValueError saying how to set it: unset, or
    a directory without the three files every rank needs. Checked by the
    native module, as a Group given no cert_dir checks it."""
    return gradlane._native.cert_dir_from_env()


def rank_listen_from_env() -> str:
    """Where a rank other than 0 listens: GRADLANE_RANK_ADDR, an "ip:port"
    or a bare IP (as scripts/testbed.sh and allreduce_bench have it; a
    free port then), default 0.0.0.0:0. Anything else is a ValueError
    naming the variable."""
    given = os.environ.get("GRADLANE_RANK_ADDR")
    addr = given or "0.0.0.0:0"
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        pass
    else:
        return f"[{ip}]:0" if ip.version == 6 else f"{ip}:0"
    host, sep, port = addr.rpartition(":")
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        ok = sep == ":" and port.isdigit() and 0 <= int(port) <= 65535
        if ok and ":" in host and not host.startswith("["):
            ok = False  # an IPv6 address with a port is written [ip]:port
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"gradlane: GRADLANE_RANK_ADDR {given!r} is not an IP address or ip:port "
            "(e.g. 10.0.0.2, 10.0.0.2:4000 or [fd00::2]:4000): the address this rank "
            "listens on, reachable from the other ranks; unset, 0.0.0.0 and a free port"
        )
    return addr


def port_from_env(name: str) -> int:
    """The port in environment variable ``name``, or a ValueError naming it."""
    value = os.environ[name]
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ValueError(f"gradlane: {name} {value!r} is not a port (1-65535)")
    return port


def hook_port_from_env() -> int:
    """The port the hook's own Group listens on at rank 0: GRADLANE_PORT,
    else MASTER_PORT + 1; a ValueError where neither is set or either is
    not a port."""
    if "GRADLANE_PORT" in os.environ:
        return port_from_env("GRADLANE_PORT")
    if "MASTER_PORT" in os.environ:
        return port_from_env("MASTER_PORT") + 1
    raise ValueError(
        "gradlane: the hook's own Group needs GRADLANE_PORT or MASTER_PORT "
        "(rank 0 listens on MASTER_ADDR at that port, or MASTER_PORT + 1)"
    )


#: The test-only switch: stage CPU tensors through host buffers as well.
STAGE_CPU_ENV = "GRADLANE_STAGE_CPU_TENSORS"


def stage_cpu_tensors_from_env() -> bool:
    """Whether GRADLANE_STAGE_CPU_TENSORS asks for CPU tensors to be
    staged (tests); anything but unset, "" or "0" is a ValueError."""
    value = os.environ.get(STAGE_CPU_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(
            f"gradlane: {STAGE_CPU_ENV} {value!r} is not 0 or 1 (1 stages CPU tensors "
            "through host buffers as CUDA tensors are: for tests; unset, 0)"
        )
    return value == "1"


def rejoin_from_env() -> bool:
    """GRADLANE_REJOIN: 1 for a replacement rank, 0 (default) otherwise."""
    value = os.environ.get("GRADLANE_REJOIN", "0").strip() or "0"
    if value not in ("0", "1"):
        raise ValueError(
            f"gradlane: GRADLANE_REJOIN {value!r} is not 0 or 1 (1 starts a replacement "
            "for a rank the others went on without; unset, 0)"
        )
    if value == "1" and on_rank_failure_from_env() != "continue":
        raise ValueError(
            "gradlane: GRADLANE_REJOIN=1 needs GRADLANE_ON_RANK_FAILURE=continue "
            "(a group that fails on a death has no one to rejoin)"
        )
    return value == "1"


def on_rank_failure_from_env() -> str:
    """GRADLANE_ON_RANK_FAILURE: ``fail`` (default) or ``continue``."""
    value = os.environ.get("GRADLANE_ON_RANK_FAILURE", "fail").strip().lower() or "fail"
    if value not in ("fail", "continue"):
        raise ValueError(
            f"gradlane: GRADLANE_ON_RANK_FAILURE {value!r} is not fail or continue "
            "(continue goes on with the ranks left when one dies; unset, fail)"
        )
    return value


def asynchronous_from_env() -> bool:
    """GRADLANE_ASYNC: 1 (default) returns each collective's Work at once,
    0 returns it done (for comparing the two; DDP cannot overlap then)."""
    value = os.environ.get("GRADLANE_ASYNC", "1")
    if value not in ("0", "1"):
        raise ValueError(
            f"gradlane: GRADLANE_ASYNC {value!r} is not 0 or 1 (1 returns each "
            "collective's Work at once, 0 once it is done; unset, 1)"
        )
    return value == "1"


def _seconds_from_env(name: str, what: str) -> float | None:
    """Environment variable ``name`` as a positive number of seconds, or
    None where unset; anything else is a ValueError saying ``what`` it is."""
    text = os.environ.get(name)
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"gradlane: {name} {text!r} is not a positive number of seconds ({what})")
    return seconds


def idle_timeout_from_env() -> float | None:
    """GRADLANE_IDLE_TIMEOUT in seconds, or None (the Group's default)."""
    return _seconds_from_env(
        "GRADLANE_IDLE_TIMEOUT",
        "how long a silent link lasts before the ranks raise; unset, 30",
    )


def join_timeout_from_env() -> float | None:
    """GRADLANE_JOIN_TIMEOUT in seconds, or None (the process group's
    timeout, at least 60 s)."""
    return _seconds_from_env(
        "GRADLANE_JOIN_TIMEOUT",
        "how long forming the group may take; unset, the process group's timeout, at least 60",
    )
