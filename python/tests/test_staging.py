"""gradlane.torch._staging in one process, on CPU tensors (the test
switch): host buffers by size class, reused and bounded; values copied in
for what a collective reads and back for what it writes; errors."""

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from gradlane.torch import _environment, _staging  # noqa: E402


def test_size_classes_are_powers_of_two_from_4_kib():
    assert _staging.size_class(0) == 4096
    assert _staging.size_class(1) == 4096
    assert _staging.size_class(4096) == 4096
    assert _staging.size_class(4097) == 8192
    assert _staging.size_class(25 * 2**20) == 32 * 2**20


def test_buffers_are_reused_by_size_class_and_the_cache_is_bounded():
    pool = _staging.HostBuffers(pinned=False, cache_limit=3 * 8192)
    a = pool.take(5000)
    assert a.numel() == 8192 and a.dtype == torch.uint8
    pool.give(a)
    assert pool.cached_bytes == 8192
    b = pool.take(8000)  # the same class: the same buffer
    assert b.data_ptr() == a.data_ptr()
    assert (pool.allocated, pool.reused) == (1, 1)
    c = pool.take(100)  # another class: a new one
    assert c.numel() == 4096 and pool.allocated == 2
    big = [pool.take(8192) for _ in range(4)]
    for buf in big:
        pool.give(buf)
    # Only three 8 KiB buffers fit under the limit; the fourth is freed.
    assert pool.cached_bytes == 3 * 8192
    pool.give(c)
    assert pool.cached_bytes == 3 * 8192  # over the limit: not kept either


def test_a_call_copies_in_what_is_read_and_back_what_is_written():
    stager = _staging.Stager(stage_cpu=True)
    x = torch.arange(6, dtype=torch.float32).view(2, 3)
    y = torch.full((5,), 7, dtype=torch.bfloat16)
    assert stager.needs_staging([x, y])
    call = stager.call([x, y], reads=[True, False], writes=[True, True])
    hx, hy = call.host
    assert hx.shape == x.shape and hx.dtype == x.dtype and hx.is_contiguous()
    assert hy.shape == y.shape and hy.dtype == torch.bfloat16
    assert hx.data_ptr() != x.data_ptr()
    assert torch.equal(hx, x)  # read: copied in
    hx.mul_(10)
    hy.fill_(3)
    assert x[1, 2] == 5  # not yet back
    call.finish()
    assert torch.equal(x, torch.arange(6, dtype=torch.float32).view(2, 3) * 10)
    assert torch.equal(y, torch.full((5,), 3, dtype=torch.bfloat16))
    # The two buffers went back to the pool and are taken again.
    again = stager.call([x], reads=[False], writes=[False])
    assert stager.buffers(pinned=False).reused == 1
    again.abandon()


def test_an_abandoned_call_writes_nothing_back():
    stager = _staging.Stager(stage_cpu=True)
    x = torch.ones(4)
    call = stager.call([x], reads=[True], writes=[True])
    call.host[0].fill_(9)
    call.abandon()
    assert torch.equal(x, torch.ones(4))
    assert stager.buffers(pinned=False).cached_bytes == 4096


def test_a_completed_future_holds_the_value():
    stager = _staging.Stager(stage_cpu=True)
    x = torch.ones(3)
    call = stager.call([x], reads=[True], writes=[True])
    call.finish()
    fut = _staging.future_for(x.device)
    call.complete(fut, [x])
    assert fut.done() and fut.wait()[0] is x


def test_without_the_switch_cpu_tensors_are_not_staged():
    assert not _staging.Stager(stage_cpu=False).needs_staging([torch.ones(2)])
    assert not _staging.Stager(stage_cpu=True).needs_staging([])


def test_tensors_on_two_devices_or_an_unknown_device_are_a_value_error():
    stager = _staging.Stager(stage_cpu=True)
    with pytest.raises(ValueError, match="one device"):
        stager.call([torch.ones(2), torch.ones(2, device="meta")], [True, True], [True, True])
    with pytest.raises(ValueError, match="CPU and CUDA"):
        stager.call([torch.ones(2, device="meta")], [True], [True])


def test_the_switch_takes_0_or_1_only(monkeypatch):
    monkeypatch.setenv(_environment.STAGE_CPU_ENV, "1")
    assert _staging.Stager().stage_cpu
    monkeypatch.setenv(_environment.STAGE_CPU_ENV, "0")
    assert not _staging.Stager().stage_cpu
    monkeypatch.setenv(_environment.STAGE_CPU_ENV, "yes")
    with pytest.raises(ValueError, match="GRADLANE_STAGE_CPU_TENSORS"):
        _staging.Stager()
