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
- Offsets over feature rows ``(N, d)`` (the GNN pooling case): many segments as stacked
  products of 0/1 interval matrices over tiles of 128 rows, partials added in float64
  (:func:`_tile_rows`); few or very long ones one BLAS product per segment.

It serves NumPy arrays and CPU PyTorch tensors (viewed as NumPy arrays, no copy).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from linred._dtypes import identity, itemsize, numpy_dtype
from linred._fpwarnings import at_caller, noting, once_per_kind, pool_context, reissue
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
#: elements converted at a time where a ``reduceat`` reads data of another dtype than it computes in
#: (below, NumPy's ``reduceat`` converts them all at once)
CONVERT_ELEMENTS = 1 << 20

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
    (measured: 1.9x on 2 cores; no gain at all otherwise), hence those forms.  Data to
    be converted (``dtype`` is not the data's) goes through :func:`_reduceat_converting`:
    NumPy's ``reduceat`` converts its whole input first.
    """
    B, n, D = x3.shape
    k = starts.shape[0]
    same = dtype is None or np.dtype(dtype) == x3.dtype
    converting = not same and B * n * D > CONVERT_ELEMENTS
    chunks = min(B * n * D // THREAD_ELEMENTS, k) if B == 1 and D == 1 else 1
    if chunks > 1:
        chunks = min(chunks, num_threads())
    if chunks <= 1:
        if converting:
            _reduceat_converting(ufunc, x3, starts, out, dtype)
            return
        flat = _reshaped(out, (k,)) if B == 1 and D == 1 else None  # (None: not a view of out)
        if flat is not None:  # 1-D: NumPy's reduceat is quickest on a 1-D array
            ufunc.reduceat(x3.reshape(n), starts, dtype=dtype, out=flat)
        else:
            ufunc.reduceat(x3, starts, axis=1, dtype=dtype, out=out)
        return
    x1, out1 = x3[0, :, 0], out[0, :, 0]
    cuts = np.searchsorted(starts, np.linspace(0, n, chunks + 1)[1:-1]).tolist()
    bounds = list(zip([0, *cuts], [*cuts, k], strict=True))

    def run(a: int, b: int) -> None:
        if a < b:
            end = int(starts[b]) if b < k else n
            if converting:  # (the run's own elements, a block at a time)
                first = int(starts[a])
                _reduceat_converting(ufunc, x1[first:end].reshape(1, -1, 1), starts[a:b] - first,
                                     out1[a:b].reshape(1, -1, 1), dtype)  # fmt: skip
                return
            part = ufunc.reduceat(x1[:end], starts[a:b]) if same else ufunc.reduceat(x1[:end], starts[a:b], dtype=dtype)
            out1[a:b] = part

    _in_threads(run, bounds)


def _reduceat_converting(ufunc: Any, x3: np.ndarray, starts: np.ndarray, out: np.ndarray, dtype: Any) -> None:
    """:func:`_reduceat` of data converted to ``dtype`` at most :data:`CONVERT_ELEMENTS` elements at
    a time (int8 data summed in int64 took eight times its bytes more, float16 data in float32
    twice, where NumPy's ``reduceat`` converted all of it): the whole segments of a block of rows
    by one ``reduceat``, a segment longer than a block by blocks whose reductions are combined
    (the same bits for integers, maxima and minima; a float sum of such a segment adds its
    blocks' sums)."""
    B, n, D = x3.shape
    k = starts.shape[0]
    rows = max(1, CONVERT_ELEMENTS // max(B * D, 1))
    ends = np.empty(k, dtype=np.int64)
    ends[:-1] = starts[1:]
    ends[-1] = n
    i = 0
    while i < k:
        first = int(starts[i])
        j = int(np.searchsorted(ends, first + rows, side="right"))
        if j > i:  # segments i .. j - 1 end within the block
            end = int(ends[j - 1])
            block = x3[:, first:end, :].astype(dtype)
            out[:, i:j, :] = ufunc.reduceat(block, starts[i:j] - first, axis=1)
            i = j
            continue
        end = int(ends[i])  # one segment longer than a block
        total = ufunc.reduce(x3[:, first : first + rows, :].astype(dtype), axis=1)
        for start in range(first + rows, end, rows):
            ufunc(total, ufunc.reduce(x3[:, start : min(start + rows, end), :].astype(dtype), axis=1), out=total)
        out[:, i, :] = total
        i += 1


def _in_threads(work: Any, bounds: list[tuple[int, int]]) -> None:
    """``work(a, b)`` for every ``(a, b)`` of ``bounds``, the first on this thread, the others on
    the pool's threads, all done on return.  Each runs in a copy of the caller's context (NumPy's
    error modes are context variables); their warnings are issued from this thread once per kind,
    at the caller's line, as one NumPy call's would be."""
    pending: list[str] = []
    pool = _executor(len(bounds))
    futures = [pool.submit(pool_context(pending).run, work, a, b) for a, b in bounds[1:]]
    try:
        pool_context(pending).run(work, *bounds[0])
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
#: long as the row allows, and a product's last rows or columns (past a multiple of its
#: kernel's width) one: one float32 segment of 2^24 values came out 3e-3 off, (n/4, 4) feature
#: rows of 2^17 3e-6 off, and constant float32 data 3.4e-6 off at 256 rows (the 9th of 9
#: columns; 2 segments of 1,024 values likewise), 3.7e-7 at 128 (OpenBLAS 0.3.31).  A longer
#: segment is cut into blocks of at most this many, whose sums are added in float64.
BLAS_BLOCK = 128
BLAS_BLOCK_FEATURES = 128


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


def _blas_reads(x4: np.ndarray) -> bool:
    """Whether NumPy's ``matmul`` hands each segment of ``x4`` (``(B, m, L, D)``; ``(L, D)`` rows,
    or for one column the ``(m, L)`` segments) to BLAS as it is: a unit stride along one axis and
    the other at least its extent, positive (NumPy's own test).  Where it does not (a broadcast,
    reversed or doubly strided view), ``matmul`` adds each result's values one after another in
    the data's dtype, which on constant float32 data erred by 1.3e-6 of sum|x| over 128 values
    (BLAS: 4e-8): such data is summed from contiguous copies of a bounded block at a time."""
    _, m, L, D = x4.shape
    it = x4.itemsize
    _, sm, sl, sd = x4.strides
    if L == 1:
        return True
    if D > 1:
        return (sd == it and sl >= D * it) or (sl == it and sd >= L * it)
    # (one segment a row of the batch: the rows are the batch's, whose stride must do)
    return sl == it and (sm >= L * it if m > 1 else (x4.shape[0] == 1 or x4.strides[0] >= L * it))


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
    if x4.dtype == acc and out3.dtype == acc and _blas_reads(x4):
        _product_with_ones(x4, ones, out3)
        return
    # Convert (or copy what BLAS cannot read) in blocks of rows: bounded extra memory, never a
    # copy of the whole input.
    rows = max(1, BLOCK_ELEMENTS // max(1, L * D))
    tmp = np.empty((B, min(rows, m), D), dtype=acc) if out3.dtype != acc else None
    for start in range(0, m, rows):
        stop = min(start + rows, m)
        block = x4[:, start:stop].astype(acc, order="C")  # (C order: a copy BLAS reads)
        target = out3[:, start:stop] if tmp is None else tmp[:, : stop - start]
        _product_with_ones(block, ones, target)
        if tmp is not None:
            np.copyto(out3[:, start:stop], target, casting="unsafe")


#: one column of data in segments of at least this many values is summed by columns (see
#: :func:`_long_sum`): 2 cores, OpenBLAS 0.3.31, 2^25 float32 values (medians of 15 calls taken
#: in turns) in segments of 2^19, 2^20 and 2^20 + 37 values by columns in 8.7-9.5 ms against
#: 9.8-12.2 by rows of a block, and one segment of 2^25 in 10.2 against 12.0 (the product with
#: ones over whole segments, which loses digits: 7.0-8.4 ms, and 29 for the one segment); in
#: segments of 2^18 and 3 x 2^17, 15 ms by columns against 9.5-9.9 (OpenBLAS spreads a product of
#: 128 x 4,096 values over the cores, not one of 128 x 3,072)
COLUMNS_MIN_LENGTH = 1 << 19


def _long_sum(x4: np.ndarray, out3: np.ndarray, acc: np.dtype, ones: np.ndarray) -> None:
    """:func:`_fixed_sum` of segments longer than their BLAS block: the sums of their blocks
    (products with ones, in ``acc``) added in float64, converted from the data's dtype a bounded
    piece at a time where it is not ``acc``.  A segment of one column of at least
    :data:`COLUMNS_MIN_LENGTH` values in ``acc`` is cut into K rows of q columns instead
    (``ones(K) @ segment.reshape(K, q)``: each of the q sums adds K values q apart, as a block
    adds K neighbours), one product per segment that BLAS spreads over the cores."""
    B, m, L, D = x4.shape
    K = _block_length(L, D)
    q, r = divmod(L, K)
    convert = x4.dtype != acc or not _blas_reads(x4)  # (converted pieces are contiguous copies)
    columns = D == 1 and not convert and L >= COLUMNS_MIN_LENGTH and x4.strides[2] == x4.itemsize
    if columns:  # (each segment's K x q values a view: a segment's values are adjacent)
        views = [_reshaped(x4[b, :, : q * K, 0], (m, K, q)) for b in range(B)]
        columns = all(v is not None for v in views)
    if columns:
        sums = np.empty((B, m, q), dtype=acc)
        for b, view in enumerate(views):
            np.matmul(ones[:K], view, out=sums[b])
        total = np.add.reduce(sums, axis=2, dtype=np.float64)
        if r:
            rest = np.empty((B, m, 1), dtype=acc)
            _product_with_ones(x4[:, :, q * K :], ones[:r], rest)
            total += rest[..., 0]
        np.copyto(out3[..., 0], total, casting="same_kind")
        return
    total = np.zeros((B, m, D), dtype=np.float64)
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
            piece = (piece.astype(acc, order="C") if convert else piece).reshape(B, s1 - s0, b1 - b0, K, D)
            sums = np.empty((B, s1 - s0, b1 - b0, D), dtype=acc)
            _blocks_with_ones(piece, ones[:K], sums)
            part = total[:, s0:s1]
            if b1 - b0 <= CHAIN_LONGEST:
                # A few blocks a segment: each block's sums added to the float64 totals in turn.
                # np.add.reduce over so short an axis takes 7x longer (2 cores, 2^24 float32
                # values in L = 256: 1.74 ms against 0.25 for the two blocks' sums).
                for k in range(b1 - b0):
                    np.add(part, sums[:, :, k], out=part)
            else:
                part += np.add.reduce(sums, axis=2, dtype=np.float64)
        if r:
            rest = x4[:, s0:s1, q * K :]
            sums = np.empty((B, s1 - s0, D), dtype=acc)
            _product_with_ones(rest.astype(acc, order="C") if convert else rest, ones[:r], sums)
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
#: where a product with zeros left NaN in more than 1 / REDO_ALL_FRACTION of the segments (NaN or
#: infinities in the data), all of them are summed again the plain way (a gather of that many
#: segments would copy most of the data, a loop over them cost more: 10^6 segments of 4 x 4 float32
#: with a NaN column took 87 ms by the gather against 34 for the plain way)
REDO_ALL_FRACTION = 8


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
                if again.shape[0] * REDO_ALL_FRACTION > B * m:  # many: all of them, with no copy
                    np.matmul(ones, x4, out=out3)
                else:  # (a gather: a copy of those segments only)
                    results[again] = np.matmul(ones, x4.reshape(B * m, L, D)[again])
            return
    if D == 1:
        # (a reshape of out3 that is not a view, a slice of a batch's results, would be a copy
        # that the product fills and drops: _reshaped says so)
        rows, results = _reshaped(x4[..., 0], (B * m, x4.shape[2])), _reshaped(out3, (B * m,))
        if rows is not None and results is not None:
            np.matmul(rows, ones, out=results)
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


#: fixed segments of at most this many elements (one column, contiguous) are reduced by max, min
#: and prod as L - 1 elementwise calls over the strided columns of the (m, L) view, in the order
#: ufunc.reduce takes (so the same results): NumPy's reduce over so short a last axis pays its
#: inner loop's overhead per segment.  2 cores, 2^24 float32 values, maximum: L = 2 534 -> 18 ms,
#: 4 293 -> 37, 8 157 -> 73; at 16 the columns' passes lose (159 against 120 ms)
CHAIN_LONGEST = 8


def _chained(ufunc: Any, rows: tuple[int, int], flat: tuple[int]):
    """``run`` for one contiguous column of fixed segments of ``L = rows[1]`` elements: ``ufunc``
    applied along each segment as ``L - 1`` elementwise calls over the columns of the ``rows``
    view (a copy for L = 1)."""
    L = rows[1]

    def run(x: Any, out: Any, segments: Segments, stream: Any) -> None:
        result = out if out.shape == flat else out.reshape(flat)
        columns = x.reshape(rows)
        if L == 1:
            np.copyto(result, columns[:, 0])
            return
        ufunc(columns[:, 0], columns[:, 1], out=result)
        for k in range(2, L):
            ufunc(result, columns[:, k], out=result)

    return run


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
        ufunc = _UFUNCS[problem.reduction]
        if L <= CHAIN_LONGEST:
            return _chained(ufunc, rows, flat)
        reduce = ufunc.reduce

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


def _chain_into(ufunc: Any, x3: np.ndarray, out2: np.ndarray, dtype: np.dtype) -> None:
    """``out2 = ufunc.reduce(x3, axis=2, dtype=dtype)`` (cast into ``out2``) as ``L - 1``
    elementwise calls over the columns ``x3[:, :, k]``, in the order the reduce takes."""
    L = x3.shape[2]
    target = out2 if out2.dtype == dtype else np.empty(out2.shape, dtype=dtype)
    if L == 1:
        np.copyto(target, x3[:, :, 0], casting="unsafe")
    else:
        ufunc(x3[:, :, 0], x3[:, :, 1], out=target, dtype=dtype, casting="unsafe")
        for k in range(2, L):
            ufunc(target, x3[:, :, k], out=target, dtype=dtype, casting="unsafe")
    if target is not out2:
        np.copyto(out2, target, casting="unsafe")


def _chain_rule(problem: Problem, acc: np.dtype) -> tuple[Any, np.dtype] | None:
    """``(ufunc, dtype)`` where :func:`_fixed` takes the columns' elementwise calls
    (:func:`_chain_into`) for one column of short segments of any strides or dtype, else None.

    Measured on 2 cores, 2^24 values (ms, ``reduce`` or the product with ones before):
    max, min and prod up to ``CHAIN_LONGEST`` as in :func:`_fixed_direct`, but not of float16
    (NumPy's half-precision elementwise loops convert each value: 82 -> 121 at L = 2); integer
    sums into an integer accumulator up to 4 elements, or 8 of 1-byte data (int32 L = 2
    179 -> 39, L = 4 91 -> 46, L = 8 54 -> 64; uint8 L = 8 73 -> 33), exact; means of up to
    2 integers (103 -> 70; at 4, 42 -> 64).  Not floating sums: ``a + b`` keeps the sign of
    ``-0.0 + -0.0``, where the product with ones (and ``add.reduce``) gives ``+0.0``."""
    _, _, D = problem.in_shape
    L, reduction = problem.segment_length, problem.reduction
    data = numpy_dtype(problem.dtype)
    half = data.kind == "f" and data.itemsize == 2
    if D != 1 or L > CHAIN_LONGEST or data.kind not in "biuf" or acc.kind not in "biuf" or half:
        return None
    if reduction in _UFUNCS:
        return _UFUNCS[reduction], (data if reduction in ("max", "min") else acc)
    if data.kind in "biu" and acc.kind in "iu" and reduction == "sum" and (L <= 4 or data.itemsize == 1):
        return np.add, acc
    if L <= 2 and data.kind in "biu" and acc.itemsize == 8:
        return np.add, acc
    return None


def _fixed(problem: Problem):
    acc = numpy_dtype(problem.acc_dtype)
    reduction = problem.reduction
    B, _, D = problem.in_shape
    L = problem.segment_length
    m = problem.num_segments
    # The ones vector depends only on the plan: made once, reused by every call.
    ones = None if acc.kind in "biu" else np.ones(L, dtype=np.empty(0, acc).real.dtype)
    chain = _chain_rule(problem, acc)
    # A mean of segments longer than a BLAS block (float64 sums of their blocks, _long_sum) is
    # divided before the cast, so that a float32 mean whose sum passes the float32 range stays finite
    mean_in_float64 = reduction == "mean" and acc.kind == "f" and _blas_block(D) < L

    def run(x: Any, out: Any, segments: Segments, stream: Any) -> None:
        x4 = host_view(x).reshape(B, m, L, D)
        out3 = host_view(out)
        if chain is not None:
            ufunc, dtype = chain
            if reduction == "mean":
                total = np.empty((B, m), dtype=acc)
                _chain_into(ufunc, x4[..., 0], total, dtype)
                _divide(total, L, out3[..., 0])
            else:
                _chain_into(ufunc, x4[..., 0], out3[..., 0], dtype)
            return
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
            if mean_in_float64:
                total = np.empty(out3.shape, dtype=np.float64)
            else:
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
#: rows of one tile of the interval products (:func:`_tile_rows`).  Each partial sum adds at most
#: this many rows in the data's dtype, in float64 afterwards (float32 positive data: 2e-7 to 6e-7
#: off float64, as the 128-row blocks of the loop); a tile's 0/1 matrix is a gather from a table
#: of every interval ``[lo, hi)`` of a tile: (T + 1)(T + 2)/2 rows of T, 4.3 MB in float32
TILE_ROWS = 128
#: the tiles need more segments than this, and at least TILE_MIN_ELEMENTS of data: their set-up
#: (some 40 NumPy calls over the offsets and tiles, 0.1-0.2 ms) costs more than one BLAS product
#: per segment of a few segments or a small call (2 cores, float32, segments of ~64 rows of 64
#: features: 65 segments 0.30 ms against 0.24 for the loop, 128 0.21 against 0.24, 256 0.35
#: against 0.46; 256 segments of ~32 rows of 16 (130,000 elements) 0.16 against 0.10, 400 of 64
#: rows of 16 (410,000) 0.28 against 0.62)
TILE_MIN_SEGMENTS = 128
TILE_MIN_ELEMENTS = 1 << 18
#: ... and fewer rows per segment (on average) than this: a long segment's tiles each hold a
#: full 0/1 matrix whose products mostly multiply zeros (10,000 x 256 float32, one segment of
#: 9,000 rows among 8: the loop 0.19 ms)
TILE_MAX_ROWS = 4096
#: tiles of a segment after its first added by one vectorised gather each, for all segments at
#: once; the longer segments' remaining tiles are added one segment at a time
TILE_COMBINE_STEPS = 32
#: elements of the 0/1 matrices of one stacked product (128 KiB in float32, kept in the cache)
TILE_CHUNK_ELEMENTS = 1 << 15
#: ... and the fewest chunks of a call, which the threads share out by their matrices' rows
#: (whole chunks each: with 4 chunks of 128, 128, 128 and 7 tiles 2 threads took 1.35 ms on
#: 50,000 x 128 float32 rows in 256 segments, 0.93 with 8 or more); the chunks do not depend on the
#: thread count, so neither do the results' bits
TILE_MIN_CHUNKS = 8
#: fewest elements of data from which the tiles' products are shared among threads: below, the
#: hand-off and the GIL cost more than the second core gives (2 cores, float32 rows of 64 features
#: in segments of ~128 rows: 1.1M elements 0.31 ms on one thread, 0.50 on two; 4.1M 1.0 and 1.0;
#: 8.7M 2.6 and 2.0; 17M, segments of ~64 rows, 6.2 and 5.1)
TILE_THREAD_ELEMENTS = 1 << 22


def _rows_fast(problem: Problem) -> bool:
    """Whether feature rows can be read by BLAS as they are: floating data of the accumulation
    and result dtype, C-contiguous, native and aligned (no conversion, no copy)."""
    acc = numpy_dtype(problem.acc_dtype)
    return (
        acc.kind == "f"
        and problem.dtype == problem.acc_dtype == problem.out_dtype
        and problem.plain
        and _contiguous(problem)
    )


def _variable_rows(problem: Problem):
    """Feature rows (``features > 1``) with offsets, summed segment by segment, or None.

    Used where segments are long enough on average (:data:`ROWS_LOOP_MIN_ROWS`) that BLAS
    products beat a plain ``reduceat`` across rows: :func:`_blocked_rows` for narrow rows of a
    small call, the tiles of :func:`_tile_rows` for many segments of data BLAS reads as it is,
    else :func:`_loop_rows`.
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
    tiles = m > TILE_MIN_SEGMENTS and B * n * D >= TILE_MIN_ELEMENTS and n < TILE_MAX_ROWS * m
    fast = _rows_fast(problem)
    narrow = D <= BLOCKED_MAX_FEATURES and (D <= BLOCKED_OVER_TILES_FEATURES or not tiles)
    most = BLOCKED_MAX_BYTES if D <= BLOCKED_NARROW_FEATURES else BLOCKED_WIDE_MAX_BYTES
    small = B * n * D * acc.itemsize <= most and n <= BLOCKED_MAX_ROWS * m
    if fast and narrow and small:
        return _blocked_rows(problem)
    if fast and tiles:
        return _tile_rows(problem)
    return _loop_rows(problem)


#: narrow feature rows of a small call are summed by ``reduceat`` across rows, in blocks of at
#: most TILE_ROWS rows of a segment (float32 sums of at most 128 values, as the tiles' partials),
#: the blocks' sums added in float64 by a second ``reduceat``: where the data fits the cache,
#: ``reduceat``'s loop over rows of a few features beats both a BLAS product per segment and the
#: tiles' products (2 cores, float32: 300 segments of 130 rows x 4, 0.6 MB: 0.087 ms against 0.44
#: for the loop; 1,000 of 130 x 4: 0.24 against 0.42 for the tiles; 100 of 600 x 8: 0.23 against
#: 0.57), and loses beyond it (20,000 of 100 x 8, 64 MB: 30 ms against 8.4 for the tiles), for
#: 16 features (2,000 of 64 x 16, 8 MB: 2.0 against 0.41) and for long segments (16 of 8,000 x 8:
#: 0.42 against 0.19 for the loop)
BLOCKED_NARROW_FEATURES = 8
#: ... and rows of up to this many features in calls of at most BLOCKED_WIDE_MAX_BYTES, which the
#: cache holds (2 cores, float32 rows of 16 features, the loop against ``reduceat`` in blocks, ms:
#: 2,000 rows in 32 segments 0.082 against 0.060, 4,000 in 40 0.13 against 0.08, 10,000 in 100
#: 0.32 against 0.14, 16,000 in 50 (1.0 MB) 0.29 against 0.21; but 30,000 in 100 (1.9 MB) 0.61
#: against 0.63, 40,000 in 100 (2.6 MB) 0.70 against 1.31, 60,000 in 100 0.79 against 2.49;
#: 12 features, 10,000 rows in 100: 0.29 against 0.11; 32 features, 8,000 rows in 100: 0.27 either
#: way)
BLOCKED_MAX_FEATURES = 16
BLOCKED_WIDE_MAX_BYTES = 1 << 20
#: ... over the tiles only up to this many features (1,000 segments of 64 rows x 8, 2 MB: the
#: tiles 0.24 ms, ``reduceat`` 0.21 without blocks)
BLOCKED_OVER_TILES_FEATURES = 4
BLOCKED_MAX_BYTES = 4 << 20
BLOCKED_MAX_ROWS = 1024


def _blocked_rows(problem: Problem):
    """Narrow feature rows with offsets in a small call: ``reduceat`` across rows over blocks of at
    most :data:`TILE_ROWS` rows of each non-empty segment, the blocks' sums added in float64 by a
    second ``reduceat`` (empty segments get the reduction's identity).  A value is added only
    into its own segment's blocks: infinities and NaN stay in their segment and feature."""
    B = problem.in_shape[0]
    T = TILE_ROWS
    empty_value = identity(problem.reduction, problem.out_dtype)
    mean = problem.reduction == "mean"
    add = np.add.reduceat

    def run(x: Any, out: Any, segments: VariableSegments, stream: Any) -> None:
        x3, out3 = host_view(x), host_view(out)
        off, nonempty = _nonempty_offsets(segments, out3, empty_value)
        if off.shape[0] == 1:
            return
        lengths = np.diff(off)
        if not mean and nonempty is None and lengths.max() <= T:
            # Every segment one block: reduceat's sum of its at most T values in the data's dtype is
            # the result (the accuracy of one block of the loop's, other bits), written as it
            # comes (2 cores, 10,000 x 16 float32 rows in 100 segments: 0.080 ms, against 0.14 with
            # the blocks' bookkeeping).
            for b in range(B):
                add(x3[b], off[:-1], axis=0, out=out3[b])
            return
        # Blocks of T rows: segment s has ceil(len / T) of them, from its start on.
        count = -(-lengths // T)
        first = np.zeros(count.shape[0], dtype=np.int64)
        np.cumsum(count[:-1], out=first[1:])
        blocks = np.repeat(off[:-1] - T * first, count) + T * np.arange(int(first[-1] + count[-1]), dtype=np.int64)
        for b in range(B):
            total = add(add(x3[b], blocks, axis=0), first, axis=0, dtype=np.float64)
            if mean:
                total /= lengths[:, None]
            _store(out3[b], total, nonempty)

    return run


def _nonempty_offsets(segments: VariableSegments, out3: np.ndarray, empty_value: Any) -> tuple[np.ndarray, Any]:
    """The bounds of the non-empty segments as int64 offsets (each starts where the one before it
    ends), and which segments they are (None: all); the empty ones' results are set to
    ``empty_value`` in ``out3`` ``(B, m, D)``."""
    off = np.asarray(segments.offsets)
    if off.dtype != np.int64:
        off = off.astype(np.int64)
    if not segments.min_length:  # unchecked, or checked with empty segments: find them
        empty = off[1:] == off[:-1]
        if _count_nonzero(empty):
            nonempty = ~empty
            out3[:, empty, :] = empty_value
            return np.concatenate((off[:1], off[1:][nonempty])), nonempty
    return off, None


def _store(out: np.ndarray, total: np.ndarray, nonempty: Any) -> None:
    """The results of the non-empty segments (``total``, float64) into ``out`` (``(..., m, D)``),
    cast to its dtype; ``nonempty`` as :func:`_nonempty_offsets` gives it."""
    if nonempty is None:
        np.copyto(out, total, casting="same_kind")
    else:
        out[..., nonempty, :] = total


def _segment_total(rows: np.ndarray, ones: np.ndarray, total: np.ndarray, convert: bool) -> None:
    """``total`` (float64, ``(D,)``) = the sum of ``rows`` (``(L, D)``, ``L >= 1``): products with
    ``ones`` of blocks of :data:`BLAS_BLOCK_FEATURES` rows, added in float64.

    The whole blocks are one stacked product (a view of the rows) unless the data is converted,
    which is done a block at a time.
    """
    block = BLAS_BLOCK_FEATURES
    L = rows.shape[0]
    q, r = divmod(L, block)
    if convert:
        total[:] = 0
        for k in range(0, L, block):
            piece = rows[k : k + block]
            total += np.matmul(ones[: piece.shape[0]], piece.astype(ones.dtype, order="C"))
        return
    if q:
        sums = np.matmul(ones[:block], rows[: q * block].reshape(q, block, rows.shape[1]))
        np.add.reduce(sums, axis=0, dtype=np.float64, out=total)
        if r:
            total += np.matmul(ones[:r], rows[q * block :])
    else:
        total[:] = np.matmul(ones[:r], rows)


#: max and min of feature rows with offsets take a per-segment ``ufunc.reduce`` (:func:`_loop_extreme`)
#: over ``reduceat`` across rows, whose NumPy loop gets slower the wider the rows are, where the
#: rows are at least EXTREME_LOOP_MIN_FEATURES wide and a segment holds, on average, at least
#: EXTREME_LOOP_MIN_ELEMENTS (or EXTREME_LOOP_WIDE_MIN_ELEMENTS from EXTREME_LOOP_WIDE_FEATURES
#: features): the loop costs about 1 us a segment, ``reduceat`` 3-35 ns an element.  2 cores,
#: float32 max of 2^22 values, ms (reduceat / loop) at mean lengths 4, 16, 100, 1000 rows:
#: 16 features 62 / 246, 46 / 74, 31 / 23, 29 / 15; 32 features 116 / 121, 76 / 34, 56 / 12,
#: 48 / 6.6; 64 features 149 / 35, 76 / 11, 44 / 5.8, 35 / 3.8; 8 features 65 / 535 ... 17 / 32
#: (never).  Data that fits the cache keeps ``reduceat`` (2,000 x 64 rows in 32 segments: 0.22 ms
#: against 0.26): from EXTREME_LOOP_MIN_BYTES.
EXTREME_LOOP_MIN_FEATURES = 16
EXTREME_LOOP_MIN_ELEMENTS = 1600
EXTREME_LOOP_WIDE_FEATURES = 32
EXTREME_LOOP_WIDE_MIN_ELEMENTS = 256
EXTREME_LOOP_MIN_BYTES = 1 << 20


#: feature rows in short segments are reduced a row at a time (:func:`_rows_steps`) where rows
#: are at least ROWS_STEPS_MIN_FEATURES wide, segments hold at most ROWS_STEPS_MAX_MEAN rows on
#: average (ROWS_STEPS_NARROW_MAX_MEAN below ROWS_STEPS_NARROW_FEATURES features; for max and min
#: ROWS_STEPS_WIDE_MAX_MEAN from ROWS_STEPS_WIDE_FEATURES features, where the per-segment loop
#: takes the call), and the call reads at least ROWS_STEPS_MIN_BYTES; the steps stop at
#: ROWS_STEPS_MAX_STEPS rows (each costs some µs of Python), the rest of a longer segment is one
#: reduce (sums: BLAS blocks added in float64).  2 cores, float32 over 2^22 values in geometric
#: lengths, ms (steps / before: the loop or ``reduceat`` / ``torch.segment_reduce``), max at mean
#: lengths 2, 8, 32 rows: 16 features 31.6 / 81.7 / 17.0, 19.8 / 47.5 / 11.9, 25.2 / 33.0 / 13.0;
#: 32 features 17.6 / 102.6 / 28.4, 14.5 / 62.9 / 13.2, 15.2 / 21.7 / 13.5; 64 features 11.7 /
#: 146.0 / 25.5, 8.6 / 22.3 / 11.0, 9.3 / 11.4 / 13.8; 128 features 8.1 / 23.4 / 17.0, 7.8 / 10.5 /
#: 8.5, 8.0 / 7.1 / 13.8 (the loop); at mean 64 the loop wins from 32 features; 8 features (2^21
#: values) at mean 2, 8, 15, 30: 29.9 / 40.8, 9.3 / 14.9, 8.8 / 11.3, 10.6 / 8.3; 4 features:
#: mixed, never.  Sums (2^21 values; ``reduceat`` before) at mean 2, 8, 15: 8 features 13.2 /
#: 30.6, 11.0 / 15.8, 9.2 / 10.7; 16 features 10.0 / 35.7, 9.1 / 20.1, 8.1 / 13.0; 64 features
#: 5.1 / 49.0, 3.6 / 15.0, 4.3 / 17.9; 4 features 20.9 / 29.2 at mean 2, slower at 8 and 15.  Small
#: calls: max of 2,000 x 64 rows in 400 random segments 0.45 against 1.34 ms (``reduceat``).
ROWS_STEPS_MIN_FEATURES = 8
ROWS_STEPS_NARROW_FEATURES = 16
ROWS_STEPS_NARROW_MAX_MEAN = 16
ROWS_STEPS_MAX_MEAN = 32
ROWS_STEPS_WIDE_FEATURES = 128
ROWS_STEPS_WIDE_MAX_MEAN = 16
ROWS_STEPS_MIN_BYTES = 1 << 17
ROWS_STEPS_MAX_STEPS = 64

_STEP_UFUNCS = {"sum": np.add, "mean": np.add, **_UFUNCS}


def _rows_steps(problem: Problem):
    """Feature rows with offsets in short segments, or None: every segment's first row gathered
    at once, then for ``k = 1, 2, ...`` the ``k``-th rows of the segments longer than ``k`` (the
    longest first, so that those are a prefix) gathered and folded in by one elementwise ufunc
    (``add``, ``multiply``, ``maximum``, ``minimum``) into the accumulation dtype.  ``reduceat``
    across rows and a reduction per segment pay per row or per segment (about 1 µs), which short
    segments of wide rows make the whole cost.  Max and min give ``reduceat``'s values (the same
    ufunc on the same rows in the same order: NaN propagates); sums add a segment's first
    ROWS_STEPS_MAX_STEPS rows in order in the accumulation dtype (as ``reduceat`` does), the rest
    of a longer one in BLAS blocks added in float64.  An empty segment gets the identity."""
    B, n, D = problem.in_shape
    m = problem.num_segments
    reduction = problem.reduction
    dtype, acc = numpy_dtype(problem.dtype), numpy_dtype(problem.acc_dtype)
    if reduction in ("max", "min"):
        work, served = dtype, problem.out_dtype == problem.dtype and dtype.kind in "biuf"
    else:
        # (data that the accumulation dtype takes without loss: a dtype= of another kind, which
        # reduceat casts element by element first, keeps reduceat)
        kinds = "f" if reduction == "mean" else "iuf"
        work = acc
        served = problem.out_dtype == problem.acc_dtype and acc.kind in kinds and np.can_cast(dtype, acc, "safe")
    most = ROWS_STEPS_NARROW_MAX_MEAN if D < ROWS_STEPS_NARROW_FEATURES else ROWS_STEPS_MAX_MEAN
    if not (
        served
        and m
        and D >= ROWS_STEPS_MIN_FEATURES
        and n <= most * m
        and B * n * D * dtype.itemsize >= ROWS_STEPS_MIN_BYTES
    ):
        return None
    if (
        reduction in ("max", "min")
        and D >= ROWS_STEPS_WIDE_FEATURES
        and n > ROWS_STEPS_WIDE_MAX_MEAN * m
        and _loop_extreme(problem) is not None
    ):
        return None
    ufunc = _STEP_UFUNCS[reduction]
    empty_value = identity(reduction, problem.out_dtype)
    convert = dtype != work
    blas = reduction in ("sum", "mean") and work.kind == "f"
    ones = np.ones(BLAS_BLOCK_FEATURES, dtype=work) if blas else None

    def run(x: Any, out: Any, segments: VariableSegments, stream: Any) -> None:
        x3, out3 = host_view(x), host_view(out)
        off, nonempty = _nonempty_offsets(segments, out3, empty_value)
        if off.shape[0] == 1:
            return
        order = np.argsort(np.diff(off), kind="stable")[::-1]  # the longest first
        starts, stops = off[:-1][order], off[1:][order]
        lengths = stops - starts
        steps = min(int(lengths[0]), ROWS_STEPS_MAX_STEPS)
        # at step k, the first active[k - 1] segments (those longer than k) take their k-th row
        active = np.searchsorted(-lengths, -np.arange(1, steps), side="left").tolist()
        longer = int(np.searchsorted(-lengths, -steps, side="left"))  # (segments with rows left after the steps)
        dest = order if nonempty is None else np.flatnonzero(nonempty)[order]
        total = np.empty(D, dtype=np.float64)
        for b in range(B):
            rows = x3[b]
            with once_per_kind():  # (the steps' warnings once, as one reduceat's)
                result = rows.take(starts, axis=0)
                if convert:
                    result = result.astype(work)
                for k, count in enumerate(active, start=1):
                    part = result[:count]
                    ufunc(part, rows.take(starts[:count] + k, axis=0), out=part)
                for i in range(longer):  # (the rest of each long segment)
                    if blas:
                        _segment_total(rows[starts[i] + steps : stops[i]], ones, total, convert)
                        total += result[i]
                        result[i] = total
                    elif reduction == "prod":  # (whole: two parts' inf * 0 would be NaN where the product is not)
                        ufunc.reduce(rows[starts[i] : stops[i]], axis=0, dtype=work, out=result[i])
                    else:  # (in the accumulation dtype: uint8 rows reduce to uint64 by default)
                        rest = ufunc.reduce(rows[starts[i] + steps : stops[i]], axis=0, dtype=work)
                        ufunc(result[i], rest, out=result[i])
                if reduction == "mean":
                    np.divide(result, lengths[:, None], out=result)
            out3[b][dest] = result

    return run


def _loop_extreme(problem: Problem):
    """Max or min of feature rows with offsets, one ``ufunc.reduce`` over each segment's rows
    (every feature at once), or None where ``reduceat`` is the faster (see
    :data:`EXTREME_LOOP_MIN_FEATURES`).  The same values as ``reduceat``: NaN propagates, an
    empty segment gets the reduction's identity."""
    B, n, D = problem.in_shape
    m = problem.num_segments
    if not (
        problem.reduction in ("max", "min")
        and problem.out_dtype == problem.dtype
        and m
        and D >= EXTREME_LOOP_MIN_FEATURES
        and B * n * D * itemsize(problem.dtype) >= EXTREME_LOOP_MIN_BYTES
    ):
        return None
    per_segment = n * D / m
    wide = D >= EXTREME_LOOP_WIDE_FEATURES and per_segment >= EXTREME_LOOP_WIDE_MIN_ELEMENTS
    if not (wide or per_segment >= EXTREME_LOOP_MIN_ELEMENTS):
        return None
    reduce = _UFUNCS[problem.reduction].reduce
    empty_value = identity(problem.reduction, problem.out_dtype)

    def run(x: Any, out: Any, segments: VariableSegments, stream: Any) -> None:
        x3, out3 = host_view(x), host_view(out)
        bounds = np.asarray(segments.offsets).tolist()
        for b in range(B):
            rows, results = x3[b], out3[b]
            for i in range(m):
                lo, hi = bounds[i], bounds[i + 1]
                if lo == hi:
                    results[i] = empty_value
                else:
                    reduce(rows[lo:hi], axis=0, out=results[i])

    return run


def _loop_rows(problem: Problem):
    """Feature rows with offsets, one segment at a time.

    A segment of at most :data:`BLAS_BLOCK_FEATURES` rows is one BLAS product with a ones vector;
    a longer one is cut into blocks of that many rows (as the fixed-length path does, for the same
    accuracy), each block one product, the blocks' sums added in float64 (for all long segments
    of a row of the batch by one ``reduceat``).  Data of another dtype than the accumulation's, or
    a result of another dtype, takes :func:`_segment_total` a segment at a time, converting a
    block at a time.
    """
    B, _, D = problem.in_shape
    m = problem.num_segments
    acc = numpy_dtype(problem.acc_dtype)
    block = BLAS_BLOCK_FEATURES
    ones = np.ones(block, dtype=acc)
    empty_value = identity(problem.reduction, problem.out_dtype)
    mean = problem.reduction == "mean"
    matmul = np.matmul

    def run(x: Any, out: Any, segments: VariableSegments, stream: Any) -> None:
        x3, out3 = host_view(x), host_view(out)
        # (each block converted, or copied where BLAS cannot read the rows as they are)
        convert = x3.dtype != acc or not _blas_reads(x3[:, None, : min(block, x3.shape[1])])
        offsets = np.asarray(segments.offsets)
        starts = offsets.tolist()
        if not convert and out3.dtype == acc:
            _blocks_run(x3, out3, offsets, starts)
            return
        total = np.empty(D, dtype=np.float64)
        for b in range(B):
            rows, results = x3[b], out3[b]
            for i in range(m):
                lo, hi = starts[i], starts[i + 1]
                if lo == hi:
                    results[i] = empty_value
                    continue
                _segment_total(rows[lo:hi], ones, total, convert)
                if mean:
                    total /= hi - lo
                results[i] = total  # (cast to the result dtype)

    def _blocks_run(x3: np.ndarray, out3: np.ndarray, offsets: np.ndarray, starts: list) -> None:
        """Data read as it is: a segment of at most a block (a sum) is one product into its result;
        another's whole blocks are one stacked product into partials of the data's dtype (its
        last rows one more), and every such segment's partials are added in float64 by one
        ``reduceat`` at the end (four or five NumPy calls for each long segment cost as much as a
        short segment's product: 2 cores, float32, random bounds, 2,000 x 64 rows in 32 segments
        0.095 -> 0.087 ms a call, 20,000 x 32 in 60 0.45 -> 0.34)."""
        parts = np.empty((x3.shape[1] // block + m, D), dtype=acc)
        for b in range(B):
            rows, results = x3[b], out3[b]
            firsts: list[int] = []
            which: list[int] = []
            j = 0
            for i in range(m):
                lo, hi = starts[i], starts[i + 1]
                if lo == hi:
                    results[i] = empty_value
                    continue
                if hi - lo <= block and not mean:
                    matmul(ones[: hi - lo], rows[lo:hi], out=results[i])
                    continue
                firsts.append(j)
                which.append(i)
                q, r = divmod(hi - lo, block)
                if q:  # (the whole blocks: one stacked product of a view of the rows)
                    matmul(ones, rows[lo : lo + q * block].reshape(q, block, D), out=parts[j : j + q])
                    j += q
                if r:
                    matmul(ones[:r], rows[hi - r : hi], out=parts[j])
                    j += 1
            if which:
                totals = np.add.reduceat(parts[:j], firsts, axis=0, dtype=np.float64)
                if mean:
                    totals /= (offsets[1:] - offsets[:-1])[which][:, None]
                results[which] = totals  # (cast to the result dtype)

    return run


@functools.lru_cache(maxsize=2)
def _interval_table(T: int, dtype: np.dtype) -> np.ndarray:
    """The 0/1 indicator of every interval ``[lo, hi)`` of ``T`` rows, ``0 <= lo <= hi <= T``:
    ``((T + 1)(T + 2)/2, T)``, row ``hi (hi + 1)/2 + lo``; read-only (shared by plans)."""
    hi = np.repeat(np.arange(T + 1, dtype=np.int64), np.arange(1, T + 2))
    lo = np.arange(hi.shape[0], dtype=np.int64) - hi * (hi + 1) // 2
    r = np.arange(T, dtype=np.int64)
    table = ((r >= lo[:, None]) & (r < hi[:, None])).astype(dtype)
    table.flags.writeable = False
    return table


def _tile_rows(problem: Problem):
    """Feature rows with offsets over many segments: stacked products of 0/1 interval matrices.

    The rows are cut into tiles of :data:`TILE_ROWS`.  Tile ``t`` meets ``k_t`` segments (the
    non-empty ones; empty segments get the reduction's identity); its ``(K, T)`` matrix has one
    row per segment, 1 on the segment's rows in the tile, and its product with the tile's
    ``(T, D)`` rows gives the ``K`` partial sums of the segments in the tile.  The tiles are taken
    in chunks of a few (``K`` the chunk's largest ``k_t``, so that one tile crowded with short
    segments widens only its chunk), each chunk one stacked ``np.matmul`` (BLAS releases the
    GIL: the chunks are shared among threads).  Each segment's partials (at most ``T`` rows each,
    in the data's dtype) are then added in float64 by a few gathers over all segments at once.
    The matrices depend on the offsets only: a batch reuses them for each of its rows.

    A product also multiplies every value of a tile by 0 for the tile's other segments: an
    infinite or NaN value gives NaN in their partials (0 * inf).  One pass over the results
    finds any NaN (the minimum propagates it), and those segments are summed again apart, which
    warns where their own sums are invalid (the products' 0 * inf must not).
    """
    B, n, D = problem.in_shape
    T = TILE_ROWS
    acc = numpy_dtype(problem.acc_dtype)
    table = _interval_table(T, acc)
    ones = np.ones(BLAS_BLOCK_FEATURES, dtype=acc)
    empty_value = identity(problem.reduction, problem.out_dtype)
    mean = problem.reduction == "mean"
    nt, nfull = -(-n // T), n // T
    tile_starts = np.arange(0, nt * T, T, dtype=np.int64)
    tile_stops = np.minimum(tile_starts + T, n)
    tiles = np.arange(nt, dtype=np.int64)
    # 0: num_threads() at the call, the chunks at least TILE_MIN_CHUNKS
    threads = 1 if B * n * D < TILE_THREAD_ELEMENTS else 0
    min_chunks = 1 if threads else TILE_MIN_CHUNKS

    def run(x: Any, out: Any, segments: VariableSegments, stream: Any) -> None:
        x3, out3 = host_view(x), host_view(out)
        off, nonempty = _nonempty_offsets(segments, out3, empty_value)
        me = off.shape[0] - 1
        if me == 0:
            return
        # Per tile: its first row's segment a, and the segments it meets (a up to b - 1).
        a = np.searchsorted(off, tile_starts, side="right") - 1
        k = np.searchsorted(off, tile_stops, side="left") - a
        # Chunks of tiles with k_t slots each (the chunk's largest), ~TILE_CHUNK_ELEMENTS of matrices.
        step = max(1, min(TILE_CHUNK_ELEMENTS // (T * (-(-int(k.sum()) // nt))), -(-nt // min_chunks)))
        firsts = np.arange(0, nt, step, dtype=np.int64)
        widths = np.maximum.reduceat(k, firsts)
        counts = np.diff(np.append(firsts, nt))
        bases = np.zeros(firsts.shape[0] + 1, dtype=np.int64)
        np.cumsum(widths * counts, out=bases[1:])
        per_tile = np.repeat(widths, counts)
        tile_base = np.repeat(bases[:-1], counts) + (tiles - np.repeat(firsts, counts)) * per_tile
        # Each slot's segment and its rows in the tile, as a row of the interval table (slots
        # past the offsets' end read n: empty intervals).
        tile = np.repeat(tiles, per_tile)
        seg = np.arange(bases[-1], dtype=np.int64)
        seg -= tile_base[tile]
        seg += a[tile]
        padded = np.concatenate((off, np.full(int(widths.max()) + 1, n, dtype=np.int64)))
        rows0 = tile * T
        lo = padded[seg] - rows0
        hi = padded[seg + 1] - rows0
        np.clip(lo, 0, T, out=lo)
        np.clip(hi, 0, T, out=hi)
        code = hi * (hi + 1) // 2 + lo
        partials = np.empty((B, int(bases[-1]), D), dtype=acc)
        width, base = widths.tolist(), bases.tolist()

        def products(c0: int, c1: int) -> None:
            with np.errstate(invalid="ignore"):  # 0 * inf of the other segments' rows (see above)
                for c in range(c0, c1):
                    t0, t1, K, r0, r1 = c * step, min(c * step + step, nt), width[c], base[c], base[c + 1]
                    S = table.take(code[r0:r1], axis=0).reshape(t1 - t0, K, T)
                    f = min(t1, nfull) - t0  # whole tiles of the chunk
                    for b in range(B):
                        if f > 0:
                            rows = x3[b, t0 * T : (t0 + f) * T].reshape(f, T, D)
                            np.matmul(S[:f], rows, out=partials[b, r0 : r0 + f * K].reshape(f, K, D))
                        if t1 > nfull:  # the last tile, shorter
                            np.matmul(S[-1, :, : n - nfull * T], x3[b, nfull * T :], out=partials[b, r1 - K : r1])

        chunks = len(width)
        workers = min(threads or num_threads(), chunks)
        if workers > 1:
            # cut where the matrices' rows (the products' work) are shared out evenly
            cuts = np.searchsorted(bases, np.linspace(0, base[-1], workers + 1)[1:-1]).tolist()
            _in_threads(products, list(itertools.pairwise([0, *cuts, chunks])))
        else:
            products(0, chunks)

        # Each segment's partials: its slot in its first tile, then slot 0 of each later tile.
        first = off[:-1] // T
        spans = (off[1:] - 1) // T - first
        segs = np.arange(me, dtype=np.int64)
        total = partials.take(tile_base[first] + segs - a[first], axis=1)
        if total.dtype != np.float64:
            total = total.astype(np.float64)
        more = np.flatnonzero(spans)
        j = 1
        while more.shape[0] and j <= TILE_COMBINE_STEPS:
            total[:, more] += partials[:, tile_base[first[more] + j]]
            j += 1
            more = more[spans[more] >= j]
        for s in more.tolist():
            t = first[s]
            total[:, s] += np.add.reduce(partials[:, tile_base[t + j : t + spans[s] + 1]], axis=1, dtype=np.float64)
        if np.isnan(np.minimum.reduce(total, axis=None)):
            again = np.isnan(total).any(axis=2)
            if _count_nonzero(again) * REDO_ALL_FRACTION > again.size:  # many: the loop, for all
                _loop_rows(problem)(x, out, segments, stream)
                return
            for b, s in zip(*np.nonzero(again), strict=True):
                _segment_total(x3[b, off[s] : off[s + 1]], ones, total[b, s], False)
        if mean:
            total /= np.diff(off)[:, None]
        _store(out3, total, nonempty)

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
    summary = (
        "host arrays: BLAS GEMV (data @ ones) for fixed lengths, ufunc.reduceat for offsets, "
        "products of 0/1 interval matrices for feature rows with offsets"
    )
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
        kept = direct
        if direct is not None and problem.in_shape[0] > 1:
            # (a batch of rows, not one column: its overflowing runs are summed again, as every
            # host call's are but the one-column calls the accuracy notes name)
            kept = _kept_sums(problem, direct)
        if direct is not None:  # reads the caller's arrays as they come: no views needed
            # (a fixed length's one GEMV or ufunc.reduce is safe from an out that overlaps x: NumPy
            # computes such calls as if they did not overlap; not the chained columns' calls, nor
            # a sum summed again, which reads x after out is written)
            safe = problem.fixed and problem.segment_length > CHAIN_LONGEST and kept is direct
            return FunctionExecutor(_at_caller(problem, kept), views=False, overlap_safe=safe)
        if problem.fixed:
            return FunctionExecutor(_at_caller(problem, _kept_sums(problem, _fixed(problem))))
        run = _variable_rows(problem) or _rows_steps(problem) or _loop_extreme(problem) or _variable(problem)
        return FunctionExecutor(_at_caller(problem, _kept_sums(problem, run)))


def _kept_sums(problem: Problem, run: Any) -> Any:
    """``run``, for a float32 (or complex64) sum or mean of data that accumulator holds, with the
    segments whose result is not finite summed again in float64: a run of up to 128 values can
    pass the float32 range (two of 3e38) where the segment's sum does not (3e38, 3e38, -3e38,
    -2e38), or give ``inf - inf`` where the data is finite; the sum or mean is then kept, and that
    overflow warns of nothing.  A segment whose own sum passes the range comes back ``inf`` with
    the cast's overflow warning; data holding ``inf`` or NaN gives what float64 gives, with its
    warnings.  The result is tested only where NumPy flagged an overflow or an invalid value
    (:func:`linred._fpwarnings.noting`).  Other calls: ``run`` itself."""
    acc, data = numpy_dtype(problem.acc_dtype), numpy_dtype(problem.dtype)
    narrow = (acc.kind == "f" and acc.itemsize < 8) or (acc.kind == "c" and acc.itemsize < 16)
    if not (problem.reduction in ("sum", "mean") and narrow and (data.kind in "iub" or np.can_cast(data, acc, "safe"))):
        return run
    B, n, D = problem.in_shape
    L = problem.segment_length
    mean = problem.reduction == "mean"
    wide = np.complex128 if acc.kind == "c" else np.float64

    noted_run = noting(run)

    def kept(x: Any, out: Any, segments: Any, stream: Any) -> None:
        if not noted_run(x, out, segments, stream):
            return  # (no overflow, no inf - inf: the results are what float32 gives them)
        out3 = host_view(out)
        finite = np.isfinite(out3)
        if finite.all():
            return
        out3 = out3.reshape(B, -1, D)
        x3 = host_view(x).reshape(B, n, D)
        bad = np.flatnonzero(~finite.reshape(B, -1, D).all(axis=(0, 2)))
        if L:
            total = x3.reshape(B, -1, L, D)[:, bad].sum(axis=2, dtype=wide)
            counts: Any = L
        else:
            off = np.asarray(segments.offsets, dtype=np.int64)
            lo, hi = off[bad], off[bad + 1]
            nonempty = hi > lo  # (an empty segment's mean is NaN: left as it is)
            bad, lo, hi = bad[nonempty], lo[nonempty], hi[nonempty]
            if not bad.size:
                return
            # Segment k's sum is reduceat's result 2k over [lo_0, hi_0, lo_1, hi_1, ...]: the
            # results between are the gaps (dropped), and a last hi of n is left out (reduceat's
            # last result runs to the end).
            bounds = np.stack([lo, hi], axis=1).reshape(-1)
            if bounds[-1] == n:
                bounds = bounds[:-1]
            total = np.add.reduceat(x3, bounds, axis=1, dtype=wide)[:, ::2]
            counts = (hi - lo)[None, :, None]
        if mean:
            if total.dtype.kind == "c":  # (each part divided by the count: a complex division
                # by count + 0j would make inf + 0j's imaginary part NaN)
                parts = total.view(np.float64).reshape(*total.shape, 2) / np.asarray(counts)[..., None]
                total = parts.reshape(*total.shape[:-1], -1).view(np.complex128)
            else:
                total = total / counts
        out3[:, bad, :] = total  # (a cast into the result's dtype: a sum past its range warns)

    return kept


def _at_caller(problem: Problem, run: Any) -> Any:
    """``run``, with NumPy's overflow and invalid-value warnings reported at the caller's line.

    Integer data into an integer result raises none (NumPy's integer sums wrap silently;
    linred's accumulators are wide enough), so its calls skip the switch of error modes; a
    floating result of integer data does not (the cast of 70000 into float16 overflows).  The maximum and minimum of
    bfloat16 data run with invalid values ignored: ml_dtypes' ``maximum.reduce`` warns where
    a segment holds a NaN, NumPy's own floating-point types do not (a NaN is their result).
    """
    if problem.dtype == "bfloat16" and problem.reduction in ("max", "min"):
        inner = run

        def run(x: Any, out: Any, segments: Any, stream: Any) -> None:
            with np.errstate(invalid="ignore"):
                inner(x, out, segments, stream)

    floating = "fc"
    if (numpy_dtype(problem.acc_dtype).kind in floating or numpy_dtype(problem.out_dtype).kind in floating
            or problem.dtype in ("float16", "bfloat16")):  # fmt: skip
        return at_caller(run)
    return run


BACKEND = NumpyBackend()
