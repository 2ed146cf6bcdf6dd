"""CPU benchmarks: linred's host backends beside NumPy's (and PyTorch's) own ways to a segmented sum.

NumPy arrays of ``N_CPU`` float32 elements' worth of bytes (2^22: 16 MiB; float64
cases hold half as many elements), random normal data.  ``time_sum`` is asv's
timing of one call; ``track_gbps`` reports (bytes read + bytes written) / the median
wall-clock time of one call, in GB/s.  ``linred bench --device cpu`` measures
larger buffers with more care; these are for history: did a commit make it slower?
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._common import (
    N_CPU,
    _Case,
    _SegmentedSum,
    check,
    import_torch,
    linred_sum,
    make_case,
    relative_error,
    torch_peer,
)

LINRED = ["linred-auto", "linred-numpy", "linred-nvmath"]


def _data(case: _Case) -> np.ndarray:
    return np.random.default_rng(case.seed).standard_normal(case.array_shape, dtype=np.dtype(case.dtype))


def _reference(case: _Case, x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    if case.fixed:
        return x64.reshape(case.m, case.shape.length, *x.shape[1:]).sum(axis=1)
    reference = np.zeros((case.m, *x.shape[1:]))
    nonempty = np.diff(case.offsets) > 0
    reference[nonempty] = np.add.reduceat(x64, case.offsets[:-1][nonempty], axis=0)
    return reference


def _reduceat(case: _Case, x: np.ndarray) -> Callable[[], Any]:
    starts = np.arange(0, case.rows, case.shape.length) if case.fixed else case.offsets[:-1]
    empty = None if case.fixed else np.diff(case.offsets) == 0
    if empty is None or not empty.any():
        return lambda: np.add.reduceat(x, starts, axis=0)

    # reduceat gives an empty segment the element at its start: what a careful user must add
    # is part of the cost.  (A start of n would be refused, but the last segment is never empty here.)
    def fn() -> np.ndarray:
        result = np.add.reduceat(x, starts, axis=0)
        result[empty] = 0
        return result

    return fn


def _peer(method: str, case: _Case, x: np.ndarray) -> Callable[[], Any]:
    rest = x.shape[1:]
    if method == "numpy-reduceat":
        return _reduceat(case, x)
    if method == "numpy-reshape-sum":
        view = x.reshape(case.m, case.shape.length, *rest)
        return lambda: view.sum(axis=1)
    if method == "numpy-matmul-ones":  # the formulation linred is built on, straight through NumPy's BLAS
        ones = np.ones(case.shape.length, dtype=x.dtype)
        if not rest:
            view = x.reshape(case.m, case.shape.length)
            return lambda: view @ ones
        view3 = x.reshape(case.m, case.shape.length, *rest)
        return lambda: np.matmul(ones, view3)
    torch = import_torch()
    return torch_peer(method, case, torch.from_numpy(x), None if case.fixed else torch.from_numpy(case.offsets))


class _HostSum(_SegmentedSum):
    def prepare(self, method: str, shape: str, dtype: str) -> tuple[Callable[[], Any], int]:
        case = make_case(shape, dtype, N_CPU)
        x = _data(case)
        if method.startswith("linred-"):
            segments = {"segment_length": case.shape.length} if case.fixed else {"offsets": case.offsets}
            fn, result = linred_sum(method, x, segments)
        else:
            fn = _peer(method, case, x)
            result = fn()  # warm-up
        result = np.asarray(result)  # a torch CPU tensor shares its memory
        check(*relative_error(np, result.astype(np.float64), _reference(case, x)), dtype, method)
        return fn, case.nbytes


class CpuFixed(_HostSum):
    """Fixed segment lengths: the data viewed as an (m, L) matrix (or (m, L, d) with features)."""

    params = (
        [*LINRED, "numpy-reduceat", "numpy-reshape-sum", "numpy-matmul-ones", "torch-sum"],
        ["L=2", "L=32", "L=1024", "d=64 L=8"],
        ["float32", "float64"],
    )


class CpuVariable(_HostSum):
    """Variable lengths from offsets: geometric lengths, and half of the segments empty."""

    params = (
        [*LINRED, "linred-auto-checked", "numpy-reduceat", "torch-segment_reduce"],
        ["geom 16", "half empty"],
        ["float32", "float64"],
    )
