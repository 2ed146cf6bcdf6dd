"""Clocks and the timing scheme: wall clock on the host, CUDA events on the device, and bandwidth arithmetic.

A method is timed in two phases.  :func:`warm_up` makes ``warmup`` untimed
calls (the first one pays for planning, JIT compilation and allocation) and
measures the last one.  Then :func:`take_sample` times *samples*: ``calls``
back-to-back calls between two clock readings, so that a fast call is not
drowned by the clock's resolution and, on the GPU, the host queues ahead and
the sample measures the device's throughput rather than Python's launch
latency.  :func:`plan_samples` chooses ``calls`` so that a sample lasts about
``min_sample_s``, and the number of samples: ``repeats``, fewer when one call
is so slow that they would exceed ``budget_s`` (never fewer than 3).  The time
per call is the median over samples.

On the device, each sample is preceded by untimed calls of the same method,
queued back to back with it (:func:`lead_calls`: about ``LEAD_S`` of device
time): a GPU that was idle or lightly loaded a moment before runs its first
milliseconds at lower clocks.  On an H100, three calls of a variable-length sum
(0.4 ms each) timed after 5 ms of idle ran 2-8% slower than the same calls
timed back to back, and 15-20% slower after 50 ms; with the lead-in every
sample measures the device's steady state.

The runner may take the samples of several methods in turns (one sample of
each, round after round), so that a load that comes and goes on a shared
machine touches every method alike.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "HostClock",
    "Timing",
    "device_clock",
    "gbps",
    "lead_calls",
    "plan_samples",
    "take_sample",
    "time_device",
    "time_host",
    "warm_up",
]

#: the shortest sample worth timing: many calls of a fast method are batched up to this
MIN_SAMPLE_S = 1e-3
#: cap on calls per sample, so a very fast method does not run thousands of times
MAX_CALLS = 256
#: device time of the untimed calls queued before each device sample (see the module's docstring)
LEAD_S = 3e-3


@dataclass
class Timing:
    """The outcome of timing one method.

    Attributes
    ----------
    seconds : float
        Median time per call.
    samples : list of float
        Time per call of every sample.
    calls : int
        Calls per sample.
    last : object
        What the last call returned (checked again for correctness).
    """

    seconds: float
    samples: list[float] = field(default_factory=list)
    calls: int = 1
    last: Any = None


def gbps(nbytes: int, seconds: float) -> float:
    """Effective bandwidth in GB/s (10^9 bytes per second)."""
    return nbytes / seconds / 1e9


def plan_samples(single_s: float, repeats: int, budget_s: float, min_sample_s: float = MIN_SAMPLE_S) -> tuple[int, int]:
    """``(calls per sample, samples)`` for a method whose one call takes ``single_s``."""
    single_s = max(single_s, 1e-9)
    calls = max(1, min(MAX_CALLS, math.ceil(min_sample_s / single_s)))
    affordable = int(budget_s / (single_s * calls))
    samples = max(min(3, repeats), min(repeats, affordable))
    return calls, samples


def lead_calls(single_s: float, lead_s: float = LEAD_S) -> int:
    """Untimed calls to queue before a device sample: about ``lead_s`` of them, 1 to ``MAX_CALLS``."""
    return max(1, min(MAX_CALLS, math.ceil(lead_s / max(single_s, 1e-9))))


class HostClock:
    """:func:`time.perf_counter`, for host code (NumPy, CPU BLAS)."""

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self._t0


class _CupyClock:
    def __init__(self) -> None:
        import cupy

        self._cupy = cupy
        self._stream = cupy.cuda.get_current_stream()
        self._start = cupy.cuda.Event()
        self._end = cupy.cuda.Event()

    def start(self) -> None:
        self._start.record(self._stream)

    def stop(self) -> float:
        self._end.record(self._stream)
        self._end.synchronize()
        return self._cupy.cuda.get_elapsed_time(self._start, self._end) * 1e-3


class _TorchClock:
    def __init__(self) -> None:
        import torch

        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._start.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) * 1e-3


def device_clock(lib: str) -> Any:
    """CUDA events on the current stream of ``lib`` (``"torch"``: PyTorch's, else CuPy's).

    Both are the legacy default stream unless the caller changed them.
    """
    return _TorchClock() if lib == "torch" else _CupyClock()


def warm_up(fn: Callable[[], Any], clock: Any, warmup: int) -> tuple[float, Any]:
    """Call ``fn`` ``max(1, warmup)`` times; return the time of the last call and its result."""
    out = None
    single = math.inf
    for _ in range(max(1, warmup)):
        clock.start()
        out = fn()
        single = clock.stop()
    return single, out


def take_sample(fn: Callable[[], Any], clock: Any, calls: int, lead: int = 0) -> tuple[float, Any, float]:
    """Time ``calls`` back-to-back calls: ``(time per call, last result, host time per call)``.

    ``lead`` untimed calls go first, queued back to back with the timed ones (on
    the device: the clock starts after them in the same stream, without waiting).
    The host time is how long issuing one call took, up to the last call's return
    (before the clock waits for the device).  On the device, a host time near the
    time per call means the sample measured the host, not the device.
    """
    out = None
    for _ in range(lead):
        fn()
    clock.start()
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn()
    issued = time.perf_counter() - t0
    return clock.stop() / calls, out, issued / calls


def _time(
    fn: Callable[[], Any], clock: Any, warmup: int, repeats: int, budget_s: float, min_sample_s: float, device: bool
) -> Timing:
    single, out = warm_up(fn, clock, warmup)
    calls, samples = plan_samples(single, repeats, budget_s, min_sample_s)
    lead = lead_calls(single) if device else 0
    times = []
    enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection inside a sample is noise
    try:
        for _ in range(samples):
            out = None
            t, out, _ = take_sample(fn, clock, calls, lead)
            times.append(t)
    finally:
        if enabled:
            gc.enable()
    return Timing(statistics.median(times), times, calls, out)


def time_host(
    fn: Callable[[], Any], *, warmup: int, repeats: int, budget_s: float, min_sample_s: float = MIN_SAMPLE_S
) -> Timing:
    """Time ``fn`` alone with :func:`time.perf_counter`."""
    return _time(fn, HostClock(), warmup, repeats, budget_s, min_sample_s, device=False)


def time_device(
    fn: Callable[[], Any],
    *,
    lib: str,
    warmup: int,
    repeats: int,
    budget_s: float,
    min_sample_s: float = MIN_SAMPLE_S,
) -> Timing:
    """Time ``fn`` alone with CUDA events on the current stream of ``lib``, each sample after a lead-in."""
    return _time(fn, device_clock(lib), warmup, repeats, budget_s, min_sample_s, device=True)
