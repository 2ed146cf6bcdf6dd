"""var of long segments on a CUDA device: linred's pieces (linred._pieces) against the composition
(``linred._pieces.ENABLED = False``) in one process, and ``torch.var`` of the same rows where the
lengths are fixed.

Every row: CUDA events around each call (median of 15 after 3 warm-up calls, with the 2nd and
14th), the host time of a call with a ``torch.cuda.synchronize()``, and the largest relative
error against float64.  Percentages are of a device-to-device copy's bandwidth, the reduction's
bytes being the data read once.

    python tools/var_long_segments.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

import linred
from linred import _pieces

CASES = [(1 << 26, 1, torch.float32), (1 << 26, 1, torch.float64), (1 << 26, 1, torch.float16),
         (1 << 22, 1, torch.float32), (1 << 20, 1, torch.float32), (1 << 20, 64, torch.float32),
         (1 << 18, 128, torch.float32), (1 << 24, 16, torch.float32)]  # fmt: skip


def events(fn: Callable[[], object], reps: int = 15) -> tuple[float, float, float]:
    """Device µs per call: the median, 2nd and next-to-last of ``reps`` samples."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return statistics.median(times), times[1], times[-2]


def host(fn: Callable[[], object], reps: int = 15) -> float:
    """Host µs per call with a synchronize, the median of ``reps``."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def main() -> None:
    rng = np.random.default_rng(0)
    for n, d, dtype in CASES:
        x = (torch.randn(n, d, device="cuda") * 3 + 100).to(dtype)
        x = x.reshape(n) if d == 1 else x
        y = torch.empty_like(x)
        copy = events(lambda x=x, y=y: y.copy_(x))[0]
        xd = x.double()
        for m in (1, 16, 1024) if d == 1 else (1, 8, 64):
            length = n // m
            even = torch.arange(0, n + 1, length, device="cuda")
            cuts = np.sort(rng.choice(np.arange(1, n), m - 1, replace=False))
            random = torch.as_tensor(np.concatenate([[0], cuts, [n]]), device="cuda")
            for label, kw, bounds in (("fixed", {"segment_length": length}, even), ("offsets", {"offsets": even}, even),
                                      ("random offsets", {"offsets": random}, random)):  # fmt: skip
                b = bounds.cpu().numpy()
                ref = torch.stack([xd[b[i] : b[i + 1]].var(0, correction=0) for i in range(len(b) - 1)])
                row = []
                for enabled in (False, True):
                    _pieces.ENABLED = enabled

                    def call(x=x, kw=kw) -> object:
                        return linred.segmented_var(x, **kw)

                    err = ((call().double() - ref).abs() / ref.abs()).max().item()
                    t, h = events(call), host(call)
                    row.append(f"{'pieces' if enabled else 'composed'} {t[0]:8.1f} [{t[1]:.1f},{t[2]:.1f}] us "
                               f"({copy / t[0] * 50:5.1f}% copy) host+sync {h:8.1f}  err {err:.1e}")  # fmt: skip
                _pieces.ENABLED = True
                peer = ""
                if label == "fixed":
                    rows = x.view(m, length, *x.shape[1:])
                    tv = events(lambda rows=rows: torch.var(rows, 1, correction=0))
                    peer = f" | torch.var {tv[0]:8.1f} us ({copy / tv[0] * 50:5.1f}%)"
                name = str(dtype).removeprefix("torch.")
                print(f"{name:8s} {n:>9d}x{d:<3d} m={m:<5d} {label:14s} " + " | ".join(row) + peer, flush=True)


if __name__ == "__main__":
    main()
