"""Lengths into int64 offsets on a CUDA device: CuPy's and PyTorch's cumulative sums against CUB's
``DeviceScan`` (``cuda.compute.make_inclusive_scan``), and a copy of the same bytes, in one
process (CUDA events, median of 25 with the 10th and 90th percentiles; each result checked).

    python tools/lengths_scan.py
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import cupy
import numpy as np
import torch
from cuda.compute import OpKind, make_inclusive_scan


class _Stream:
    """A raw stream handle in the CUDA stream protocol (what cuda.compute takes)."""

    def __init__(self, handle: int) -> None:
        self.handle = int(handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def events(fn: Callable[[], object], reps: int = 25) -> tuple[float, float, float]:
    stream = cupy.cuda.get_current_stream()
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    times.sort()
    return statistics.median(times), times[len(times) // 10], times[-1 - len(times) // 10]


def _case(mean: int, dtype: type, rng: np.random.Generator, zero: np.ndarray) -> None:
    """One row of lengths: every method on the same arrays."""
    m = (1 << 28) // mean
    lengths = rng.geometric(1.0 / mean, size=m).astype(dtype)
    want = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    on_device = cupy.asarray(lengths)
    off = cupy.empty(m + 1, dtype=cupy.int64)
    moved = m * lengths.itemsize + (m + 1) * 8
    as_torch, off_torch = torch.as_tensor(on_device, device="cuda"), torch.as_tensor(off, device="cuda")
    scan = make_inclusive_scan(d_in=on_device, d_out=off[1:], op=OpKind.PLUS, init_value=zero)
    stream = _Stream(cupy.cuda.get_current_stream().ptr)
    args = dict(d_in=on_device, d_out=off[1:], op=OpKind.PLUS, init_value=zero, num_items=m, stream=stream)
    temp = cupy.empty(max(int(scan(temp_storage=None, **args)), 1), dtype=cupy.uint8)
    src = cupy.empty(moved // 2, dtype=cupy.uint8)
    dst = cupy.empty_like(src)

    def by_cupy() -> None:
        off[:1] = 0
        cupy.cumsum(on_device, dtype=cupy.int64, out=off[1:])

    def by_torch() -> None:
        off_torch[:1].zero_()
        torch.cumsum(as_torch, 0, dtype=torch.int64, out=off_torch[1:])

    def by_cub() -> None:
        off[:1] = 0
        scan(temp_storage=temp, **args)

    def copy() -> None:
        dst[...] = src

    for name, fn in (("copy (same bytes)", copy), ("cupy.cumsum", by_cupy), ("torch.cumsum", by_torch),
                     ("cub inclusive_scan", by_cub)):  # fmt: skip
        off[:] = -1
        med, lo, hi = events(fn)
        ok = name.startswith("copy") or bool((off.get() == want).all())
        print(f"mean {mean:5d} {np.dtype(dtype).name:6s} m={m:>11,d}  {name:20s} {med:8.1f} us "
              f"[{lo:7.1f}, {hi:7.1f}]  {moved / med / 1e3:7.0f} GB/s  correct={ok}", flush=True)  # fmt: skip


def main() -> None:
    rng = np.random.default_rng(0)
    zero = np.zeros(1, np.int64)
    for mean, dtype in ((16, np.int64), (16, np.int32), (256, np.int64), (2, np.int64)):
        _case(mean, dtype, rng, zero)


if __name__ == "__main__":
    main()
