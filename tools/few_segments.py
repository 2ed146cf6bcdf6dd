"""Feature rows in segments too few to fill the GPU: cut into tiles past FEATURE_FEW_ROWS, or not.

For each case (dtype, rows x features, segments, spec) below, CUDA tensors in this process: the
device time per call of ``segmented_sum(..., check=False)`` through nvrtc as shipped, through
nvrtc with ``FEATURE_CHUNKS_MIN_ROWS`` patched past any length (a long segment's tiles added in
one chain, not a chunk at a time), through nvrtc with ``FEATURE_FEW_ROWS`` patched past any length
(those segments walked by one block's lanes), through cub, and with ``backend="auto"``; and a
copy of the data for scale. Each figure is
the median of 9 samples of 10 back-to-back calls timed with CUDA events
(``feature_rows.timeit``); every result is checked against float64 first.

    python tools/few_segments.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from feature_rows import timeit

import linred
import linred.backends.nvrtc.kernels as kernels

CASES = [("int32", 10**6, 64, 1, "offsets"), ("int32", 10**6, 64, 1, "fixed"), ("int32", 10**6, 64, 100, "offsets"),
         ("float32", 10**6, 128, 100, "offsets"), ("float32", 10**6, 128, 1, "offsets"),
         ("int64", 2 * 10**5, 32, 3, "offsets"), ("float32", 10**7, 16, 10**6, "offsets")]  # fmt: skip


def main() -> None:
    cases = []
    for dtype, n, d, m, spec in CASES:
        kind = getattr(torch, dtype)
        if dtype.startswith("int"):
            x = torch.randint(-1000, 1000, (n, d), device="cuda", dtype=kind)
        else:
            x = torch.randn(n, d, device="cuda", dtype=kind)
        ptr = torch.linspace(0, n, m + 1, device="cuda").round().long()
        kw = {"offsets": ptr} if spec == "offsets" else {"segment_length": n // m}
        ref = torch.segment_reduce(x.double(), "sum", offsets=ptr, axis=0)
        cases.append((f"{dtype} {n} x {d}, {m} segments, {spec}", x, kw, ref))
    print(torch.cuda.get_device_name(), "device us per call, check=False")
    base, chunks = kernels.FEATURE_FEW_ROWS, kernels.FEATURE_CHUNKS_MIN_ROWS
    rows = (("nvrtc cut (default)", "nvrtc", base, chunks), ("nvrtc cut, one chain", "nvrtc", base, 1 << 62),
            ("nvrtc no few cut", "nvrtc", 1 << 62, chunks), ("cub", "cub", base, chunks),
            ("auto", "auto", base, chunks))  # fmt: skip
    try:
        for name, backend, few, min_rows in rows:
            kernels.FEATURE_FEW_ROWS, kernels.FEATURE_CHUNKS_MIN_ROWS = few, min_rows
            linred.clear_plan_cache()
            cells = []
            for label, x, kw, ref in cases:
                r = linred.segmented_sum(x, **kw, backend=backend, check=False)
                err = ((r.double() - ref).abs().max() / ref.abs().max().clamp(min=1)).item()
                if not err < 1e-6:
                    raise AssertionError(f"{name}: {label}: relative error {err:.1e}")
                call = lambda x=x, kw=kw, b=backend: linred.segmented_sum(x, **kw, backend=b, check=False)
                cells.append(timeit(call, reps=10)[0])
            print(f"{name:22s}", " ".join(f"{t:9.1f}" for t in cells), flush=True)
    finally:
        kernels.FEATURE_FEW_ROWS, kernels.FEATURE_CHUNKS_MIN_ROWS = base, chunks
        linred.clear_plan_cache()
    copies = []
    for _, x, _, _ in cases:
        y = torch.empty_like(x)
        copies.append(timeit(lambda x=x, y=y: y.copy_(x))[0])
    print(f"{'copy (x -> y)':22s}", " ".join(f"{t:9.1f}" for t in copies))
    for label, *_ in cases:
        print("  ", label)


if __name__ == "__main__":
    main()
