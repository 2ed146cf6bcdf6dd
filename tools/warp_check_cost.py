#!/usr/bin/env python3
"""Device time of ``warp_reduce`` with and without its offsets check, on a GPU.

One column of 2^28 float32 values, the variable-length layouts of ``linred bench``: the
plan's executor is called directly, back to back, with segments that carry a check word
(the ``CHECKED`` variant) and without (the unchecked one), timed with CUDA events (7 samples
of 30 calls, median and [min, max]); the two results must be identical and the word clear.
The function's own calls (default and ``check=False``), timed back to back the same way,
follow: a default call waits for its stream, so its figure includes the host's time per call.
"""

from __future__ import annotations

import numpy as np


def main() -> None:
    import cupy as cp

    import linred
    from linred.arrays import _device_checks
    from linred.arrays._cupy import _pinned_words
    from linred.bench.cases import make_offsets
    from linred.segments import VariableSegments

    n = 1 << 28
    x = cp.random.rand(n, dtype=cp.float32)
    dst = cp.empty_like(x)
    stream = cp.cuda.get_current_stream()

    def device_time(fn, calls: int = 30, samples: int = 7) -> tuple[float, float, float]:
        fn()
        stream.synchronize()
        times = []
        for _ in range(samples):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(calls):
                fn()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / calls)
        return float(np.median(times)), min(times), max(times)

    copy = device_time(lambda: cp.copyto(dst, x))[0]
    print(f"copy {copy:.1f} us ({8 * n / copy / 1e3:.0f} GB/s); samples: 7 rounds of 30 back-to-back calls, "
          "median (min-max) per call")  # fmt: skip
    layouts = [("geometric", 16), ("half-empty", 16), ("geometric", 256), ("geometric", 8192), ("zipf", 0),
               ("one-huge", 16)]  # fmt: skip

    def measure(layout: str, mean: int) -> None:
        off = cp.asarray(make_offsets(layout, n, mean, 0))
        m = off.shape[0] - 1
        out = cp.empty(m, cp.float32)
        plan = linred.SegmentedReduction(x, offsets=off, backend="nvrtc")
        executor, handle = plan._executor, stream.ptr
        plain = VariableSegments(off, m)
        checked = VariableSegments(off, m, word=_device_checks.arm(_pinned_words))
        nbytes = 4 * n + 8 * (m + 1) + 4 * m

        def share(t: float) -> float:
            return nbytes / t / (8 * n / copy)

        r0 = device_time(lambda: executor(x, out, plain, handle))
        want = out.copy()
        r1 = device_time(lambda: executor(x, out, checked, handle))
        same = _device_checks._state.word.value == 0 and bool((out == want).all())
        r2 = device_time(lambda: linred.segmented_sum(x, offsets=off, out=out))
        r3 = device_time(lambda: linred.segmented_sum(x, offsets=off, out=out, check=False))
        print(
            f"{layout} {mean}: m={m} {type(executor).__name__}: unchecked {r0[0]:.1f} ({r0[1]:.1f}-{r0[2]:.1f}) "
            f"{share(r0[0]):.1%} | checked {r1[0]:.1f} ({r1[1]:.1f}-{r1[2]:.1f}) {share(r1[0]):.1%} same={same} | "
            f"function default {r2[0]:.1f} {share(r2[0]):.1%} | check=False {r3[0]:.1f} {share(r3[0]):.1%}"
        )
        plan.free()

    for layout, mean in layouts:
        measure(layout, mean)


if __name__ == "__main__":
    main()
