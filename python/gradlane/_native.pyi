"""Type stubs of gradlane._native (the docstrings are on the objects)."""

import os
from typing import Any, Literal, Self

from typing_extensions import Buffer

TypedDtype = Literal[
    "float32", "bfloat16", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"
]
TypedOp = Literal["sum", "avg", "mean", "product", "min", "max", "band", "bor", "bxor"]

__version__: str

def generate_certs(dir: str | os.PathLike[str], names: list[str]) -> dict[str, os.PathLike[str]]: ...
def generate_job_certs(
    dir: str | os.PathLike[str], job: str, ca_dir: str | os.PathLike[str] | None = None
) -> dict[str, os.PathLike[str]]: ...

def codec_encode(keys: Buffer, values: Buffer, dim: int, base: float = 1.25) -> bytes: ...
def codec_decode(frame: Buffer) -> tuple[bytearray, bytearray, int]: ...
def codec_decode_add(frame: Buffer, acc: Buffer) -> dict[str, Any]: ...
def codec_header(frame: Buffer) -> dict[str, Any]: ...

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

def close_groups_at_exit() -> None: ...
def port_range_from_env() -> tuple[int, int] | None: ...
def cert_dir_from_env() -> str: ...

class Settings:
    def __init__(
        self,
        *,
        loss_tolerance: float = ...,
        injected_loss: float = ...,
        injected_delay: float = ...,
        seed: int = ...,
        idle_timeout: float | None = ...,
        dscp: bool = ...,
        lossy_carrier: Literal["adaptive", "datagrams"] = ...,
        important_format: Literal["f32", "bf16", "f16"] = ...,
        lossy_format: Literal["f32", "bf16", "f16", "log8"] = ...,
        sockets: int | None = ...,
        port_range: str | None = ...,
        on_rank_failure: Literal["fail", "continue"] = ...,
        join_timeout: float = ...,
        collective_timeout: float | None = ...,
        recovery: Literal["zero_fill", "rescale", "error_feedback"] = ...,
        compression_feedback: bool | None = ...,
        lossy_return: bool = ...,
        deadline: Literal["adaptive"] | float | None = ...,
        deadline_factor: float = ...,
        overlap: bool = ...,
        rotation: Literal["hadamard"] | None = ...,
    ) -> None: ...
    def replace(self, **knobs: Any) -> Settings: ...
    def links_match(self, other: Settings) -> bool: ...
    @property
    def needs_own_group(self) -> bool: ...
    loss_tolerance: float
    injected_loss: float
    injected_delay: float
    seed: int
    idle_timeout: float | None
    dscp: bool
    lossy_carrier: str
    important_format: str
    lossy_format: str
    sockets: int | None
    port_range: str | None
    on_rank_failure: str
    join_timeout: float
    collective_timeout: float | None
    recovery: str
    compression_feedback: bool | None
    lossy_return: bool
    deadline: str | float | None
    deadline_factor: float
    overlap: bool
    rotation: str | None

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
        rejoin: bool = False,
        settings: Settings | None = None,
        **knobs: Any,
    ) -> None: ...
    @property
    def settings(self) -> Settings: ...
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
    def allreduce_typed(self, buf: Buffer, dtype: TypedDtype, op: TypedOp = "sum") -> None: ...
    def reduce(self, root: int, buf: Buffer, dtype: TypedDtype, op: TypedOp = "sum") -> None: ...
    def reduce_scatter_typed(
        self, input: Buffer, output: Buffer, dtype: TypedDtype, op: TypedOp = "sum"
    ) -> None: ...
    def gather(self, root: int, input: Buffer, outputs: list[Buffer] | None = None) -> None: ...
    def scatter(self, root: int, inputs: list[Buffer] | None, output: Buffer) -> None: ...
    def all_to_all(self, inputs: list[Buffer], outputs: list[Buffer]) -> None: ...
    def monitored_barrier(self, timeout: float) -> None: ...
    def register_bucket(
        self,
        shapes: list[tuple[str, list[int], Literal["conv2d", "dense"]]],
        recovery: Literal["zero_fill", "rescale", "error_feedback", "drop"] | None = None,
        *,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        settings: Settings | None = None,
        gather: bool = False,
        **knobs: Any,
    ) -> int: ...
    def allreduce_differentiated(
        self, bucket: int, buf: Buffer, op: Literal["sum", "mean"] = "mean"
    ) -> dict[str, int]: ...
    def allgather_differentiated(self, bucket: int, buf: Buffer) -> dict[str, int]: ...
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
