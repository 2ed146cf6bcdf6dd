#!/usr/bin/env python3
"""Broken offsets (and others) through the kernels that check them as they read them, for compute-sanitizer.

``check=True`` with offsets on the GPU lets the reduction kernel check the offsets
(``checked_bounds`` in ``linred/kernels/offsets.cuh`` for feature rows, ``warp_reduce``'s
walks for one column): it must read and write nothing outside the data, the result and
shared memory whatever the offsets hold.  This script makes such calls (CuPy and PyTorch,
int32 and int64 offsets, the one-thread-per-segment and the split kernels, warp_reduce and,
for data not 16-byte aligned, tile_reduce; values far outside the axis, negative,
decreasing, a wrong first or last offset, a reversed quarter, two far apart swapped) after a valid call has planned
each layout, checks that each raises ValueError and that a valid call after it is right,
and prints a count; then the same for the softmax family's kernel.  Run it under the sanitizer on a GPU machine::

    compute-sanitizer --tool memcheck --error-exitcode 1 python tools/sanitize_checked_offsets.py

``--ahead`` sends every checked call the route of large calls whose offsets are few: the
one-kernel check enqueued ahead of the checking reduction, the call waiting for the check alone
(:func:`linred.arrays._device_checks.check_ahead`), whatever the call's size.
"""

from __future__ import annotations

import sys

import numpy as np

import linred


def main() -> int:
    import cupy

    if "--ahead" in sys.argv[1:]:
        from linred.arrays import _device_checks

        _device_checks.AHEAD_MIN_BYTES, _device_checks.AHEAD_MAX_OFFSETS_BYTES = 0, float("inf")

    kinds = {"cupy": (cupy.asarray, cupy.asnumpy)}
    try:
        import torch

        if torch.cuda.is_available():
            kinds["torch"] = (lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda(), lambda t: t.cpu().numpy())
    except ImportError:
        pass
    rng = np.random.default_rng(0)
    calls = raised = 0
    for kind, (to, back) in kinds.items():
        layouts = [((2000, 64), 32), ((513, 4), 300), ((3000, 16), 3), ((257, 8), 1)]
        layouts += [((100_000,), 3000), ((40_000,), 1), ((9000,), 700), ((9001,), 700, "unaligned"), ((4096,), 4)]
        for shape, m, *unaligned in layouts:
            n = shape[0]
            x = rng.standard_normal(shape).astype(np.float32)
            good = np.concatenate([[0], np.sort(rng.choice(np.arange(1, n), m - 1, replace=False)), [n]])
            want = np.add.reduceat(x.astype(np.float64), good[:-1], axis=0)
            xd = to(np.concatenate([[0], x]).astype(np.float32))[1:] if unaligned else to(x)
            for dtype in ("int32", "int64"):
                big = np.iinfo(dtype).max
                linred.segmented_sum(xd, offsets=to(good.astype(dtype)))  # plans (the separate check)
                changed = []
                for at in sorted({0, m // 2, m}):
                    for value in (-big, -5, 1, n + 1, n - 1 if at else 1, big):
                        bad = good.copy()
                        bad[at] = value
                        changed.append(bad)
                if good[m - 1] + 1 < n:  # a last offset short of n, still non-decreasing
                    bad = good.copy()
                    bad[m] = good[m - 1] + 1
                    changed.append(bad)
                if m >= 8:
                    bad = good.copy()
                    bad[m // 4 : m // 2] = bad[m // 4 : m // 2][::-1].copy()
                    changed.append(bad)
                    bad = good.copy()
                    bad[1], bad[m - 1] = bad[m - 1], bad[1]
                    changed.append(bad)
                for bad in changed:
                    calls += 1
                    try:
                        linred.segmented_sum(x, offsets=bad.astype(dtype))  # the host's verdict
                        broken = False
                    except ValueError:
                        broken = True
                    try:
                        linred.segmented_sum(xd, offsets=to(bad.astype(dtype)))
                        if broken:
                            print(f"{kind} {shape} {dtype}: broken offsets {np.flatnonzero(bad != good)} passed")
                            return 1
                    except ValueError:
                        if not broken:
                            print(f"{kind} {shape} {dtype}: valid offsets refused")
                            return 1
                        raised += 1
                    got = back(linred.segmented_sum(xd, offsets=to(good.astype(dtype))))
                    if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                        print(f"{kind} {shape} {dtype}: a valid call after a broken one is wrong")
                        return 1
    print(f"{calls} calls with changed offsets, {raised} broke a rule and raised ValueError as the host's check does")
    return _softmax_family(kinds, rng)


def _softmax_family(kinds: dict, rng: np.random.Generator) -> int:
    """The same for segmented_logsumexp / softmax / log_softmax / var / std, whose kernel checks
    the offsets as it reads them too (one column: a warp per segment; feature rows: a thread per
    feature); it serves these few segments here (it leaves calls with few workers to the
    composition)."""
    from linred import _softmax_kernel

    _softmax_kernel.MIN_WORKERS_PER_SM = 0
    calls = raised = 0
    for kind, (to, _) in kinds.items():
        for shape, m in (((2000,), 32), ((2000, 8), 32), ((300, 1), 1)):
            n = shape[0]
            x = rng.standard_normal(shape).astype(np.float32)
            good = np.concatenate([[0], np.sort(rng.choice(np.arange(1, n), m - 1, replace=False)), [n]])
            for name in ("logsumexp", "softmax", "log_softmax", "var", "std"):
                fn = getattr(linred, f"segmented_{name}")
                for at in sorted({0, m // 2, m}):
                    for value in (-(2**40), -5, n + 1, 2**40):
                        bad = good.copy()
                        bad[at] = value
                        calls += 1
                        try:
                            fn(to(x), offsets=to(bad))
                            print(f"{kind} {name} {shape}: broken offsets passed")
                            return 1
                        except ValueError:
                            raised += 1
    print(f"{calls} softmax-family (and var, std) calls with broken offsets, {raised} raised ValueError")
    return 0


if __name__ == "__main__":
    sys.exit(main())
