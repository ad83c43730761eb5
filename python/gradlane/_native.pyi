"""Type stubs of gradlane._native (the docstrings are on the objects)."""

import os
from typing import Any, Literal, Self

from typing_extensions import Buffer

__version__: str

def generate_certs(dir: str | os.PathLike[str], names: list[str]) -> dict[str, os.PathLike[str]]: ...
def generate_job_certs(
    dir: str | os.PathLike[str], job: str, ca_dir: str | os.PathLike[str] | None = None
) -> dict[str, os.PathLike[str]]: ...

class GroupError(Exception):
    rank: int | None
    missing: list[int] | None

class GroupSetupError(GroupError): ...
class JoinTimeoutError(GroupError): ...
class RankFailedError(GroupError): ...
class OutOfStepError(GroupError): ...
class GroupClosedError(GroupError): ...
class RemovedError(GroupError): ...
class CollectiveTimeoutError(GroupError): ...

class Group:
    def __init__(
        self,
        rank: int,
        world: int,
        *,
        root: str | None = None,
        addresses: list[str] | None = None,
        listen: str = "0.0.0.0:0",
        cert_dir: str | os.PathLike[str] | None = None,
        server_name: str | None = None,
        join_timeout: float = 60.0,
        loss_tolerance: float = 0.2,
        injected_loss: float = 0.0,
        seed: int = 0,
        idle_timeout: float | None = None,
        dscp: bool = False,
        lossy_carrier: Literal["adaptive", "datagrams"] = "adaptive",
        important_format: Literal["f32", "bf16", "f16"] = "f32",
        lossy_format: Literal["f32", "bf16", "f16", "log8"] = "f32",
        sockets: int | None = None,
        port_range: str | None = None,
        on_rank_failure: Literal["fail", "continue"] = "fail",
        rejoin: bool = False,
        collective_timeout: float | None = None,
    ) -> None: ...
    def local_ports(self) -> list[int]: ...
    @property
    def rank(self) -> int: ...
    @property
    def world(self) -> int: ...
    @property
    def bytes_sent(self) -> int: ...
    @property
    def members(self) -> list[int]: ...
    @property
    def epoch(self) -> int: ...
    @property
    def contributors(self) -> int: ...
    @property
    def joined(self) -> list[int]: ...
    @property
    def addresses(self) -> list[str]: ...
    def admit(self) -> list[int]: ...
    @property
    def closed(self) -> bool: ...
    def barrier(self) -> None: ...
    def send(self, peer: int, tag: int, buf: Buffer) -> None: ...
    def recv(self, source: int | None, tag: int, buf: Buffer) -> int: ...
    def broadcast(self, root: int, buf: Buffer) -> None: ...
    def allreduce(
        self,
        buf: Buffer,
        op: Literal["sum", "mean", "max", "min"] = "sum",
        dtype: Literal["float32", "bfloat16", "float16"] | None = None,
    ) -> None: ...
    def allgather(self, input: Buffer, output: Buffer) -> None: ...
    def reduce_scatter(
        self,
        input: Buffer,
        output: Buffer,
        op: Literal["sum", "mean", "max", "min"] = "sum",
        dtype: Literal["float32", "bfloat16", "float16"] | None = None,
    ) -> None: ...
    def register_bucket(
        self,
        shapes: list[tuple[str, list[int], Literal["conv2d", "dense"]]],
        recovery: Literal["zero_fill", "rescale", "error_feedback"] = "zero_fill",
        *,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        important_format: Literal["f32", "bf16", "f16"] | None = None,
        lossy_format: Literal["f32", "bf16", "f16", "log8"] | None = None,
        lossy_return: bool = False,
        compression_feedback: bool | None = None,
    ) -> int: ...
    def allreduce_differentiated(
        self, bucket: int, buf: Buffer, op: Literal["sum", "mean"] = "mean"
    ) -> dict[str, int]: ...
    def sparse_allgather(
        self,
        rows: Buffer,
        values: Buffer,
        height: int,
        width: int,
        how: Literal["allgatherv", "broadcast_in_order"] = "allgatherv",
    ) -> tuple[bytearray, bytearray]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: Any) -> bool: ...
