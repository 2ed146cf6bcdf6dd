"""Dask arrays in, lazy Dask arrays out: linred's reductions chunk by chunk.

``linred.segmented_sum(x, ...)`` (and mean, max, min, prod, argmax, argmin) of a
:class:`dask.array.Array` returns a new, lazy Dask array; nothing is computed at call
time but the segment description, which is read on the host to build the graph.
Each task reduces one chunk with linred's own function on that chunk, so NumPy
chunks run on linred's host backends and CuPy chunks on its GPU backends, and the
result's chunks are of the input's chunk type (NumPy or CuPy meta).

Three ways to cut the work (``method=``; ``"auto"`` picks the first that applies of
``"blockwise"`` and ``"carry"``):

- ``"blockwise"``: every chunk boundary along the axis is a segment boundary, so each
  chunk is reduced on its own (its slice of the offsets, shifted to start at 0, or
  the fixed length): one task per chunk, no communication.
- ``"carry"``: a chunk boundary cuts a segment.  Each chunk reduces the pieces of
  the segments that lie in it (sums kept in float32 for float16/bfloat16 data);
  the piece that continues a segment from earlier chunks is gathered, for every
  chunk, in one small task per block of the other axes, combined per cut segment,
  and added (max-ed, min-ed) to the segment's first piece in the task that writes
  the segment's output chunk.  The graph has a fixed depth, whatever the number of
  chunks a segment spans.
- ``"rechunk"``: the chunk boundaries are moved to nearby segment boundaries (as
  flox's ``rechunk_for_blockwise`` does), then ``"blockwise"``.

Offsets and lengths are needed on the host to build the graph: NumPy arrays and
lists are used as they are; a Dask array is computed (``.compute()``) and a CuPy
array or PyTorch tensor copied to the host, once, when the call builds the graph.
The segment description is always checked on the host (the graph's shape depends
on it), with the same messages as the functions; the tasks then run with
``check=False``.  ``segment_ids`` are read on the host too and become offsets; unsorted
ids of few segments are reduced chunk by chunk into every segment and the chunks' results
combined (:func:`map_reduce_by_ids`), other unsorted ids move the data into their stable order
first (:func:`by_ids_order`), and results shaped like the data, or positions, are moved
back.  See ``docs/scaling.md`` for the cost model and chunk sizes.

This module imports Dask only when it builds a graph: ``linred`` detects Dask arrays
by their type's module, without importing it.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import sys
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

import linred
from linred._dtypes import identity, numpy_dtype
from linred._fpwarnings import call_at_caller
from linred._frontend import check_flag, normalize_axis
from linred._jax import is_jax
from linred.plan import SegmentedReduction

if TYPE_CHECKING:
    import dask.array

__all__ = [
    "METHODS",
    "is_dask",
    "segmented_argmax",
    "segmented_argmin",
    "segmented_max",
    "segmented_mean",
    "segmented_min",
    "segmented_prod",
    "segmented_reduce",
    "segmented_sum",
]

#: the values of ``method=``
METHODS = ("auto", "blockwise", "carry", "rechunk")

#: the reduction each chunk computes of the pieces of a segment, and how the pieces' results combine
_PARTIAL = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "max", "min": "min"}
_COMBINE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
_ARG = {"argmax": "max", "argmin": "min"}
#: linred's composed functions (linred._fused): those whose result is shaped like x, and the others
_PER_ELEMENT = ("softmax", "log_softmax")
_COMPOSED = ("logsumexp", *_PER_ELEMENT, "var", "std")

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def is_dask(x: Any) -> bool:
    """Whether ``x`` is a Dask array (classic or array-expression), without importing Dask."""
    return any(c.__name__ == "Array" and c.__module__.startswith("dask.array") for c in type(x).__mro__)


# --- the host's thread pool, capped to one thread inside tasks ---


def _one_thread() -> Any:
    """Run a task's linred calls on the calling thread only.

    The numpy backend cuts a long 1-D reduction with offsets across a pool of up to
    ``num_threads()`` threads; inside a Dask task the scheduler already runs one task per
    core (and distributed workers one thread per task slot), so that pool would oversubscribe
    the cores.  :func:`linred.backends.numpy.single_threaded` caps it for the calling thread
    only.  The result's bits do not depend on the thread count (the backend reduces every
    segment on one thread either way).  BLAS's own threads (the fixed-length sums) are Dask's
    usual concern: distributed workers start with ``OMP_NUM_THREADS=1`` and friends.
    """
    from linred.backends.numpy import single_threaded

    return single_threaded()


# --- calls on one chunk ---


def _xp(a: Any) -> Any:
    """The array module of a chunk: NumPy, or CuPy (imported, since the chunk is one of its arrays)."""
    if isinstance(a, np.ndarray):
        return np
    return sys.modules[type(a).__module__.partition(".")[0]]


def _index(axis: int, index: Any) -> tuple:
    """``index`` along ``axis`` (all of every axis before it)."""
    return (slice(None),) * axis + (index,)


def _call(reduction: str, block: Any, axis: int, backend: str, *, segment_length: int | None = None,
          offsets: np.ndarray | None = None, dtype: Any = None, cached: bool = True,
          **options: Any) -> Any:  # fmt: skip
    """linred's ``segmented_<reduction>`` of one chunk (its segments already checked on the host).

    ``cached=False`` runs a plan made for this call alone and freed after it: for calls whose
    description (the chunk's shape, the number of offsets, an odd piece length) rarely repeats,
    which would otherwise fill linred's plan cache (64 plans, shared by the whole process) with
    plans used once and push out the caller's own.  A plan costs what a cache miss costs (tens of
    microseconds on the host), less than a task's own overhead.
    """
    if cached or reduction in _ARG or reduction in _COMPOSED or block.dtype.kind in "mM":  # (no plan object)
        kwargs = {} if reduction in _ARG else {"dtype": dtype}
        function = getattr(linred, f"segmented_{reduction}")
        return function(block, segment_length, offsets=offsets, axis=axis, backend=backend, check=False, **kwargs,
                        **options)  # fmt: skip
    with SegmentedReduction(block, segment_length, offsets=offsets, axis=axis, reduction=reduction, dtype=dtype,
                            backend=backend, check=False) as plan:  # fmt: skip
        return plan(block)


def _blockwise_task(block: Any, params: np.ndarray, *, reduction: str, axis: int, as_dtype: Any, backend: str,
                    segment_length: int | None, n: int, **options: Any) -> Any:  # fmt: skip
    """A chunk whose edges are segment edges: ``params`` is ``[start, size, *local offsets]`` (no
    offsets for a fixed length)."""
    start, size = int(params[0]), int(params[1])
    with _one_thread():
        if segment_length is not None:
            # Every chunk of a regular chunking has the same shape: the cached plan is reused.
            result = _call(reduction, block, axis, backend, segment_length=segment_length, dtype=as_dtype, **options)
        else:
            result = _call(reduction, block, axis, backend, offsets=params[2:], dtype=as_dtype, cached=False,
                           **options)  # fmt: skip
    if reduction in _ARG:  # positions in the chunk (size for an empty segment) -> positions in x (n)
        xp = _xp(result)
        result = xp.where(result == size, n, result + start)
    return result


def _piece_offsets(params: np.ndarray, segment_length: int | None) -> np.ndarray:
    """The chunk's pieces as local offsets.  ``params`` is ``[start, size, *local offsets]``, or
    ``[start, size, head, whole, tail]`` for a fixed length: a head piece of ``head`` elements (the
    end of a segment begun in an earlier chunk), ``whole`` segments, a tail piece of ``tail``
    elements (the start of a segment that goes on)."""
    if segment_length is None:
        return params[2:]
    head, whole, tail = (int(v) for v in params[2:5])
    parts = [[0], [head] if head else [], head + segment_length * np.arange(1, whole + 1)]
    if tail:
        parts.append([head + whole * segment_length + tail])
    return np.concatenate(parts).astype(np.int64)


def _pieces_task(block: Any, params: np.ndarray, *, reduction: str, axis: int, as_dtype: Any, backend: str,
                 segment_length: int | None, parts_dtype: Any = None) -> Any:  # fmt: skip
    """The chunk's piece of every segment that lies in it, in ``as_dtype`` (the accumulation dtype of
    sums: float32 for float16 data; None for max and min, which keep the data's dtype), returned in
    ``parts_dtype`` where one is given: float64 (complex128) for float32 (complex64) sums, so that
    the pieces of one segment never overflow where they are added.  A host chunk whose pieces come
    out not finite is summed again in ``parts_dtype``: a run of float32 values can pass the range
    where the piece does not (3e38, 3e38, -3e38), as linred's host reductions do it for a call."""
    if parts_dtype is None or parts_dtype == as_dtype:
        return _pieces(block, params, reduction, axis, as_dtype, backend, segment_length)
    if not isinstance(block, np.ndarray):  # (device data: the pieces as the device sums them)
        return _pieces(block, params, reduction, axis, as_dtype, backend, segment_length).astype(parts_dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # (a run that passes the range: summed again below)
        parts = _pieces(block, params, reduction, axis, as_dtype, backend, segment_length)
    if not np.isfinite(parts).all():
        return _pieces(block, params, reduction, axis, parts_dtype, backend, segment_length)
    return parts.astype(parts_dtype)


def _pieces(block: Any, params: np.ndarray, reduction: str, axis: int, as_dtype: Any, backend: str,
            segment_length: int | None) -> Any:  # fmt: skip
    """:func:`_pieces_task`'s pieces in ``as_dtype``."""
    with _one_thread():
        if segment_length is None:
            return _call(reduction, block, axis, backend, offsets=params[2:], dtype=as_dtype, cached=False)
        # A fixed length: the whole segments with the fixed length (one plan for every chunk of the
        # same number of whole segments, reused from the cache; and BLAS products, not reduceat), the
        # cut pieces at the ends each as one segment of its own length, with a plan used once (their
        # lengths change from chunk to chunk).
        head, whole, tail = (int(v) for v in params[2:5])
        parts = []
        if head:
            parts.append(_call(reduction, block[_index(axis, slice(0, head))], axis, backend,
                               segment_length=head, dtype=as_dtype, cached=False))  # fmt: skip
        if whole or not (head or tail):
            middle = block[_index(axis, slice(head, head + whole * segment_length))]
            parts.append(_call(reduction, middle, axis, backend, segment_length=segment_length, dtype=as_dtype))
        if tail:
            end = block[_index(axis, slice(head + whole * segment_length, None))]
            parts.append(_call(reduction, end, axis, backend, segment_length=tail, dtype=as_dtype, cached=False))
    return parts[0] if len(parts) == 1 else _xp(block).concatenate(parts, axis=axis)


def _arg_pieces_task(block: Any, params: np.ndarray, *, reduction: str, axis: int, backend: str,
                     segment_length: int | None, n: int) -> Any:  # fmt: skip
    """Where in ``x`` each piece's extreme is (``n`` for an empty piece)."""
    start, size = int(params[0]), int(params[1])
    with _one_thread():
        local = _call(reduction, block, axis, backend, offsets=_piece_offsets(params, segment_length))
    return _xp(local).where(local == size, n, local + start)


def _arg_values_task(block: Any, where: Any, params: np.ndarray, *, reduction: str, axis: int, n: int) -> Any:
    """The values at the positions ``where`` (in ``x``) of the pieces' extremes; an empty piece's
    is the identity of its reduction, which no element beats."""
    xp = _xp(block)
    fill = identity(_ARG[reduction], block.dtype.name)
    start, size = int(params[0]), int(params[1])
    if size == 0:
        return xp.full(where.shape, fill, dtype=block.dtype)
    local = xp.clip(where - start, 0, size - 1)
    return xp.where(where == n, fill, xp.take_along_axis(block, local, axis=axis)).astype(block.dtype, copy=False)


def _head_task(partials: Any, params: np.ndarray, *, axis: int, fill: Any) -> Any:
    """The chunk's piece that continues a segment begun earlier (``params[0]``, the head flag), or a
    row of ``fill`` where there is none: one row per chunk."""
    if params[0]:
        return partials[_index(axis, slice(0, 1))]
    shape = list(partials.shape)
    shape[axis] = 1
    return _xp(partials).full(tuple(shape), fill, dtype=partials.dtype)


def _combine_task(heads: Any, *, reduction: str, axis: int, backend: str, groups: np.ndarray,
                  select: np.ndarray) -> Any:  # fmt: skip
    """Per chunk that owns a cut segment, the reduction of the continuing pieces (one row per chunk
    of ``heads``, the rows of later chunks that the segment reaches).  ``groups`` are offsets over
    the rows (the gaps between the groups are segments of their own, unused); ``select`` picks
    each chunk's group (any, for a chunk that owns no cut segment)."""
    dtype = None if reduction in ("max", "min") else heads.dtype
    with _one_thread():
        combined = _call(reduction, heads, axis, backend, offsets=groups, dtype=dtype)
    return _xp(heads).take(combined, _xp(heads).asarray(select), axis=axis)


def _arg_combine_task(values: Any, where: Any, *, reduction: str, axis: int, backend: str, groups: np.ndarray,
                      select: np.ndarray, n: int) -> Any:  # fmt: skip
    """As :func:`_combine_task` for positions: the smallest position in each group that attains the
    group's extreme (NaN counts as the extreme, as in linred's arg-reductions)."""
    xp = _xp(values)
    which = _ARG[reduction]
    sizes = np.diff(groups)
    with _one_thread():
        best = _call(which, values, axis, backend, offsets=groups)
        spread = xp.take(best, xp.asarray(np.repeat(np.arange(sizes.shape[0]), sizes)), axis=axis)
        hit = values == spread
        if _holds_nan(values.dtype):
            hit |= xp.isnan(values) & xp.isnan(spread)
        first = _call("min", xp.where(hit, where, n), axis, backend, offsets=groups)
    return xp.take(first, xp.asarray(select), axis=axis)


def _holds_nan(dtype: np.dtype) -> bool:
    """Whether values of ``dtype`` can be NaN: floating and complex dtypes, and ml_dtypes'
    bfloat16 (whose NumPy kind is ``"V"``)."""
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def _finalize_task(partials: Any, params: np.ndarray, carried: Any = None, *, reduction: str, axis: int,
                   out_dtype: np.dtype, segment_length: int | None) -> Any:  # fmt: skip
    """The output chunk: the pieces of the segments that start in the chunk, the last one (when it
    goes on into later chunks) combined with ``carried``; means divided by their lengths, empty
    segments given their identity, the result in the output dtype.  ``params`` is ``[head, cut,
    count]`` for a fixed length, else ``[head, cut, *lengths]``."""
    xp = _xp(partials)
    head, cut = int(params[0]), int(params[1])
    own = partials[_index(axis, slice(head, None))]
    if cut:
        own = own.copy()  # (the partials are another task's result: never written in place)
        last = _index(axis, slice(-1, None))
        combine = _COMBINE[_PARTIAL[reduction]]
        if _PARTIAL[reduction] in ("max", "min"):
            with np.errstate(invalid="ignore"):  # (ml_dtypes' bfloat16 maximum of a NaN warns; NumPy's floats do not)
                own[last] = combine(own[last], carried)
        else:  # (inf - inf, or an overflow, of two pieces: the warning linred's reductions give)
            own[last] = call_at_caller(combine, own[last], carried)
    count = own.shape[axis]
    lengths = params[2:] if segment_length is None else np.full(count, segment_length, dtype=np.int64)
    shape = [1] * own.ndim
    shape[axis] = count
    if reduction == "mean":
        real = np.empty(0, dtype=own.dtype).real.dtype  # divide by a real, part by part (as linred does)
        den = xp.asarray(lengths.astype(real).reshape(shape))
        with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0: an empty segment's NaN
            if own.dtype.kind == "c":  # (not own / den: an infinite part would make the other NaN)
                quotient = xp.empty(own.shape, dtype=own.dtype)
                quotient.real[...] = own.real / den
                quotient.imag[...] = own.imag / den
                own = quotient
            else:
                own = own / den
    # (an overflow of the cast to a narrower dtype=: the warning linred's reductions give)
    result = call_at_caller(own.astype, out_dtype, copy=False)
    if reduction == "mean" and result.dtype.kind == "c" and not lengths.all():
        # (an empty segment's mean is NaN, nan+0j for complex as the functions give it: 0/0 made
        # the imaginary part NaN too)
        result = xp.where(xp.asarray((lengths == 0).reshape(shape)), complex(math.nan, 0.0), result)
        result = result.astype(out_dtype, copy=False)
    if reduction in ("max", "min") and not lengths.all():
        # An empty piece holds the identity of the data's dtype; the empty segment's value is that
        # of the result's dtype (they differ for dtype=float64 of int32 data).
        result = xp.where(xp.asarray((lengths == 0).reshape(shape)), identity(reduction, out_dtype.name), result)
        result = result.astype(out_dtype, copy=False)
    return result


def _arg_finalize_task(where: Any, values: Any, params: np.ndarray, carried_where: Any = None,
                       carried_values: Any = None, *, reduction: str, axis: int) -> Any:  # fmt: skip
    """As :func:`_finalize_task` for positions: a cut segment's position is its first piece's unless
    the continuing pieces hold a greater (smaller) value, or a NaN where the first piece has none."""
    xp = _xp(where)
    head, cut = int(params[0]), int(params[1])
    own = where[_index(axis, slice(head, None))]
    if not cut:
        return own
    own = own.copy()
    last = _index(axis, slice(-1, None))
    first = values[_index(axis, slice(head, None))][last]
    with np.errstate(invalid="ignore"):  # (ml_dtypes' bfloat16 comparisons with NaN warn; NumPy's do not)
        better = carried_values > first if reduction == "argmax" else carried_values < first
    if _holds_nan(values.dtype):
        better |= xp.isnan(carried_values) & ~xp.isnan(first)
    own[last] = xp.where(better, carried_where, own[last])
    return own


# --- the segments, on the host ---


class _Segments:
    """The segments of an axis of length ``n``: a fixed length (nothing is built per segment) or
    int64 offsets; what the graph needs to know of them, for many chunk edges at once."""

    def __init__(self, n: int, length: int | None = None, offsets: np.ndarray | None = None) -> None:
        self.n = n
        self.length = length
        self.offsets = offsets
        self.count = n // length if length is not None else offsets.shape[0] - 1

    def first_starting_at(self, p: np.ndarray) -> np.ndarray:
        """The index of the first segment that starts at or after each position (``count`` if none)."""
        if self.length is not None:
            return np.minimum(-(-p // self.length), self.count)
        return np.searchsorted(self.offsets[:-1], p, side="left")

    def offset(self, j: np.ndarray) -> np.ndarray:
        """Where segment ``j`` starts (``n`` for ``j == count``)."""
        return j * self.length if self.length is not None else self.offsets[j]

    def is_boundary(self, p: np.ndarray) -> np.ndarray:
        """Whether each position is a segment boundary (an offset)."""
        if self.length is not None:
            return p % self.length == 0
        j = np.minimum(np.searchsorted(self.offsets, p, side="left"), self.count)
        return self.offsets[j] == p

    def nearest_boundary(self, p: np.ndarray) -> np.ndarray:
        """The segment boundary nearest to each position (the lower one on a tie)."""
        if self.length is not None:
            return np.minimum(np.floor_divide(2 * p + self.length - 1, 2 * self.length) * self.length, self.n)
        j = np.searchsorted(self.offsets, p, side="left")
        above = self.offsets[np.minimum(j, self.count)]
        below = self.offsets[np.maximum(j - 1, 0)]
        return np.where(above - p < p - below, above, np.where(above == p, p, below))

    def lengths(self, lo: int, hi: int) -> np.ndarray:
        return np.diff(self.offsets[lo : hi + 1])


def _host_index(value: Any, name: str) -> Any:
    """Offsets or lengths as something on the host (a Dask array computed, a device array copied)."""
    if value is None:
        return None
    if is_dask(value):
        value = value.compute()  # the one thing a call computes: the graph's shape depends on it
    module = type(value).__module__.partition(".")[0]
    if module == "cupy":
        value = value.get()
    elif module == "torch":
        value = value.detach().cpu().numpy()
    elif is_jax(value):
        value = np.asarray(value)
    return value


def _segments(x: Any, axis: int, segment_length: Any, offsets: Any, lengths: Any,
              remainder: Any) -> tuple[Any, _Segments]:  # fmt: skip
    """``(x, segments)``: the segment arguments read and checked on the host, ``remainder=`` applied
    (``"drop"`` slices ``x``, lazily), with the functions' messages."""
    from linred.arrays import NUMPY
    from linred.segments import _segment_length, parse_segments

    n = x.shape[axis]
    if remainder not in ("error", "drop", "keep"):
        raise ValueError(f"remainder must be 'error', 'drop' or 'keep'; got {remainder!r}")
    if remainder != "error":
        if segment_length is None or offsets is not None or lengths is not None:
            raise TypeError("remainder= applies to segment_length only (offsets and lengths name every element)")
        if isinstance(segment_length, bool) or not hasattr(segment_length, "__index__"):
            raise TypeError(f"segment_length must be an integer; got {type(segment_length).__name__} "
                            f"{segment_length!r}")  # fmt: skip
        L = operator.index(segment_length)
        if L < 1:
            raise ValueError(f"segment_length must be >= 1; got {L}")
        rest = n % L
        if rest and remainder == "drop":
            x = x[_index(axis, slice(0, n - rest))]
            n -= rest
        elif rest:
            segment_length, lengths = None, np.append(np.full(n // L, L, dtype=np.int64), rest)
    if segment_length is not None and offsets is None and lengths is None:
        fixed = _segment_length(segment_length, n, axis)
        return x, _Segments(n, length=fixed.length)
    parsed = parse_segments(segment_length, _host_index(offsets, "offsets"), _host_index(lengths, "lengths"),
                            n=n, axis=axis, adapter=NUMPY, device=None, check=True)  # fmt: skip
    return x, _Segments(n, offsets=np.asarray(parsed.offsets, dtype=np.int64))


# --- the graphs ---


def _params(parts: list[np.ndarray]) -> dask.array.Array:
    """One small int64 block per chunk along the axis (the tasks' own arguments), as a Dask array
    whose blocks line up with the chunks': each task is sent its block only."""
    import dask.array as da

    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    return da.from_array(np.concatenate(parts), chunks=(tuple(p.shape[0] for p in parts),))


def _blockwise(func: Any, token: str, along: int, ndim: int, arrays: list[tuple[Any, bool]], out_chunks: Any,
               meta: Any, **kwargs: Any) -> dask.array.Array:  # fmt: skip
    """``func`` block by block over arrays that have as many blocks along the axis ``along`` (``True``: an
    array of the data's rank; ``False``: a 1-D block of parameters per chunk), its result's chunks
    along it being ``out_chunks``."""
    import dask.array as da

    index = _LETTERS[:ndim]
    args: list[Any] = []
    for array, full in arrays:
        args += [array, index if full else index[along]]
    return da.blockwise(func, index, *args, align_arrays=False, adjust_chunks={index[along]: tuple(out_chunks)},
                        dtype=meta.dtype, meta=meta, token=token, **kwargs)  # fmt: skip


def _layout(segs: _Segments, bounds: np.ndarray) -> dict[str, np.ndarray]:
    """Per chunk along the axis: where it starts and its size, the segments that start in it
    (``[lo, hi)``; the last chunk also owns the empty segments at ``n``), whether it begins
    inside a segment (``head``), and whether its last segment goes on past it (``cut``)."""
    start, end = bounds[:-1], bounds[1:]
    size = end - start
    lo = segs.first_starting_at(start)
    hi = np.append(lo[1:], segs.count)
    starts_here = (lo < segs.count) & (segs.offset(np.minimum(lo, max(segs.count - 1, 0))) == start)
    head = (size > 0) & ~starts_here
    cut = (hi > lo) & (segs.offset(hi) > end)
    return {"start": start, "size": size, "lo": lo, "hi": hi, "head": head, "cut": cut}


def _build_blockwise(reduction: str, x: Any, axis: int, segs: _Segments, dtype: Any, backend: str,
                     meta: Any, **options: Any) -> dask.array.Array:  # fmt: skip
    bounds = np.cumsum((0, *x.chunks[axis]), dtype=np.int64)
    lay = _layout(segs, bounds)
    parts = []
    for i in range(len(lay["start"])):
        a, c = int(lay["start"][i]), int(lay["size"][i])
        if segs.length is not None:
            parts.append([a, c])
        else:
            local = segs.offsets[lay["lo"][i] : lay["hi"][i]] - a
            parts.append(np.concatenate([[a, c], local, [c]]))
    # A per-element function's result chunks are the data's; a reduction's hold the segments that start in them.
    out_chunks = lay["size"] if reduction in _PER_ELEMENT else lay["hi"] - lay["lo"]
    return _blockwise(_blockwise_task, f"linred-{reduction}", axis, x.ndim, [(x, True), (_params(parts), False)],
                      out_chunks, meta, reduction=reduction, axis=axis, as_dtype=dtype, backend=backend,
                      segment_length=segs.length, n=segs.n, **options)  # fmt: skip


def _carry_groups(lay: dict[str, np.ndarray], segs: _Segments, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets over the chunks' head rows grouping, for each chunk that owns a cut segment, the rows
    of the later chunks the segment reaches; and each chunk's group."""
    K = lay["start"].shape[0]
    owners = np.flatnonzero(lay["cut"])
    ends = segs.offset(lay["hi"][owners])
    last = np.searchsorted(bounds, ends, side="left") - 1  # the chunk that holds the segment's last element
    groups = np.unique(np.concatenate([[0, K], owners + 1, last + 1]))
    select = np.zeros(K, dtype=np.int64)
    select[owners] = np.searchsorted(groups, owners + 1)
    return groups, select


def _build_carry(reduction: str, x: Any, axis: int, segs: _Segments, dtype: Any, backend: str, meta: Any,
                 out_dtype: np.dtype) -> dask.array.Array:  # fmt: skip
    """The ``carry`` graph, four layers deep whatever the chunks: each chunk's pieces (one task per
    chunk); each chunk's head row (the piece that continues a segment begun earlier); all head rows
    of a block of the other axes in one task, which combines the rows each cut segment reaches
    (its result split back into one row per chunk); each output chunk from its chunk's pieces and
    its cut segment's combined continuation.  The head rows are the only data that moves."""

    from linred._dtypes import dtype_name, resolve

    bounds = np.cumsum((0, *x.chunks[axis]), dtype=np.int64)
    lay = _layout(segs, bounds)
    K = bounds.shape[0] - 1
    L = segs.length
    pieces, finals = [], []
    for i in range(K):
        a, c, head, cut = int(lay["start"][i]), int(lay["size"][i]), bool(lay["head"][i]), bool(lay["cut"][i])
        lo, hi = int(lay["lo"][i]), int(lay["hi"][i])
        if L is not None:
            first = min(lo * L, a + c)  # where the first segment that starts in the chunk starts
            h = first - a if head else 0
            whole = max(0, (a + c - first) // L)
            pieces.append([a, c, h, whole, a + c - first - whole * L])
            finals.append([int(head), int(cut), hi - lo])
        else:
            local = segs.offsets[lo:hi] - a
            pieces.append(np.concatenate([[a, c], [0] if head else [], local, [c]]))
            finals.append(np.concatenate([[int(head), int(cut)], segs.lengths(lo, hi)]))
    if L is None:  # ([start, size, *piece offsets])
        piece_counts = np.array([len(p) - 3 for p in pieces])
    else:  # ([start, size, head, whole, tail])
        piece_counts = np.array([int(p[3]) + (p[2] > 0) + (p[4] > 0) for p in pieces])
    pieces_params, final_params = _params(pieces), _params(finals)
    out_chunks = lay["hi"] - lay["lo"]
    common = {"axis": axis, "backend": backend}
    token = f"linred-{reduction}"
    has_cut = bool(lay["cut"].any())
    if has_cut:
        groups, select = _carry_groups(lay, segs, bounds)

    if reduction in _ARG:
        which = _ARG[reduction]
        where_meta = _meta_like(meta, x.ndim, dtype=np.dtype(np.int64))
        value_meta = _meta_like(meta, x.ndim, dtype=x.dtype)
        where = _blockwise(_arg_pieces_task, f"{token}-pieces", axis, x.ndim, [(x, True), (pieces_params, False)],
                           piece_counts, where_meta, reduction=reduction, segment_length=L, n=segs.n,
                           **common)  # fmt: skip
        values = _blockwise(_arg_values_task, f"{token}-values", axis, x.ndim,
                            [(x, True), (where, True), (pieces_params, False)], piece_counts, value_meta,
                            reduction=reduction, axis=axis, n=segs.n)  # fmt: skip
        if not has_cut:
            return _blockwise(_arg_finalize_task, token, axis, x.ndim,
                              [(where, True), (values, True), (final_params, False)], out_chunks, where_meta,
                              reduction=reduction, axis=axis)  # fmt: skip
        ones = np.ones(K, dtype=np.int64)
        heads_where = _blockwise(_head_task, f"{token}-heads", axis, x.ndim, [(where, True), (final_params, False)],
                                 ones, where_meta, axis=axis, fill=segs.n).rechunk({axis: -1})  # fmt: skip
        heads_values = _blockwise(_head_task, f"{token}-heads", axis, x.ndim,
                                  [(values, True), (final_params, False)], ones, value_meta, axis=axis,
                                  fill=identity(which, x.dtype.name)).rechunk({axis: -1})  # fmt: skip
        carried_where = _blockwise(_arg_combine_task, f"{token}-combine", axis, x.ndim,
                                   [(heads_values, True), (heads_where, True)], [K], where_meta,
                                   reduction=reduction, groups=groups, select=select, n=segs.n,
                                   **common)  # fmt: skip
        carried_values = _blockwise(_combine_task, f"{token}-combine", axis, x.ndim, [(heads_values, True)], [K],
                                    value_meta, reduction=which, groups=groups, select=select,
                                    **common)  # fmt: skip
        return _blockwise(_arg_finalize_task, token, axis, x.ndim,
                          [(where, True), (values, True), (final_params, False),
                           (carried_where.rechunk({axis: 1}), True), (carried_values.rechunk({axis: 1}), True)],
                          out_chunks, where_meta, reduction=reduction, axis=axis)  # fmt: skip

    partial = _PARTIAL[reduction]
    requested = None if dtype is None else dtype_name(dtype)
    # Sums keep their pieces in linred's accumulation dtype (float32 for float16 and bfloat16 data,
    # float64 for a mean of integers); max and min are exact in the data's own dtype.
    # A float32 or complex64 sum's pieces are added in float64 or complex128 (two pieces of a
    # segment whose sum fits may not: 3e38 and -2e38 after 3e38), rounded once at the end.
    acc = None if partial in ("max", "min") else numpy_dtype(resolve(reduction, dtype_name(x.dtype), requested)[0])
    wide = acc if acc is None or acc.str[1:] not in ("f4", "c8") else _WIDER[acc.str[1:]]
    partial_meta = _meta_like(meta, x.ndim, dtype=x.dtype if acc is None else wide)
    partials = _blockwise(_pieces_task, f"{token}-pieces", axis, x.ndim, [(x, True), (pieces_params, False)],
                          piece_counts, partial_meta, reduction=partial, as_dtype=acc, segment_length=L,
                          parts_dtype=wide, **common)  # fmt: skip
    final = {"reduction": reduction, "axis": axis, "out_dtype": out_dtype, "segment_length": L}
    if not has_cut:
        return _blockwise(_finalize_task, token, axis, x.ndim, [(partials, True), (final_params, False)],
                          out_chunks, meta, **final)  # fmt: skip
    heads = _blockwise(_head_task, f"{token}-heads", axis, x.ndim, [(partials, True), (final_params, False)],
                       np.ones(K, dtype=np.int64), partial_meta, axis=axis,
                       fill=identity(partial, partial_meta.dtype.name)).rechunk({axis: -1})  # fmt: skip
    carried = _blockwise(_combine_task, f"{token}-combine", axis, x.ndim, [(heads, True)], [K], partial_meta,
                         reduction=partial, groups=groups, select=select, **common)  # fmt: skip
    return _blockwise(_finalize_task, token, axis, x.ndim,
                      [(partials, True), (final_params, False), (carried.rechunk({axis: 1}), True)], out_chunks,
                      meta, **final)  # fmt: skip


def _rechunked(x: Any, axis: int, segs: _Segments) -> Any:
    """``x`` with every chunk edge along ``axis`` moved to the segment boundary nearest to it (edges
    that meet merge their chunks; a segment longer than a chunk becomes one chunk or more)."""
    bounds = np.cumsum((0, *x.chunks[axis]), dtype=np.int64)
    inner = segs.nearest_boundary(bounds[1:-1])
    edges = np.unique(np.concatenate([[0, segs.n], inner]))
    chunks = tuple(int(c) for c in np.diff(edges)) or (0,)
    return x if chunks == tuple(x.chunks[axis]) else x.rechunk({axis: chunks})


def _probe(reduction: str, x: Any, dtype: Any) -> np.dtype:
    """The result dtype, found as linred finds it (one call on a single zero of x's dtype), with
    the functions' own errors for a dtype, or a reduction of a dtype, that they refuse."""
    function = getattr(linred, f"segmented_{reduction}")
    sample = np.zeros(1, dtype=x.dtype)
    if reduction in _ARG:
        return function(sample, 1).dtype
    return function(sample, 1, dtype=dtype).dtype


def _checked_input(x: Any, axis: Any, backend: Any, check: Any) -> tuple[int, Any]:
    """``(axis, chunk_meta)`` of a Dask array ``x`` of at least one dimension, with the functions'
    errors for a bad ``axis``, ``backend`` or ``check``, chunks that are neither NumPy nor CuPy
    arrays, or unknown chunk sizes along the axis."""
    from dask.array.utils import meta_from_array

    from linred.backends import check_backend_name

    axis = normalize_axis(axis, x.ndim)
    check_backend_name(backend)
    check_flag(check)
    chunk_meta = getattr(x, "_meta", None)
    if chunk_meta is None:
        chunk_meta = meta_from_array(x)
    if not (type(chunk_meta) is np.ndarray or type(chunk_meta).__module__.partition(".")[0] == "cupy"):
        raise TypeError(f"x must be a Dask array of NumPy or CuPy chunks; got chunks of "
                        f"{type(chunk_meta).__module__}.{type(chunk_meta).__name__}")  # fmt: skip
    if any(math.isnan(c) for c in x.chunks[axis]):
        raise ValueError(f"x has unknown chunk sizes along axis {axis}; call x.compute_chunk_sizes() first")
    return axis, chunk_meta


def segmented_reduce(
    reduction: str,
    x: dask.array.Array,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    axis: int = 0,
    dtype: Any = None,
    backend: str = "auto",
    check: bool = True,
    remainder: str = "error",
    method: str = "auto",
) -> dask.array.Array:
    """A segmented reduction of a Dask array, as a lazy Dask array.

    The graph reduces each chunk with linred's own ``segmented_<reduction>`` (NumPy chunks
    on the host, CuPy chunks on the GPU); the result has the chunk type of ``x``.  Only
    the segment description is read at call time.

    Parameters
    ----------
    reduction : {"sum", "mean", "max", "min", "prod", "argmax", "argmin"}
        The reduction (``"prod"`` where linred has ``segmented_prod``).
    x : dask.array.Array
        The data, of NumPy or CuPy chunks, with known chunk sizes along ``axis``.
    segment_length : int, optional
        Fixed segment length, as in :func:`linred.segmented_sum`.
    offsets : array_like of int, optional
        Segment offsets, as in :func:`linred.segmented_sum`; a NumPy array or a list, or a
        Dask, CuPy or PyTorch array, which is computed or copied to the host once, here.
    lengths : array_like of int, optional
        Segment lengths, read as ``offsets`` are.
    axis : int, default 0
        The axis the segments run along; negative values count from the end.
    dtype : dtype, optional
        Accumulation and result dtype, as in :func:`linred.segmented_sum` (not for the
        arg-reductions).
    backend : str, default "auto"
        The backend of every chunk's call.
    check : bool, default True
        Must be a bool.  The segments are checked on the host either way (the graph is built
        from them); the tasks run unchecked.
    remainder : {"error", "drop", "keep"}, default "error"
        As in :func:`linred.segmented_sum`, applied on the host (``"drop"`` slices ``x``).
    method : {"auto", "blockwise", "carry", "rechunk"}, default "auto"
        How chunks meet segments: ``"blockwise"`` needs every chunk edge along ``axis`` to
        be a segment edge; ``"carry"`` combines the pieces of cut segments in a second,
        shallow step; ``"rechunk"`` moves the chunk edges to segment edges first;
        ``"auto"`` is ``"blockwise"`` where it applies, else ``"carry"`` (``"rechunk"`` for
        datetime64/timedelta64 data).

    Returns
    -------
    dask.array.Array
        Shape ``x.shape[:axis] + (m,) + x.shape[axis+1:]``; along ``axis``, one chunk per
        chunk of ``x`` (of the rechunked ``x`` for ``"rechunk"``) holding the segments that
        start in it.

    Raises
    ------
    TypeError, ValueError
        For bad arguments, as the functions raise them; ``ValueError`` for
        ``method="blockwise"`` where a chunk edge cuts a segment.

    See Also
    --------
    linred.segmented_sum : The same reductions of NumPy, CuPy, PyTorch and JAX arrays.

    Notes
    -----
    Results equal the single-array call's up to the order of additions: ``"blockwise"`` and
    ``"rechunk"`` make the same calls on smaller arrays (bit for bit the same for offsets over
    1-D host data, max, min and integers; BLAS may block a fixed-length float sum of fewer rows
    differently, within linred's accuracy bound); ``"carry"`` adds a cut segment's pieces
    (in float32 for float16 and bfloat16 data, in float64 for a mean of integers).

    Examples
    --------
    >>> import numpy as np
    >>> import dask.array as da
    >>> import linred.dask
    >>> x = da.from_array(np.arange(1.0, 13.0), chunks=5)
    >>> y = linred.dask.segmented_reduce("sum", x, offsets=[0, 2, 7, 7, 12])
    >>> y.chunks, y.compute()
    (((2, 2, 0),), array([ 3., 25.,  0., 50.]))
    >>> linred.dask.segmented_reduce("max", x, 4, method="rechunk").compute()
    array([ 4.,  8., 12.])
    """

    if not is_dask(x):
        raise TypeError(f"x must be a dask.array.Array; got {type(x).__module__}.{type(x).__name__}")
    if reduction not in (*_PARTIAL, *_ARG) or not hasattr(linred, f"segmented_{reduction}"):
        raise ValueError(f"reduction must be one of {', '.join(map(repr, (*_PARTIAL, *_ARG)))}; got {reduction!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {method!r}")
    if reduction in _ARG and dtype is not None:
        raise TypeError(f"dtype cannot be given for segmented_{reduction} (its result is int64 positions)")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension; got a 0-d array")
    axis, chunk_meta = _checked_input(x, axis, backend, check)
    out_dtype = _probe(reduction, x, dtype)
    x, segs = _segments(x, axis, segment_length, offsets, lengths, remainder)
    meta = _meta_like(chunk_meta, x.ndim, dtype=out_dtype)
    time = x.dtype.kind in "mM"
    bounds = np.cumsum((0, *x.chunks[axis]), dtype=np.int64)
    aligned = bool(segs.is_boundary(bounds[1:-1]).all())
    if method == "auto":
        method = "blockwise" if aligned else "rechunk" if time else "carry"
    if method == "blockwise" and not aligned:
        at = int(bounds[1:-1][~segs.is_boundary(bounds[1:-1])][0])
        raise ValueError(f"method='blockwise' needs every chunk edge along axis {axis} to be a segment edge; the edge "
                         f"at {at} cuts a segment (use method='carry' or 'rechunk')")  # fmt: skip
    if method == "carry" and time:
        raise TypeError(f"method='carry' does not take {x.dtype} data; use method='rechunk' or 'blockwise'")
    if method == "rechunk":
        x = _rechunked(x, axis, segs)
        method = "blockwise"
    if method == "blockwise":
        return _build_blockwise(reduction, x, axis, segs, dtype, backend, meta)
    return _build_carry(reduction, x, axis, segs, dtype, backend, meta, out_dtype)


def ids_offsets(x: Any, segment_ids: Any, num_segments: int | None,
                axis: Any) -> tuple[np.ndarray, Any, np.ndarray]:  # fmt: skip
    """The offsets that ``segment_ids`` (one id per element along ``axis`` of Dask array ``x``,
    read on the host as offsets are) name once the elements are in the ids' order, and that
    order: ``num_segments`` segments (default: the largest id + 1), id ``k`` the elements of
    segment ``k``; the order is None for sorted ids (the elements are in it already), else the
    stable sort of the ids (:func:`by_ids_order` moves the elements).  Ids outside
    ``[0, num_segments)`` are refused, also with ``check=False``: the graph is built from them.
    (``ids_sorted`` is not needed: the ids are read.)  Also the ids as read, int64 on the host."""
    ax = normalize_axis(axis, x.ndim)
    n = x.shape[ax]
    if math.isnan(n):
        raise ValueError(f"x has unknown chunk sizes along axis {ax}; call x.compute_chunk_sizes() first")
    from linred.arrays import NUMPY

    # (converted and refused as NumPy data's ids are: an empty list as int64, a list of Python
    # integers or an object array of them as int64, uint64 past int64 by value, floats refused)
    ids = NUMPY.index_array(_host_index(segment_ids, "segment_ids"), None, "segment_ids")
    if ids.ndim != 1:
        raise ValueError(f"segment_ids must be 1-D (one id per element along axis); got shape {ids.shape}")
    if ids.shape[0] != n:
        raise ValueError(f"segment_ids must have one id per element along axis {axis} ({n}); got {ids.shape[0]}")
    given = ids = ids.astype(np.int64, copy=False)
    order = None
    if n and bool((ids[1:] < ids[:-1]).any()):
        order = np.argsort(ids, kind="stable")  # (stable: a segment keeps its elements' order)
        ids = ids[order]
    # (inferred as the eager call infers it: one past the largest id, at least 0)
    ns = max(int(ids[-1]) + 1 if n else 0, 0) if num_segments is None else num_segments
    if n and (ids[0] < 0 or ids[-1] >= ns):
        from linred._segment_ids import outside_error

        raise outside_error(given, ns)  # (the first in the caller's order)
    return np.searchsorted(ids, np.arange(ns + 1, dtype=np.int64), side="left").astype(np.int64), order, given


#: the reductions of unsorted ids that map-reduce serves: each chunk's results by segment
#: combine into the segments' results (a sum of sums, a max of maxima; a mean from the sums and
#: the counts the ids give on the host)
_MAP_REDUCE = {"sum": "sum", "mean": "sum", "max": "max", "min": "min", "prod": "prod"}
#: map-reduce where each chunk's results by segment, ``num_segments`` of them, are at most this
#: share of the chunk (on average): the results of all chunks are then at most as large as the data
MAP_REDUCE_MAX_SHARE = 1.0


def map_reduce_by_ids(reduction: str, x: Any, ids: np.ndarray, ns: int, axis: int, dtype: Any,
                      backend: Any, check: Any) -> Any | None:  # fmt: skip
    """The reduction of ``x`` by unsorted ids as flox's "map-reduce": each chunk reduced by its
    own ids into all ``ns`` segments, where no element moves; the chunks' results then combined by
    Dask's tree reduction (each chunk's part of a float32 or complex64 result in float64 or
    complex128, of a 16-bit one in float32, rounded once at the end: a part never overflows or
    underflows where the segment's result does not, so a float32 product of 1e-30s and 1e30s is
    their float64 product's rounding, where the single call's float32 running product may
    underflow first; argmax and argmin of NumPy chunks
    from pairs of values and positions, :func:`_arg_map_reduce`).  None where it does not apply:
    a reduction whose results do not combine that way (the composed functions, complex products),
    time data, or where ``ns`` segments a chunk would outweigh the chunk
    (:data:`MAP_REDUCE_MAX_SHARE`; the elements are moved into the ids' order then,
    :func:`by_ids_order`)."""
    if np.dtype(x.dtype).kind in "mM" or x.ndim == 0:  # (time data: its own rules, as the sorted path keeps them)
        return None
    if reduction not in _MAP_REDUCE and reduction not in _ARG:
        return None
    if reduction == "prod" and (np.dtype(x.dtype).kind == "c" or _complex(dtype)):
        # (a complex product of the chunks' parts: a chunk without the segment's elements gives
        # 1 + 0j, and (inf + 0j)(1 + 0j) is inf + nanj, where the segment's own product is not)
        return None
    ax, meta = _checked_input(x, axis, backend, check)  # (the functions' errors, when the graph is built)
    n = x.shape[ax]
    if not n or ns * len(x.chunks[ax]) > MAP_REDUCE_MAX_SHARE * n:
        return None
    if reduction in _ARG:
        return _arg_map_reduce(reduction, x, ids, ns, ax, meta, backend)
    import dask.array as da

    partial = _MAP_REDUCE[reduction]
    final = _probe(reduction, x, dtype)
    if partial in ("max", "min"):
        if final != np.dtype(x.dtype):
            # (a dtype= cast: a chunk's part in that dtype can overflow where the segment's extreme
            # does not, and the empty segment's identity and the cast's warnings are the result
            # dtype's: the elements move, the single call's rules then hold)
            return None
        part, request = final, None
    else:
        # Each chunk's part wider than the result (a mean's sums too: float64 for integers):
        # float64 for float32, complex128 for complex64, float32 for 16-bit results, rounded
        # once at the end, so that a part that would overflow or underflow in the result's dtype
        # (a float32 product of 1e-30s, one of 1e30s) does not make the combination inf - inf
        # or 0 * inf where the segment's own result is finite.
        request = _WIDER.get(f"{final.kind}{final.itemsize}", final)
        part = _probe(partial, x, request)
    # (max and min of 16-bit parts in float32, exactly: ml_dtypes' bfloat16 warns of NaN in a reduce)
    wide = _WIDER.get(f"{part.kind}{part.itemsize}", part)
    xp = _xp(meta)
    parts = _chunk_parts(_ids_part_task, x, ids, ns, ax, part, xp.empty((0,) * (x.ndim + 1), dtype=part),
                         f"linred-{reduction}-by-ids", reduction=partial, dtype_=request, backend=backend)  # fmt: skip
    parts = parts.astype(wide)
    # Dask's tree reduction of the parts, quiet (NumPy's warnings would name its reduce), and
    # whether any of each segment's parts is infinite, or NaN: an infinity or NaN that the
    # combination makes warns as linred's reductions warn (a part's own warned in its task).
    quiet = functools.partial(_quiet_reduce, op=partial, dtype=wide if partial in ("sum", "prod") else None)
    total = da.reduction(parts, quiet, quiet, axis=ax, combine=quiet, dtype=wide, name=f"linred-{reduction}-combine",
                         meta=xp.empty((0,) * x.ndim, dtype=wide))  # fmt: skip
    given = None
    if wide.kind in "fc" and partial in ("sum", "prod"):
        given = (da.isinf(parts).any(axis=ax), da.isnan(parts).any(axis=ax))
    counts = None
    if reduction == "mean":  # the sums divided by the counts the ids give (0 / 0: NaN, as linred's)
        shape = [1] * x.ndim
        shape[ax] = ns
        counts = np.bincount(ids, minlength=ns).astype(np.float64).reshape(shape)
    out_meta = xp.empty((0,) * x.ndim, dtype=final)
    if given is None:
        return total.map_blocks(_finish_task, counts=counts, final=final, dtype=final, meta=out_meta)
    return da.map_blocks(_finish_task, total, *given, counts=counts, final=final, dtype=final, meta=out_meta)


def _chunk_parts(task: Any, x: Any, ids: np.ndarray, ns: int, ax: int, dtype: Any, meta: Any, token: str,
                 *more: Any, **kwargs: Any) -> Any:  # fmt: skip
    """``task(block, ids_block, *more_blocks, axis=ax, ns=ns, **kwargs)`` for every chunk of ``x``,
    each chunk's ``ns`` results by segment along a new axis after one of the chunks along ``ax``
    (``more``: 1-D arrays of one block per chunk along ``ax``)."""
    import dask.array as da

    index = _LETTERS[: x.ndim]
    out_index = index[:ax] + index[ax] + "Z" + index[ax + 1 :]  # ("Z": the segments, after the chunks)
    blocks = [da.from_array(ids, chunks=(x.chunks[ax],)), *more]
    args = [a for block in blocks for a in (block, index[ax])]
    return da.blockwise(task, out_index, x, index, *args, new_axes={"Z": ns}, adjust_chunks={index[ax]: 1},
                        align_arrays=False, dtype=dtype, meta=meta, token=token, axis=ax, ns=ns, **kwargs)  # fmt: skip


def _arg_map_reduce(reduction: str, x: Any, ids: np.ndarray, ns: int, ax: int, meta: Any, backend: Any) -> Any | None:
    """:func:`map_reduce_by_ids` for argmax and argmin of NumPy chunks: each chunk's positions by
    segment (in the caller's order: no element moves) with their values, the chunks' pairs then
    combined by Dask's tree reduction, the earlier chunk's kept on a tie or where both are NaN (the
    first occurrence, and the first NaN, as the single call's rule).  (CuPy chunks, whose arrays
    have no structured dtype, move the elements.)"""
    if type(meta) is not np.ndarray:
        return None
    import dask.array as da

    _probe(reduction, x, None)  # (the functions' errors: complex data has no order)
    pair = _pairs(x.dtype)
    starts = np.cumsum((0, *x.chunks[ax][:-1]), dtype=np.int64)
    parts = _chunk_parts(_ids_arg_part_task, x, ids, ns, ax, pair, np.empty((0,) * (x.ndim + 1), dtype=pair),
                         f"linred-{reduction}-by-ids", da.from_array(starts, chunks=1), reduction=reduction,
                         n=x.shape[ax], backend=backend)  # fmt: skip
    pick = functools.partial(_pick_pairs, largest=reduction == "argmax")
    best = da.reduction(parts, _same_pairs, pick, axis=ax, combine=pick, dtype=pair, name=f"linred-{reduction}-combine",
                        meta=np.empty((0,) * x.ndim, dtype=pair))  # fmt: skip
    return best.map_blocks(_positions_of, dtype=np.int64, meta=np.empty((0,) * x.ndim, dtype=np.int64))


def _pairs(dtype: Any) -> np.dtype:
    """A chunk's argmax (argmin) of one segment: its value, its position in the caller's data, and
    whether the chunk holds any of the segment."""
    return np.dtype([("value", dtype), ("position", np.int64), ("some", np.bool_)])


def _ids_arg_part_task(block: np.ndarray, ids: np.ndarray, start: np.ndarray, *, reduction: str, axis: int, ns: int,
                       n: int, backend: Any) -> np.ndarray:  # fmt: skip
    """One chunk's argmax (argmin) by its own ids (:func:`_pairs`; the position ``n`` where the
    chunk holds none of the segment)."""
    function = getattr(linred, f"segmented_{reduction}")
    size = block.shape[axis]
    with _one_thread():
        where = function(block, segment_ids=ids, num_segments=ns, axis=axis, check=False, backend=backend)
    some = where < size
    pairs = np.empty(where.shape, dtype=_pairs(block.dtype))
    pairs["value"] = np.take_along_axis(block, np.minimum(where, size - 1), axis) if size else 0
    pairs["position"] = np.where(some, where + int(start[0]), n)
    pairs["some"] = some
    return np.expand_dims(pairs, axis)


def _same_pairs(pairs: np.ndarray, axis: Any = None, keepdims: bool = False, **kwargs: Any) -> np.ndarray:
    """Dask ``reduction``'s step on one chunk's pairs: they are that chunk's result already."""
    if _for_meta(pairs, axis, kwargs):
        return _empty_meta(np, pairs, keepdims, pairs.dtype)
    return pairs if keepdims else np.squeeze(pairs, axis=axis)


def _pick_pairs(pairs: np.ndarray, axis: Any = None, keepdims: bool = False, *, largest: bool,
                **kwargs: Any) -> np.ndarray:  # fmt: skip
    """Of the pairs along ``axis`` (chunks in order), the one whose value is the largest (the
    smallest) among those with ``some``; a NaN beats any number; the earlier one on a tie or
    where both are NaN."""
    ax = axis[0] if isinstance(axis, tuple) else axis
    moved = np.moveaxis(pairs, ax, 0)
    if _for_meta(pairs, axis, kwargs):  # (Dask's meta: no pairs)
        return _empty_meta(np, pairs, keepdims, pairs.dtype)
    best = moved[0].copy()
    kind = pairs.dtype["value"].kind
    with np.errstate(invalid="ignore"):
        for cand in moved[1:]:
            a, b = cand["value"], best["value"]
            beats = (a > b) if largest else (a < b)
            if kind in "fV":  # (ml_dtypes' bfloat16, kind "V", asked in float32: exact)
                a_nan, b_nan = (np.isnan(v if kind == "f" else v.astype(np.float32)) for v in (a, b))
                beats = (beats & ~b_nan) | (a_nan & ~b_nan)
            better = cand["some"] & (~best["some"] | beats)
            best = np.where(better, cand, best)
    return np.expand_dims(best, ax) if keepdims else best


def _positions_of(pairs: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(pairs["position"])


def _quiet_reduce(a: Any, axis: Any = None, keepdims: bool = False, *, op: str, dtype: Any = None,
                  **kwargs: Any) -> Any:  # fmt: skip
    """``op`` (sum, prod, max or min) of a block of parts along ``axis``, without NumPy's
    floating-point warnings (Dask's ``reduction`` calls it as chunk, combine and aggregate)."""
    xp = _xp(a)
    if _for_meta(a, axis, kwargs):  # (the array-expression mode's meta: an empty array of any shape)
        return _empty_meta(xp, a, keepdims, dtype or a.dtype)
    extra = {} if dtype is None else {"dtype": dtype}
    with np.errstate(all="ignore"):
        return getattr(xp, op)(a, axis=axis, keepdims=keepdims, **extra)


def _for_meta(a: Any, axis: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a reduction step of the chunks' parts is Dask computing its meta: asked so, or given
    no part along the reduced axis (every chunk gives one; a meta array has none)."""
    axes = axis if isinstance(axis, tuple) else (() if axis is None else (axis,))
    return bool(kwargs.get("computing_meta")) or any(a.shape[i] == 0 for i in axes)


def _empty_meta(xp: Any, a: Any, keepdims: bool, dtype: Any) -> Any:
    """A reduction step's meta in Dask's array-expression mode: an empty array (size 0, at least one
    dimension), which Dask reshapes to the step's dimensions (a 0-d reduction of an empty block has
    one element, which it cannot)."""
    return xp.empty((0,) * max(a.ndim - (0 if keepdims else 1), 1), dtype=dtype)


def _finish_task(total: Any, had_inf: Any = None, had_nan: Any = None, *, counts: np.ndarray | None,
                 final: np.dtype) -> Any:  # fmt: skip
    """The combined parts as the result: divided by the segments' counts for a mean (an empty
    segment's NaN without a warning, as linred's), in the result's dtype.  Where a segment's
    result is infinite and none of its parts was (an overflow, of the combination or of the cast),
    or NaN and none of its parts was (``inf - inf`` of two chunks' parts), the warning linred's
    reductions give."""
    xp = _xp(total)
    if xp is not np:
        if counts is not None:
            total = _divided(xp, total, xp.asarray(counts))
        return total.astype(final)
    with np.errstate(all="ignore"):
        if counts is not None:
            total = _divided(np, total, counts)
        result = total.astype(final)
    if had_inf is not None and result.dtype.kind in "fc":
        some = True if counts is None else counts > 0  # (an empty segment's NaN: no warning)
        for kind, test, had in (("overflow", np.isinf, had_inf), ("invalid value", np.isnan, had_nan)):
            if (test(result) & ~had & some).any():
                warnings.warn(f"{kind} encountered in a segmented reduction", RuntimeWarning, stacklevel=2)
    return result


def _complex(dtype: Any) -> bool:
    """Whether a ``dtype=`` argument names a complex dtype (None and names NumPy lacks: no)."""
    try:
        return dtype is not None and np.dtype(dtype).kind == "c"
    except TypeError:
        return False


def _meta_like(meta: Any, ndim: int, *, dtype: Any) -> Any:
    """Dask's ``meta_from_array`` of an empty ``meta``, quiet: a complex meta cast to a real dtype
    (var and std of complex chunks) loses nothing, but NumPy warns that it would."""
    from dask.array.utils import meta_from_array

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        return meta_from_array(meta, ndim, dtype=dtype)


#: the dtype of the chunks' parts (or their combination) for a result of the key's kind and size
_WIDER = {"f4": np.dtype(np.float64), "c8": np.dtype(np.complex128), "f2": np.dtype(np.float32),
          "V2": np.dtype(np.float32)}  # fmt: skip


def _divided(xp: Any, total: Any, counts: Any) -> Any:
    """``total / counts``, a complex total part by part (a complex division by ``count + 0j``
    would make ``inf + 0j`` NaN)."""
    if total.dtype.kind != "c":
        return total / counts
    result = xp.empty(np.broadcast_shapes(total.shape, counts.shape), dtype=total.dtype)
    result.real = total.real / counts
    # (an empty segment's mean is nan + 0j, as linred's: its imaginary part is not 0 / 0)
    result.imag = xp.where(counts > 0, total.imag / xp.where(counts > 0, counts, 1), 0)
    return result


def _ids_part_task(block: Any, ids: np.ndarray, *, reduction: str, axis: int, ns: int, dtype_: Any,
                   backend: Any) -> Any:  # fmt: skip
    """One chunk reduced by its own ids (checked on the host) into all ``ns`` segments, with a new
    axis of one chunk before the segments' axis."""
    function = getattr(linred, f"segmented_{reduction}")
    with _one_thread():
        part = function(block, segment_ids=ids, num_segments=ns, axis=axis, check=False, dtype=dtype_,
                        backend=backend)  # fmt: skip
    return _xp(part).expand_dims(part, axis)


def by_ids_order(x: Any, order: np.ndarray, axis: int) -> Any:
    """Dask array ``x`` with its elements along ``axis`` moved into ``order``: Dask's gather
    (``x[order]``), or in the array-expression mode, which cannot index by an integer array in
    Dask 2026.8 ("'Shuffle' object has no attribute '_token'"), :func:`_gather`."""
    ax = normalize_axis(axis, x.ndim)
    if 0 in x.chunks[ax] and x.shape[ax]:
        # (Dask's gather sizes its output chunks by the mean input chunk, which empty chunks
        # can make 0: "range() arg 3 must not be zero"; the same data without them)
        x = x.rechunk({ax: tuple(c for c in x.chunks[ax] if c)})
    if type(x).__module__.startswith("dask.array._array_expr"):
        return _gather(x, order, ax)
    return x[_index(ax, order)]


def _gather(x: Any, order: np.ndarray, ax: int) -> Any:
    """``x[order]`` along ``ax`` (no empty chunks) from plain slices and ``map_blocks``, in chunks of
    the sizes of ``x``'s: each output chunk takes, from each input chunk it reads, the elements it
    needs (one task a pair), joined and put in order by one more task (about twice the time of
    Dask's own gather, 2M x 4 float64 in 50 chunks: 2.5 s against 1.0)."""
    import dask.array as da

    sizes = x.chunks[ax]
    if not len(order):
        return x
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    source = np.searchsorted(bounds, order, side="right") - 1  # the input chunk of each position
    outputs = []
    for start, stop in itertools.pairwise(bounds.tolist()):
        wanted, chunk = order[start:stop], source[start:stop]
        by_chunk = np.argsort(chunk, kind="stable")  # the output chunk's positions grouped by input chunk
        parts = []
        for k in np.unique(chunk):
            local = wanted[chunk == k] - bounds[k]
            block = x[_index(ax, slice(int(bounds[k]), int(bounds[k + 1])))]  # (input chunk k: a plain slice)
            parts.append(block.map_blocks(_take_task, local, ax, chunks=_with(block.chunks, ax, len(local)),
                                          dtype=x.dtype, meta=x._meta))  # fmt: skip
        joined = parts[0] if len(parts) == 1 else da.concatenate(parts, axis=ax).rechunk({ax: -1})
        back = np.argsort(by_chunk, kind="stable")  # where each output position lies in `joined`
        if (back != np.arange(len(back))).any():
            joined = joined.map_blocks(_take_task, back, ax, dtype=x.dtype, meta=x._meta)
        outputs.append(joined)
    return outputs[0] if len(outputs) == 1 else da.concatenate(outputs, axis=ax)


def _with(chunks: tuple[tuple[int, ...], ...], axis: int, size: int) -> tuple[tuple[int, ...], ...]:
    """``chunks`` with one chunk of ``size`` along ``axis``."""
    return (*chunks[:axis], (size,), *chunks[axis + 1 :])


def _take_task(block: Any, index: np.ndarray, axis: int) -> Any:
    """The elements ``index`` (NumPy integers) of ``block`` along ``axis``, on the block's device."""
    xp = _xp(block)
    return xp.take(block, index if xp is np else xp.asarray(index), axis=axis)


def positions_back(result: Any, order: np.ndarray, n: int) -> Any:
    """Positions along the axis of the data moved into ``order`` (:func:`by_ids_order`), as the
    arg-reductions return them, made positions into the caller's data (``n``, an empty
    segment's, stays ``n``): block by block, the order one node of the graph (on the chunks'
    device).  The sort is stable, so the first of equal values in the moved data is the first
    in the caller's: the tie rule holds."""
    if n == 0:
        return result
    import dask.array as da

    xp = _xp(result._meta)
    if any(0 in sizes for sizes in result.chunks):
        # Empty chunks dropped first: Dask's blockwise with an index of the order's own (below)
        # gives an empty chunk of another axis a whole block's values (dask 2026.8: a (1, 2)
        # result chunked ((1, 0), (1, 1)) came back (2, 2), its row twice).
        result = result.rechunk(tuple(tuple(size for size in sizes if size) or (0,) for sizes in result.chunks))
    # The order as one chunk of the graph that every task reads (an index of its own, "z", which
    # the result lacks: each task gets the whole of it); also in the array-expression mode,
    # which has no place for a delayed argument ("Missing dependency").
    table = da.from_array(order if xp is np else xp.asarray(order), chunks=-1)
    ind = "".join(chr(ord("a") + i) for i in range(result.ndim))
    return da.blockwise(_positions_back_task, ind, result, ind, table, "z", n=n, concatenate=True,
                        dtype=result.dtype, meta=result._meta)  # fmt: skip


def _positions_back_task(block: Any, table: Any, *, n: int) -> Any:
    xp = _xp(block)
    return xp.where(block < n, table[xp.minimum(block, n - 1)], block)


def composed(name: str, x: Any, segments: dict[str, Any], axis: Any, dtype: Any, backend: Any, stream: Any,
             check: Any, remainder: Any, **options: Any) -> dask.array.Array:  # fmt: skip
    """``linred.segmented_<name>`` of a Dask array for the composed functions (logsumexp, softmax,
    log_softmax, var, std): the chunk edges along ``axis`` moved to segment edges (as
    ``method="rechunk"``), then each chunk computed by linred's function; lazy, of ``x``'s chunk
    type.  ``segments`` are the call's segment keywords; ``options`` the function's own (``ddof``)."""

    if stream is not None:
        raise TypeError("stream cannot be given for Dask arrays (each chunk's call runs on its array library's "
                        "current stream)")  # fmt: skip
    if x.ndim == 0:
        raise ValueError(f"segmented_{name}: x must have at least one dimension; got a 0-d array")
    if segments.get("segment_ids") is not None or segments.get("num_segments") is not None:
        from linred._segment_ids import ids_arguments

        others = [k for k in ("segment_length", "offsets", "lengths") if segments.get(k) is not None]
        ns = ids_arguments(segments.get("segment_ids"), segments.get("num_segments"), segments.get("ids_sorted"),
                           others)  # fmt: skip
        offsets, order, _ = ids_offsets(x, segments["segment_ids"], ns, axis)
        segments = {"offsets": offsets}
    else:
        order = None
    axis, chunk_meta = _checked_input(x, axis, backend, check)
    if order is not None:  # unsorted ids: the data moved into their order (the result moved back below)
        x = by_ids_order(x, order, axis)
    sample = getattr(linred, f"segmented_{name}")(np.zeros(1, dtype=x.dtype), 1, dtype=dtype, **options)
    x, segs = _segments(x, axis, segments.get("segment_length"), segments.get("offsets"), segments.get("lengths"),
                        remainder)  # fmt: skip
    meta = _meta_like(chunk_meta, x.ndim, dtype=sample.dtype)
    x = _rechunked(x, axis, segs)  # every segment whole in one chunk: the functions read a segment at once
    result = _build_blockwise(name, x, axis, segs, dtype, backend, meta, **options)
    if order is not None and name in _PER_ELEMENT:
        result = by_ids_order(result, np.argsort(order), axis)
    return result


def _from_function(reduction: str, x: Any, segment_length: Any, offsets: Any, lengths: Any, axis: Any, dtype: Any,
                   out: Any, backend: Any, stream: Any, check: Any, remainder: Any) -> Any:  # fmt: skip
    """``linred.segmented_<reduction>`` of a Dask array (see :mod:`linred._functions`)."""
    given = [name for name, v in (("out", out), ("stream", stream)) if v is not None]
    if given:
        raise TypeError(f"{' and '.join(given)} cannot be given for Dask arrays (the result is a new lazy Dask "
                        "array; each chunk's call runs on its array library's current stream)")  # fmt: skip
    return segmented_reduce(reduction, x, segment_length, offsets=offsets, lengths=lengths, axis=axis, dtype=dtype,
                            backend=backend, check=check, remainder=remainder)  # fmt: skip


_WRAPPER_DOC = """{summary}

:func:`segmented_reduce` with ``reduction="{reduction}"``; ``linred.segmented_{reduction}`` of a
Dask array calls it with ``method="auto"``.

Parameters
----------
x : dask.array.Array
    The data, of NumPy or CuPy chunks.
segment_length : int, optional
    Fixed segment length.
offsets : array_like of int, optional
    Segment offsets (read on the host when the graph is built).
lengths : array_like of int, optional
    Segment lengths (read on the host when the graph is built).
axis : int, default 0
    The axis the segments run along.
{dtype}backend : str, default "auto"
    The backend of every chunk's call.
check : bool, default True
    Must be a bool; the segments are always checked on the host.
remainder : {{"error", "drop", "keep"}}, default "error"
    For a ``segment_length`` that does not divide the axis.
method : {{"auto", "blockwise", "carry", "rechunk"}}, default "auto"
    See :func:`segmented_reduce`.

Returns
-------
dask.array.Array
    The lazy result, of ``x``'s chunk type.

See Also
--------
segmented_reduce : The reductions, with how chunks meet segments.

Examples
--------
>>> import numpy as np
>>> import dask.array as da
>>> import linred.dask
>>> x = da.from_array(np.arange(1.0, 13.0), chunks=5)
>>> linred.dask.segmented_{reduction}(x, offsets=[0, 3, 3, 12]).compute()
{example}
"""

_DTYPE_DOC = "dtype : dtype, optional\n    Accumulation and result dtype.\n"


def segmented_sum(x: dask.array.Array, segment_length: int | None = None, *, offsets: Any = None,
                  lengths: Any = None, axis: int = 0, dtype: Any = None, backend: str = "auto",
                  check: bool = True, remainder: str = "error", method: str = "auto") -> dask.array.Array:  # fmt: skip
    return segmented_reduce("sum", x, segment_length, offsets=offsets, lengths=lengths, axis=axis, dtype=dtype,
                            backend=backend, check=check, remainder=remainder, method=method)  # fmt: skip


def segmented_mean(x: dask.array.Array, segment_length: int | None = None, *, offsets: Any = None,
                   lengths: Any = None, axis: int = 0, dtype: Any = None, backend: str = "auto",
                   check: bool = True, remainder: str = "error", method: str = "auto") -> dask.array.Array:  # fmt: skip
    return segmented_reduce("mean", x, segment_length, offsets=offsets, lengths=lengths, axis=axis, dtype=dtype,
                            backend=backend, check=check, remainder=remainder, method=method)  # fmt: skip


def segmented_max(x: dask.array.Array, segment_length: int | None = None, *, offsets: Any = None,
                  lengths: Any = None, axis: int = 0, dtype: Any = None, backend: str = "auto",
                  check: bool = True, remainder: str = "error", method: str = "auto") -> dask.array.Array:  # fmt: skip
    return segmented_reduce("max", x, segment_length, offsets=offsets, lengths=lengths, axis=axis, dtype=dtype,
                            backend=backend, check=check, remainder=remainder, method=method)  # fmt: skip


def segmented_min(x: dask.array.Array, segment_length: int | None = None, *, offsets: Any = None,
                  lengths: Any = None, axis: int = 0, dtype: Any = None, backend: str = "auto",
                  check: bool = True, remainder: str = "error", method: str = "auto") -> dask.array.Array:  # fmt: skip
    return segmented_reduce("min", x, segment_length, offsets=offsets, lengths=lengths, axis=axis, dtype=dtype,
                            backend=backend, check=check, remainder=remainder, method=method)  # fmt: skip


def segmented_prod(x: dask.array.Array, segment_length: int | None = None, *, offsets: Any = None,
                   lengths: Any = None, axis: int = 0, dtype: Any = None, backend: str = "auto",
                   check: bool = True, remainder: str = "error", method: str = "auto") -> dask.array.Array:  # fmt: skip
    return segmented_reduce("prod", x, segment_length, offsets=offsets, lengths=lengths, axis=axis, dtype=dtype,
                            backend=backend, check=check, remainder=remainder, method=method)  # fmt: skip


def segmented_argmax(x: dask.array.Array, segment_length: int | None = None, *, offsets: Any = None,
                     lengths: Any = None, axis: int = 0, backend: str = "auto", check: bool = True,
                     remainder: str = "error", method: str = "auto") -> dask.array.Array:  # fmt: skip
    return segmented_reduce("argmax", x, segment_length, offsets=offsets, lengths=lengths, axis=axis,
                            backend=backend, check=check, remainder=remainder, method=method)  # fmt: skip


def segmented_argmin(x: dask.array.Array, segment_length: int | None = None, *, offsets: Any = None,
                     lengths: Any = None, axis: int = 0, backend: str = "auto", check: bool = True,
                     remainder: str = "error", method: str = "auto") -> dask.array.Array:  # fmt: skip
    return segmented_reduce("argmin", x, segment_length, offsets=offsets, lengths=lengths, axis=axis,
                            backend=backend, check=check, remainder=remainder, method=method)  # fmt: skip


for _function, _summary, _example in (
    (segmented_sum, "Sum of each segment of a Dask array, lazily.", "array([ 6.,  0., 72.])"),
    (segmented_mean, "Mean of each segment of a Dask array, lazily.", "array([ 2., nan,  8.])"),
    (segmented_max, "Maximum of each segment of a Dask array, lazily.", "array([  3., -inf,  12.])"),
    (segmented_min, "Minimum of each segment of a Dask array, lazily.", "array([ 1., inf,  4.])"),
    (
        segmented_prod,
        "Product of each segment of a Dask array, lazily.",
        "array([6.00000e+00, 1.00000e+00, 7.98336e+07])",
    ),
    (segmented_argmax, "Index of the maximum of each segment of a Dask array, lazily.", "array([ 2, 12, 11])"),
    (segmented_argmin, "Index of the minimum of each segment of a Dask array, lazily.", "array([ 0, 12,  3])"),
):
    _reduction = _function.__name__.removeprefix("segmented_")
    _function.__doc__ = _WRAPPER_DOC.format(summary=_summary, reduction=_reduction, example=_example,
                                            dtype="" if _reduction in _ARG else _DTYPE_DOC)  # fmt: skip
del _function, _summary, _example, _reduction
