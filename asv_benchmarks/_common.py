"""Shared by the benchmarks: data, correctness checks, linred callables, timing helpers.

No benchmark lives here (asv collects ``time_*``/``track_*`` names from every module).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: every linred method a benchmark may name, as "linred-<backend>"
LINRED_METHODS = ("linred-auto", "linred-numpy", "linred-nvmath", "linred-cublas", "linred-cub")


def host_data(n: int, seed: int = 0) -> np.ndarray:
    """float32 values in [1, 2): segment sums are far from 0, so relative errors mean something."""
    x = np.random.default_rng(seed).random(n, dtype=np.float32)
    x += 1
    return x


def geometric_offsets(n: int, mean_length: int, seed: int = 1) -> np.ndarray:
    """int64 offsets of segments with geometric lengths (>= 1) of the given mean, covering ``n``."""
    lengths = np.random.default_rng(seed).geometric(1 / mean_length, size=2 * n // mean_length + 2)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.append(offsets[offsets < n], n).astype(np.int64)


def linred_call(method: str, x: Any, out: Any, **segments: Any) -> Callable[[], Any]:
    """A no-argument callable running ``linred.segmented_sum`` with the backend of ``method``.

    Raises NotImplementedError (asv's "skip") where the backend cannot serve the
    call here: not installed, no GPU, refused, or absent from the linred being measured.
    """
    import linred

    backend = method.removeprefix("linred-")
    try:
        linred.SegmentedReduction(x, **segments, backend=backend).free()
    except (linred.BackendError, ValueError) as e:  # ValueError: a backend name this version lacks
        raise NotImplementedError(f"{method}: {e}") from None
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("linred.backends."):
            raise NotImplementedError(f"{method}: {e}") from None
        raise
    return lambda: linred.segmented_sum(x, **segments, backend=backend, out=out)


def check(result: np.ndarray, reference: np.ndarray, max_length: int, method: str) -> None:
    """Refuse to measure a method whose result is wrong (a wrong result is never fast)."""
    err = float(np.max(np.abs(result.astype(np.float64) - reference) / np.abs(reference)))
    tolerance = 2 * max_length * float(np.finfo(np.float32).eps)
    if not err <= tolerance:
        raise ValueError(f"{method} gives a wrong result: max relative error {err:.2e} > {tolerance:.2e}")


def median_seconds(f: Callable[[], Any], repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gpu_or_skip() -> Any:
    """The ``cupy`` module when a CUDA device is visible; else NotImplementedError (asv skips)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as e:
        raise NotImplementedError(f"no usable CUDA device ({type(e).__name__}: {e})") from None
    return cupy


def cuda_median_seconds(cupy: Any, f: Callable[[], Any], repeat: int = 10) -> float:
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        f()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return statistics.median(times)
