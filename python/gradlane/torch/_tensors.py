"""What the gradlane backend's collectives take, and how their tensors
cross to :class:`gradlane.Group`.

The checks here run in the call itself (gradlane.torch._backend and
gradlane.torch._ops), before anything is issued, so bad input raises a
TypeError or ValueError naming the tensor on the rank that passed it and
the ranks stay in step. The views are numpy arrays over a contiguous CPU
tensor's memory (no copy): its values on the float path, its bytes on
the typed path and for data movement.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

#: The dtypes the float path (gradlane.Group.allreduce and reduce_scatter)
#: takes as values, and the name the Group takes each by.
REDUCED_DTYPES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}
#: The dtypes the typed reductions take, by the name gradlane.Group knows.
TYPED_DTYPES = {
    **REDUCED_DTYPES,
    torch.float64: "float64",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
#: The ops the float path has, by its names.
FAST_OPS = {"sum": "sum", "avg": "mean", "max": "max", "min": "min"}

_TYPED_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}


# ------------------------------------------------------------ reductions


def typed_op(opts, what) -> str:
    """The name of the ReduceOp in ``opts`` (SUM where there are none)
    gradlane reduces with; PREMUL_SUM (as gloo) is a ValueError."""
    op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
    for known, name in _TYPED_OPS.items():
        if op == known:
            return name
    name = getattr(getattr(op, "op", op), "name", op)
    raise ValueError(
        f"gradlane: {what} supports ReduceOp.SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and "
        f"BXOR, not {name}"
    )


def reduction_plan(t, op: str, what: str):
    """How tensor ``t`` is reduced with ``op``: ``(None, name)`` on the float
    path (the values themselves), or ``(dtype, op)`` on the typed path (its
    bytes). A dtype or op/dtype pair gradlane (and gloo) does not reduce is a
    TypeError naming both."""
    if t.dtype not in TYPED_DTYPES:
        raise TypeError(
            f"gradlane: {what} is {t.dtype}; gradlane reduces "
            + ", ".join(str(d) for d in TYPED_DTYPES)
            + " (complex tensors as their real view, with SUM or AVG)"
        )
    integral = t.dtype not in (*REDUCED_DTYPES, torch.float64)
    if op in ("band", "bor", "bxor") and not integral:
        raise TypeError(
            f"gradlane: {what}: ReduceOp.{op.upper()} applies to integer and bool tensors, "
            f"not {t.dtype} (as gloo)"
        )
    if op == "avg" and integral:
        raise TypeError(
            f"gradlane: {what}: ReduceOp.AVG applies to floating-point tensors, not {t.dtype} "
            "(gloo has no AVG; sum and divide)"
        )
    if t.dtype in REDUCED_DTYPES and op in FAST_OPS:
        return None, FAST_OPS[op]
    return TYPED_DTYPES[t.dtype], op


def real_view(t, op: str, what: str):
    """A complex tensor as its real view (as torch's own all_reduce passes
    it), where the op allows; any other tensor as it is."""
    if not t.is_complex():
        return t
    if op not in ("sum", "avg"):
        raise TypeError(
            f"gradlane: {what} is complex ({t.dtype}); ReduceOp.{op.upper()} does not apply "
            "(SUM and AVG do)"
        )
    return torch.view_as_real(t)


# ----------------------------------------------------------------- checks


def check_tensor(t, what):
    """A dense CPU or CUDA tensor (a CUDA one contiguous), or an error
    naming ``what``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gradlane: {what} must be a torch.Tensor, not {type(t).__name__}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"gradlane: {what} is on {t.device}; the gradlane backend takes CPU and CUDA tensors"
        )
    if t.is_sparse or t.layout != torch.strided:
        raise NotImplementedError(
            f"gradlane: {what} has layout {t.layout}; gradlane implements dense tensors only"
        )
    if not t.is_contiguous() and t.device.type != "cpu":
        raise ValueError(
            f"gradlane: {what} (shape {tuple(t.shape)}, stride {t.stride()}) is not "
            "contiguous; pass tensor.contiguous() (CPU tensors are copied)"
        )


def one(tensors, what):
    """The one tensor (or list) a process passes as ``what``."""
    if len(tensors) != 1:
        raise ValueError(f"gradlane: {what}: one per process, got {len(tensors)}")
    return tensors[0]


def same(t, like, what, like_what):
    """``t`` has ``like``'s dtype and number of values."""
    if t.dtype != like.dtype or t.numel() != like.numel():
        raise ValueError(
            f"gradlane: {what} is {t.numel()} x {t.dtype}, {like_what} "
            f"{like.numel()} x {like.dtype}"
        )


def check_whole(whole, part, size, op, whole_what, part_what):
    """The tensor forms of allgather, gather and reduce_scatter: ``whole``
    holds ``size`` parts of ``part``'s dtype and size, one per rank."""
    check_tensor(part, f"{op} {part_what}")
    check_tensor(whole, f"{op} {whole_what}")
    if whole.dtype != part.dtype:
        raise TypeError(
            f"gradlane: {op} {whole_what} is {whole.dtype}, its {part_what} {part.dtype}"
        )
    if whole.numel() != part.numel() * size:
        raise ValueError(
            f"gradlane: {op} {whole_what} has {whole.numel()} values, needs "
            f"{part.numel()} x {size} ranks = {part.numel() * size}"
        )


def check_parts(parts, like, size, op, what, like_what):
    """The list forms of allgather, gather, scatter and reduce_scatter:
    ``size`` tensors, one per rank, each of ``like``'s dtype and size."""
    if len(parts) != size:
        raise ValueError(f"gradlane: {op} takes {size} {what} tensors, got {len(parts)}")
    for i, t in enumerate(parts):
        check_tensor(t, f"{op} {what} {i}")
        same(t, like, f"{op} {what} {i}", f"the {like_what}")
    return list(parts)


def rooted_parts(ones, lists, *, at_root, size, op, one_what, parts_what):
    """gather's and scatter's tensors: the one tensor every rank passes
    (``ones`` holds it) and, on the root, the ``size`` tensors like it
    (``lists`` holds their list); the other ranks pass no parts."""
    single = one(ones, f"{op} {one_what}")
    check_tensor(single, f"{op} {one_what}")
    if not at_root:
        if lists and any(len(p) for p in lists):
            raise ValueError(f"gradlane: {op} takes {parts_what} tensors on the root rank only")
        return single, []
    parts = one(lists, f"{op}'s root {parts_what} list")
    return single, check_parts(parts, single, size, op, parts_what, one_what)


def root_of(opts, size):
    """The root rank ``opts`` names (0 without options)."""
    root = getattr(opts, "rootRank", 0) if opts is not None else 0
    if not 0 <= root < size:
        raise ValueError(f"gradlane: root rank {root} is not in 0..{size - 1}")
    return root


def splits(sizes, rows, size, what):
    """Rows per rank of dim 0: the split sizes given, or equal parts."""
    if not sizes:
        if rows % size:
            raise ValueError(
                f"gradlane: {what} has {rows} rows along dim 0, not divisible by {size} ranks "
                "(give split sizes)"
            )
        return [rows // size] * size
    sizes = list(sizes)
    if len(sizes) != size or sum(sizes) != rows or min(sizes) < 0:
        raise ValueError(
            f"gradlane: {what} split sizes {sizes} do not split its {rows} rows among {size} ranks"
        )
    return sizes


# ------------------------------------------------------------------ views


def values_view(t):
    """A flat numpy view of a checked float tensor's values (no copy) and
    the dtype name :class:`gradlane.Group` takes it with: numpy has no
    bfloat16, so a bfloat16 tensor crosses as its 16-bit integers."""
    flat = t.detach().reshape(-1)
    if t.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return flat.numpy(), REDUCED_DTYPES[t.dtype]


def byte_view(t):
    """A flat uint8 numpy view of a contiguous CPU tensor's bytes (no copy)."""
    flat = t.detach().reshape(-1)
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8).numpy()


def word_view(t):
    """A float32 numpy view of a contiguous tensor's bytes (the Group's
    broadcast and allgather move 4-byte words), or None when its size in
    bytes is not a multiple of 4 (then the caller pads a copy)."""
    n = t.numel() * t.element_size()
    if n % 4:
        return None
    if n == 0:
        return np.empty(0, np.float32)
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.float32:
        return flat.numpy()
    return flat.view(torch.uint8).view(torch.float32).numpy()


def padded_words(t):
    """A zero-padded float32 copy of a tensor's bytes (sizes not a multiple
    of 4 bytes), and its byte count."""
    raw = t.detach().reshape(-1).view(torch.uint8).numpy()
    buf = np.zeros((raw.size + 3) // 4, np.float32)
    buf.view(np.uint8)[: raw.size] = raw
    return buf, raw.size


def apart(ins, outs):
    """The input views, each copied where it shares memory with an output
    (all_to_all_single(x, x) say): the Group takes separate buffers."""
    return [i.copy() if any(np.shares_memory(i, o) for o in outs) else i for i in ins]


def byte_parts(view, rows, row_bytes):
    """``view`` cut into consecutive parts of ``rows[k] * row_bytes`` bytes."""
    parts, at = [], 0
    for n in rows:
        parts.append(view[at:at + n * row_bytes])
        at += n * row_bytes
    return parts


def contiguous_copies(tensors, writes):
    """The tensors with each non-contiguous one replaced by a contiguous
    copy, and the (original, copy) pairs to copy back once the collective
    wrote them. Non-contiguous CUDA tensors are refused: their copy back
    would have to be ordered after the staged one on the device."""
    out, back = [], []
    for t, w in zip(tensors, writes, strict=True):
        if t.is_contiguous():
            out.append(t)
            continue
        if t.device.type != "cpu":
            raise ValueError(
                f"gradlane: a non-contiguous {t.device.type} tensor (shape {tuple(t.shape)}, "
                f"stride {t.stride()}): pass tensor.contiguous() (CPU ones are copied)"
            )
        c = t.contiguous()
        out.append(c)
        if w:
            back.append((t, c))
    return out, back
