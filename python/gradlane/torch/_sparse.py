"""The allreduce of a sparse COO tensor (ReduceOp.SUM), as gloo's.

Each rank coalesces its tensor, the ranks agree on its shape and dtype
(one allgather of a fixed-size header), then every rank sends its indices
and values to every other (one all-to-all of sizes the headers gave) and
sums them all in rank order. Every rank builds the same tensor from the
same bytes in the same order, so the result has the same bits everywhere;
it is coalesced, as gloo's is. Embedding gradients (``sparse=True``) take
this path under DDP.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

#: A header's fields before the shape: nnz, sparse dims, dense dims,
#: dtype, number of dims.
_FIELDS = 5
#: The most dims a sparse tensor may have here (the header's fixed size).
MAX_DIMS = 16
_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.bool,
]


class SparseMixin:
    """allreduce of sparse tensors, for :class:`GradlaneProcessGroup`."""

    def _sparse_allreduce(self, tensors, opts):
        if len(tensors) != 1:
            raise ValueError(
                f"gradlane: allreduce of sparse tensors takes one tensor, got {len(tensors)}"
            )
        t = tensors[0]
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if op != dist.ReduceOp.SUM:
            raise ValueError(
                "gradlane: allreduce of a sparse tensor supports ReduceOp.SUM only (as gloo)"
            )
        if t.layout != torch.sparse_coo:
            raise NotImplementedError(
                f"gradlane: allreduce of a {t.layout} tensor; gradlane reduces dense and "
                "sparse COO tensors"
            )
        if t.dtype not in _DTYPES:
            raise TypeError(f"gradlane: allreduce of a sparse {t.dtype} tensor")
        if t.dim() > MAX_DIMS:
            raise ValueError(
                f"gradlane: a sparse tensor of {t.dim()} dims; the sparse allreduce takes "
                f"at most {MAX_DIMS}"
            )
        # On the caller's thread, so that a CUDA tensor is read after the
        # kernels queued before this call on its stream.
        mine = t.detach().coalesce().cpu()

        def body(_host):
            total = self._sparse_sum(mine)
            # As gloo: the input tensor becomes the sum (copy_ between
            # sparse tensors takes the other's indices and values).
            with torch.no_grad():
                t.copy_(total.to(t.device))
            if t.device.type == "cuda":
                torch.cuda.current_stream(t.device).synchronize()

        return self._run("allreduce", [], [], [], body, tensors)

    def _sparse_sum(self, mine):
        """The sum of every rank's coalesced CPU tensor ``mine``, in rank order."""
        n = self._size
        header = torch.zeros(_FIELDS + MAX_DIMS, dtype=torch.int64)
        header[:_FIELDS] = torch.tensor(
            [mine._nnz(), mine.sparse_dim(), mine.dense_dim(), _DTYPES.index(mine.dtype),
             mine.dim()]
        )
        header[_FIELDS:_FIELDS + mine.dim()] = torch.tensor(mine.shape, dtype=torch.int64)
        headers = torch.empty(n * header.numel(), dtype=torch.int64)
        self._all_gather_host(headers, header)
        headers = headers.view(n, -1)
        for r in range(n):
            if not torch.equal(headers[r, 1:], header[1:]):
                theirs = headers[r]
                dims = int(theirs[4])
                raise ValueError(
                    f"gradlane: sparse allreduce of {_describe(mine)} on rank {self._rank}, "
                    f"but rank {r} has {_DTYPES[int(theirs[3])]} of shape "
                    f"{tuple(theirs[_FIELDS:_FIELDS + dims].tolist())} with "
                    f"{int(theirs[1])} sparse dims"
                )
        payload = _payload(mine)
        row = _row_bytes(mine)
        outs = [np.empty(int(headers[r, 0]) * row, np.uint8) for r in range(n)]
        self.group.all_to_all([payload] * n, outs)
        indices, values = [], []
        dense_shape = mine.shape[mine.sparse_dim():]
        for r, out in enumerate(outs):
            nnz = int(headers[r, 0])
            idx_bytes = nnz * mine.sparse_dim() * 8
            flat = torch.from_numpy(out)
            indices.append(flat[:idx_bytes].view(torch.int64).view(mine.sparse_dim(), nnz))
            # A copy: the values' offset need not be a multiple of their size.
            values.append(flat[idx_bytes:].clone().view(mine.dtype).view(nnz, *dense_shape))
        # Checked: indices out of the shape (a peer's bytes) would make
        # torch write out of bounds where it should raise.
        try:
            total = torch.sparse_coo_tensor(
                torch.cat(indices, dim=1), torch.cat(values), mine.shape, check_invariants=True
            )
        except RuntimeError as e:
            raise ValueError(f"gradlane: sparse allreduce: a peer's indices: {e}") from e
        return total.coalesce()


def _row_bytes(s):
    """The bytes one nonzero of ``s`` takes: its indices and its values."""
    dense = 1
    for d in s.shape[s.sparse_dim():]:
        dense *= d
    return s.sparse_dim() * 8 + dense * s.element_size()


def _payload(s):
    """A coalesced tensor's indices then values, as one uint8 array."""
    idx = s.indices().contiguous().view(-1).view(torch.uint8)
    vals = s.values().contiguous().view(-1).view(torch.uint8)
    return torch.cat([idx, vals]).numpy()


def _describe(s):
    return f"{s.dtype} of shape {tuple(s.shape)} with {s.sparse_dim()} sparse dims"
