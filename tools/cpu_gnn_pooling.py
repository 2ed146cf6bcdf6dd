"""GNN pooling on the CPU: linred with its default arguments against torch ``index_add_``,
``torch.segment_reduce`` and ``np.add.reduceat``, float32 feature rows with offsets (and narrow
rows in segments of 2), in one process on the same buffers; each method's error against float64.

    python tools/cpu_gnn_pooling.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import linred

#: (name, rows N, features d, segments m, layout of the lengths)
CASES = (
    ("a 512,000 x 64, 256", 512_000, 64, 256, "even"),
    ("b 50,000 x 128, 256", 50_000, 128, 256, "even"),
    ("c 2,000 x 64, 32", 2000, 64, 32, "even"),
    ("d 10^6 x 16, 4,096", 1_000_000, 16, 4096, "even"),
    ("f 10,000 x 256, 8 (one of 9,000 rows)", 10_000, 256, 8, "skewed"),
    ("g 209,000 x 32, 4,096 random (empties)", 209_000, 32, 4096, "random"),
)


def timed(fn: Callable[[], Any], samples: int = 15) -> tuple[float, float, float]:
    """Median, min and max ms per call of ``samples`` calls after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[samples // 2], times[0], times[-1]


def offsets(n: int, m: int, layout: str, rng: np.random.Generator) -> np.ndarray:
    if layout == "skewed":  # one segment of 9,000 rows, the rest shared out
        lengths = np.full(m, (n - 9000) // (m - 1))
        lengths[0] = 9000
        lengths[-1] += n - lengths.sum()
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if layout == "random":  # random cuts: some segments empty
        cuts = np.sort(rng.integers(0, n + 1, m - 1))
    else:
        cuts = np.linspace(0, n, m + 1).astype(np.int64)[1:-1]
    return np.concatenate([[0], cuts, [n]]).astype(np.int64)


def report(label: str, fn: Callable[[], Any], reference: np.ndarray, samples: int = 15) -> None:
    got = np.asarray(fn())
    err = np.abs(got - reference).max() / np.abs(reference).max()
    med, lo, hi = timed(fn, samples)
    print(f"  {label:38s} {med:8.3f} [{lo:.3f}, {hi:.3f}]  err {err:.1e}")


def feature_rows(name: str, n: int, d: int, m: int, layout: str, rng: np.random.Generator) -> None:
    x = rng.random((n, d), dtype=np.float32)
    ptr = offsets(n, m, layout, rng)
    xt, pt = torch.from_numpy(x), torch.from_numpy(ptr)
    batch = torch.repeat_interleave(torch.arange(m), torch.from_numpy(np.diff(ptr)))
    reference = np.add.reduceat(x.astype(np.float64), np.minimum(ptr[:-1], n - 1), axis=0)
    reference[np.diff(ptr) == 0] = 0
    print(f"== {name}")
    report("linred segmented_sum(x, offsets=ptr)", lambda: linred.segmented_sum(x, offsets=ptr), reference)
    report("linred, torch CPU tensors", lambda: linred.segmented_sum(xt, offsets=pt), reference)
    report("torch index_add_", lambda: torch.zeros(m, d).index_add_(0, batch, xt), reference)
    report("torch.segment_reduce", lambda: torch.segment_reduce(xt, "sum", offsets=pt), reference)
    if (np.diff(ptr) > 0).all():  # (reduceat reads an empty segment's next value)
        report("np.add.reduceat", lambda: np.add.reduceat(x, ptr[:-1], axis=0), reference)
    else:
        print(f"  {'np.add.reduceat':38s} n/a (empty segments)")


def narrow_rows(rng: np.random.Generator) -> None:
    n, d, L = 2_500_000, 4, 2
    m = n // L
    x = rng.random((n, d), dtype=np.float32)
    xt = torch.from_numpy(x)
    batch, pt = torch.arange(n) // L, torch.arange(0, n + 1, L)
    reference = x.reshape(m, L, d).astype(np.float64).sum(1)
    print(f"== e {n:,} x {d}, fixed L = {L} ({m:,} segments)")
    report("linred segmented_sum(x, 2)", lambda: linred.segmented_sum(x, L), reference, 9)
    report("torch index_add_", lambda: torch.zeros(m, d).index_add_(0, batch, xt), reference, 9)
    report("torch.segment_reduce", lambda: torch.segment_reduce(xt, "sum", offsets=pt), reference, 9)
    report("np.add.reduceat", lambda: np.add.reduceat(x, np.arange(0, n, L), axis=0), reference, 9)
    report("x.reshape(m, 2, 4).sum(1)", lambda: x.reshape(m, L, d).sum(1), reference, 9)


def main() -> None:
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    print(
        f"linred {linred.__version__}, numpy {np.__version__}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); ms per call, median [min, max] of 15; float32; "
        "error: largest relative error against float64"
    )
    for case in CASES:
        feature_rows(*case, rng)
    narrow_rows(rng)


if __name__ == "__main__":
    main()
