"""The public functions: ``segmented_sum``, ``segmented_mean``, ``segmented_max``, ``segmented_min``,
``segmented_prod``, ``segmented_argmax`` and ``segmented_argmin``."""

from __future__ import annotations

from typing import Any

from linred import _dynamo
from linred._arg import argextreme
from linred._jax import call_jax, is_jax
from linred._segment_ids import reduce_by_ids
from linred._time import is_time, reduce_time
from linred.backends import BackendName

__all__ = [
    "segmented_argmax",
    "segmented_argmin",
    "segmented_max",
    "segmented_mean",
    "segmented_min",
    "segmented_prod",
    "segmented_sum",
]

_PARAMETERS = """\
Parameters
----------
x : array_like
    The data: a NumPy array, a CuPy array, a PyTorch tensor (CPU or CUDA), or
    anything :func:`numpy.asarray` accepts.  Any layout; it is never modified.
segment_length : int, optional
    Fixed segment length ``L >= 1``, dividing ``n = x.shape[axis]``: segment
    ``i`` is ``[i*L, (i+1)*L)`` and ``m = n // L``.  No offsets array is built.
offsets : array_like of int, optional
    CSR-style offsets (a NumPy, CuPy or PyTorch array, or a list):
    ``m + 1`` non-decreasing values with ``offsets[0] == 0`` and
    ``offsets[-1] == n``; segment ``i`` is ``[offsets[i], offsets[i+1])``.
    int32 and int64 offsets are used as they are, other integer dtypes become
    int64.  Host offsets for device data are copied to the device (a small
    transfer); device offsets for host data are refused.
lengths : array_like of int, optional
    Segment lengths: ``m`` non-negative integers summing to ``n``.
segment_ids : array_like of int, optional
    One segment id per element along ``axis`` (PyG's ``batch`` vector,
    ``jax.ops.segment_sum``'s ``segment_ids``): segment ``i`` gathers the
    elements with id ``i``, in their order.  Sorted ids are served as offsets
    (no data moves); unsorted ids by a stable sort of the ids and a gather of
    ``x`` (one copy), deterministically.  Ids outside ``[0, num_segments)``
    raise ``ValueError`` (``check=True``) or are dropped (``check=False``, as
    JAX does).  See :doc:`api`.
num_segments : int, optional
    The number of segments ``m`` named by ``segment_ids`` (ids need not use
    all of them: a missing id is an empty segment).  Default:
    ``max(segment_ids) + 1``, found by reading the ids (on a GPU, one
    synchronization).
ids_sorted : bool, optional
    Whether ``segment_ids`` never decrease.  Default: found when the ids are
    read (``check=True``, or host ids); with ``check=False`` on a GPU, ids not
    promised sorted are sorted (right for any ids, at the cost of a sort).
axis : int, default 0
    The axis along which segments run; negative values count from the end.  The
    other axes are carried: ``x`` of shape ``(n, d)`` gives ``(m, d)``.
dtype : dtype, optional
    Accumulation and result dtype.  By default floating and complex dtypes keep
    their own (float16 and bfloat16 are always accumulated in float32), bool
    and signed integers give int64 and unsigned integers uint64{mean_dtype}.
    For max and min it is the result dtype only: the
    extreme is found in ``x``'s dtype, then converted (as
    ``x.max().astype(dtype)``), so a value the conversion wraps or truncates
    never changes which element is the extreme.
out : array, optional
    Preallocated result: C-contiguous, writeable, of the result's shape and
    dtype, and of ``x``'s array type and device.  It is filled and returned.
backend : {{"auto", "numpy", "nvmath", "cublas", "cub", "nvrtc"}}, default "auto"
    Which implementation runs the call.  ``"auto"`` takes the first backend,
    in an order measured per problem shape (see :doc:`backends`), that can
    serve it.  A named backend that cannot serve the call raises
    :class:`linred.BackendError`; there is no silent fallback.
stream : optional
    CUDA stream for device data: a CuPy or PyTorch stream, an object with
    ``__cuda_stream__``, or a raw ``cudaStream_t`` int.  Default: the array
    library's current stream.  Must be None for host data.
check : bool, default True
    Validate ``offsets`` or ``lengths``; a call whose segments break a rule
    raises ``ValueError`` naming the index and values.  On a GPU this costs one
    synchronization of the call's stream.  Where the call's plan is cached and runs
    one of nvrtc's kernels that check the offsets as they read them (feature rows, and
    one column of contiguous data: every call of a layout after its first), the
    call waits for that kernel and, on an error, ``out`` may have been written;
    otherwise one kernel over the offsets runs first.  A large call (at least 32 MiB
    of data) whose offsets are at most 64 MiB waits for that one kernel
    only, enqueued ahead of its checking reduction, and returns while the reduction
    runs (on an error it waits for the reduction too, then raises).
    ``check=False`` skips it: the caller promises valid segments, and invalid ones
    give undefined results.
remainder : {{"error", "drop", "keep"}}, default "error"
    What to do when ``segment_length`` does not divide ``n`` (time series cut
    into windows): ``"error"`` refuses the call; ``"drop"`` leaves out the last
    ``n % L`` elements (``m = n // L``; ``x`` is sliced, not copied);
    ``"keep"`` makes them a last, shorter segment (``m = ceil(n / L)``; the call
    then runs with ``lengths``, built on the host: device data gets them copied
    to the device on every call).  Only with ``segment_length``.

Returns
-------
array
    Shape ``x.shape[:axis] + (m,) + x.shape[axis+1:]``, of ``x``'s array type
    and on its device (``out`` when given).

Raises
------
TypeError, ValueError
    For bad arguments, with a message naming the argument, the rule and the
    offending value (:class:`numpy.exceptions.AxisError` for ``axis``).
linred.BackendError
    If the requested backend cannot serve the call.
"""


def _served_otherwise(x: Any) -> bool:
    """Whether ``x`` is of a type the pipeline refuses but linred serves another way (see :func:`_other`)."""
    from linred.dask import is_dask  # (no Dask import: the type's module is read)

    return is_jax(x) or is_time(x) or is_dask(x)


def _other(function: Any, reduction: str, x: Any, segment_length: Any, offsets: Any, lengths: Any, axis: Any,
           dtype: Any, out: Any, backend: Any, stream: Any, check: Any, remainder: Any) -> Any:  # fmt: skip
    """``function`` (``segmented_<reduction>``) of a JAX array (reduced where it lies, through
    DLPack: :mod:`linred._jax`), of a Dask array (a lazy Dask array, reduced chunk by chunk:
    :mod:`linred.dask`) or of NumPy datetime64/timedelta64 data (:mod:`linred._time`)."""
    from linred.dask import _from_function, is_dask

    if is_dask(x):
        return _from_function(reduction, x, segment_length, offsets, lengths, axis, dtype, out, backend, stream,
                              check, remainder)  # fmt: skip
    if is_jax(x):
        return call_jax(function, x, segment_length, offsets=offsets, lengths=lengths, out=out, stream=stream,
                        axis=axis, dtype=dtype, backend=backend, check=check, remainder=remainder)  # fmt: skip
    given = [name for name, v in (("dtype", dtype), ("out", out), ("stream", stream)) if v is not None]
    if given:
        raise TypeError(f"{' and '.join(given)} cannot be given for {x.dtype} data (a reduction in its own unit)")
    segments = {"segment_length": segment_length, "offsets": offsets, "lengths": lengths}
    return reduce_time(reduction, x, segments, axis, backend, check)


_REMAINDERS = ("error", "drop", "keep")


def _given(segment_length: Any, offsets: Any, lengths: Any, remainder: Any) -> list[str]:
    """The segment arguments given besides ``segment_ids`` (which cannot go with it)."""
    given = [name for name, v in (("segment_length", segment_length), ("offsets", offsets), ("lengths", lengths))
             if v is not None]  # fmt: skip
    return given + (["remainder"] if remainder != "error" else [])


def _remainder(x: Any, segment_length: Any, offsets: Any, lengths: Any, axis: Any, remainder: Any) -> tuple:
    """``(x, segment_length, lengths)`` of a call with ``remainder="drop"`` or ``"keep"``: ``x``
    without its last ``n % L`` elements along ``axis`` (a view), or lengths ``[L, ..., L, n % L]``.
    Anything it cannot read is left for the call's own checks to refuse."""
    if remainder not in _REMAINDERS:
        raise ValueError(f"remainder must be 'error', 'drop' or 'keep'; got {remainder!r}")
    if segment_length is None or offsets is not None or lengths is not None:
        raise TypeError("remainder= applies to segment_length only (offsets and lengths name every element)")
    from linred.dask import is_dask

    if isinstance(segment_length, bool) or not hasattr(segment_length, "__index__") or is_jax(x) or is_dask(x):
        return x, segment_length, lengths  # (refused by the call, naming segment_length; JAX, Dask: applied there)
    import operator

    from linred._frontend import normalize_axis
    from linred.arrays import as_array

    x, adapter = as_array(x)
    try:
        L = operator.index(segment_length)
    except TypeError:  # (a NumPy array of one integer, say: refused by the call, naming segment_length)
        return x, segment_length, lengths
    if not x.shape or L < 1:
        return x, segment_length, lengths
    ax = normalize_axis(axis, len(x.shape))
    n = x.shape[ax]
    rest = n % L
    if rest == 0:
        return x, segment_length, lengths
    if remainder == "drop":
        # (nothing left where L passes n: no segment, whatever the length; 1 keeps a length past
        # the index range out of the call)
        return x[(slice(None),) * ax + (slice(0, n - rest),)], segment_length if n >= L else 1, None
    from linred._fused import _compiling

    if adapter.kind == "torch" and _compiling():
        # (a tensor on x's device while torch.compile traces the call: a NumPy array passed on as
        # lengths reads as a device array there; eagerly, host lengths go to x's device as before)
        import torch

        kept = torch.full((n // L + 1,), min(L, n), dtype=torch.int64, device=x.device)
    else:
        import numpy as np

        kept = np.full(n // L + 1, min(L, n), dtype=np.int64)  # (L past n: one segment, of n)
    kept[-1] = rest
    return x, None, kept


def _doc(summary: str, extended: str, see_also: str, example: str, mean_dtype: str = "", notes: str = "") -> str:
    notes = f"Notes\n-----\n{notes}\n" if notes else ""
    return (
        f"{summary}\n\n{extended}\n\n{_PARAMETERS.format(mean_dtype=mean_dtype)}\n"
        f"See Also\n--------\n{see_also}\n\n{notes}Examples\n--------\n{example}"
    )


def segmented_sum(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    dtype: Any = None,
    out: Any = None,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    if segment_ids is not None or num_segments is not None or ids_sorted is not None:
        return reduce_by_ids(segmented_sum, x, segment_ids, num_segments, ids_sorted,
                             _given(segment_length, offsets, lengths, remainder), axis, out, check,
                             dtype=dtype, backend=backend, stream=stream)  # fmt: skip
    if remainder != "error":
        x, segment_length, lengths = _remainder(x, segment_length, offsets, lengths, axis, remainder)
    try:
        return _dynamo.run("sum", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
    except TypeError:
        if not _served_otherwise(x):
            raise
    return _other(segmented_sum, "sum", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream,
                  check, remainder)  # fmt: skip


def segmented_mean(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    dtype: Any = None,
    out: Any = None,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    if segment_ids is not None or num_segments is not None or ids_sorted is not None:
        return reduce_by_ids(segmented_mean, x, segment_ids, num_segments, ids_sorted,
                             _given(segment_length, offsets, lengths, remainder), axis, out, check,
                             dtype=dtype, backend=backend, stream=stream)  # fmt: skip
    if remainder != "error":
        x, segment_length, lengths = _remainder(x, segment_length, offsets, lengths, axis, remainder)
    try:
        return _dynamo.run("mean", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
    except TypeError:
        if not _served_otherwise(x):
            raise
    return _other(segmented_mean, "mean", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream,
                  check, remainder)  # fmt: skip


def segmented_max(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    dtype: Any = None,
    out: Any = None,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    if segment_ids is not None or num_segments is not None or ids_sorted is not None:
        return reduce_by_ids(segmented_max, x, segment_ids, num_segments, ids_sorted,
                             _given(segment_length, offsets, lengths, remainder), axis, out, check,
                             dtype=dtype, backend=backend, stream=stream)  # fmt: skip
    if remainder != "error":
        x, segment_length, lengths = _remainder(x, segment_length, offsets, lengths, axis, remainder)
    try:
        return _dynamo.run("max", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
    except TypeError:
        if not _served_otherwise(x):
            raise
    return _other(segmented_max, "max", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream,
                  check, remainder)  # fmt: skip


def segmented_min(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    dtype: Any = None,
    out: Any = None,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    if segment_ids is not None or num_segments is not None or ids_sorted is not None:
        return reduce_by_ids(segmented_min, x, segment_ids, num_segments, ids_sorted,
                             _given(segment_length, offsets, lengths, remainder), axis, out, check,
                             dtype=dtype, backend=backend, stream=stream)  # fmt: skip
    if remainder != "error":
        x, segment_length, lengths = _remainder(x, segment_length, offsets, lengths, axis, remainder)
    try:
        return _dynamo.run("min", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
    except TypeError:
        if not _served_otherwise(x):
            raise
    return _other(segmented_min, "min", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream,
                  check, remainder)  # fmt: skip


def segmented_prod(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    dtype: Any = None,
    out: Any = None,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    if segment_ids is not None or num_segments is not None or ids_sorted is not None:
        return reduce_by_ids(segmented_prod, x, segment_ids, num_segments, ids_sorted,
                             _given(segment_length, offsets, lengths, remainder), axis, out, check,
                             dtype=dtype, backend=backend, stream=stream)  # fmt: skip
    if remainder != "error":
        x, segment_length, lengths = _remainder(x, segment_length, offsets, lengths, axis, remainder)
    try:
        return _dynamo.run("prod", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
    except TypeError:
        if not _served_otherwise(x):
            raise
    return _other(segmented_prod, "prod", x, segment_length, offsets, lengths, axis, dtype, out, backend, stream,
                  check, remainder)  # fmt: skip


_PRECISION = """\
Every addition is done in the accumulation dtype or wider: float32 in float32
(never in TF32, whatever CuPy's or PyTorch's settings), float16 and bfloat16 in
float32, integers in int64 or uint64 unless ``dtype=`` asks for another.
"""

segmented_sum.__doc__ = _doc(
    "Sum each segment of ``x`` along ``axis``.",
    "For fixed-length segments this is the matrix product of the ``(m, L)`` view of\n"
    "the data with a vector of ones (a GEMV: BLAS on the host, cuBLAS or cuBLASLt on\n"
    "the GPU); short segments and offsets run on linred's own CUDA kernels on the\n"
    "GPU, integer sums on CUB or those kernels.  An empty segment sums to 0.",
    "segmented_mean : The mean of each segment.\nSegmentedReduction : A reduction planned once for many arrays.",
    """\
>>> import numpy as np
>>> import linred
>>> x = np.arange(1, 13, dtype=np.float32)
>>> linred.segmented_sum(x, 4)
array([10., 26., 42.], dtype=float32)
>>> linred.segmented_sum(x, offsets=[0, 2, 2, 12])
array([ 3.,  0., 75.], dtype=float32)
>>> linred.segmented_sum(x.reshape(6, 2), lengths=[1, 5])
array([[ 1.,  2.],
       [35., 40.]], dtype=float32)

Segments along the last axis of a 2-D array:

>>> linred.segmented_sum(np.arange(12).reshape(2, 6), 3, axis=-1)
array([[ 3, 12],
       [21, 30]])

Integers are summed in 64 bits; ``dtype=`` chooses another result:

>>> small = np.array([100, 100, 100], dtype=np.int8)
>>> linred.segmented_sum(small, 3)
array([300])
>>> linred.segmented_sum(small, lengths=[2, 1], dtype=np.float32)
array([200., 100.], dtype=float32)
""",
    notes=_PRECISION,
)
segmented_mean.__doc__ = _doc(
    "Mean of each segment of ``x`` along ``axis``.",
    "The segmented sum divided by the segment lengths (for fixed lengths, the\n"
    "product with ones scaled by ``1/L``).  An empty segment's mean is NaN.",
    "segmented_sum : The sum of each segment.\nSegmentedReduction : A reduction planned once for many arrays.",
    """\
>>> import numpy as np
>>> import linred
>>> linred.segmented_mean(np.arange(1, 13, dtype=np.float32), 4)
array([ 2.5,  6.5, 10.5], dtype=float32)
>>> linred.segmented_mean([1, 2, 3, 4], lengths=[3, 0, 1])
array([ 2., nan,  4.])
""",
    mean_dtype="; the mean of integers is float64",
    notes=_PRECISION,
)
segmented_prod.__doc__ = _doc(
    "Product of each segment of ``x`` along ``axis``.",
    "Not linear, so not a matrix product: NumPy's ``multiply.reduce`` and\n"
    "``multiply.reduceat`` on the host, linred's own CUDA kernels on the GPU (the\n"
    "``numpy`` and ``nvrtc`` backends; the others raise :class:`linred.BackendError`).\n"
    "An empty segment's product is 1.  Integers multiply in 64 bits (or the\n"
    "``dtype=`` asked for) and wrap around on overflow, as NumPy's products do.",
    "segmented_sum : The sum of each segment.\nSegmentedReduction : A reduction planned once for many arrays.",
    """\
>>> import numpy as np
>>> import linred
>>> linred.segmented_prod(np.arange(1, 7, dtype=np.float64), 3)
array([  6., 120.])
>>> linred.segmented_prod([2, 3, 4, 5], lengths=[1, 0, 3])
array([ 2,  1, 60])
""",
    notes="""\
Floating-point products are accumulated in the accumulation dtype (float32 for
float16, bfloat16 and float32), in a different order on each backend (NumPy: left
to right; the GPU kernels: a fixed tree), so backends may differ in the last bits;
the relative error grows at most linearly with the segment length.
For PyTorch tensors that require grad, the gradient of an element is the product
of the other elements of its segment (computed without dividing by zero).
""",
)
segmented_max.__doc__ = _doc(
    "Maximum of each segment of ``x`` along ``axis``.",
    "Not linear, so not a matrix product: NumPy ufuncs on the host, linred's own\n"
    "CUDA kernels or CUB on the GPU.  A NaN makes its segment's maximum NaN, as\n"
    "in NumPy.  Complex input raises TypeError (complex numbers have no order).\n"
    "An empty segment's maximum is the identity: -inf for floating dtypes, the\n"
    "dtype's minimum for integers, False for bool.",
    "segmented_min : The minimum of each segment.\nSegmentedReduction : A reduction planned once for many arrays.",
    """\
>>> import numpy as np
>>> import linred
>>> linred.segmented_max(np.arange(1, 13, dtype=np.float32), 4)
array([ 4.,  8., 12.], dtype=float32)
>>> linred.segmented_max(np.array([3.0, 1.0]), lengths=[0, 2])
array([-inf,   3.])
>>> linred.segmented_max(np.array([1.0, np.nan, 3.0, 4.0]), 2)
array([nan,  4.])
""",
)
segmented_min.__doc__ = _doc(
    "Minimum of each segment of ``x`` along ``axis``.",
    "Not linear, so not a matrix product: NumPy ufuncs on the host, linred's own\n"
    "CUDA kernels or CUB on the GPU.  A NaN makes its segment's minimum NaN, as\n"
    "in NumPy.  Complex input raises TypeError (complex numbers have no order).\n"
    "An empty segment's minimum is the identity: +inf for floating dtypes, the\n"
    "dtype's maximum for integers, True for bool.",
    "segmented_max : The maximum of each segment.\nSegmentedReduction : A reduction planned once for many arrays.",
    """\
>>> import numpy as np
>>> import linred
>>> linred.segmented_min(np.arange(1, 13, dtype=np.float32), 4)
array([1., 5., 9.], dtype=float32)
>>> linred.segmented_min(np.array([3, 1], dtype=np.int32), lengths=[2, 0])
array([         1, 2147483647], dtype=int32)
""",
)


def segmented_argmax(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    if segment_ids is not None or num_segments is not None or ids_sorted is not None:
        return reduce_by_ids(segmented_argmax, x, segment_ids, num_segments, ids_sorted,
                             _given(segment_length, offsets, lengths, remainder), axis, None, check,
                             positions=True, backend=backend, stream=stream)  # fmt: skip
    if remainder != "error":
        x, segment_length, lengths = _remainder(x, segment_length, offsets, lengths, axis, remainder)
    try:
        return argextreme("max", x, segment_length, offsets, lengths, axis, backend, stream, check)
    except TypeError:
        if is_time(x):  # (positions of time data are not served)
            raise TypeError(f"segmented_argmax does not take {x.dtype} data (sum, mean, max and min do); its "
                            "int64 counts are x.view('int64'), where NaT is the smallest value") from None  # fmt: skip
        if not is_jax(x):
            from linred.dask import _from_function, is_dask

            if is_dask(x):
                return _from_function("argmax", x, segment_length, offsets, lengths, axis, None, None, backend,
                                      stream, check, remainder)  # fmt: skip
            raise
    return call_jax(segmented_argmax, x, segment_length, offsets=offsets, lengths=lengths, out=None, stream=stream,
                    axis=axis, backend=backend, check=check, remainder=remainder)  # fmt: skip


def segmented_argmin(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    if segment_ids is not None or num_segments is not None or ids_sorted is not None:
        return reduce_by_ids(segmented_argmin, x, segment_ids, num_segments, ids_sorted,
                             _given(segment_length, offsets, lengths, remainder), axis, None, check,
                             positions=True, backend=backend, stream=stream)  # fmt: skip
    if remainder != "error":
        x, segment_length, lengths = _remainder(x, segment_length, offsets, lengths, axis, remainder)
    try:
        return argextreme("min", x, segment_length, offsets, lengths, axis, backend, stream, check)
    except TypeError:
        if is_time(x):  # (positions of time data are not served)
            raise TypeError(f"segmented_argmin does not take {x.dtype} data (sum, mean, max and min do); its "
                            "int64 counts are x.view('int64'), where NaT is the smallest value") from None  # fmt: skip
        if not is_jax(x):
            from linred.dask import _from_function, is_dask

            if is_dask(x):
                return _from_function("argmin", x, segment_length, offsets, lengths, axis, None, None, backend,
                                      stream, check, remainder)  # fmt: skip
            raise
    return call_jax(segmented_argmin, x, segment_length, offsets=offsets, lengths=lengths, out=None, stream=stream,
                    axis=axis, backend=backend, check=check, remainder=remainder)  # fmt: skip


_ARG = """{summary}

The index along ``axis`` into ``x`` (not into the segment) of the first element
of each segment that attains its {extreme}: ties go to the first occurrence.  A NaN
is the {extreme} of its segment, and the index is that of its first NaN, as in
:func:`numpy.arg{which}`.  An empty segment's index is ``n = x.shape[axis]``, one
past the end, so that indexing ``x`` with it raises instead of reading another
segment's element.

Computed as two of linred's reductions and a comparison: ``segmented_{which}``,
then each element compared with its segment's {extreme}, then the smallest position
that attains it (an int64 ``segmented_min``).  ``backend`` serves both reductions.

Parameters
----------
x : array_like
    As in :func:`segmented_{which}`; complex data raises TypeError.
segment_length : int, optional
    Fixed segment length, as in :func:`segmented_{which}`.
offsets : array_like of int, optional
    Segment offsets, as in :func:`segmented_{which}`.
lengths : array_like of int, optional
    Segment lengths, as in :func:`segmented_{which}`.
segment_ids : array_like of int, optional
    Segments named by ids, as in :func:`segmented_{which}`; positions are still
    positions in ``x`` (unsorted ids: the position of the first of the
    segment's elements, in ``x``'s order, that attains the {extreme}).
num_segments : int, optional
    The number of segments ``segment_ids`` name, as in :func:`segmented_{which}`.
ids_sorted : bool, optional
    Whether ``segment_ids`` never decrease, as in :func:`segmented_{which}`.
axis : int, default 0
    The axis along which segments run.
backend : str, default "auto"
    The backend of both reductions, as in :func:`segmented_{which}`.
stream : optional
    CUDA stream for device data, as in :func:`segmented_{which}`.
check : bool, default True
    Validate ``offsets`` or ``lengths`` (once: the second reduction reads the same).
remainder : {{"error", "drop", "keep"}}, default "error"
    As in :func:`segmented_{which}`: a ``segment_length`` that does not divide
    ``n`` is refused, its remainder dropped, or kept as a last, shorter segment
    (positions are then still positions in ``x``).

Returns
-------
array of int64
    Shape ``x.shape[:axis] + (m,) + x.shape[axis+1:]``, of ``x``'s array type and
    device.

See Also
--------
segmented_{which} : The {extreme} itself.
segmented_arg{other} : The index of the {other_extreme}.

Examples
--------
>>> import numpy as np
>>> import linred
>>> x = np.array([3, 1, 3, 2, 5, 5, 0, 9], dtype=np.float32)
>>> linred.segmented_arg{which}(x, offsets=[0, 3, 3, 6, 8])
array([{ex1}, 8, {ex2}, {ex3}])
"""

segmented_argmax.__doc__ = _ARG.format(
    summary="Index of the maximum of each segment of ``x`` along ``axis``.",
    extreme="maximum", which="max", other="min", other_extreme="minimum", ex1=0, ex2=4, ex3=7,
)  # fmt: skip
segmented_argmin.__doc__ = _ARG.format(
    summary="Index of the minimum of each segment of ``x`` along ``axis``.",
    extreme="minimum", which="min", other="max", other_extreme="maximum", ex1=1, ex2=3, ex3=6,
)  # fmt: skip
