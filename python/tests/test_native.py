"""Tests of gradlane's native Python package (numpy only, no torch).

Groups of three ranks run as three processes (multiprocessing "spawn") on
loopback, with certificates made by gradlane.generate_certs. Each rank
reports what it computed through a queue; the test process checks it
against numpy, bit for bit. Every wait is bounded (a queue timeout), and
nothing waits for time to pass: a rank that should fail fails by QUIC's
idle timeout, which the test sets short.
"""

import multiprocessing
import os
import socket
import traceback

import numpy as np
import pytest

import gradlane
from rank_processes import collect

WORLD = 3
# Sizes of the exact collectives: empty, one value, odd sizes that do not
# split evenly over three ranks.
SIZES = [0, 1, 7, 1001]
# A bucket like a small CNN's: conv kernels (chunked per kernel) and dense
# tensors (chunked in 1 KiB blocks).
BUCKET = [
    ("conv1.weight", [16, 8, 3, 3], "conv2d"),
    ("conv1.bias", [16], "dense"),
    ("fc.weight", [10, 300], "dense"),
    ("fc.bias", [10], "dense"),
]
BUCKET_VALUES = sum(int(np.prod(shape)) for _, shape, _ in BUCKET)
# A larger one for the lossy runs (473 KB): its lossy fifth makes some
# seventy datagrams per rank and step, so that at 5% loss some are lost
# (at least one in 630 all but surely: 0.95^630 < 1e-14).
LOSSY_BUCKET = [
    ("conv.weight", [64, 32, 3, 3], "conv2d"),
    ("fc.weight", [100, 1000], "dense"),
]
LOSSY_BUCKET_VALUES = sum(int(np.prod(shape)) for _, shape, _ in LOSSY_BUCKET)
# Generous bounds on a whole scenario: they only turn a hang into a
# failure, they are not what any test measures.
RESULT_TIMEOUT = 180.0


def values(rank, size, salt=0):
    """Rank `rank`'s deterministic float32 input of `size` values."""
    rng = np.random.default_rng(10_000 * salt + 100 * rank + size)
    return (rng.standard_normal(size) * 3.0).astype(np.float32)


def gradient(rank, step, n=BUCKET_VALUES):
    """A rank's gradient of `n` values: magnitudes that differ by chunk,
    so that the important chunks differ between ranks."""
    rng = np.random.default_rng(7919 * rank + step)
    scales = np.exp(rng.uniform(0.0, 8.0, size=n // 64 + 1))
    scale = np.repeat(scales, 64)[:n]
    return ((rng.uniform(size=n) - 0.5) * scale).astype(np.float32)


def rank_sum(parts):
    """The sum of `parts` in rank order, in float32, as gradlane sums."""
    acc = np.zeros_like(parts[0], dtype=np.float32)
    for p in parts:
        acc += p
    return acc


def bits(a):
    """The raw bits of a float32 array, for exact comparisons."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_same_bits(got, want, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    differ = np.flatnonzero(bits(got) != bits(want))
    assert differ.size == 0, (
        f"{what}: {differ.size} of {got.size} values differ, first at "
        f"{differ[:5].tolist()}: {got[differ[:5]]} vs {want[differ[:5]]}"
    )


def free_port():
    """A loopback UDP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- ranks
# Each scenario runs in every rank's process and returns what the test
# checks (plain Python objects and bytes, so they cross the queue as they
# are).


def scenario_exact(g):
    """Every exact collective at every size, a bad call before each (which
    must fail locally without putting the ranks out of step), and the
    differentiated allreduce without loss next to the exact one."""
    rank = g.rank
    out = {"bad": []}

    def bad(call):
        try:
            call()
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["bad"].append((type(e).__name__, str(e)))
        else:
            out["bad"].append(("no error", ""))

    for n in SIZES:
        x = values(rank, n)
        bad(lambda: g.allreduce(x.astype(np.float64)))
        a = x.copy()
        g.allreduce(a, op="sum")
        out[f"allreduce_sum_{n}"] = a.tobytes()
        a = x.copy()
        g.allreduce(a, op="mean")
        out[f"allreduce_mean_{n}"] = a.tobytes()
        b = x.copy() if rank == 1 else np.full(n, np.nan, np.float32)
        g.broadcast(1, b)
        out[f"broadcast_{n}"] = b.tobytes()
        gathered = np.empty(n * WORLD, np.float32)
        bad(lambda: g.allgather(x, np.empty(n * WORLD + 1, np.float32)))
        g.allgather(x, gathered)
        out[f"allgather_{n}"] = gathered.tobytes()
        parts = values(rank, n * WORLD, salt=1)
        scattered = np.empty(n, np.float32)
        g.reduce_scatter(parts, scattered, op="sum")
        out[f"reduce_scatter_{n}"] = scattered.tobytes()
        g.barrier()

    bucket = g.register_bucket(BUCKET, recovery="zero_fill")
    grad = gradient(rank, 0)
    d = grad.copy()
    stats = g.allreduce_differentiated(bucket, d, op="mean")
    e = grad.copy()
    g.allreduce(e, op="mean")
    out["differentiated"] = d.tobytes()
    out["exact_mean"] = e.tobytes()
    out["stats"] = stats
    out["bytes_sent"] = g.bytes_sent
    return out


def scenario_lossy(g):
    """Three steps of the differentiated allreduce with seeded loss on
    every rank's outgoing packets."""
    bucket = g.register_bucket(LOSSY_BUCKET, recovery="zero_fill")
    steps, stats = [], []
    for step in range(3):
        buf = gradient(g.rank, step, LOSSY_BUCKET_VALUES)
        stats.append(g.allreduce_differentiated(bucket, buf, op="mean"))
        steps.append(buf.tobytes())
    return {"steps": steps, "stats": stats}


def scenario_dies(g):
    """Rank 2 leaves without a word (no close: its process ends at once);
    the others' next collectives must fail naming it."""
    g.barrier()
    if g.rank == 2:
        # A collective returns once this rank holds what it needs, not
        # once its own messages left: an exit right after the first
        # barrier could take this rank's part of it along and fail the
        # others there. The second completes only once the others have
        # passed the first.
        g.barrier()
        os._exit(0)
    try:
        g.barrier()
        g.allreduce(values(g.rank, 1 << 16))
    except gradlane.GroupError as e:
        return {
            "type": type(e).__name__,
            "is_group_error": isinstance(e, gradlane.GroupError),
            "rank": e.rank,
            "message": str(e),
        }
    return {"type": None}


def bf16_bits(a):
    """float32 values rounded to the nearest bfloat16 (ties to even), as
    the 16-bit integers a bfloat16 tensor's view(torch.int16) shows."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).view(np.int16)


def bf16_values(bits16):
    """The float32 values of bfloat16 bits."""
    return (np.asarray(bits16).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def scenario_formats(g):
    """16-bit buffers through the exact reductions (every op), then a
    bfloat16 bucket and an f32 bucket in bf16 + log8 through the
    differentiated allreduce with seeded loss."""
    rank, out = g.rank, {}
    x = values(rank, 1001)
    for op in ("sum", "mean", "max", "min"):
        h = x.astype(np.float16)
        g.allreduce(h, op=op)
        out[f"f16_{op}"] = h.tobytes()
        b = bf16_bits(x)
        g.allreduce(b, op=op, dtype="bfloat16")
        out[f"bf16_{op}"] = b.tobytes()
    parts = bf16_bits(values(rank, 30, salt=2))
    mine = np.empty(10, np.int16)
    g.reduce_scatter(parts, mine, op="sum", dtype="bfloat16")
    out["bf16_reduce_scatter"] = mine.tobytes()

    steps = []
    packed = g.register_bucket(
        LOSSY_BUCKET, important_format="bf16", lossy_format="log8", lossy_return=True
    )
    native = g.register_bucket(LOSSY_BUCKET, dtype="bfloat16", recovery="rescale")
    stats = []
    for step in range(3):
        f = gradient(rank, step, LOSSY_BUCKET_VALUES)
        stats.append(g.allreduce_differentiated(packed, f, op="mean"))
        b = bf16_bits(gradient(rank, 10 + step, LOSSY_BUCKET_VALUES))
        stats.append(g.allreduce_differentiated(native, b, op="mean"))
        steps.append((f.tobytes(), b.tobytes()))
    out["steps"], out["stats"] = steps, stats
    return out


STRIPED = 300_001


def scenario_striped(g):
    """An allreduce and an allgather large enough to be striped over the
    paths of a group whose ranks have several sockets."""
    x = values(g.rank, STRIPED)
    a = x.copy()
    g.allreduce(a, op="sum")
    gathered = np.empty(STRIPED * WORLD, np.float32)
    g.allgather(x, gathered)
    return {"sum": a.tobytes(), "gathered": gathered.tobytes()}


SCENARIOS = {
    "exact": scenario_exact,
    "striped": scenario_striped,
    "lossy": scenario_lossy,
    "dies": scenario_dies,
    "formats": scenario_formats,
}


def rank_main(scenario, rank, root, cert_dir, options, results, done):
    """One rank's process: join, run the scenario, report, and keep the
    group open until the test has every rank's report (so that no rank's
    closing reaches another before that one has reported)."""
    try:
        g = gradlane.Group(
            rank, WORLD, root=f"127.0.0.1:{root}", cert_dir=cert_dir, **options
        )
        out = SCENARIOS[scenario](g)
        results.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((rank, "error", traceback.format_exc()))
        return
    done.wait(RESULT_TIMEOUT)
    g.close()


def run_ranks(scenario, cert_dir, options=None, expect=WORLD):
    """Runs `scenario` on WORLD ranks and returns the reports of the first
    `expect` ranks to report, by rank."""
    ctx = multiprocessing.get_context("spawn")
    results, done = ctx.Queue(), ctx.Event()
    root = free_port()
    procs = [
        ctx.Process(
            target=rank_main,
            args=(scenario, r, root, cert_dir, options or {}, results, done),
            daemon=True,
        )
        for r in range(WORLD)
    ]
    return collect(procs, results, expect, RESULT_TIMEOUT, done=done)


# ---------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def exact(cert_dir):
    return run_ranks("exact", cert_dir)


@pytest.mark.parametrize("n", SIZES)
def test_exact_collectives_equal_numpy_bit_for_bit(exact, n):
    inputs = [values(r, n) for r in range(WORLD)]
    total = rank_sum(inputs)
    parts = [values(r, n * WORLD, salt=1) for r in range(WORLD)]
    for r in range(WORLD):
        got = {k: np.frombuffer(v, np.float32) for k, v in exact[r].items()
               if isinstance(v, bytes)}
        assert_same_bits(got[f"allreduce_sum_{n}"], total, f"rank {r} sum")
        assert_same_bits(
            got[f"allreduce_mean_{n}"], total / np.float32(WORLD), f"rank {r} mean"
        )
        assert_same_bits(got[f"broadcast_{n}"], inputs[1], f"rank {r} broadcast")
        assert_same_bits(
            got[f"allgather_{n}"], np.concatenate(inputs), f"rank {r} allgather"
        )
        want = rank_sum([p[r * n:(r + 1) * n] for p in parts])
        assert_same_bits(got[f"reduce_scatter_{n}"], want, f"rank {r} reduce_scatter")


def test_differentiated_allreduce_without_loss_equals_exact(exact):
    want = rank_sum([gradient(r, 0) for r in range(WORLD)]) / np.float32(WORLD)
    for r in range(WORLD):
        d = np.frombuffer(exact[r]["differentiated"], np.float32)
        e = np.frombuffer(exact[r]["exact_mean"], np.float32)
        assert_same_bits(d, e, f"rank {r}: differentiated vs exact")
        assert_same_bits(d, want, f"rank {r}: differentiated vs numpy")
        stats = exact[r]["stats"]
        assert stats["missing_ranges"] == stats["lost_ranges"] == 0, stats
        assert stats["zero_filled_lossy_bytes"] == 0, stats
        # The lossy share did travel as such (loss_tolerance 0.2).
        assert stats["sent_lossy_bytes"] > 0, stats
        assert stats["sent_important_bytes"] > stats["sent_lossy_bytes"], stats
        assert exact[r]["bytes_sent"] > 0


def test_bad_calls_fail_locally_and_keep_ranks_in_step(exact):
    # Each rank made a float64 allreduce and a wrong-size allgather before
    # the good calls, which all succeeded (checked above).
    for r in range(WORLD):
        kinds = {k for k, _ in exact[r]["bad"]}
        assert kinds == {"TypeError", "ValueError"}, exact[r]["bad"]


def test_with_injected_loss_every_rank_ends_with_the_same_bits(cert_dir):
    got = {}
    # Each rank drops 5% of its outgoing packets, seeded per rank.
    for r, out in run_ranks("lossy", cert_dir, {"injected_loss": 0.05}).items():
        got[r] = out
    for step in range(3):
        first = np.frombuffer(got[0]["steps"][step], np.float32)
        assert np.isfinite(first).all()
        for r in range(1, WORLD):
            assert_same_bits(
                np.frombuffer(got[r]["steps"][step], np.float32),
                first,
                f"step {step}: rank {r} vs rank 0",
            )
    stats = [s for r in range(WORLD) for s in got[r]["stats"]]
    assert all(s["sent_lossy_bytes"] > 0 for s in stats)
    # Loss did happen, and every rank was told of what it lost: the
    # chunks owners missed are the chunks senders lost.
    missing = sum(s["missing_ranges"] for s in stats)
    assert missing > 0, stats
    assert missing == sum(s["lost_ranges"] for s in stats), stats


def test_sixteen_bit_buffers_and_formats_keep_every_rank_identical(cert_dir):
    got = run_ranks("formats", cert_dir, {"injected_loss": 0.05, "seed": 3})
    x = [values(r, 1001) for r in range(WORLD)]
    for op, combine in [
        ("sum", lambda a: rank_sum(a)),
        ("mean", lambda a: rank_sum(a) / np.float32(WORLD)),
        ("max", lambda a: np.maximum.reduce(a)),
        ("min", lambda a: np.minimum.reduce(a)),
    ]:
        want16 = combine([v.astype(np.float16).astype(np.float32) for v in x]).astype(np.float16)
        wantb = bf16_bits(combine([bf16_values(bf16_bits(v)) for v in x]))
        for r in range(WORLD):
            assert got[r][f"f16_{op}"] == want16.tobytes(), (op, r)
            assert got[r][f"bf16_{op}"] == wantb.tobytes(), (op, r)
    parts = [bf16_values(bf16_bits(values(r, 30, salt=2))) for r in range(WORLD)]
    for r in range(WORLD):
        want = bf16_bits(rank_sum([p[10 * r:10 * (r + 1)] for p in parts]))
        assert got[r]["bf16_reduce_scatter"] == want.tobytes(), r
    for step in range(3):
        for r in range(1, WORLD):
            assert got[r]["steps"][step] == got[0]["steps"][step], (step, r)
        f = np.frombuffer(got[0]["steps"][step][0], np.float32)
        assert np.isfinite(f).all()
    # bf16 + log8 puts about 0.45 of the f32 bytes on the wire; a bf16
    # bucket half.
    for r in range(WORLD):
        packed, native = got[r]["stats"][0::2], got[r]["stats"][1::2]
        for s in packed + native:
            assert s["sent_important_bytes"] > 0 and s["return_bytes"] > 0, s
        sent = sum(s["sent_important_bytes"] + s["sent_lossy_bytes"] for s in packed)
        values_sent = 3 * LOSSY_BUCKET_VALUES * (WORLD - 1) / WORLD
        assert 0.40 < sent / (4 * values_sent) < 0.5, sent / (4 * values_sent)


def test_a_rank_that_exits_is_named_by_the_others(cert_dir):
    # A 3 s idle timeout: a silent link fails after 3 s; the queue timeout
    # bounds the whole test.
    got = run_ranks("dies", cert_dir, {"idle_timeout": 3.0}, expect=WORLD - 1)
    assert set(got) == {0, 1}
    for r, out in got.items():
        assert out["type"] == "RankFailedError", (r, out)
        assert out["is_group_error"]
        assert out["rank"] == 2, (r, out)
        assert "rank 2" in out["message"], (r, out)


# ------------------------------------------- input checks on one rank
# A group of one rank runs every check of the input without a network.


@pytest.fixture
def solo(cert_dir):
    with gradlane.Group(0, 1, root=f"127.0.0.1:{free_port()}", cert_dir=cert_dir) as g:
        yield g


def test_bad_buffers_are_type_and_value_errors(solo):
    good = np.zeros(6, np.float32)
    with pytest.raises(TypeError, match="float32"):
        solo.allreduce(np.zeros(6, np.float64))
    with pytest.raises(TypeError):
        solo.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="C-contiguous"):
        solo.allreduce(good[::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        solo.allreduce(np.zeros((4, 3), np.float32).T)
    read_only = np.zeros(6, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        solo.allreduce(read_only)
    with pytest.raises(ValueError, match="read-only"):
        solo.allgather(good, read_only)
    solo.allgather(read_only, good)  # a read-only input is fine
    with pytest.raises(ValueError, match="needs 6"):
        solo.allgather(good, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="needs"):
        solo.reduce_scatter(good, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="share memory"):
        solo.allgather(good, good)
    with pytest.raises(ValueError, match="unknown op"):
        solo.allreduce(good, op="prod")
    with pytest.raises(ValueError, match="unknown dtype"):
        solo.allreduce(good, dtype="float8")
    with pytest.raises(TypeError, match="bfloat16"):
        solo.allreduce(np.zeros(6, np.int16))  # bf16 bits must say so
    with pytest.raises(TypeError, match="bfloat16"):
        solo.allreduce(good, dtype="bfloat16")  # 4-byte items are not bf16
    with pytest.raises(ValueError, match="unknown op"):
        solo.reduce_scatter(good, np.zeros(6, np.float32), op="avg")
    with pytest.raises(ValueError, match="root"):
        solo.broadcast(1, good)
    # A C-contiguous 2-d array is taken as its flat values.
    solo.allreduce(np.zeros((2, 3), np.float32))


def test_bad_buckets_and_sparse_rows_are_value_errors(solo):
    with pytest.raises(ValueError, match="unknown recovery"):
        solo.register_bucket(BUCKET, recovery="forget")
    with pytest.raises(ValueError, match="unknown kind"):
        solo.register_bucket([("w", [4], "conv")])
    with pytest.raises(ValueError, match="conv2d"):
        solo.register_bucket([("w", [4, 4], "conv2d")])
    with pytest.raises(ValueError, match="negative"):
        solo.register_bucket([("w", [-1], "dense")])
    b = solo.register_bucket(BUCKET, recovery="error_feedback")
    with pytest.raises(ValueError, match="holds"):
        solo.allreduce_differentiated(b, np.zeros(BUCKET_VALUES + 1, np.float32))
    with pytest.raises(ValueError, match="no bucket"):
        solo.allreduce_differentiated(b + 1, np.zeros(BUCKET_VALUES, np.float32))
    with pytest.raises(ValueError, match="sums"):
        solo.allreduce_differentiated(b, np.zeros(BUCKET_VALUES, np.float32), op="max")
    with pytest.raises(ValueError, match="log8"):
        solo.register_bucket(BUCKET, important_format="log8")
    with pytest.raises(ValueError, match="unknown value format"):
        solo.register_bucket(BUCKET, lossy_format="int4")
    h = solo.register_bucket(BUCKET, dtype="float16")
    with pytest.raises(TypeError, match="float16"):
        solo.allreduce_differentiated(h, np.zeros(BUCKET_VALUES, np.float32))
    grad = gradient(0, 0)
    stats = solo.allreduce_differentiated(b, grad.copy(), op="sum")
    assert stats["lost_ranges"] == 0
    # An allgather bucket holds one tensor per rank, and takes
    # allgather_differentiated only (and a plain bucket only the allreduce).
    with pytest.raises(ValueError, match="one tensor per rank"):
        solo.register_bucket([("a", [8], "dense"), ("b", [8], "dense")], gather=True)
    gb = solo.register_bucket([("rank0", [8], "dense")], gather=True)
    with pytest.raises(ValueError, match="allgather"):
        solo.allreduce_differentiated(gb, np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="not an f32 allgather bucket"):
        solo.allgather_differentiated(b, np.zeros(BUCKET_VALUES, np.float32))
    with pytest.raises(ValueError, match="given 7"):
        solo.allgather_differentiated(gb, np.zeros(7, np.float32))
    mine = np.arange(8, dtype=np.float32)
    solo.allgather_differentiated(gb, mine)
    assert_same_bits(mine, np.arange(8, dtype=np.float32), "a group of one gathers itself")
    rows = np.array([3, 1], np.uint64)
    vals = np.arange(4, dtype=np.float32)
    with pytest.raises(ValueError, match="outside"):
        solo.sparse_allgather(rows, vals, 2, 2)
    with pytest.raises(ValueError, match="need"):
        solo.sparse_allgather(rows, vals[:3], 5, 2)
    with pytest.raises(TypeError, match="uint64"):
        solo.sparse_allgather(rows.astype(np.float64), vals, 5, 2)
    with pytest.raises(ValueError, match="unknown how"):
        solo.sparse_allgather(rows, vals, 5, 2, how="gather")
    got_rows, got_vals = solo.sparse_allgather(rows, vals, 5, 2)
    assert np.frombuffer(got_rows, np.uint64).tolist() == [3, 1]
    assert_same_bits(np.frombuffer(got_vals, np.float32), vals, "sparse values")


def test_bad_group_arguments_are_value_errors(cert_dir):
    root = f"127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match="exactly one"):
        gradlane.Group(0, 1, cert_dir=cert_dir)
    with pytest.raises(ValueError, match="exactly one"):
        gradlane.Group(0, 1, root=root, addresses=[root], cert_dir=cert_dir)
    with pytest.raises(ValueError, match="rank"):
        gradlane.Group(1, 1, root=root, cert_dir=cert_dir)
    with pytest.raises(ValueError, match="addresses"):
        gradlane.Group(0, 2, addresses=[root], cert_dir=cert_dir)
    with pytest.raises(ValueError, match="loss_tolerance 1.5 is not in"):
        gradlane.Group(0, 1, root=root, cert_dir=cert_dir, loss_tolerance=1.5)
    with pytest.raises(ValueError, match="injected_loss"):
        gradlane.Group(0, 1, root=root, cert_dir=cert_dir, injected_loss=-0.1)
    with pytest.raises(ValueError, match="idle_timeout"):
        gradlane.Group(0, 1, root=root, cert_dir=cert_dir, idle_timeout=0.0)
    with pytest.raises(ValueError, match="unknown lossy_carrier"):
        gradlane.Group(0, 1, root=root, cert_dir=cert_dir, lossy_carrier="streams")
    with pytest.raises(ValueError, match="root"):
        gradlane.Group(0, 1, root="not an address", cert_dir=cert_dir)
    with pytest.raises(gradlane.GroupSetupError):
        gradlane.Group(0, 1, root=root, cert_dir=os.path.join(cert_dir, "absent"))
    with pytest.raises(ValueError, match="names"):
        gradlane.generate_certs(os.path.join(cert_dir, "none"), [])


def test_several_sockets_stripe_and_stay_bit_for_bit(cert_dir):
    got = run_ranks("striped", cert_dir, {"sockets": 4})
    inputs = [values(r, STRIPED) for r in range(WORLD)]
    for r in range(WORLD):
        total = np.frombuffer(got[r]["sum"], np.float32)
        assert_same_bits(total, rank_sum(inputs), f"rank {r} sum")
        gathered = np.frombuffer(got[r]["gathered"], np.float32)
        assert_same_bits(gathered, np.concatenate(inputs), f"rank {r} allgather")


def test_bad_socket_counts_are_value_errors(cert_dir, monkeypatch):
    root = f"127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match="socket count"):
        gradlane.Group(0, 1, root=root, cert_dir=cert_dir, sockets=0)
    monkeypatch.setenv("GRADLANE_SOCKETS", "many")
    with pytest.raises(ValueError, match="GRADLANE_SOCKETS"):
        gradlane.Group(0, 1, root=root, cert_dir=cert_dir)
    monkeypatch.setenv("GRADLANE_SOCKETS", "2")
    with gradlane.Group(0, 1, root=root, cert_dir=cert_dir) as g:
        g.barrier()


def test_cert_dir_comes_from_the_environment(cert_dir, monkeypatch):
    monkeypatch.setenv("GRADLANE_CERT_DIR", cert_dir)
    with gradlane.Group(0, 1, root=f"127.0.0.1:{free_port()}") as g:
        g.barrier()
    monkeypatch.delenv("GRADLANE_CERT_DIR")
    with pytest.raises(ValueError, match="GRADLANE_CERT_DIR"):
        gradlane.Group(0, 1, root=f"127.0.0.1:{free_port()}")


def test_a_rank_that_never_comes_is_a_join_timeout_naming_it(cert_dir):
    with pytest.raises(gradlane.JoinTimeoutError) as caught:
        gradlane.Group(
            0, 2, root=f"127.0.0.1:{free_port()}", cert_dir=cert_dir, join_timeout=0.5
        )
    assert isinstance(caught.value, gradlane.GroupError)
    assert caught.value.rank == 1
    assert caught.value.missing == [1]


def test_a_closed_group_refuses_calls(cert_dir):
    g = gradlane.Group(0, 1, root=f"127.0.0.1:{free_port()}", cert_dir=cert_dir)
    g.barrier()
    assert not g.closed
    g.close()
    g.close()  # again: nothing
    assert g.closed
    assert repr(g) == "Group(rank=0, world=1, closed)"
    assert (g.rank, g.world) == (0, 1)
    with pytest.raises(gradlane.GroupClosedError):
        g.barrier()
    with pytest.raises(gradlane.GroupError):
        g.allreduce(np.zeros(1, np.float32))


def test_errors_carry_no_rank_by_default():
    assert gradlane.GroupError.rank is None
    assert issubclass(gradlane.RankFailedError, gradlane.GroupError)
    assert issubclass(gradlane.GroupError, Exception)
