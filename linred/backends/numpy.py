"""The NumPy backend: host arrays through NumPy's BLAS and ufuncs.

- Fixed-length sum and mean of floating data: the ``(m, L)`` view of the data
  times a ones vector (``np.matmul``, a BLAS GEMV), 3-18x faster than
  ``x.reshape(m, L).sum(1)`` or ``np.add.reduceat`` on the CPU.  Data whose dtype
  differs from the accumulation dtype (float16, bfloat16, ``dtype=``) is converted
  in bounded blocks, never as a whole copy.
- Integer sums and max/min: ``ufunc.reduce`` over the segment axis.
- Offsets: ``ufunc.reduceat`` over the starts of the non-empty segments only, so
  that empty segments get the reduction's identity instead of ``reduceat``'s
  copy of the next element.

It serves NumPy arrays and CPU PyTorch tensors (viewed as NumPy arrays, no copy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from linred._dtypes import identity, numpy_dtype
from linred.backends.base import Backend, FunctionExecutor
from linred.problem import Problem
from linred.segments import Segments, VariableSegments

#: elements converted per block when the data's dtype is not the accumulation dtype
BLOCK_ELEMENTS = 1 << 18


def host_view(a: Any) -> np.ndarray:
    """A NumPy view of a NumPy array or a CPU PyTorch tensor (no copy)."""
    if isinstance(a, np.ndarray):
        return a
    import torch

    if a.dtype == torch.bfloat16:  # torch cannot export bfloat16 to NumPy directly
        return a.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return a.numpy()


def _merge_rows(x4: np.ndarray) -> np.ndarray | None:
    """``(B, m, L)`` as an ``(B*m, L)`` view (one BLAS call instead of B), or None."""
    v = x4.view()
    try:
        v.shape = (x4.shape[0] * x4.shape[1], x4.shape[2])
    except AttributeError:  # not expressible as a view
        return None
    return v


def _fixed_sum(x4: np.ndarray, out3: np.ndarray, acc: np.dtype, ones: np.ndarray | None) -> None:
    """``out3 = x4.sum(axis=2)`` in ``acc``, as a product with ``ones`` for floating dtypes."""
    B, m, L, D = x4.shape
    if acc.kind in "biu":
        np.add.reduce(x4, axis=2, dtype=acc, out=out3)
        return
    if acc.kind == "c":
        # Real and imaginary parts separately: a complex product with ones would turn
        # an infinite part into NaN (inf * 0 in the cross terms).
        real = ones.dtype
        _fixed_sum(x4.real, out3.real, real, ones)
        _fixed_sum(x4.imag, out3.imag, real, ones)
        return
    if x4.dtype == acc and out3.dtype == acc:
        _product_with_ones(x4, ones, out3)
        return
    # Convert in blocks of rows: bounded extra memory, never a copy of the input.
    rows = max(1, BLOCK_ELEMENTS // max(1, L * D))
    tmp = np.empty((B, min(rows, m), D), dtype=acc) if out3.dtype != acc else None
    for start in range(0, m, rows):
        stop = min(start + rows, m)
        block = x4[:, start:stop].astype(acc)
        target = out3[:, start:stop] if tmp is None else tmp[:, : stop - start]
        _product_with_ones(block, ones, target)
        if tmp is not None:
            np.copyto(out3[:, start:stop], target, casting="unsafe")


def _product_with_ones(x4: np.ndarray, ones: np.ndarray, out3: np.ndarray) -> None:
    B, m, _, D = x4.shape
    if D == 1:
        rows = _merge_rows(x4[..., 0])
        if rows is not None:
            np.matmul(rows, ones, out=out3.reshape(B * m))
        else:
            np.matmul(x4[..., 0], ones, out=out3[..., 0])
    else:
        np.matmul(ones, x4, out=out3)


def _divide(num: np.ndarray, den: Any, out: np.ndarray) -> None:
    """``out = num / den`` for a real ``den``; complex parts are divided separately, so
    that an infinite part stays infinite instead of becoming NaN."""
    if out.dtype.kind == "c":
        np.divide(num.real, den, out=out.real, casting="unsafe")
        np.divide(num.imag, den, out=out.imag, casting="unsafe")
    else:
        np.divide(num, den, out=out, casting="unsafe")


def _fixed(problem: Problem):
    acc = numpy_dtype(problem.acc_dtype)
    reduction = problem.reduction
    B, _, D = problem.in_shape
    L = problem.segment_length
    m = problem.num_segments
    # The ones vector depends only on the plan: made once, reused by every call.
    ones = None if acc.kind in "biu" else np.ones(L, dtype=np.empty(0, acc).real.dtype)

    def run(x: Any, out: Any, segments: Segments, stream: Any) -> None:
        x4 = host_view(x).reshape(B, m, L, D)
        out3 = host_view(out)
        if reduction in ("max", "min"):
            ufunc = np.maximum if reduction == "max" else np.minimum
            if out3.dtype == x4.dtype:
                ufunc.reduce(x4, axis=2, out=out3)
            else:
                np.copyto(out3, ufunc.reduce(x4, axis=2), casting="unsafe")
        elif reduction == "sum":
            _fixed_sum(x4, out3, acc, ones)
        else:  # mean
            total = out3 if acc == out3.dtype else np.empty(out3.shape, dtype=acc)
            _fixed_sum(x4, total, acc, ones)
            _divide(total, L, out3)

    return run


def _variable(problem: Problem):
    acc = numpy_dtype(problem.acc_dtype)
    reduction = problem.reduction
    fill = identity(reduction, problem.out_dtype)

    def run(x: Any, out: Any, segments: Segments, stream: Any) -> None:
        assert isinstance(segments, VariableSegments)
        x3 = host_view(x)
        out3 = host_view(out)
        off = np.asarray(segments.offsets, dtype=np.intp)
        if segments.min_length:  # checked: no empty segment, so no mask to build
            lengths = nonempty = None
            starts = off[:-1]
            all_nonempty = True
        else:
            lengths = np.diff(off)
            nonempty = lengths > 0
            starts = off[:-1][nonempty]
            all_nonempty = starts.shape[0] == lengths.shape[0]
        if not all_nonempty:
            out3[:, ~nonempty, :] = fill
        if starts.shape[0] == 0:
            return
        # With no empty segment and the result dtype as computed, reduce straight into out.
        direct = all_nonempty and reduction != "mean"
        if reduction in ("max", "min"):
            ufunc = np.maximum if reduction == "max" else np.minimum
            if direct and out3.dtype == x3.dtype:
                ufunc.reduceat(x3, starts, axis=1, out=out3)
                return
            result = ufunc.reduceat(x3, starts, axis=1)
        elif direct and out3.dtype == acc:
            np.add.reduceat(x3, starts, axis=1, dtype=acc, out=out3)
            return
        else:
            result = np.add.reduceat(x3, starts, axis=1, dtype=acc)
            if reduction == "mean":
                quotient = np.empty(result.shape, dtype=np.result_type(acc, np.float32))
                counts = np.diff(off) if lengths is None else lengths[nonempty]
                _divide(result, counts[None, :, None], quotient)
                result = quotient
        if all_nonempty:
            np.copyto(out3, result, casting="unsafe")
        else:
            out3[:, nonempty, :] = result

    return run


class NumpyBackend(Backend):
    name = "numpy"
    summary = "host arrays: BLAS GEMV (data @ ones) for fixed lengths, ufunc.reduceat for offsets"

    def unsupported(self, problem: Problem) -> str | None:
        if problem.device is not None:
            return f"it runs on the host and the data is a {problem.kind} array on CUDA device {problem.device}"
        if problem.dtype == "bfloat16" and problem.kind == "numpy":
            try:
                numpy_dtype("bfloat16")
            except TypeError as e:
                return str(e)
        return None

    def plan(self, problem: Problem) -> FunctionExecutor:
        make = _fixed if problem.fixed else _variable
        return FunctionExecutor(make(problem))


BACKEND = NumpyBackend()
