"""Staging: how a collective on device tensors (CUDA) runs on gradlane,
whose Group reads and writes host memory.

A :class:`StagedCall` copies the tensors a collective reads into host
buffers, on a side stream of the tensors' device that first waits for
the stream they were computed on; the thread that runs the collective
waits for those copies (it needs the values on the host), the caller
does not. The collective runs on the
host buffers. Then the buffers it wrote are copied back to the device
on the side stream, without waiting: the Work's ``wait()`` and its
future make the caller's current stream wait for them, as NCCL's do,
and the future completes only once the data is back on the device.

The host buffers are pinned (page-locked, so the copies are DMA and
asynchronous) and reused: :class:`HostBuffers` keeps them in size
classes, and a buffer handed back is taken again only after the copy
that last read it has finished.

GRADLANE_STAGE_CPU_TENSORS=1 stages CPU tensors too, through unpinned
buffers with synchronous copies: a switch for tests, so that the code
above runs where there is no GPU.
"""

from __future__ import annotations

import threading

import torch

from gradlane.torch._environment import stage_cpu_tensors_from_env

#: Free host buffers kept for reuse, at most, per process (buffers in use
#: are not counted: one collective's tensors always get their buffers).
CACHE_LIMIT_BYTES = 1 << 30
#: The smallest size class: smaller requests share buffers of this size.
MIN_CLASS_BYTES = 1 << 12


def size_class(nbytes: int) -> int:
    """The buffer size a request of ``nbytes`` gets: the next power of
    two, at least MIN_CLASS_BYTES (so that buffers are reused across
    sizes that differ a little, at most twice the bytes asked)."""
    return max(MIN_CLASS_BYTES, 1 << max(0, nbytes - 1).bit_length())


class HostBuffers:
    """Reusable host buffers (pinned when ``pinned``), by size class.

    ``take`` returns a uint8 buffer of at least the bytes asked; ``give``
    returns it with the CUDA event (or None) after which it is free: the
    copy back to the device that reads it. Thread-safe (the hook's
    overlap thread and the training thread both stage)."""

    def __init__(self, pinned: bool, cache_limit: int = CACHE_LIMIT_BYTES):
        self.pinned = pinned
        self.cache_limit = cache_limit
        self._free: dict[int, list[tuple[torch.Tensor, object]]] = {}
        self._cached = 0
        self._lock = threading.Lock()
        #: Buffers allocated and reused so far (for tests and stats).
        self.allocated = 0
        self.reused = 0

    @property
    def cached_bytes(self) -> int:
        """Bytes of free buffers kept for reuse."""
        return self._cached

    def take(self, nbytes: int) -> torch.Tensor:
        size = size_class(nbytes)
        with self._lock:
            free = self._free.get(size)
            entry = free.pop() if free else None
            if entry is not None:
                self._cached -= size
                self.reused += 1
            else:
                self.allocated += 1
        if entry is None:
            return torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
        buf, event = entry
        if event is not None:
            event.synchronize()  # the copy that last read it has finished
        return buf

    def give(self, buf: torch.Tensor, event=None) -> None:
        size = buf.numel()
        with self._lock:
            if self._cached + size <= self.cache_limit:
                self._free.setdefault(size, []).append((buf, event))
                self._cached += size
                return
        # Not kept: it is freed, but not while a copy still reads it.
        if event is not None:
            event.synchronize()


class Stager:
    """Stages collectives of one process: its host buffers (pinned ones
    for CUDA, plain ones for the test switch) and a side stream per CUDA
    device."""

    def __init__(self, stage_cpu: bool | None = None):
        self.stage_cpu = stage_cpu_tensors_from_env() if stage_cpu is None else stage_cpu
        self._buffers: dict[bool, HostBuffers] = {}
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._lock = threading.Lock()

    def needs_staging(self, tensors) -> bool:
        """Whether a collective on ``tensors`` runs staged."""
        return any(t.device.type != "cpu" for t in tensors) or (
            self.stage_cpu and len(tensors) > 0
        )

    def buffers(self, pinned: bool) -> HostBuffers:
        with self._lock:
            if pinned not in self._buffers:
                self._buffers[pinned] = HostBuffers(pinned)
            return self._buffers[pinned]

    def stream(self, device: torch.device):
        with self._lock:
            s = self._streams.get(device)
            if s is None:
                s = torch.cuda.Stream(device)
                self._streams[device] = s
            return s

    def call(self, tensors, reads, writes) -> StagedCall:
        """Starts a staged collective on ``tensors`` (all on one device):
        ``reads[i]`` says whether the collective reads tensor i (copied to
        the host now), ``writes[i]`` whether it writes it (copied back by
        :meth:`StagedCall.finish`)."""
        return StagedCall(self, list(tensors), list(reads), list(writes))


def _device_of(tensors) -> torch.device:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise ValueError(
            f"gradlane: one collective's tensors are on {names}; they must be on one device"
        )
    device = devices.pop()
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"gradlane: a tensor is on {device}; the gradlane backend takes CPU and CUDA tensors"
        )
    return device


class StagedCall:
    """One collective's tensors on the host: ``host[i]`` is a contiguous
    host tensor of tensor i's dtype and shape, holding its values when the
    collective reads it. :meth:`finish` copies the written ones back and
    frees the buffers; :meth:`abandon` frees them with nothing copied (the
    collective failed)."""

    def __init__(self, stager: Stager, tensors, reads, writes):
        self.device = _device_of(tensors)
        self.cuda = self.device.type == "cuda"
        self._stager = stager
        self._tensors = tensors
        self._writes = writes
        self._pool = stager.buffers(pinned=self.cuda)
        self._raw = []
        self.host = []
        self.stream = None
        self.event = None
        self._copied_in = None
        try:
            for t in tensors:
                nbytes = t.numel() * t.element_size()
                raw = self._pool.take(nbytes)
                self._raw.append(raw)
                self.host.append(raw[:nbytes].view(t.dtype).view(t.shape))
            if self.cuda:
                self.stream = stager.stream(self.device)
                # The side stream starts where the caller's stream is: the
                # tensors hold what was computed before the collective.
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self.stream):
                    for t, h, r in zip(tensors, self.host, reads, strict=True):
                        if r:
                            h.copy_(t, non_blocking=True)
                    self._copied_in = torch.cuda.Event()
                    self._copied_in.record(self.stream)
            else:
                for t, h, r in zip(tensors, self.host, reads, strict=True):
                    if r:
                        h.copy_(t)
        except BaseException:
            try:
                # Copies already queued on the side stream still write into
                # the buffers: they must end before the buffers are reused.
                if self.stream is not None:
                    self.stream.synchronize()
            finally:
                self.abandon()
            raise

    def wait_copied_in(self) -> None:
        """Blocks until the host buffers hold what the collective reads
        (the copies to the host are queued when the call is made, so that
        the caller need not wait for them)."""
        if self._copied_in is not None:
            self._copied_in.synchronize()

    def finish(self) -> None:
        """Copies what the collective wrote back to the device tensors (on
        the side stream, not waited for) and frees the host buffers once
        those copies are done."""
        if self.cuda:
            with torch.cuda.stream(self.stream):
                for t, h, w in zip(self._tensors, self.host, self._writes, strict=True):
                    if w:
                        t.copy_(h, non_blocking=True)
                        # The caller may free t before the copy ran: its
                        # memory is not reused until the side stream is past it.
                        t.record_stream(self.stream)
                self.event = torch.cuda.Event()
                self.event.record(self.stream)
        else:
            for t, h, w in zip(self._tensors, self.host, self._writes, strict=True):
                if w:
                    t.copy_(h)
        self._release(self.event)

    def abandon(self) -> None:
        """Frees the host buffers with nothing copied back."""
        self._release(None)

    def _release(self, event) -> None:
        raws, self._raw, self.host = self._raw, [], []
        for raw in raws:
            self._pool.give(raw, event)

    def complete(self, future: torch.futures.Future, value) -> None:
        """Completes ``future`` (made with :func:`future_for`) with
        ``value`` once the copies back are done: for CUDA, its waiters'
        streams wait for the side stream."""
        if self.cuda:
            with torch.cuda.stream(self.stream):
                future.set_result(value)
        else:
            future.set_result(value)


def future_for(device: torch.device) -> torch.futures.Future:
    """A future that may hold tensors of ``device`` (a CUDA one must be
    made with its device, or completing it raises)."""
    if device.type == "cuda":
        return torch.futures.Future(devices=[device])
    return torch.futures.Future()
