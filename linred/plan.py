"""Plans: a segmented reduction prepared once and run on many arrays.

:class:`SegmentedReduction` is the stateful, user-facing plan, in the manner of
nvmath-python's ``Matmul``.  The functions (``linred.segmented_sum`` and
friends) prepare the same way and keep their plans in a bounded, thread-safe
cache, so repeated calls on same-shaped data do not plan again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from linred._dtypes import REDUCTIONS, dtype_name, identity, resolve
from linred.arrays import ArrayAdapter, as_array, fast_keys, refusal
from linred.backends import check_backend_name
from linred.backends.base import Executor
from linred.backends.select import select
from linred.problem import Problem
from linred.segments import FixedSegments, Segments, VariableSegments, parse_segments

__all__ = ["SegmentedReduction", "clear_plan_cache", "plan_cache_info", "set_plan_cache_size"]

logger = logging.getLogger("linred")


def _normalize_axis(axis: Any, ndim: int) -> int:
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"axis must be an integer; got {type(axis).__name__} {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim


@dataclass(slots=True)
class _Call:
    """A call's inputs, validated and reduced to a :class:`Problem`."""

    problem: Problem
    backend: str
    adapter: ArrayAdapter
    x3: Any
    segments: Segments
    out_shape: tuple[int, ...]
    stream: Any = None  #: the resolved stream handle (None on the host)


def _prepare(
    reduction: str,
    x: Any,
    segment_length: Any,
    offsets: Any,
    lengths: Any,
    axis: Any,
    dtype: Any,
    backend: Any,
    check: bool,
    stream: Any = None,
) -> _Call:
    x, adapter = as_array(x)
    x = adapter.prepare(x)
    try:
        info = adapter.info(x)
    except TypeError as e:
        raise TypeError(f"x has an unsupported dtype: {e}") from None
    ndim = len(info.shape)
    if ndim == 0:
        raise ValueError("x must have at least one dimension; got a 0-d array")
    axis = _normalize_axis(axis, ndim)
    backend = check_backend_name(backend)
    if not isinstance(check, bool):
        raise TypeError(f"check must be True or False; got {type(check).__name__} {check!r}")
    n = info.shape[axis]
    handle = adapter.resolve_stream(stream, info.device)
    # Offsets are moved, checked and derived on the call's stream, ordered with the
    # work that produced them there and with the reduction that reads them.
    with adapter.on_stream(handle, info.device):
        segments = parse_segments(
            segment_length, offsets, lengths, n=n, axis=axis, adapter=adapter, device=info.device, check=check
        )
    acc, out_dtype = resolve(reduction, info.dtype, None if dtype is None else dtype_name(dtype))
    batch = math.prod(info.shape[:axis])
    features = math.prod(info.shape[axis + 1 :])
    x3 = adapter.reshape(x, (batch, n, features))
    m = segments.count
    problem = Problem(
        reduction=reduction,
        kind=adapter.kind,
        device=info.device,
        dtype=info.dtype,
        acc_dtype=acc,
        out_dtype=out_dtype,
        batch=batch,
        n=n,
        features=features,
        strides=adapter.info(x3).strides,
        num_segments=m,
        segment_length=segments.length if isinstance(segments, FixedSegments) else None,
        offsets_dtype=None if isinstance(segments, FixedSegments) else segments.key[2],
        plain=info.plain,
    )
    out_shape = (*info.shape[:axis], m, *info.shape[axis + 1 :])
    return _Call(problem, backend, adapter, x3, segments, out_shape, handle)


def _check_out(out: Any, call: _Call) -> bool:
    """Validate ``out``; return whether the result can be written into it directly.

    It cannot when it overlaps ``x`` (or the offsets), whose elements the reduction
    still has to read, or when its memory is not plain (byte-swapped or unaligned):
    the result is then computed into a new array and copied into ``out``.
    """
    adapter = call.adapter
    problem = call.problem
    if type(out).__module__.split(".")[0] != adapter.kind or not hasattr(out, "shape"):
        raise TypeError(f"out must be a {adapter.type_name} like x; got {type(out).__module__}.{type(out).__name__}")
    reason = refusal(out, "out")
    if reason is not None:
        raise TypeError(reason)
    info = adapter.info(out)
    if info.shape != call.out_shape:
        raise ValueError(f"out must have shape {call.out_shape}; got {info.shape}")
    if info.dtype != problem.out_dtype:
        raise ValueError(f"out must have dtype {problem.out_dtype}; got {info.dtype}")
    if info.device != problem.device:
        where = lambda d: "the host" if d is None else f"CUDA device {d}"
        raise ValueError(f"out must be on {where(problem.device)} like x; got {where(info.device)}")
    if not adapter.is_c_contiguous(out):
        raise ValueError("out must be C-contiguous")
    if not adapter.is_writeable(out):
        raise ValueError("out must be writeable (not read-only, not a lazily conjugated or negated view)")
    if not info.plain or adapter.overlaps(out, call.x3):
        return False
    offsets = getattr(call.segments, "offsets", None)
    return offsets is None or not adapter.overlaps(out, offsets)


class _FillExecutor:
    """For problems with no data to read (n == 0 or an empty result): fill the identity."""

    def __init__(self, problem: Problem, adapter: ArrayAdapter) -> None:
        self._value = identity(problem.reduction, problem.out_dtype)
        self._adapter = adapter

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        if math.prod(out.shape):
            self._adapter.fill(out, self._value, stream)

    def free(self) -> None:
        pass


def _plan(call: _Call) -> tuple[str, Executor]:
    problem = call.problem
    backend = select(problem, call.backend)
    if problem.n == 0 or problem.batch * problem.num_segments * problem.features == 0:
        return backend.name, _FillExecutor(problem, call.adapter)
    logger.debug("planning %s with backend %r", problem.describe(), backend.name)
    return backend.name, backend.plan(problem)


def _execute(call: _Call, executor: Executor, out: Any) -> Any:
    adapter = call.adapter
    problem = call.problem
    if out is None:
        out = target = adapter.empty(call.out_shape, problem.out_dtype, problem.device)
    elif _check_out(out, call):
        target = out
    else:  # out overlaps the inputs or is not plain: a new result, then copied (NumPy's ufuncs do the same)
        target = adapter.empty(call.out_shape, problem.out_dtype, problem.device)
    executor(call.x3, adapter.reshape(target, problem.out_shape), call.segments, call.stream)
    if target is not out:
        adapter.copy(out, target, call.stream)
    return out


class _PlanCache:
    """A bounded LRU of executors keyed by (problem, backend, thread).

    Executors hold per-plan state (library handles, operand bindings) that is not
    safe to share between threads, so each thread gets its own; the lock guards
    only the dictionary.  An evicted executor is dropped, not freed: a call in
    another thread may still be running it, and its resources go with the last
    reference.
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._plans: OrderedDict[tuple, tuple[str, Executor]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def lookup(self, call: _Call) -> tuple[str, Executor]:
        key = (call.problem, call.backend, threading.get_ident())
        with self._lock:
            entry = self._plans.get(key)
            if entry is not None:
                self._plans.move_to_end(key)
                self.hits += 1
                return entry
            self.misses += 1
        entry = _plan(call)  # outside the lock: planning may be slow
        with self._lock:
            if self.maxsize:
                self._plans[key] = entry
                self._plans.move_to_end(key)
            while len(self._plans) > self.maxsize:
                self._plans.popitem(last=False)
        return entry

    def resize(self, maxsize: int) -> None:
        with self._lock:
            self.maxsize = maxsize
            while len(self._plans) > maxsize:
                self._plans.popitem(last=False)
        with _fast_lock:
            _fast.clear()


_cache = _PlanCache(64)


def set_plan_cache_size(maxsize: int) -> None:
    """Set how many plans the functions keep (default 64).

    The cache is shared by ``segmented_sum``, ``segmented_mean``,
    ``segmented_max`` and ``segmented_min``; the least recently used plans beyond
    ``maxsize`` are dropped.

    Parameters
    ----------
    maxsize : int
        The most plans to keep, ``>= 0``; 0 keeps none (every call plans again).

    Raises
    ------
    ValueError
        If ``maxsize`` is not a non-negative integer.

    See Also
    --------
    plan_cache_info : The cache's size, limit, hits and misses.
    clear_plan_cache : Drop every cached plan.

    Examples
    --------
    >>> import linred
    >>> linred.set_plan_cache_size(16)
    >>> linred.plan_cache_info()["maxsize"]
    16
    >>> linred.set_plan_cache_size(64)
    """
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
        raise ValueError(f"maxsize must be a non-negative integer; got {maxsize!r}")
    _cache.resize(maxsize)


def clear_plan_cache() -> None:
    """Drop every cached plan.

    A dropped plan's resources (library handles, workspaces, scratch buffers)
    are released once no running call uses it.  The hit and miss counters are
    kept.

    See Also
    --------
    plan_cache_info : The cache's size, limit, hits and misses.
    set_plan_cache_size : How many plans to keep.

    Examples
    --------
    >>> import numpy as np
    >>> import linred
    >>> _ = linred.segmented_sum(np.ones(8), 4)
    >>> linred.plan_cache_info()["size"] > 0
    True
    >>> linred.clear_plan_cache()
    >>> linred.plan_cache_info()["size"]
    0
    """
    maxsize = _cache.maxsize
    _cache.resize(0)
    _cache.resize(maxsize)


def plan_cache_info() -> dict[str, int]:
    """The state of the functions' plan cache.

    Returns
    -------
    dict
        ``{"size": plans held, "maxsize": the limit, "hits": calls that found
        their plan, "misses": calls that had to plan}``; the counters count
        since the process started.

    See Also
    --------
    set_plan_cache_size : How many plans to keep.
    clear_plan_cache : Drop every cached plan.

    Examples
    --------
    >>> import numpy as np
    >>> import linred
    >>> linred.clear_plan_cache()
    >>> before = linred.plan_cache_info()
    >>> x = np.arange(12.0)
    >>> _ = linred.segmented_sum(x, 4)  # plans
    >>> _ = linred.segmented_sum(x, 4)  # reuses the plan
    >>> after = linred.plan_cache_info()
    >>> after["size"], after["misses"] - before["misses"], after["hits"] - before["hits"]
    (1, 1, 1)
    """
    return {"size": len(_cache._plans), "maxsize": _cache.maxsize, "hits": _cache.hits, "misses": _cache.misses}


class _FastCall:
    """A repeated fixed-length call, reduced to what must happen per call.

    Calls with a fixed ``segment_length`` and no ``offsets``, ``lengths``, ``dtype``
    or ``stream`` are fully described by the reduction, ``L``, ``axis``, ``backend``,
    the input's type, shape, strides, dtype and device, and the same of ``out`` when
    one is given (with its writeability where an array can be read-only).  Once such
    a call has gone through the validating path, later ones with the same
    description skip straight to allocating the result (or taking ``out``, whose
    description is that of an ``out`` already checked) and running the plan.
    """

    __slots__ = (
        "empty", "executor", "flat", "in_shape", "out_shape", "out_shape3", "overlaps", "prepare", "segments", "stream"
    )  # fmt: skip

    def __init__(self, call: _Call, executor: Executor) -> None:
        fast = call.adapter.fast_path(call.problem.out_dtype, call.problem.device)
        self.prepare, self.empty, self.stream = fast
        #: an ``out`` that overlaps ``x`` takes the checked path (which reduces into a new array)
        self.overlaps = call.adapter.overlaps
        self.executor = executor
        # An executor that reads only device pointers takes the arrays as they come (no views).
        self.flat = getattr(executor, "flat", False)
        self.segments = call.segments
        self.in_shape = call.problem.in_shape
        self.out_shape = call.out_shape
        self.out_shape3 = call.problem.out_shape

    def __call__(self, x: Any, out: Any = None) -> Any:
        x = self.prepare(x)
        if out is None:
            result = target = self.empty(self.out_shape)
        else:
            result, target = out, self.prepare(out)  # a torch out that requires grad: detached
        if self.flat:
            self.executor(x, target, self.segments, self.stream())
        else:
            self.executor(x.reshape(self.in_shape), target.reshape(self.out_shape3), self.segments, self.stream())
        return result


_fast: dict[tuple, _FastCall] = {}
_fast_lock = threading.Lock()


def run(
    reduction: str,
    x: Any,
    segment_length: Any,
    offsets: Any,
    lengths: Any,
    axis: Any,
    dtype: Any,
    out: Any,
    backend: Any,
    stream: Any,
    check: Any,
) -> Any:
    """The body of the public functions: prepare, look up or make a plan, execute."""
    fast_kind = (
        type(segment_length) is int
        and type(axis) is int
        and type(backend) is str
        and offsets is None
        and lengths is None
        and dtype is None
        and stream is None
        and check is True
    )
    key = _fast_key(reduction, x, segment_length, axis, backend, out) if fast_kind else None
    if key is not None:
        fast = _fast.get(key)
        if fast is not None and (out is None or not fast.overlaps(x, out)):
            _cache.hits += 1
            return fast(x, out)
    call = _prepare(reduction, x, segment_length, offsets, lengths, axis, dtype, backend, check, stream)
    _, executor = _cache.lookup(call)
    result = _execute(call, executor, out)
    # (an out that is not plain is described like no plain one: the fast path never sees it)
    if fast_kind and _cache.maxsize and (out is None or call.adapter.info(out).plain):
        if key is None:  # an array type seen for the first time: its adapter has just registered its key
            key = _fast_key(reduction, x, segment_length, axis, backend, out)
        if key is not None:
            with _fast_lock:
                if len(_fast) >= _cache.maxsize:
                    del _fast[next(iter(_fast))]
                _fast[key] = _FastCall(call, executor)
    return result


def _fast_key(reduction: str, x: Any, segment_length: int, axis: int, backend: str, out: Any) -> tuple | None:
    """The fast path's key of a call (None where the array type has no fast path)."""
    describe = fast_keys.get(type(x))
    if describe is None or (out is not None and type(out) is not type(x)):
        return None
    where = None if out is None else describe(out)
    return (reduction, segment_length, axis, backend, describe(x), where, threading.get_ident())


class SegmentedReduction:
    """A segmented reduction planned once for repeated calls on same-shaped data.

    The plan is built from an example array (its array type, device, shape,
    strides and dtype), the segments, the reduction and the backend; planning
    chooses the backend, validates the segments once and builds the backend's
    own plan (a cuBLASLt matmul, a CUB reduction, a compiled kernel).  Calling
    it (or :meth:`execute`) runs the reduction on a new array of the same
    layout.  Use it as a context manager, or call :meth:`free`, to release its
    resources.

    Parameters
    ----------
    x : array
        An example of the arrays the plan will run on (NumPy, CuPy or PyTorch).
        Only its properties are used; the plan keeps no reference to it.
    segment_length : int, optional
        Fixed segment length, as in :func:`linred.segmented_sum`.
    offsets : array_like of int, optional
        Segment offsets, as in :func:`linred.segmented_sum`.  They are copied
        into the plan and checked once, when it is built.
    lengths : array_like of int, optional
        Segment lengths, as in :func:`linred.segmented_sum`; checked once and
        kept by the plan as offsets.
    axis : int, default 0
        The axis along which segments run.
    reduction : {"sum", "mean", "max", "min"}, default "sum"
        The reduction to plan.
    dtype : dtype, optional
        Accumulation and result dtype, as in :func:`linred.segmented_sum`.
    backend : str, default "auto"
        A backend name or ``"auto"``, resolved once, when the plan is built.
    check : bool, default True
        Whether to validate ``offsets`` or ``lengths``.

    Attributes
    ----------
    backend : str
        The backend that serves the plan (``"auto"`` resolved).
    reduction : str
        The planned reduction.
    out_shape : tuple of int
        The shape of every result.
    out_dtype : str
        The dtype of every result, by name (``"float32"``, ``"int64"``, ...).

    Raises
    ------
    TypeError, ValueError
        For bad arguments, as :func:`linred.segmented_sum`.
    linred.BackendError
        If the requested backend cannot serve the problem.

    See Also
    --------
    segmented_sum : The same reduction as a function, with its plans cached.

    Notes
    -----
    A plan is not thread-safe: use one plan per thread (the functions' cache
    already does).

    Examples
    --------
    >>> import numpy as np
    >>> import linred
    >>> x = np.arange(1, 13, dtype=np.float32)
    >>> with linred.SegmentedReduction(x, 4) as plan:
    ...     plan(x)
    ...     plan(2 * x)
    array([10., 26., 42.], dtype=float32)
    array([20., 52., 84.], dtype=float32)

    What the plan chose and returns:

    >>> plan = linred.SegmentedReduction(x, offsets=[0, 3, 12], reduction="max")
    >>> plan.backend, plan.out_shape, plan.out_dtype
    ('numpy', (2,), 'float32')
    >>> plan.free()
    """

    def __init__(
        self,
        x: Any,
        segment_length: int | None = None,
        *,
        offsets: Any = None,
        lengths: Any = None,
        axis: int = 0,
        reduction: str = "sum",
        dtype: Any = None,
        backend: str = "auto",
        check: bool = True,
    ) -> None:
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}; got {reduction!r}")
        call = _prepare(reduction, x, segment_length, offsets, lengths, axis, dtype, backend, check)
        if isinstance(call.segments, VariableSegments):
            # The plan owns its offsets: later changes to the caller's array must not
            # reach a plan whose offsets were checked once, at construction.
            off = call.segments.offsets
            owned = off.clone() if hasattr(off, "clone") else off.copy()
            call.segments = dataclasses.replace(call.segments, offsets=owned)
        self.backend, self._executor = _plan(call)
        self._call = call
        self._info = call.adapter.info(as_array(x)[0])
        call.x3 = None  # keep no reference to the example array
        self.reduction = reduction
        self.out_shape = call.out_shape
        self.out_dtype = call.problem.out_dtype

    def _check_x(self, x: Any) -> Any:
        adapter = self._call.adapter
        x, x_adapter = as_array(x)
        x = x_adapter.prepare(x)
        if x_adapter is not adapter:
            raise TypeError(
                f"x must be a {adapter.type_name} like the array the plan was built for; got {x_adapter.type_name}"
            )
        info = adapter.info(x)
        expected = self._info
        for field in ("shape", "dtype", "device", "strides", "plain"):
            if getattr(info, field) != getattr(expected, field):
                raise ValueError(
                    f"x must have the {field} of the array the plan was built for, {getattr(expected, field)}; "
                    f"got {getattr(info, field)}"
                )
        return adapter.reshape(x, self._call.problem.in_shape)

    def execute(self, x: Any, *, out: Any = None, stream: Any = None) -> Any:
        """Reduce ``x``; calling the plan does the same.

        Parameters
        ----------
        x : array
            Of the same array type, device, shape, strides and dtype as the
            array the plan was built for.
        out : array, optional
            Where to write the result (C-contiguous, of the plan's
            ``out_shape`` and ``out_dtype``); returned when given.
        stream : optional
            As in :func:`linred.segmented_sum`.

        Returns
        -------
        array
            The result, of ``x``'s array type and device.

        Raises
        ------
        TypeError, ValueError
            If ``x`` or ``out`` does not match the plan (the message names the
            field that differs).
        RuntimeError
            If the plan has been freed.

        Examples
        --------
        >>> import numpy as np
        >>> import linred
        >>> x = np.arange(8.0)
        >>> plan = linred.SegmentedReduction(x, 2, reduction="mean")
        >>> out = np.empty(plan.out_shape)
        >>> plan.execute(x + 1, out=out) is out
        True
        >>> out
        array([1.5, 3.5, 5.5, 7.5])
        >>> plan.free()
        """
        if self._executor is None:
            raise RuntimeError("this SegmentedReduction has been freed")
        call = self._call
        call.x3 = self._check_x(x)
        call.stream = call.adapter.resolve_stream(stream, call.problem.device)
        try:
            return _execute(call, self._executor, out)
        finally:
            call.x3 = None

    __call__ = execute

    def free(self) -> None:
        """Release the plan's resources; the plan cannot run afterwards.

        Leaving a ``with`` block frees the plan; freeing twice does nothing.

        Examples
        --------
        >>> import numpy as np
        >>> import linred
        >>> plan = linred.SegmentedReduction(np.ones(4), 2)
        >>> plan.free()
        >>> plan(np.ones(4))
        Traceback (most recent call last):
            ...
        RuntimeError: this SegmentedReduction has been freed
        """
        if self._executor is not None:
            self._executor.free()
            self._executor = None

    def __enter__(self) -> SegmentedReduction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._executor is None else self.backend
        return f"<SegmentedReduction {self._call.problem.describe()} [{state}]>"
