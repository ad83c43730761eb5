"""The ops of a drop-in torch.distributed backend (issue 55) over gradlane,
against gloo in the same processes and against references computed in
rank order: every dtype and op of the reductions, reduce, gather,
scatter, all-to-all (uneven splits), the coalesced forms, the
reduce-scatter variants, non-contiguous tensors, new_group,
monitored_barrier naming the rank that stayed away, and the mixed
backend strings.

One set of rank processes runs every check (rank processes are most of
the time); the test functions compare what they recorded.
"""

import datetime

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from test_torch import run_ranks  # noqa: E402

#: The world sizes every check runs at.
WORLDS = [2, 3]
R = dist.ReduceOp
DTYPES = [
    torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool,
]
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
INTEGRAL = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)


def values(rank, dtype, n=9):
    """Rank `rank`'s values: integers over their whole range (sums and
    products wrap), floats with fractions and signs."""
    g = torch.Generator().manual_seed(100 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype in INTEGRAL:
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dtype)


def reference(dtype, op, parts):
    """The reduction in rank order, as gradlane defines it: 16/32-bit floats
    in float32 rounded once, everything else in its own type."""
    wide = dtype in (torch.bfloat16, torch.float16)
    acc = parts[0].float() if wide else parts[0].clone()
    for p in parts[1:]:
        p = p.float() if wide else p
        acc = {
            "SUM": lambda a, b: a + b, "AVG": lambda a, b: a + b,
            "PRODUCT": lambda a, b: a * b, "MIN": torch.minimum, "MAX": torch.maximum,
            "BAND": lambda a, b: a & b, "BOR": lambda a, b: a | b, "BXOR": lambda a, b: a ^ b,
        }[op](acc, p)
    if op == "AVG":
        acc = acc / len(parts)
    return acc.to(dtype)


def outcome(fn):
    """What a call did: ("ok", value) or (exception class name, message)."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - recorded for the test
        return (type(e).__name__, str(e))


def bits(t):
    """A tensor's bytes, for bit-exact comparison."""
    t = t.contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


#: Sparse cases: (sparse dims, dense dims, dtype).
SPARSE_CASES = [(1, 0, torch.float32), (2, 0, torch.float64), (1, 2, torch.float32),
                (3, 1, torch.int64)]


def sparse_values(rank, sparse_dims, dense_dims, dtype):
    """Rank `rank`'s sparse tensor: indices that overlap the other ranks'
    (and repeat within it: uncoalesced), values of its own."""
    g = torch.Generator().manual_seed(200 + rank)
    nnz = 3 + rank
    idx = torch.randint(0, 4, (sparse_dims, nnz), generator=g)
    vals = values(rank, dtype, nnz * 2 ** dense_dims).reshape(nnz, *[2] * dense_dims)
    return torch.sparse_coo_tensor(idx, vals, [4] * sparse_dims + [2] * dense_dims,
                                   check_invariants=True)


def sparse_bits(t):
    """A sparse tensor's coalesced shape, indices and values, for comparison."""
    t = t.coalesce()
    return (tuple(t.shape), bits(t.indices()), bits(t.values()))


def scenario_ops(rank, file_dir):
    out = {}
    dist.init_process_group("gradlane")
    gloo = dist.new_group(backend="gloo")
    world = dist.get_world_size()
    stager = dist.distributed_c10d._get_default_group()._stager
    out["staged"] = stager.needs_staging([torch.zeros(1)])

    def both(fn):
        """fn(group) over gradlane (the default group) and over gloo."""
        return {"gradlane": outcome(lambda: fn(None)), "gloo": outcome(lambda: fn(gloo))}

    # Every dtype and op of all_reduce.
    for dtype in DTYPES:
        for op in OPS:
            def ar(group, dtype=dtype, op=op):
                t = values(rank, dtype)
                dist.all_reduce(t, op=getattr(R, op), group=group)
                return bits(t)
            out[("all_reduce", str(dtype), op)] = both(ar)

    # The count every evaluation loop sums.
    count = torch.tensor(5 + rank, dtype=torch.int64)
    dist.all_reduce(count)
    out["count"] = int(count)

    # Complex, as its real view (torch's all_reduce passes it so).
    def complex_sum(group):
        t = torch.complex(values(rank, torch.float64), values(rank + 7, torch.float64))
        dist.all_reduce(t, group=group)
        return bits(t)
    out["complex"] = both(complex_sum)

    # Non-contiguous tensors: reduced, broadcast, gathered into.
    def noncontig(group):
        t = (torch.arange(12, dtype=torch.int32).reshape(3, 4) * (rank + 1)).t()
        dist.all_reduce(t, group=group)
        b = (torch.arange(6, dtype=torch.float64).reshape(2, 3) + rank).t()
        dist.broadcast(b, src=1, group=group)
        outs = [torch.zeros(4, 3, dtype=torch.int32).t() for _ in range(world)]
        dist.all_gather(outs, torch.full((3, 4), rank, dtype=torch.int32), group=group)
        return [bits(t), bits(b)] + [bits(o) for o in outs]
    out["noncontig"] = both(noncontig)

    # reduce to rank 1: int64 sum and float32 max.
    def reduce(group):
        a = values(rank, torch.int64)
        dist.reduce(a, dst=1, group=group)
        b = values(rank, torch.float32)
        dist.reduce(b, dst=1, op=R.MAX, group=group)
        return [bits(a), bits(b)] if rank == 1 else None
    out["reduce"] = both(reduce)

    # gather to 0, scatter from 1 (int32, bool; gloo has no int16).
    def gather_scatter(group):
        got = [torch.zeros(5, dtype=torch.int32) for _ in range(world)] if rank == 0 else None
        dist.gather(values(rank, torch.int32, 5), got, dst=0, group=group)
        parts = [values(10 + q, torch.bool, 4) for q in range(world)] if rank == 1 else None
        mine = torch.zeros(4, dtype=torch.bool)
        dist.scatter(mine, parts, src=1, group=group)
        return [bits(g) for g in got or []] + [bits(mine)]
    out["gather_scatter"] = both(gather_scatter)

    def gather_single(group):
        got = torch.zeros(world, 3, dtype=torch.float64) if rank == 0 else None
        dist.gather_single(values(rank, torch.float64, 3), got, dst=0, group=group)
        return bits(got) if rank == 0 else None
    out["gather_single"] = both(gather_single)

    # all_to_all_single with uneven splits: rank r sends r + d + 1 rows to d.
    def a2a_single(group):
        send = [rank + d + 1 for d in range(world)]
        recv = [s + rank + 1 for s in range(world)]
        inp = torch.arange(sum(send) * 3, dtype=torch.float64).reshape(-1, 3) + 100 * rank
        outp = torch.zeros(sum(recv), 3, dtype=torch.float64)
        dist.all_to_all_single(outp, inp, recv, send, group=group)
        even_in = torch.arange(world * 2, dtype=torch.int64) + 10 * rank
        even_out = torch.zeros_like(even_in)
        dist.all_to_all_single(even_out, even_in, group=group)
        return [bits(outp), bits(even_out)]
    out["a2a_single"] = both(a2a_single)

    # In place, output and input one tensor (gloo reads what it already
    # overwrote here: against the reference only).
    same = torch.arange(world * 2, dtype=torch.int32) + 10 * rank
    dist.all_to_all_single(same, same)
    out["a2a_in_place"] = bits(same)

    def a2a_list(group):
        ins = [torch.full((2,), 10 * rank + d, dtype=torch.int32) for d in range(world)]
        outs = [torch.zeros(2, dtype=torch.int32) for _ in range(world)]
        dist.all_to_all(outs, ins, group=group)
        return [bits(o) for o in outs]
    out["a2a_list"] = both(a2a_list)

    def coalesced(group):
        a, b = values(rank, torch.float64, 4), values(rank + 5, torch.float64, 3)
        dist.all_reduce_coalesced([a, b], group=group)
        ins = [values(rank, torch.int64, 2), values(rank + 5, torch.int64, 3)]
        outs = [[torch.zeros_like(t) for t in ins] for _ in range(world)]
        dist.all_gather_coalesced(outs, ins, group=group)
        return [bits(a), bits(b)] + [bits(o) for os_ in outs for o in os_]
    out["coalesced"] = both(coalesced)

    def reduce_scatter(group):
        inp = values(rank, torch.int64, 2 * world)
        o = torch.zeros(2, dtype=torch.int64)
        dist.reduce_scatter_tensor(o, inp, group=group)
        parts = [values(rank + 3 * q, torch.float64, 3) for q in range(world)]
        o2 = torch.zeros(3, dtype=torch.float64)
        dist.reduce_scatter(o2, parts, op=R.MAX, group=group)
        return [bits(o), bits(o2)]
    out["reduce_scatter"] = both(reduce_scatter)

    # Sparse COO tensors (SUM, as gloo): sparse and dense dims, several dtypes.
    def sparse(group):
        got = []
        for case in SPARSE_CASES:
            t = sparse_values(rank, *case)
            dist.all_reduce(t, group=group)
            got.append(sparse_bits(t))
        return got
    out["sparse"] = both(sparse)
    # Shapes that differ among the ranks: an error on every rank, not a hang.
    odd = torch.sparse_coo_tensor([[0]], [1.0], (3 + rank,), check_invariants=True)
    out["sparse_mismatch"] = outcome(lambda: dist.all_reduce(odd))

    # An embedding with sparse gradients under DDP (its reducer allreduces
    # them sparse): the same weights as over gloo.
    def sparse_ddp(group):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Embedding(50, 4, sparse=True), process_group=group)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for step in range(3):
            ids = torch.tensor([(7 * rank + 3 * step + k) % 50 for k in range(6)])
            model(ids).square().sum().backward()
            opt.step()
            opt.zero_grad()
        return bits(model.module.weight.detach())
    out["sparse_ddp"] = both(sparse_ddp)

    # A gradlane subgroup and a monitored barrier all come to.
    sub = dist.new_group(ranks=list(range(world)), backend="gradlane")
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t, group=sub)
    out["new_group"] = int(t)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    # Point-to-point on the subgroup: a ring.
    got = torch.zeros(1, dtype=torch.int64)
    dist.send(torch.tensor([rank]), dst=(rank + 1) % world, group=sub)
    dist.recv(got, src=(rank - 1) % world, group=sub)
    out["ring"] = int(got)
    pg = dist.distributed_c10d._get_default_group()
    out["reconfigure"] = outcome(lambda: pg.reconfigure())
    pg._wait_for_pending_works()

    def split():
        pairs = dist.split_group(split_ranks=[list(range(world))])
        t = torch.tensor([rank + 1], dtype=torch.int64)
        dist.all_reduce(t, group=pairs)
        return int(t)
    out["split"] = outcome(split)

    # Last: rank 1 stays away from a monitored barrier on a subgroup (which
    # is unusable afterwards). Ranks beyond 1 wait as long as rank 0 the
    # first time (their own timeout or rank 0's giving up, whichever comes
    # first, ends their wait), ten times as long the second (rank 0's
    # giving up does).
    for wait_all in (False, True):
        watched = dist.new_group(ranks=list(range(world)), backend="gradlane")
        seconds = 10 if wait_all and rank > 1 else 1
        if rank != 1:
            out[("monitored", wait_all)] = outcome(lambda: dist.monitored_barrier(
                watched, timeout=datetime.timedelta(seconds=seconds), wait_all_ranks=wait_all))
    dist.barrier(gloo)
    dist.destroy_process_group()

    # The mixed backend strings, each a process group of its own.
    for i, spec in enumerate(["cpu:gloo,cuda:gradlane", "cpu:gradlane", "cuda:gradlane"]):
        def mixed(spec=spec, i=i):
            dist.init_process_group(
                spec, init_method=f"file://{file_dir}/store{i}", rank=rank, world_size=world
            )
            try:
                t = torch.tensor([rank + 1], dtype=torch.int64)
                dist.all_reduce(t)
                cpu = dist.distributed_c10d._get_default_group()._cpu_backend
                return int(t), type(cpu).__name__
            finally:
                dist.destroy_process_group()
        out[("mixed", spec)] = outcome(mixed)
    return out


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w}ranks")
def ops(request, cert_dir, tmp_path_factory):
    """What every rank recorded, by rank, at 2 and 3 ranks."""
    d = str(tmp_path_factory.mktemp("stores"))
    return run_ranks(scenario_ops, cert_dir, d, world=request.param)


def test_every_dtype_and_op_reduces_as_gloo_or_errs_where_it_does(ops):
    world = len(ops)
    parts = {dtype: [values(r, dtype) for r in range(world)] for dtype in DTYPES}
    for r in range(world):
        for dtype in DTYPES:
            for op in OPS:
                got = ops[r][("all_reduce", str(dtype), op)]
                (gl, gv), (gg, gm) = got["gradlane"], got["gloo"]
                bitwise_on_float = op.startswith("B") and dtype not in INTEGRAL
                if bitwise_on_float or (op == "AVG" and dtype in INTEGRAL):
                    assert gl == "TypeError" and op in gv, (dtype, op, got)
                    continue
                assert gl == "ok", (dtype, op, gv)
                want = bits(reference(dtype, op, parts[dtype]))
                assert gv == want, (dtype, op)
                # Where gloo reduces (it has no AVG), it agrees bit for bit
                # where the order of the ranks cannot show: at two ranks,
                # and for integers, MIN and MAX at any number (gloo sums
                # floats in an order of its own).
                exact_in_any_order = dtype in INTEGRAL or op in ("MIN", "MAX")
                if gg == "ok" and (world == 2 or exact_in_any_order):
                    if dtype == torch.bool:
                        # gloo adds bools as bytes (True + True is a byte 2);
                        # gradlane's are 0 or 1, as torch's own sum of bools.
                        gm = bytes(int(b != 0) for b in gm)
                    assert gv == gm, (dtype, op)


def test_an_int64_count_sums(ops):
    world = len(ops)
    for r in range(world):
        assert ops[r]["count"] == sum(5 + q for q in range(world))


def float_sums_in_rank_order(what, world):
    """What "complex" and "coalesced" (float64 sums) end with, summed in
    rank order: gloo sums in an order of its own beyond two ranks."""
    def summed(parts):
        acc = parts[0].clone()
        for p in parts[1:]:
            acc = acc + p
        return acc
    if what == "complex":
        return bits(summed([torch.complex(values(q, torch.float64), values(q + 7, torch.float64))
                            for q in range(world)]))
    a = summed([values(q, torch.float64, 4) for q in range(world)])
    b = summed([values(q + 5, torch.float64, 3) for q in range(world)])
    gathered = [bits(t) for q in range(world)
                for t in (values(q, torch.int64, 2), values(q + 5, torch.int64, 3))]
    return [bits(a), bits(b)] + gathered


def test_data_movement_and_reductions_equal_gloos_bit_for_bit(ops):
    world = len(ops)
    for r in range(world):
        for what in ["complex", "noncontig", "reduce", "gather_scatter", "a2a_single",
                     "a2a_list", "coalesced", "reduce_scatter"]:
            got = ops[r][what]
            assert got["gradlane"][0] == "ok", (what, got["gradlane"])
            assert got["gloo"][0] == "ok", f"gloo failed {what}: {got['gloo']}"
            if what in ("complex", "coalesced"):
                assert got["gradlane"][1] == float_sums_in_rank_order(what, world), (r, what)
                if world > 2:
                    continue
            assert got["gradlane"][1] == got["gloo"][1], (r, what)


def test_a_sparse_allreduce_sums_as_gloo(ops):
    world = len(ops)
    for i, case in enumerate(SPARSE_CASES):
        # Each rank's tensor coalesced, then summed in rank order.
        parts = [sparse_values(r, *case).coalesce() for r in range(world)]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        want = sparse_bits(total)
        for r in range(world):
            kind, got = ops[r]["sparse"]["gradlane"]
            assert kind == "ok", got
            assert got[i] == want, (r, case)
            if ops[r]["sparse"]["gloo"][0] == "ok":
                assert ops[r]["sparse"]["gloo"][1][i] == want, (r, case)


def test_sparse_tensors_of_other_shapes_are_a_value_error_on_every_rank(ops):
    world = len(ops)
    for r in range(world):
        kind, msg = ops[r]["sparse_mismatch"]
        assert kind == "ValueError" and "shape" in msg, (kind, msg)


def test_sparse_gradients_under_ddp_end_as_over_gloo(ops):
    world = len(ops)
    for r in range(world):
        kind, got = ops[r]["sparse_ddp"]["gradlane"]
        assert kind == "ok", got
        assert ops[r]["sparse_ddp"]["gloo"] == ("ok", got), r
    assert ops[0]["sparse_ddp"]["gradlane"] == ops[1]["sparse_ddp"]["gradlane"]


def test_gather_into_one_tensor(ops):
    world = len(ops)
    want = torch.stack([values(r, torch.float64, 3) for r in range(world)])
    kind, got = ops[0]["gather_single"]["gradlane"]
    assert kind == "ok" and got == bits(want), got
    if ops[0]["gather_single"]["gloo"][0] == "ok":
        assert ops[0]["gather_single"]["gloo"][1] == got


def test_uneven_all_to_all_single_against_the_reference(ops):
    world = len(ops)
    for r in range(world):
        want = []
        for s in range(world):
            send = [s + d + 1 for d in range(world)]
            rows = torch.arange(sum(send) * 3, dtype=torch.float64).reshape(-1, 3) + 100 * s
            start = sum(send[:r])
            want.append(rows[start:start + send[r]])
        assert ops[r]["a2a_single"]["gradlane"][1][0] == bits(torch.cat(want))


def test_all_to_all_single_in_place(ops):
    world = len(ops)
    for r in range(world):
        want = torch.tensor([10 * s + 2 * r + k for s in range(world) for k in range(2)],
                            dtype=torch.int32)
        assert ops[r]["a2a_in_place"] == bits(want)


def test_new_group_and_a_monitored_barrier_all_come_to(ops):
    world = len(ops)
    for r in range(world):
        assert ops[r]["new_group"] == sum(range(1, world + 1))
        assert ops[r]["ring"] == (r - 1) % world
        kind, msg = ops[r]["reconfigure"]
        assert kind == "NotImplementedError" and "reconfigure" in msg


def test_monitored_barrier_names_the_rank_that_stayed_away(ops):
    world = len(ops)
    # The ranks that came are not let through, as gloo's say, whether
    # their own wait or rank 0's giving up ended it.
    for r in range(2, world):
        for wait_all in (False, True):
            kind, msg = ops[r][("monitored", wait_all)]
            assert kind == "MonitoredBarrierError", (r, wait_all, kind, msg)
            want = (f"Rank {r} successfully reached monitoredBarrier, but received errors "
                    "while waiting for send/recv from rank 0")
            assert want in msg, msg
    kind, msg = ops[0][("monitored", False)]
    assert kind == "MonitoredBarrierError", (kind, msg)
    assert "Rank 1 failed to pass monitoredBarrier in 1000 ms" in msg, msg
    kind, msg = ops[0][("monitored", True)]
    assert kind == "MonitoredBarrierError", (kind, msg)
    assert "Ranks 1 failed to pass monitoredBarrier in 1000 ms" in msg, msg


def test_split_group(ops):
    world = len(ops)
    for r in range(world):
        kind, got = ops[r]["split"]
        assert kind == "ok", got
        assert got == sum(range(1, world + 1))


def test_mixed_backend_strings(ops):
    world = len(ops)
    for r in range(world):
        for spec in ["cpu:gloo,cuda:gradlane", "cpu:gradlane", "cuda:gradlane"]:
            kind, got = ops[r][("mixed", spec)]
            assert kind == "ok", (spec, got)
            assert got[0] == sum(range(1, world + 1)), spec
            # CPU tensors go to gloo where the string says so.
            want = "ProcessGroupGloo" if spec.startswith("cpu:gloo") else "NoneType"
            assert got[1] == want, (spec, got)


def test_byte_views_cover_every_dtype():
    from gradlane.torch._ops import byte_view

    for dtype in DTYPES:
        t = values(0, dtype, 3)
        assert byte_view(t).nbytes == t.numel() * t.element_size()


def test_staged_ops_give_the_same_results(ops, cert_dir, tmp_path_factory):
    """The path CUDA tensors take (staged through host buffers), run on CPU
    tensors: every op records what it did unstaged."""
    world = len(ops)
    d = str(tmp_path_factory.mktemp("stores-staged"))
    staged = run_ranks(
        scenario_ops, cert_dir, d, world=world, extra_env={"GRADLANE_STAGE_CPU_TENSORS": "1"}
    )
    for r in range(world):
        assert staged[r].pop("staged") and not ops[r]["staged"]
        assert staged[r].keys() == ops[r].keys() - {"staged"}
        for key, got in staged[r].items():
            if key[0] == "monitored" and r > 1:
                # Which of two ends of its wait came first shows in the
                # message after gloo's words.
                got, unstaged = got[1].split(" (gradlane")[0], ops[r][key][1].split(" (gradlane")[0]
                assert got == unstaged, (r, key)
                continue
            assert got == ops[r][key], (r, key)
