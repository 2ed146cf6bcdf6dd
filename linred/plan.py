"""Plans: a segmented reduction validated once and run many times.

:class:`SegmentedReduction` is the stateful plan, in the manner of
nvmath-python's ``Matmul``, and the only way linred runs a reduction: the
functions (``linred.segmented_sum`` and friends) are a cache of these plans
(:mod:`linred._plan_cache`).  Building a plan validates the call
(:func:`linred._frontend.request`), chooses the backend and builds its executor;
a call on the plan compares a cheap description of the array with the one it was
built for and runs the executor.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

from linred._dtypes import itemsize
from linred._frontend import FillExecutor, Request, check_out, check_reduction, check_x, request
from linred.backends.base import Executor, FunctionExecutor
from linred.backends.select import select
from linred.segments import Segments, VariableSegments

__all__ = ["SegmentedReduction"]

logger = logging.getLogger("linred")


def make_executor(req: Request) -> tuple[str, Executor]:
    """``(backend name, executor)`` for a request: the backend's plan, or a fill of the identity
    where there is no data to read."""
    problem = req.problem
    backend = select(problem, req.backend)
    if problem.n == 0 or problem.batch * problem.num_segments * problem.features == 0:
        return backend.name, FillExecutor(problem, req.adapter)
    logger.debug("planning %s with backend %r", problem.describe(), backend.name)
    return backend.name, backend.plan(problem)


def _refuse_served_otherwise(x: Any) -> None:
    """A JAX or Dask array (which the functions take, through DLPack or chunk by chunk) is
    refused by a plan with a message that says where it is served."""
    from linred._jax import is_jax
    from linred.dask import is_dask  # (no Dask import: the type's module is read)

    if is_jax(x) or is_dask(x):
        raise TypeError(
            f"SegmentedReduction takes NumPy, CuPy and PyTorch arrays; got {type(x).__module__}.{type(x).__name__}: "
            "JAX and Dask arrays are reduced by the functions (linred.segmented_sum and the others)"
        )


class SegmentedReduction:
    """A segmented reduction planned once for repeated calls on same-shaped data.

    The plan is built from an example array (its array type, device, shape,
    strides and dtype), the segments, the reduction and the backend; planning
    chooses the backend, validates the segments once and builds the backend's
    own plan (a cuBLASLt matmul, a CUB reduction, a compiled kernel).  Calling
    it (or :meth:`execute`) runs the reduction on a new array of the same
    layout, with no further validation than a comparison of the array's layout
    with the example's: it is the fastest way to call linred.  Use it as a
    context manager, or call :meth:`free`, to release its resources.

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
    reduction : {"sum", "mean", "max", "min", "prod"}, default "sum"
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
    already does).  It cannot be pickled or copied (``TypeError``): it holds
    its backend's resources; build one in each process.  The backend's tuning
    options in force when the plan is built are the plan's for its lifetime
    (see :func:`linred.backends.configure`).

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
        check_reduction(reduction)
        _refuse_served_otherwise(x)
        req, x, _ = request(
            reduction,
            x,
            segment_length=segment_length,
            offsets=offsets,
            lengths=lengths,
            axis=axis,
            dtype=dtype,
            backend=backend,
            check=check,
        )
        if isinstance(req.segments, VariableSegments):
            # The plan owns its offsets: later changes to the caller's array must not
            # reach a plan whose offsets were checked once, at construction.
            off = req.segments.offsets
            owned = off.clone() if hasattr(off, "clone") else off.copy()
            req = dataclasses.replace(req, segments=dataclasses.replace(req.segments, offsets=owned))
        self._setup(req, x)

    @classmethod
    def _from_request(cls, req: Request, x: Any) -> SegmentedReduction:
        """A plan for a request already made (the functions' cache: the segments are per call)."""
        plan = cls.__new__(cls)
        segments = req.segments
        if isinstance(segments, VariableSegments):  # keep no reference to the first call's offsets
            req = dataclasses.replace(req, segments=dataclasses.replace(segments, offsets=None))
        plan._setup(req, x)
        plan._offsets_dtype = segments.offsets.dtype if isinstance(segments, VariableSegments) else None
        plan._offsets_as_given = False  # (set by the plan cache)
        plan._count = segments.count
        plan._device = req.problem.device
        plan._device_of = req.adapter.device_of
        plan._contiguous = req.adapter.is_c_contiguous
        #: whether a call's offsets are checked by the executor as it reads them
        plan._checks_offsets = getattr(plan._executor, "checks_offsets", False)
        # What a checked call of such offsets asks of the adapter (see linred._plan_cache.call).
        plan._armed = False  # (set by the plan cache)
        plan._ahead = False  # (set by the plan cache: checked calls take the verdict of a check enqueued ahead)
        plan._capturing = req.adapter.capturing
        plan._arm = req.adapter.check_word
        plan._check_passed = req.adapter.check_passed
        return plan

    def _setup(self, req: Request, x: Any) -> None:
        problem, adapter = req.problem, req.adapter
        self.backend, self._executor = make_executor(req)
        self.reduction = problem.reduction
        self.out_shape = req.out_shape
        self.out_dtype = problem.out_dtype
        self._request = req
        self._segments: Segments = req.segments
        self._fixed = req.segments.__class__ is not VariableSegments
        # What a call needs, resolved once: calls are counted in microseconds.
        self._type = type(x)
        self._describe = adapter.key
        self._x_key = adapter.key(x)
        self._out_key = adapter.out_key(req.out_shape, problem.out_dtype, problem.device)
        # A call's x has the plan's key (that of a prepared array) or went through check_x, which
        # prepares it; the plan cache gives back the full preparing to plans of other keys.
        self._prepare = (adapter.prepare_plain or adapter.prepare) if adapter.prepares else None
        self._prepare_out = adapter.prepare_out
        self._written = adapter.written
        self._plan_input = adapter.plan_input
        self._empty = adapter.allocator(problem.out_dtype, problem.device)
        #: the library's current stream on the data's device (None on the host: no call to make)
        self._current_stream = None if problem.device is None else adapter.current_stream(problem.device)
        self._describe_out = adapter.key_out
        self._overlaps = adapter.overlaps
        # Device data: where an array of x's layout lies from its pointer, and the bytes of a
        # result, so that a call tells whether out overlaps x from three pointers.
        self._pointer = adapter.pointer
        if self._pointer is not None:
            first, last = adapter.span(x)
            start = self._pointer(x)
            self._x_span = (first - start, last - start)
            self._out_bytes = math.prod(req.out_shape) * itemsize(problem.out_dtype)
        # (an executor that takes the caller's arrays cannot take one whose 3-D view is a copy)
        self._views = getattr(self._executor, "views", True) or not req.viewed
        # A function executor is called as its function (one Python call less per call).
        executor = self._executor
        self._launch = executor.run if isinstance(executor, FunctionExecutor) else executor
        self._in3 = problem.in_shape
        self._out3 = problem.out_shape
        fits = adapter.out_test(req.out_shape, problem.out_dtype) if self._pointer is None else None
        if fits is not None and self._prepare is None and self._prepare_out is None and self._written is None:
            self._run = self._host_run(fits)  # (shadows the method: the same steps, resolved once)

    def _stream(self, stream: Any) -> Any:
        """The handle a call runs on: ``stream`` resolved, or the array library's current stream."""
        if stream is None:
            return self._current_stream and self._current_stream()
        return self._request.adapter.resolve_stream(stream, self._request.problem.device)

    def _run(self, x: Any, out: Any, handle: Any, segments: Segments, named: bool = False) -> Any:
        """Run on ``x``, whose layout matches the plan's, into ``out`` (or a new array).

        ``named``: the call names its stream (``handle``), which need not be the library's current
        one; a new result is then allocated on it, so that the array library's memory pool orders
        its reuse after the work written there (allocated on the current stream, a result dropped
        before the call's stream is done could be handed to another array while it is written)."""
        if self._prepare is not None:
            x = self._prepare(x)
        copy_back = False
        if out is None:
            result = target = self._empty_on(handle) if named else self._empty(self.out_shape)
        else:
            result = out
            if self._prepare_out is not None:
                out = self._prepare_out(out)  # (a torch out that requires grad: refused, or detached)
            if (
                type(out) is self._type
                and self._describe_out(out) == self._out_key  # (also says it is writeable)
                and (
                    not self._overlaps(out, x) and (self._fixed or not self._overlaps(out, segments.offsets))
                    if self._pointer is None
                    else self._apart(out, x, segments)
                )
            ):
                direct = True
            else:
                direct = check_out(out, self._request, x, segments)
            if direct:
                target = out
            else:  # out overlaps the inputs or is not plain: a new result, then copied (as NumPy's ufuncs do)
                target = self._empty_on(handle) if named else self._empty(self.out_shape)
                copy_back = True
        if self._views:
            self._launch(x.reshape(self._in3), target.reshape(self._out3), segments, handle)
        else:
            self._launch(x, target, segments, handle)
        if copy_back:
            self._request.adapter.copy(out, target, handle)
        if self._written is not None and out is not None:
            self._written(out)  # (PyTorch: autograd learns that out changed)
        return result

    def _empty_on(self, handle: Any) -> Any:
        """A new result allocated on the stream ``handle`` (see :meth:`_run`)."""
        req = self._request
        with req.adapter.on_stream(handle, req.problem.device):
            return self._empty(self.out_shape)

    def _host_run(self, fits: Callable[[Any], bool]) -> Callable[..., Any]:
        """:meth:`_run` for host data whose arrays need no preparing, with what it looks up on
        every call bound once: a small call's time is mostly these lookups (1,024 float32 values:
        the reduction takes about half of the call).  ``fits(out)`` says that ``out`` is an array
        of the plan's result layout that can be written directly, short of overlapping the inputs;
        any other ``out`` takes :meth:`_run`."""
        general = functools.partial(SegmentedReduction._run, self)
        launch, overlaps, empty, shape = self._launch, self._overlaps, self._empty, self.out_shape
        fixed, views, in3, out3 = self._fixed, self._views, self._in3, self._out3
        test_overlap = not (fixed and getattr(self._executor, "overlap_safe", False))

        def _run(x: Any, out: Any, handle: Any, segments: Segments, named: bool = False) -> Any:
            if out is None:
                out = empty(shape)
            elif not fits(out) or (
                test_overlap and (overlaps(out, x) or (not fixed and overlaps(out, segments.offsets)))
            ):
                return general(x, out, handle, segments)
            if views:
                launch(x.reshape(in3), out.reshape(out3), segments, handle)
            else:
                launch(x, out, segments, handle)
            return out

        return _run

    def _apart(self, out: Any, x: Any, segments: Segments) -> bool:
        """Whether ``out`` (of the plan's result layout, on its device) shares no memory with ``x``
        (of the plan's layout) or the offsets (device data: the adapter has a ``pointer``)."""
        pointer = self._pointer
        first = pointer(out)
        end = first + self._out_bytes
        if first == end:
            return True
        start = pointer(x)
        low, high = self._x_span
        if low < high and start + low < end and first < start + high:
            return False
        if self._fixed:
            return True
        offsets = segments.offsets  # (contiguous, on the data's device)
        begin = pointer(offsets)
        return not (offsets.nbytes and begin < end and first < begin + offsets.nbytes)

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
        if self._plan_input is not None:
            self._plan_input(x)  # (a PyTorch tensor that requires grad: refused, not silently detached)
        if type(x) is not self._type or self._describe(x) != self._x_key:
            x = check_x(x, self._request)  # the same layout through another route, or an error
        if stream is None:
            return self._run(x, out, self._current_stream and self._current_stream(), self._segments)
        return self._run(x, out, self._stream(stream), self._segments, True)

    __call__ = execute

    def __reduce__(self) -> Any:
        # (a plan holds its backend's executor, library handles and device memory, none of which
        # travels between processes: a clear refusal, not the first unpicklable attribute's)
        raise TypeError(
            "a SegmentedReduction cannot be pickled: it holds its backend's resources; build one in each process "
            "(linred's functions keep a cache of plans per process)"
        )

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
        return f"<SegmentedReduction {self._request.problem.describe()} [{state}]>"
