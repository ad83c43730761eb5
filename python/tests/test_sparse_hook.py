"""The codec from Python, and the sparse log-quantized hook: its frames'
bytes are the codec's formula, both exchanges keep every rank's bits the
same, the differentiated one under loss too (its lost entries back in
their senders' residuals), and it trains."""

import numpy as np
import pytest

import gradlane
from gradlane import codec

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from test_torch import bits, run_ranks, train_steps, wide_cnn  # noqa: E402


def sparse_sample(seed, n=5000, k=120):
    rng = np.random.default_rng(seed)
    keys = np.sort(rng.choice(n, size=k, replace=False)).astype(np.uint32)
    values = (rng.standard_t(3, size=k) * 0.01).astype(np.float32)
    values[values == 0] = 1e-3
    return keys, values, n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_frame_reads_back_within_the_codecs_bound_and_its_length_is_the_formula(seed):
    keys, values, n = sparse_sample(seed)
    frame = codec.encode(keys, values, n)
    got_keys, got_values, dim = codec.decode(frame)
    assert dim == n and np.array_equal(got_keys, keys)
    ratio = got_values / values
    assert np.all(ratio > 0) and np.all(ratio <= 1.25**0.5 * (1 + 1e-6))
    assert np.all(ratio > 1.25**-0.5 * (1 - 1e-6))
    h = codec.header(frame)
    assert h["count"] == len(keys) and h["dim"] == n
    assert len(frame) == codec.frame_bytes(keys, h["q_width"], h["flag_bits"], h["widths"])
    acc = np.zeros(n, np.float32)
    codec.decode_add(frame, acc)
    assert np.array_equal(acc[keys], got_values)


def test_bad_frames_and_bad_entries_are_value_errors():
    keys, values, n = sparse_sample(3)
    frame = codec.encode(keys, values, n)
    for cut in (0, 3, 10, 44, len(frame) - 1):
        with pytest.raises(ValueError):
            codec.decode(frame[:cut])
    with pytest.raises(ValueError):
        codec.decode(b"XXXX" + frame[4:])
    with pytest.raises(ValueError):
        codec.decode_add(frame, np.zeros(n - 1, np.float32))
    with pytest.raises(ValueError, match="increasing"):
        codec.encode(keys[::-1].copy(), values, n)
    with pytest.raises(ValueError):
        codec.encode(np.array([n], np.uint32), np.array([1.0], np.float32), n)
    with pytest.raises(ValueError):
        codec.encode(np.array([1], np.uint32), np.array([np.nan], np.float32), n)
    with pytest.raises(TypeError):
        codec.encode(keys.astype(np.int64), values, n)


def test_the_hooks_settings_are_checked():
    import gradlane.torch as gl

    with pytest.raises(ValueError, match="density"):
        gl.SparseHookState(0.0)
    with pytest.raises(ValueError, match="transport"):
        gl.SparseHookState(0.01, transport="carrier pigeon")
    with pytest.raises(ValueError, match="base"):
        gl.SparseHookState(0.01, base=1.0)
    with pytest.raises(TypeError, match="HookState"):
        gl.SparseHookState(0.01, transport="differentiated", hook=object())


def scenario_sparse(rank, backend, transport, steps, loss):
    """DDP with sparse_hook over `backend`: each step's parameters, loss
    and the hook's statistics."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradlane.torch as gl

    dist.init_process_group(backend)
    model = wide_cnn(seed=7)
    ddp = DDP(model)
    hook = None
    if transport == "differentiated":
        hook = gl.HookState(
            loss_tolerance=0.5, injected_loss=loss, seed=300 + rank, lossy_carrier="datagrams"
        )
    state = gl.SparseHookState(0.02, transport=transport, hook=hook)
    ddp.register_comm_hook(state, gl.sparse_hook)
    out = train_steps(ddp, model, steps, lambda: state.last_stats, batches=4)
    out["capacity"] = sum(
        max(1, int(np.ceil(0.02 * p.numel()))) for p in model.parameters()
    )
    state.close()
    dist.destroy_process_group()
    return out


def check_replicas(got, steps, ranks):
    for r in range(ranks):
        for step in range(steps):
            for a, b in zip(got[r]["params"][step], got[0]["params"][step], strict=True):
                assert np.array_equal(bits(a), bits(b)), f"step {step}: rank {r} vs 0"
    losses = got[0]["loss"]
    assert np.mean(losses[-4:]) < np.mean(losses[:4]), losses


@pytest.mark.parametrize("backend", ["gloo", "gradlane"])
def test_the_exact_exchange_sends_the_codecs_frames_and_keeps_replicas_equal(cert_dir, backend):
    steps, ranks = 12, 3
    got = run_ranks(scenario_sparse, cert_dir, backend, "exact", steps, 0.0, world=ranks)
    check_replicas(got, steps, ranks)
    for step in range(steps):
        frames = [got[r]["stats"][step]["frame_bytes"] for r in range(ranks)]
        for r in range(ranks):
            s = got[r]["stats"][step]
            # Each rank keeps its capacity, and hands the exchange its
            # frame padded to the longest (the lengths were negotiated).
            assert s["entries"] == got[r]["capacity"], s
            assert s["sent_bytes"] == max(frames), (s, frames)
            assert s["dropped_entries"] == 0


def test_the_differentiated_exchange_under_loss_keeps_replicas_equal(cert_dir):
    steps, ranks = 16, 3
    got = run_ranks(scenario_sparse, cert_dir, "gloo", "differentiated", steps, 0.2, world=ranks)
    check_replicas(got, steps, ranks)
    stats = [s for o in got.values() for s in o["stats"]]
    assert sum(s["return_lossy_bytes"] for s in stats) > 0
    # Some entries were lost at 20% loss, and went back to their senders'
    # residuals (the replicas above are still equal).
    assert sum(s["dropped_entries"] for s in stats) > 0
    assert gradlane.__version__
