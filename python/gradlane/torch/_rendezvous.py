"""Forming a process group's :class:`gradlane.Group` through torch's store.

Rank 0 listens on MASTER_ADDR at a free UDP port and publishes that
"ip:port" under ROOT_KEY; the others read it and join it. Every rank then
publishes the address it listens on, for a replacement to rejoin through
(GRADLANE_REJOIN=1), which joins through every member's address rather
than rank 0's alone. gradlane.torch._backend wraps the Group in the
process group torch uses.
"""

from __future__ import annotations

import datetime
import os
import socket

import gradlane
from gradlane.torch._environment import (
    join_timeout_from_env,
    _free_udp_port,
    cert_dir_from_env,
    idle_timeout_from_env,
    on_rank_failure_from_env,
    rank_listen_from_env,
    rejoin_from_env,
)

#: The least time forming a group may take, in seconds, whatever the
#: process group's timeout (which bounds each collective).
MIN_JOIN_TIMEOUT = 60.0
#: The store key under which rank 0 publishes its "ip:port".
ROOT_KEY = "gradlane/root"
#: The store keys (ADDRESS_KEY/RANK) under which every rank publishes the
#: "ip:port" it listens on, for a replacement to rejoin through.
ADDRESS_KEY = "gradlane/address"


def _addresses_from_store(store, rank: int, size: int) -> list[str]:
    """Every rank's address for a rank that rejoins: the others' as they
    published them, this rank's own where it listens (GRADLANE_RANK_ADDR;
    port 0 is any)."""
    table = []
    for r in range(size):
        key = f"{ADDRESS_KEY}/{r}"
        if r == rank:
            table.append(rank_listen_from_env())
        elif store.check([key]):
            table.append(store.get(key).decode())
        else:
            raise gradlane.GroupSetupError(
                f"gradlane: GRADLANE_REJOIN=1, but rank {r} never published its address "
                f"in the store ({key}): no group formed there to rejoin (start the job "
                "without GRADLANE_REJOIN, or give the job's own store)"
            )
    return table


def _collective_timeout(timeout) -> float | None:
    """torch's process group timeout in seconds; None for none (torch
    passes zero or a negative time for "no timeout")."""
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout) if timeout else None
    if seconds is not None and seconds <= 0:
        return None
    return seconds


def join_through_store(store, rank, size, timeout) -> gradlane.Group:
    """Rank ``rank`` of ``size``'s :class:`gradlane.Group`, formed through
    ``store``; ``timeout`` bounds every collective (see
    gradlane.torch.create_process_group for the variables read)."""
    cert_dir = cert_dir_from_env()
    collective_timeout = _collective_timeout(timeout)
    join_timeout = join_timeout_from_env() or max(
        collective_timeout or MIN_JOIN_TIMEOUT, MIN_JOIN_TIMEOUT
    )
    rejoin = rejoin_from_env()
    root = addresses = None
    if rejoin:
        # Through every member's address, not rank 0's alone: any member
        # that answers admits this rank, so rank 0 may be the one it
        # replaces (where the store outlives it).
        addresses = _addresses_from_store(store, rank, size)
        listen = None
    elif rank == 0:
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        try:
            ip = socket.gethostbyname(host)
        except OSError as e:
            raise ValueError(f"gradlane: MASTER_ADDR {host!r} does not resolve: {e}") from e
        root = f"{ip}:{_free_udp_port(ip)}"
        store.set(ROOT_KEY, root)
        listen = root
    else:
        root = store.get(ROOT_KEY).decode()
        listen = rank_listen_from_env()
    group = gradlane.Group(
        rank,
        size,
        root=root,
        addresses=addresses,
        listen=listen or "0.0.0.0:0",
        cert_dir=cert_dir,
        join_timeout=join_timeout,
        idle_timeout=idle_timeout_from_env(),
        on_rank_failure=on_rank_failure_from_env(),
        rejoin=rejoin,
        collective_timeout=collective_timeout,
    )
    store.set(f"{ADDRESS_KEY}/{rank}", group.addresses[rank])
    return group
