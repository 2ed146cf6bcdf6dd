"""A call's arguments, validated once, as a frozen :class:`Request`.

Every way into linred (the functions, :class:`linred.SegmentedReduction`, the
bench and the tools) describes a call here: the array and its adapter, the axis,
the segments, the dtypes and the backend name become a :class:`Request` holding
the canonical :class:`~linred.problem.Problem`.  The plan made from a request then
runs it many times (:mod:`linred.plan`); only a plan's first call, or a call that
does not match it, comes back here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from linred._dtypes import REDUCTIONS, dtype_name, identity, resolve
from linred.arrays import ArrayAdapter, ArrayInfo, as_array, refusal
from linred.backends import check_backend_name
from linred.problem import Problem
from linred.segments import FixedSegments, Segments, parse_segments

__all__ = ["FillExecutor", "Request", "check_out", "check_reduction", "normalize_axis", "request"]


def described(value: Any) -> str:
    """``value`` and its type, module and all, for a message (NumPy's bool is named "bool" too)."""
    t = type(value)
    return f"{value!r} ({t.__name__ if t.__module__ == 'builtins' else f'{t.__module__}.{t.__name__}'})"


def check_reduction(reduction: Any) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}; got {reduction!r}")
    return reduction


def check_flag(check: Any) -> None:
    """The TypeError of a ``check`` that is not a bool (``1`` is not taken for ``True``)."""
    if not isinstance(check, bool):
        raise TypeError(f"check must be True or False; got {described(check)}")


def normalize_axis(axis: Any, ndim: int) -> int:
    """``axis`` as an index in ``[0, ndim)``; :class:`numpy.exceptions.AxisError` if out of range."""
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"axis must be an integer; got {type(axis).__name__} {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim


@dataclass(frozen=True, slots=True)
class Request:
    """One call's validated description: everything but the data itself.

    Attributes
    ----------
    problem : Problem
        The canonical problem (the plan's identity).
    backend : str
        The backend asked for (a name or ``"auto"``).
    adapter : ArrayAdapter
        The adapter of the input's array library.
    info : ArrayInfo
        The input's shape, strides, dtype, device and plainness, as given.
    axis : int
        The segment axis, in ``[0, ndim)``.
    segments : Segments
        The call's segments (for offsets, on the data's device).
    out_shape : tuple of int
        The result's shape in the input's rank.
    viewed : bool
        Whether the ``(batch, n, features)`` view of the input is a view (else
        the array library copies it whenever it is reshaped, and executors that
        read the caller's array as it comes cannot serve it).
    """

    problem: Problem
    backend: str
    adapter: ArrayAdapter
    info: ArrayInfo
    axis: int
    segments: Segments
    out_shape: tuple[int, ...]
    viewed: bool = True


def request(
    reduction: str,
    x: Any,
    *,
    segment_length: Any = None,
    offsets: Any = None,
    lengths: Any = None,
    axis: Any = 0,
    dtype: Any = None,
    backend: Any = "auto",
    check: Any = True,
    stream: Any = None,
) -> tuple[Request, Any, Any]:
    """Validate a call's arguments: ``(request, x ready to read, resolved stream handle)``.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, with a message naming it, the rule and the offending value.
    """
    x, adapter = as_array(x)
    x = adapter.prepare(x)
    try:
        info = adapter.info(x)
    except TypeError as e:
        # (the adapter names what it refuses: a dtype, or a tensor's device type)
        raise TypeError(f"x: {e}") from None
    ndim = len(info.shape)
    if ndim == 0:
        raise ValueError("x must have at least one dimension; got a 0-d array")
    axis = normalize_axis(axis, ndim)
    backend = check_backend_name(backend)
    check_flag(check)
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
    viewed = batch * n * features == 0 or adapter.overlaps(x3, x)
    return Request(problem, backend, adapter, info, axis, segments, out_shape, viewed), x, handle


def validate_out(out: Any, adapter: Any, shape: tuple[int, ...], dtype: str, device: int | None) -> Any:
    """Raise unless ``out`` can take a result of ``shape`` and ``dtype`` on ``device``: the array
    type of ``x`` (``adapter``'s), read as it is, C-contiguous and writeable.  Returns its info."""
    if type(out).__module__.split(".")[0] != adapter.kind or not hasattr(out, "shape"):
        raise TypeError(f"out must be a {adapter.type_name} like x; got {type(out).__module__}.{type(out).__name__}")
    reason = refusal(out, "out")
    if reason is not None:
        raise TypeError(reason)
    info = adapter.info(out)
    if info.shape != shape:
        raise ValueError(f"out must have shape {shape}; got {info.shape}")
    if info.dtype != dtype:
        raise ValueError(f"out must have dtype {dtype}; got {info.dtype}")
    if info.device != device:
        where = lambda d: "the host" if d is None else f"CUDA device {d}"
        raise ValueError(f"out must be on {where(device)} like x; got {where(info.device)}")
    if not adapter.is_c_contiguous(out):
        raise ValueError("out must be C-contiguous")
    if not adapter.is_writeable(out):
        raise ValueError("out must be writeable (not read-only, not a lazily conjugated or negated view)")
    return info


def check_out(out: Any, req: Request, x: Any, segments: Segments) -> bool:
    """Validate ``out``; return whether the result can be written into it directly.

    It cannot when it overlaps ``x`` (or the offsets), whose elements the reduction
    still has to read, or when its memory is not plain (byte-swapped or unaligned):
    the result is then computed into a new array and copied into ``out``.
    """
    adapter = req.adapter
    info = validate_out(out, adapter, req.out_shape, req.problem.out_dtype, req.problem.device)
    if not info.plain or adapter.overlaps(out, x):
        return False
    offsets = getattr(segments, "offsets", None)
    return offsets is None or not adapter.overlaps(out, offsets)


def check_x(x: Any, req: Request) -> Any:
    """``x`` ready to read, if it has the array type and layout ``req`` was made for; else raise."""
    adapter = req.adapter
    x, x_adapter = as_array(x)
    x = x_adapter.prepare(x)
    if x_adapter is not adapter:
        raise TypeError(
            f"x must be a {adapter.type_name} like the array the plan was built for; got {x_adapter.type_name}"
        )
    info = adapter.info(x)
    expected = req.info
    for field in ("shape", "dtype", "device", "strides"):
        if getattr(info, field) != getattr(expected, field):
            raise ValueError(
                f"x must have the {field} of the array the plan was built for, {getattr(expected, field)}; "
                f"got {getattr(info, field)}"
            )
    if info.plain != expected.plain:

        def what(plain: bool) -> str:
            return "aligned, in native byte order" if plain else "unaligned or byte-swapped"

        raise ValueError(
            f"x must be {what(expected.plain)} like the array the plan was built for; got one {what(info.plain)}"
        )
    return x


class FillExecutor:
    """For problems with no data to read (n == 0 or an empty result): fill the identity."""

    views = True

    def __init__(self, problem: Problem, adapter: ArrayAdapter) -> None:
        self._value = identity(problem.reduction, problem.out_dtype)
        self._adapter = adapter

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        if math.prod(out.shape):
            self._adapter.fill(out, self._value, stream)

    def free(self) -> None:
        pass
