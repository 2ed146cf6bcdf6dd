"""The NumPy backend: host arrays through NumPy's BLAS and ufuncs.

- Fixed-length sum and mean of floating data: the ``(m, L)`` view of the data
  times a ones vector (``np.matmul``, a BLAS GEMV), 3-18x faster than
  ``x.reshape(m, L).sum(1)`` or ``np.add.reduceat`` on the CPU.  Data whose dtype
  differs from the accumulation dtype (float16, bfloat16, ``dtype=``) is converted
  in bounded blocks, never as a whole copy.
- Integer sums and max/min: ``ufunc.reduce`` over the segment axis.
- Offsets: ``ufunc.reduceat`` over the starts of the non-empty segments only, so
  that empty segments get the reduction's identity instead of ``reduceat``'s
  copy of the next element.  Large calls are cut into runs of whole segments
  reduced by several threads at once (NumPy releases the GIL inside
  ``reduceat``); ``LINRED_NUM_THREADS`` caps their number.

It serves NumPy arrays and CPU PyTorch tensors (viewed as NumPy arrays, no copy).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from linred._dtypes import identity, numpy_dtype
from linred._fpwarnings import at_caller, pool_context, reissue
from linred.arrays.views import host_view
from linred.backends.base import Backend, FunctionExecutor
from linred.problem import Problem
from linred.segments import Segments, VariableSegments

#: ``np.count_nonzero`` without its ``__array_function__`` dispatch (once per unchecked call)
_count_nonzero = getattr(np.count_nonzero, "_implementation", np.count_nonzero)

#: elements converted per block when the data's dtype is not the accumulation dtype
BLOCK_ELEMENTS = 1 << 18
#: fewest elements per thread of a ``reduceat`` cut across threads (below, one thread)
THREAD_ELEMENTS = 1 << 20

_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


#: per thread: whether its calls reduce on that thread alone (see single_threaded)
_local = threading.local()


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Within the block, this thread's calls use no pool threads (``num_threads() == 1``).

    For callers that already run one call per core, such as Dask's tasks
    (:mod:`linred.dask`): the pool would oversubscribe the cores.  Other threads are not
    affected; the results' bits do not depend on the thread count.
    """
    outer = getattr(_local, "single", False)
    _local.single = True
    try:
        yield
    finally:
        _local.single = outer


def num_threads() -> int:
    """Threads for one ``reduceat``: the CPUs this process may use, capped by ``LINRED_NUM_THREADS``."""
    if getattr(_local, "single", False):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    cap = thread_cap()
    return max(1, cpus if cap is None else min(cpus, cap))


def thread_cap() -> int | None:
    """``LINRED_NUM_THREADS`` as a positive integer, None when unset or empty.

    Raises
    ------
    ValueError
        If it is set to anything else (``0``, ``-2``, ``abc``).
    """
    cap = os.environ.get("LINRED_NUM_THREADS", "").strip()
    if not cap:
        return None
    try:
        value = int(cap)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"LINRED_NUM_THREADS must be a positive integer; got {cap!r}")
    return value


def _executor(workers: int) -> ThreadPoolExecutor:
    """A pool of at least ``workers`` threads, shared by every call (made larger when needed)."""
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers < workers:
            _pool, _pool_workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="linred"), workers
        return _pool


def _reduceat(ufunc: Any, x3: np.ndarray, starts: np.ndarray, out: np.ndarray, dtype: Any = None) -> None:
    """``out[:] = ufunc.reduceat(x3, starts, axis=1)`` for strictly increasing ``starts``.

    One long 1-D input is cut into runs of whole segments of about equal size, each
    reduced by its own thread (the bits are the same: every segment is still
    reduced in order by one thread).  A run's data is the view ``x[:end]`` that
    stops where the next run starts, so its starts need no shifting.  Only 1-D
    ``reduceat`` without ``out=`` or a casting ``dtype=`` releases the GIL in NumPy
    (measured: 1.9x on 2 cores; no gain at all otherwise), hence those forms.
    """
    B, n, D = x3.shape
    k = starts.shape[0]
    chunks = min(B * n * D // THREAD_ELEMENTS, k) if B == 1 and D == 1 else 1
    if chunks > 1:
        chunks = min(chunks, num_threads())
    if chunks <= 1:
        if B == 1 and D == 1:  # 1-D: NumPy's reduceat is quickest on a 1-D array
            ufunc.reduceat(x3.reshape(n), starts, dtype=dtype, out=out.reshape(k))
        else:
            ufunc.reduceat(x3, starts, axis=1, dtype=dtype, out=out)
        return
    x1, out1 = x3[0, :, 0], out[0, :, 0]
    same = dtype is None or np.dtype(dtype) == x1.dtype
    cuts = np.searchsorted(starts, np.linspace(0, n, chunks + 1)[1:-1]).tolist()
    bounds = list(zip([0, *cuts], [*cuts, k], strict=True))

    def run(a: int, b: int) -> None:
        if a < b:
            end = int(starts[b]) if b < k else n
            part = ufunc.reduceat(x1[:end], starts[a:b]) if same else ufunc.reduceat(x1[:end], starts[a:b], dtype=dtype)
            out1[a:b] = part

    # Each pool thread runs in a copy of the caller's context (NumPy's error modes are context
    # variables); its warnings are issued from this thread, at the caller's line.
    pending: list[str] = []
    pool = _executor(chunks)
    futures = [pool.submit(pool_context(pending).run, run, a, b) for a, b in bounds[1:]]
    try:
        run(*bounds[0])
    finally:
        for f in futures:
            f.result()
    reissue(pending)


def _reshaped(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` viewed with ``shape``, or None where that would need a copy."""
    try:
        return np.reshape(a, shape, copy=False)
    except TypeError:  # pragma: no cover - NumPy < 2.1 has no copy= argument
        v = a.view()
        try:
            v.shape = shape
        except AttributeError:
            return None
        return v
    except ValueError:
        return None


#: the most elements of a segment that one BLAS product adds up, for one feature column and
#: for several.  BLAS keeps a few running sums per row (per column of feature rows), each as
#: long as the row allows: one float32 segment of 2^24 values came out 3e-3 off, (n/4, 4)
#: feature rows of 2^17 3e-6 off (6e-7 for 1024 rows).  A longer segment is cut into blocks
#: of at most this many, whose sums are added in float64.
BLAS_BLOCK = 1024
BLAS_BLOCK_FEATURES = 256


def _blas_block(D: int) -> int:
    """The most rows of ``D`` features one BLAS product adds up along a segment."""
    return BLAS_BLOCK if D == 1 else BLAS_BLOCK_FEATURES


def _block_length(L: int, D: int) -> int:
    """The block of a segment of ``L`` rows of ``D`` features longer than its BLAS block: its
    largest divisor between a quarter of that and that (then every block of every segment is
    one row of one product), else the BLAS block (whole blocks, then the remainder)."""
    most = _blas_block(D)
    for k in range(most, most // 4 - 1, -1):
        if L % k == 0:
            return k
    return most


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
    if _blas_block(D) < L:
        _long_sum(x4, out3, acc, ones)
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


def _long_sum(x4: np.ndarray, out3: np.ndarray, acc: np.dtype, ones: np.ndarray) -> None:
    """:func:`_fixed_sum` of segments longer than their BLAS block: the sums of their blocks
    (products with ones, in ``acc``) added in float64, converted from the data's dtype a bounded
    piece at a time where it is not ``acc``."""
    B, m, L, D = x4.shape
    K = _block_length(L, D)
    q, r = divmod(L, K)
    total = np.zeros((B, m, D), dtype=np.float64)
    convert = x4.dtype != acc
    # Segments, and blocks of a segment, per pass: all at once unless the data is converted.
    rows, blocks = m, q
    if convert:
        rows = max(1, BLOCK_ELEMENTS // (L * D))
        blocks = q if rows > 1 else max(1, BLOCK_ELEMENTS // (K * D))
    for s0 in range(0, m, rows):
        s1 = min(m, s0 + rows)
        for b0 in range(0, q, blocks):
            b1 = min(q, b0 + blocks)
            piece = x4[:, s0:s1, b0 * K : b1 * K]
            piece = (piece.astype(acc) if convert else piece).reshape(B, s1 - s0, b1 - b0, K, D)  # a view
            sums = np.empty((B, s1 - s0, b1 - b0, D), dtype=acc)
            _blocks_with_ones(piece, ones[:K], sums)
            total[:, s0:s1] += np.add.reduce(sums, axis=2, dtype=np.float64)
        if r:
            rest = x4[:, s0:s1, q * K :]
            sums = np.empty((B, s1 - s0, D), dtype=acc)
            _product_with_ones(rest.astype(acc) if convert else rest, ones[:r], sums)
            total[:, s0:s1] += sums
    np.copyto(out3, total, casting="same_kind")


def _blocks_with_ones(x5: np.ndarray, ones: np.ndarray, out4: np.ndarray) -> None:
    """``out4 = x5.sum(axis=3)`` for blocks ``(B, m, q, K, D)``: one product where the blocks
    are the rows of one matrix, else one per segment."""
    B, m, q, K, D = x5.shape
    merged = _reshaped(x5, (B, m * q, K, D))
    if merged is not None:
        _product_with_ones(merged, ones, out4.reshape(B, m * q, D))
    elif D == 1:
        np.matmul(x5[..., 0], ones, out=out4[..., 0])
    else:
        np.matmul(ones, x5, out=out4)


#: short segments of narrow feature rows are summed as one product with a stacked identity
#: (``(B*m, L*D) @ [I_D; ...; I_D]``) where ``L * D * D`` is at most this: a batch of m tiny
#: ``(1, L) @ (L, D)`` products costs about 30 ns each in NumPy.  2 cores, float32: (2.5M, 4)
#: rows with L = 2 took 3.5 ms against 35.8; D = 16, L = 2: 4.5 against 14.2; D = 8, L = 16
#: (1024): 3.8 against 2.6, D = 16, L = 8 (2048): 8.5 against 4.7.
IDENTITY_PRODUCT_MAX = 512
#: ... and where there are at least this many segments (its floating-point mode switch costs a
#: few µs, more than the batch of products of a small call)
IDENTITY_PRODUCT_MIN_SEGMENTS = 2048


@functools.lru_cache(maxsize=32)
def _stacked_identity(L: int, D: int, dtype: np.dtype) -> np.ndarray:
    """``L`` copies of the ``D x D`` identity stacked: ``(L*D, D)``, read-only (shared by plans)."""
    e = np.tile(np.eye(D, dtype=dtype), (L, 1))
    e.flags.writeable = False
    return e


def _product_with_ones(x4: np.ndarray, ones: np.ndarray, out3: np.ndarray) -> None:
    B, m, L, D = x4.shape
    if (
        D > 1
        and L * D * D <= IDENTITY_PRODUCT_MAX
        and B * m >= IDENTITY_PRODUCT_MIN_SEGMENTS
        and x4.dtype == out3.dtype
    ):
        rows, results = _reshaped(x4, (B * m, L * D)), _reshaped(out3, (B * m, D))
        if rows is not None and results is not None:
            # Each result adds its L values times 1, and the row's other values times 0: the same
            # sums, unless a value is infinite or NaN, whose product with 0 (NaN) reaches the other
            # features' results.  Any such value leaves a NaN in the results, which one pass over
            # them finds (the minimum propagates NaN); those segments are summed again apart, which
            # warns where their own sums are invalid (the product's 0 * inf must not).
            with np.errstate(invalid="ignore"):
                np.matmul(rows, _stacked_identity(L, D, x4.dtype), out=results)
            if np.isnan(np.minimum.reduce(results, axis=None)):
                again = np.flatnonzero(np.isnan(results).any(axis=1))
                results[again] = np.matmul(ones, x4.reshape(B * m, L, D)[again])
            return
    if D == 1:
        rows = _reshaped(x4[..., 0], (B * m, x4.shape[2]))
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


def _contiguous(problem: Problem) -> bool:
    """Whether the data is C-contiguous (then any reshape of the caller's array is a view)."""
    _, n, D = problem.in_shape
    expected = (n * D, D, 1)
    return all(s == e for s, e, d in zip(problem.strides, expected, problem.in_shape, strict=True) if d > 1)


#: the reductions NumPy computes with one ufunc's reduce and reduceat (sums and means go through
#: BLAS products where they can, for accuracy and speed)
_UFUNCS = {"max": np.maximum, "min": np.minimum, "prod": np.multiply}


def _fixed_direct(problem: Problem):
    """The common fixed-length call as one NumPy call on the caller's arrays, or None.

    NumPy data, C-contiguous, reduced in its own dtype into a result of that dtype,
    one feature column, segments no longer than a BLAS block: one GEMV (sum, mean)
    or one ``ufunc.reduce`` (max, min) on the ``(rows, L)`` view, nothing else.
    """
    acc = numpy_dtype(problem.acc_dtype)
    B, _, D = problem.in_shape
    L = problem.segment_length
    rows = (B * problem.num_segments, L)
    if not (
        problem.kind == "numpy"
        and D == 1
        and _contiguous(problem)
        and problem.dtype == problem.acc_dtype == problem.out_dtype
        and acc.kind in "fiub"
    ):
        return None
    # A 1-D result (the common call) is used as it is: a reshape to its own shape costs a view
    # (0.1-0.3 us of a 1.6 us call on 1,024 values).
    flat = (rows[0],)
    if problem.reduction in _UFUNCS:
        reduce = _UFUNCS[problem.reduction].reduce

        def run(x: Any, out: Any, segments: Segments, stream: Any) -> None:
            reduce(x.reshape(rows), axis=1, out=out if out.shape == flat else out.reshape(flat))

        return run
    if acc.kind != "f" or _blas_block(1) < L:
        return None
    ones = np.ones(L, dtype=acc)
    matmul, divide = np.matmul, np.divide
    if problem.reduction == "sum":

        def run(x: Any, out: Any, segments: Segments, stream: Any) -> None:
            matmul(x.reshape(rows), ones, out=out if out.shape == flat else out.reshape(flat))

        return run

    def run(x: Any, out: Any, segments: Segments, stream: Any) -> None:
        result = out if out.shape == flat else out.reshape(flat)
        matmul(x.reshape(rows), ones, out=result)
        divide(result, L, out=result)

    return run


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
        elif reduction == "prod":  # in the accumulation dtype, into out when it is of that dtype
            if out3.dtype == acc:
                np.multiply.reduce(x4, axis=2, dtype=acc, out=out3)
            else:
                np.copyto(out3, np.multiply.reduce(x4, axis=2, dtype=acc), casting="unsafe")
        elif reduction == "sum":
            _fixed_sum(x4, out3, acc, ones)
        else:  # mean
            total = out3 if acc == out3.dtype else np.empty(out3.shape, dtype=acc)
            _fixed_sum(x4, total, acc, ones)
            _divide(total, L, out3)

    return run


def _variable_direct(problem: Problem):
    """Offsets over one 1-D NumPy array as one ``ufunc.reduceat`` into the result, or None.

    One segment axis and nothing else (no batch, no features), small enough for one
    thread, and a result of the dtype ``reduceat`` computes in: sum (in its
    accumulation dtype), max or min.  Empty segments, which ``reduceat`` does not
    know, are found by comparing neighbouring offsets unless checking already
    showed there are none.
    """
    B, n, D = problem.in_shape
    m = problem.num_segments
    if not (problem.kind == "numpy" and B == 1 and D == 1 and n < 2 * THREAD_ELEMENTS):
        return None
    if problem.reduction in ("sum", "prod") and problem.out_dtype == problem.acc_dtype:
        ufunc, dtype = (np.add if problem.reduction == "sum" else np.multiply), numpy_dtype(problem.acc_dtype)
    elif problem.reduction in ("max", "min") and problem.out_dtype == problem.dtype:
        ufunc, dtype = (np.maximum if problem.reduction == "max" else np.minimum), numpy_dtype(problem.dtype)
    else:
        return None
    reduceat, fill, intp = ufunc.reduceat, identity(problem.reduction, problem.out_dtype), np.dtype(np.intp)
    shape_x, shape_out = (n,), (m,)

    def run(x: Any, out: Any, segments: VariableSegments, stream: Any) -> None:
        off = segments.offsets
        if off.dtype != intp:
            off = off.astype(intp)
        x1 = x if x.shape == shape_x else x.reshape(shape_x)  # (1-D arrays as they are: a view costs)
        out1 = out if out.shape == shape_out else out.reshape(shape_out)
        starts = off[:-1]
        if not segments.min_length:  # unchecked, or checked with empty segments: find them
            empty = off[1:] == starts
            if _count_nonzero(empty):
                out1[empty] = fill
                nonempty = ~empty
                if _count_nonzero(nonempty):
                    out1[nonempty] = reduceat(x1, starts[nonempty], dtype=dtype)
                return
        reduceat(x1, starts, dtype=dtype, out=out1)

    return run


#: feature rows per segment (on average) from which a per-segment loop of BLAS products beats
#: ``reduceat`` along the rows, whose NumPy loop is slow across rows (an i7 with 2 cores, 2^20 x 16
#: float32: 49 ms against 79 ms at 32 rows per segment, 157 against 53 ms at 8; 2^18 x 64 at 32
#: rows: 17 against 111 ms); and the fewest elements per segment for it
ROWS_LOOP_MIN_ROWS = 16
ROWS_LOOP_MIN_ELEMENTS = 512


def _variable_rows(problem: Problem):
    """Feature rows (``features > 1``) with offsets, summed segment by segment, or None.

    Each segment's rows are added by BLAS products with a ones vector in blocks of at most
    :data:`BLAS_BLOCK_FEATURES` rows (as the fixed-length path does, for the same accuracy), the
    blocks' sums added in float64; data of another dtype than the accumulation's is converted a
    block at a time.  Used where segments are long enough on average that the loop's
    per-segment cost is small beside ``reduceat``'s across rows.
    """
    B, n, D = problem.in_shape
    m = problem.num_segments
    acc = numpy_dtype(problem.acc_dtype)
    if not (
        D > 1
        and problem.reduction in ("sum", "mean")
        and acc.kind == "f"
        and m
        and n >= ROWS_LOOP_MIN_ROWS * m
        and n * D >= ROWS_LOOP_MIN_ELEMENTS * m
    ):
        return None
    block = BLAS_BLOCK_FEATURES
    ones = np.ones(block, dtype=acc)
    empty_value = identity(problem.reduction, problem.out_dtype)
    mean = problem.reduction == "mean"
    matmul = np.matmul

    def run(x: Any, out: Any, segments: VariableSegments, stream: Any) -> None:
        x3, out3 = host_view(x), host_view(out)
        convert = x3.dtype != acc
        starts = np.asarray(segments.offsets).tolist()
        part = np.empty(D, dtype=acc)
        total = np.empty(D, dtype=np.float64)
        for b in range(B):
            rows, results = x3[b], out3[b]
            for i in range(m):
                lo, hi = starts[i], starts[i + 1]
                if lo == hi:
                    results[i] = empty_value
                    continue
                if hi - lo <= block and not convert and not mean and results.dtype == acc:
                    matmul(ones[: hi - lo], rows[lo:hi], out=results[i])
                    continue
                total[:] = 0
                for k in range(lo, hi, block):
                    piece = rows[k : min(k + block, hi)]
                    matmul(ones[: piece.shape[0]], piece.astype(acc) if convert else piece, out=part)
                    total += part
                if mean:
                    total /= hi - lo
                results[i] = total  # (cast to the result dtype)

    return run


def _variable(problem: Problem):
    acc = numpy_dtype(problem.acc_dtype)
    reduction = problem.reduction
    fill = identity(reduction, problem.out_dtype)
    combine = np.multiply if reduction == "prod" else np.add  # (sum and mean)

    def run(x: Any, out: Any, segments: VariableSegments, stream: Any) -> None:
        x3 = host_view(x)
        out3 = host_view(out)
        off = segments.offsets
        if type(off) is not np.ndarray or off.dtype != np.intp:
            off = np.asarray(off, dtype=np.intp)
        starts = off[:-1]
        nonempty = None
        if not segments.min_length:  # unchecked, or checked with empty segments: find them
            empty = off[1:] == starts
            if _count_nonzero(empty):
                nonempty = ~empty
                starts = starts[nonempty]
        all_nonempty = nonempty is None
        if not all_nonempty:
            out3[:, ~nonempty, :] = fill
        if starts.shape[0] == 0:
            return
        # With no empty segment and the result dtype as computed, reduce straight into out.
        direct = all_nonempty and reduction != "mean"
        if reduction in ("max", "min"):
            ufunc = np.maximum if reduction == "max" else np.minimum
            if direct and out3.dtype == x3.dtype:
                _reduceat(ufunc, x3, starts, out3)
                return
            result = np.empty((x3.shape[0], starts.shape[0], x3.shape[2]), dtype=x3.dtype)
            _reduceat(ufunc, x3, starts, result)
        elif direct and out3.dtype == acc:
            _reduceat(combine, x3, starts, out3, dtype=acc)
            return
        else:
            result = np.empty((x3.shape[0], starts.shape[0], x3.shape[2]), dtype=acc)
            _reduceat(combine, x3, starts, result, dtype=acc)
            if reduction == "mean":
                quotient = np.empty(result.shape, dtype=np.result_type(acc, np.float32))
                counts = np.diff(off) if all_nonempty else np.diff(off)[nonempty]
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
    reads_pointers = False  # NumPy's own operations read byte-swapped, unaligned or odd-strided arrays
    reductions = ("sum", "mean", "max", "min", "prod")

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
        thread_cap()  # a bad LINRED_NUM_THREADS is reported when planning, not by the first large call
        direct = _fixed_direct(problem) if problem.fixed else _variable_direct(problem)
        if direct is not None:  # reads the caller's arrays as they come: no views needed
            return FunctionExecutor(_at_caller(problem, direct), views=False)
        if problem.fixed:
            return FunctionExecutor(_at_caller(problem, _fixed(problem)))
        return FunctionExecutor(_at_caller(problem, _variable_rows(problem) or _variable(problem)))


def _at_caller(problem: Problem, run: Any) -> Any:
    """``run``, with NumPy's overflow and invalid-value warnings reported at the caller's line.

    Integer data raises none (NumPy's integer sums wrap silently; linred's accumulators
    are wide enough), so its calls skip the switch of error modes.
    """
    if numpy_dtype(problem.acc_dtype).kind in "fc" or problem.dtype in ("float16", "bfloat16"):
        return at_caller(run)
    return run


BACKEND = NumpyBackend()
