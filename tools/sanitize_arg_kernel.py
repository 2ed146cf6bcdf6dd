#!/usr/bin/env python3
"""The first-extreme kernel (``first_hit``, ``linred/kernels/arg.cuh``) for compute-sanitizer.

Runs, with exact allocations (CuPy's memory pool off, ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) so
that memcheck sees every overrun:

1. ``tests/test_gpu_arg.py``'s cases at this build's tile edges (ARG_ROWS, ARG_LOADS), for
   int8, float16, float32, float64, int64 and bool data, CuPy and PyTorch, argmax and argmin,
   offsets, lengths and fixed lengths, the grid-stride case and the backward of max and min,
   each checked against positions found by NumPy;
2. the kernel itself (``linred._arg_kernel.first_hit``) on offsets that break every rule
   (negative, past n, decreasing, a wrong first or last offset, reversed), with ``check=False``
   semantics: the kernel must load and store nothing outside its arrays whatever the offsets
   hold, and every position it writes must lie in ``[0, n]``;

and prints a count.  On a GPU machine::

    compute-sanitizer --tool memcheck --error-exitcode 1 python tools/sanitize_arg_kernel.py
    compute-sanitizer --tool initcheck --error-exitcode 1 python tools/sanitize_arg_kernel.py

(racecheck and synccheck have nothing to look at: the kernel uses no shared memory and no
barrier; they ran clean on it all the same on 2026-11-28.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _broken_offsets(n: int) -> list[np.ndarray]:
    """Offsets of 6 segments over ``n`` rows that break each rule."""
    good = np.linspace(0, n, 7).astype(np.int64)
    out = []
    for change in (
        lambda o: o.__setitem__(2, -5 * n - 3),  # negative
        lambda o: o.__setitem__(3, 7 * n + 11),  # far past n
        lambda o: o.__setitem__(slice(2, 5), o[2:5][::-1].copy()),  # decreasing
        lambda o: o.__setitem__(0, n // 2 + 1),  # a wrong first offset
        lambda o: o.__setitem__(-1, n // 3),  # a wrong last offset
        lambda o: o.__setitem__(slice(None), o[::-1].copy()),  # reversed
    ):
        o = good.copy()
        change(o)
        out.append(o)
    return out


def main() -> int:
    import cupy

    cupy.cuda.set_allocator(None)  # exact cudaMalloc per array
    import test_gpu_arg as t

    from linred import _arg_kernel
    from linred.arrays import as_array

    calls = 0
    for kind in ("cupy", "torch-cuda"):
        for dtype in ("int8", "float16", "float32", "float64", "int64", "bool"):
            for which in ("argmax", "argmin"):
                t.test_arg_kernel_positions(kind, dtype, which)
                calls += 1
        t.test_arg_kernel_grid_stride_and_one_long_segment(kind)
        calls += 1

    class _Patch:  # the backward test's monkeypatch, outside pytest
        def setattr(self, obj, name, value):
            setattr(obj, name, value)

    kernel = _arg_kernel.first_hit
    for which in ("max", "min"):
        for shape, axis in (((3 * t.T + 1, 5), 0), ((t.T + 1,), 0), ((4, 2 * t.T - 1, 3), 1)):
            for spec in ("offsets", "lengths", "fixed"):
                t.test_cuda_max_min_backward_goes_to_the_first_extreme(which, shape, axis, spec, _Patch())
                _arg_kernel.first_hit = kernel
                calls += 1

    # The kernel alone on broken offsets (int32 and int64), rows of 1 and of 7 features.
    rng = np.random.default_rng(0)
    for features in (1, 7):
        n = 5 * t.T + 3
        x = cupy.asarray(rng.standard_normal((n, features) if features > 1 else n).astype(np.float32))
        _, adapter = as_array(x)
        device = x.device.id
        stream = cupy.cuda.get_current_stream().ptr
        for offsets in _broken_offsets(n):
            for index_dtype in (np.int32, np.int64):
                off = cupy.asarray(offsets.astype(index_dtype))
                extreme = x[: len(offsets) - 1].copy()  # (some values of x: some rows meet them)
                first = _arg_kernel.first_hit(adapter, x, extreme, 0, None, off, device, stream)
                got = cupy.asnumpy(first)
                assert ((got >= 0) & (got <= n)).all(), (offsets, got)
                calls += 1
    cupy.cuda.get_current_stream().synchronize()
    print(f"sanitize_arg_kernel: {calls} calls, every result checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
