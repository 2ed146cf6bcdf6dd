#!/usr/bin/env python3
"""What a small checked call (the default ``check=True``) waits for, on a GPU, with PyTorch.

A checked call raises before it returns, so it waits for its stream; an unchecked call returns
while its kernel runs, and the caller's own synchronization waits for it.  This times GNN-pooling
calls (``segmented_sum(x, offsets=ptr)`` of CUDA tensors) as a loop of call + ``torch.cuda.
synchronize()`` would see them, beside the same calls followed by a stream synchronization inside
the timed function, and ``torch.segment_reduce`` both ways: the difference between the rows with
and without that synchronization is the wait itself, the rest is linred's bookkeeping.

Each row: 9 samples of 500 calls, the rows interleaved sample by sample, warm; median [min, max]
of the per-call host time in µs.

Usage: ``python tools/checked_call_wait.py``
"""

from __future__ import annotations

import time

import numpy as np
import torch

import linred

SHAPES = [(2000, 64, 32), (50000, 128, 256)]  # rows, features, graphs


def _data(n: int, d: int, graphs: int) -> tuple[torch.Tensor, torch.Tensor]:
    cuts = np.sort(np.random.default_rng(0).choice(np.arange(1, n), graphs - 1, replace=False))
    return torch.randn(n, d, device="cuda"), torch.tensor(np.r_[0, cuts, n], device="cuda")


def _host(f, number: int = 500) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        f()
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / number * 1e6


def _rows(x: torch.Tensor, ptr: torch.Tensor) -> dict[str, object]:
    """The timed calls on one shape's buffers."""
    s = torch.cuda.current_stream()

    def linred_synced() -> None:
        linred.segmented_sum(x, offsets=ptr, check=False)
        s.synchronize()

    def torch_synced() -> None:
        torch.segment_reduce(x, "sum", offsets=ptr, axis=0)
        s.synchronize()

    return {
        "linred default": lambda: linred.segmented_sum(x, offsets=ptr),
        "linred check=False": lambda: linred.segmented_sum(x, offsets=ptr, check=False),
        "linred check=False + stream sync": linred_synced,
        "torch.segment_reduce": lambda: torch.segment_reduce(x, "sum", offsets=ptr, axis=0),
        "torch.segment_reduce + stream sync": torch_synced,
    }


def main() -> None:
    for n, d, graphs in SHAPES:
        rows = _rows(*_data(n, d, graphs))
        for f in rows.values():
            for _ in range(50):
                f()
        samples: dict[str, list[float]] = {k: [] for k in rows}
        for _ in range(9):
            for k, f in rows.items():
                samples[k].append(_host(f))
        print(f"== {n} x {d}, {graphs} segments: host time per call with synchronize, "
              f"median [min, max] of 9 samples of 500 calls, us")  # fmt: skip
        for k, v in samples.items():
            print(f"  {k:36s} {np.median(v):7.2f} [{min(v):.2f}, {max(v):.2f}]")


if __name__ == "__main__":
    main()
