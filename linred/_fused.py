"""Segmented logsumexp, softmax, log_softmax, var and std, composed from linred's reductions.

Each is a few of linred's own reductions (``segmented_max``, ``segmented_sum``,
``segmented_mean``) with the array library's elementwise operations between them: NumPy,
CuPy or PyTorch, on the data's device and the call's stream.  A per-segment value (a
segment's maximum, sum or mean) is broadcast back to the segment's elements

- for a fixed segment length ``L``, through a ``(..., m, L, ...)`` view of the data and a
  ``(..., m, 1, ...)`` view of the per-segment values: no index at all;
- for offsets and lengths, by gathering with an int64 element -> segment index, made once
  per call on the data's device without reading anything back on the host
  (``repeat_interleave`` with ``output_size``, ``searchsorted`` for CuPy); NumPy data is
  repeated by the segment lengths instead (``np.repeat``: no index);
- for segment ids (sorted or not), by gathering with the ids themselves.

The segments are validated once, by the first reduction (``check=``); the others run with
``check=False`` on the offsets it read.  For PyTorch, autograd records the elementwise
operations and linred's reductions (whose backward is registered), and the gathers
(``index_select``) are differentiable: gradients, double backward included, come out of the
composition.  On a GPU, logsumexp, softmax and log_softmax of arrays that need no gradient
run as one kernel instead (:mod:`linred._softmax_kernel`), with the same results; the
composition is the reference semantics that kernel meets.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from linred import _pieces, _softmax_kernel
from linred._dtypes import COMPLEX, HALF, REAL, SUPPORTED, dtype_name, numpy_dtype
from linred._fpwarnings import call_at_caller
from linred._frontend import normalize_axis
from linred._functions import _remainder, segmented_max, segmented_mean, segmented_sum
from linred._jax import _as_local, call_jax, is_jax
from linred._segment_ids import unchecked_ids
from linred.arrays import as_array, namespace
from linred.arrays.views import numpy_views
from linred.backends import BackendName

__all__ = [
    "segmented_log_softmax",
    "segmented_logsumexp",
    "segmented_softmax",
    "segmented_std",
    "segmented_var",
]

_REDUCE: dict[str, Callable[..., Any]] = {"max": segmented_max, "sum": segmented_sum, "mean": segmented_mean}

#: the segment keywords of linred's reductions, all forwarded to them (see :meth:`_Call._layout`)
_SEGMENT_KEYWORDS = ("segment_length", "offsets", "lengths", "segment_ids", "num_segments", "ids_sorted")


@dataclass
class _Call:
    """One call of a composed function: its data in the computation dtype, the segments,
    and the per-segment <-> per-element plumbing shared by the five functions."""

    name: str
    x: Any  # the data in the computation dtype (the caller's array itself when no cast was needed: never written)
    adapter: Any
    xp: Any
    axis: int
    compute: str  # the computation dtype
    result: str  # the result dtype
    grad: bool  # autograd records this call: no in-place operations (they would break the graph)
    backend: Any
    check: bool
    segments: dict[str, Any]  # the caller's segment keywords (offsets and lengths already on the device)
    device: int | None
    length: int | None = None  # fixed segment length, once known
    later: dict[str, Any] = field(default_factory=dict)  # the segments of the reductions after the first
    index: Any = None  # element -> segment (int64, on the device), for variable segments
    # the elements whose ids lie outside [0, m) (check=False drops them), shaped to broadcast
    # against the data, where autograd records the call; None where none can be (or none is)
    outside: Any = None
    # whether elements of no segment may be there: they read one more per-segment value (spread),
    # 0 where autograd records the call, else NaN
    dropped: bool = False
    repeats: Any = None  # each segment's length instead, for NumPy data with offsets or lengths
    shape: tuple[int, ...] = field(default=())

    @property
    def kind(self) -> str:
        return self.adapter.kind

    @property
    def real(self) -> str:
        """The real dtype of the computation dtype."""
        return {"complex64": "float32", "complex128": "float64"}.get(self.compute, self.compute)

    @property
    def n(self) -> int:
        return self.shape[self.axis]

    def out(self, a: Any) -> Any:
        """``out=`` for an elementwise operation that may overwrite ``a``, a temporary of this call."""
        return None if self.grad else a

    def detached(self) -> Any:
        """The data without autograd history (for the shift of the softmax family: see :func:`_shift`)."""
        return self.x.detach() if self.kind == "torch" else self.x

    def first(self, which: str, a: Any) -> Any:
        """``segmented_<which>`` of ``a`` with the caller's segments, validated (``check``); then
        the layout of the segments is known to the later steps."""
        r = _REDUCE[which](a, axis=self.axis, backend=self.backend, check=self.check, **self.segments)
        self._layout(r.shape[self.axis])
        return r

    def reduce(self, which: str, a: Any) -> Any:
        """``segmented_<which>`` of ``a`` (shaped like the data), on the segments :meth:`first` checked."""
        return _REDUCE[which](self.unview(a), axis=self.axis, backend=self.backend, check=False, **self.later)

    def _layout(self, m: int) -> None:
        """The segments as the later steps use them (:attr:`later`, :attr:`index`), once the first
        reduction has checked them and found their number ``m``."""
        segments, xp, n = self.segments, self.xp, self.n
        if segments.get("segment_length") is not None:
            self.length = int(segments["segment_length"])
            self.later = {"segment_length": self.length}
            return
        if segments.get("segment_ids") is not None:
            # The ids, sorted or not, are the element -> segment index; the later reductions take
            # them as they are, with the number of segments the first one found (no search for it).
            ids = segments["segment_ids"]  # (on the device: see _run)
            self.index = ids.long() if self.kind == "torch" else ids.astype(xp.int64, copy=False)
            known = segments.get("ids_sorted")
            traced = self.kind == "torch" and _compiling()  # (no value can be read back: see below)
            if traced and self.check:
                known = None  # (the promise unchecked: the later reductions sort the ids, right for any)
            elif not traced and (self.check or self.device is None) and n > 1:
                # Read once here (one small read back on a device, where the checked first reduction
                # has synchronized already), so that the later reductions do not sort sorted ids;
                # read also where ids_sorted was given, as the first reduction read them (the later
                # ones run unchecked, and would take a wrong promise on trust).
                known = not bool((self.index[1:] < self.index[:-1]).any())
            self.later = {"segment_ids": self.index, "num_segments": m, "ids_sorted": known}
            if not self.check:
                # Unchecked ids outside [0, m) name no segment: the reductions drop them (the later
                # ones keep the ids as given, whose order the caller may have promised), and their
                # elements read one more per-segment value (spread).  Without autograd that value
                # is NaN, which softmax and log_softmax give them.  With autograd it is 0 and the
                # elements are 0 themselves from here on, so that every step stays finite there and
                # passes them a gradient of 0 (not 0 * inf, nor a NaN); softmax and log_softmax
                # then give them NaN through a where (elements).  Host ids are read: nothing of
                # this where none lies outside.
                outside = (self.index < 0) | (self.index >= m)
                if self.device is not None or traced or bool(outside.any()):
                    self.index = xp.where(outside, m, self.index)
                    self.dropped = True
                    if self.grad:
                        shape = [1] * len(self.shape)
                        shape[self.axis] = -1
                        self.outside = outside.reshape(shape)
                        self.x = self.where(~self.outside, self.x, 0.0)
            return
        if segments.get("offsets") is not None:
            offsets = segments["offsets"]
        else:
            offsets = self.adapter.lengths_to_offsets(segments["lengths"])
        self.later = {"offsets": offsets}
        counts = offsets[1:] - offsets[:-1]
        if self.kind == "torch":
            # output_size: the index's length is known, so no synchronization to learn it
            self.index = xp.repeat_interleave(counts.to(xp.int64), output_size=n)
        elif self.kind == "numpy":
            self.repeats = counts  # (on the host, repeating the values by the lengths beats gathering by an index)
        else:  # CuPy's repeat needs the counts on the host: find each element's segment instead
            self.index = xp.searchsorted(offsets, xp.arange(n, dtype=xp.int64), side="right") - 1

    def view(self, a: Any) -> Any:
        """``a`` (shaped like the data) as ``(..., m, L, ...)`` for fixed segments, else as it is."""
        if self.length is None:
            return a
        s = self.shape
        return a.reshape((*s[: self.axis], s[self.axis] // self.length, self.length, *s[self.axis + 1 :]))

    def unview(self, a: Any) -> Any:
        return a if self.length is None else a.reshape(self.shape)

    def spread(self, r: Any) -> Any:
        """Per-segment values ``r`` (m along the axis) broadcast against :meth:`view` of the data."""
        if self.length is not None:
            return r.reshape((*r.shape[: self.axis + 1], 1, *r.shape[self.axis + 1 :]))
        if self.dropped:  # (one more value along the axis, for the elements of no segment)
            shape = list(r.shape)
            shape[self.axis] = 1
            pad = 0.0 if self.grad else math.nan
            if self.kind == "torch":
                r = self.xp.cat((r, self.xp.full(shape, pad, dtype=r.dtype, device=r.device)), self.axis)
            else:
                r = self.xp.concatenate((r, self.xp.full(shape, pad, dtype=r.dtype)), self.axis)
        if self.kind == "torch":
            return self.xp.index_select(r, self.axis, self.index)  # differentiable in r
        if self.repeats is not None:
            return np.repeat(r, self.repeats, axis=self.axis)
        return self.xp.take(r, self.index, axis=self.axis)

    def where(self, keep: Any, a: Any, value: float) -> Any:
        """``a`` where ``keep``, else the scalar ``value``, in ``a``'s dtype."""
        if self.kind == "torch":
            return self.xp.where(keep, a, value)
        return self.xp.where(keep, a, a.dtype.type(value))  # (a NumPy scalar: no device transfer for CuPy)

    def counts(self) -> Any:
        """Each segment's length (variable segments), shaped to broadcast against the per-segment results."""
        offsets = self.later.get("offsets")
        if offsets is not None:
            counts = offsets[1:] - offsets[:-1]
        else:  # ids: a sum of ones by the same ids (an int64 reduction: no atomics, no synchronization)
            xp, n = self.xp, self.n
            ones = xp.ones(n, dtype=xp.int64, device=self.x.device) if self.kind == "torch" else xp.ones(n, xp.int64)
            counts = segmented_sum(ones, axis=0, backend="auto", check=False, **self.later)
        shape = [1] * len(self.shape)
        shape[self.axis] = counts.shape[0]  # (not -1: under vmap a batch of none has no size to infer)
        return counts.reshape(shape)

    def finish(self, r: Any) -> Any:
        """``r`` in the result dtype."""
        return _astype(self, r, self.result)

    def elements(self, r: Any) -> Any:
        """Per-element results ``r`` (shaped like the data) with NaN for the elements of no segment."""
        return r if self.outside is None else self.where(~self.outside, r, math.nan)

    def quiet(self) -> Any:
        """NumPy's floating-point warnings off around elementwise steps whose NaN and infinities are
        the documented result (0/0 of an all -inf softmax segment, inf - inf, log(0))."""
        if self.kind == "numpy":
            return np.errstate(divide="ignore", invalid="ignore", over="ignore")
        return contextlib.nullcontext()


def _astype(c: _Call, a: Any, name: str) -> Any:
    if c.kind == "torch":
        return a.to(getattr(c.xp, name))  # (linred's dtype names are torch's; no copy when equal)
    return a.astype(numpy_dtype(name) if c.kind == "numpy" else name, copy=False)


def _dtypes(name: str, in_name: str, requested: Any, complex_ok: bool) -> tuple[str, str]:
    """``(computation dtype, result dtype)`` of a composed function."""
    if in_name in COMPLEX and not complex_ok:
        raise TypeError(f"{name} does not support complex input ({in_name}): it orders the values (a maximum)")
    if requested is not None:
        req = dtype_name(requested)
        if req not in REAL:
            raise TypeError(f"{name} returns a real floating dtype (float16, bfloat16, float32, float64); got {req}")
        compute = "float32" if req in HALF else req
        if in_name in COMPLEX:  # the deviations of complex data are complex; their squares real
            compute = "complex64" if compute == "float32" else "complex128"
        return compute, req
    if in_name in COMPLEX:
        return in_name, "float32" if in_name == "complex64" else "float64"
    if in_name in REAL:
        return ("float32" if in_name in HALF else in_name), in_name
    return "float64", "float64"  # bool and integers, as NumPy's mean and var


def _check_ddof(name: str, ddof: Any) -> float:
    if isinstance(ddof, bool) or not isinstance(ddof, numbers.Real):
        raise TypeError(f"{name}: ddof must be a real number; got {type(ddof).__name__} {ddof!r}")
    if not ddof >= 0:  # (NaN too)
        raise ValueError(f"{name}: ddof must be >= 0; got {ddof}")
    return ddof


def _run(
    function: Callable[..., Any],
    body: Callable[[_Call], Any],
    x: Any,
    segments: dict[str, Any],
    axis: Any,
    dtype: Any,
    backend: Any,
    stream: Any,
    check: Any,
    remainder: Any,
    complex_ok: bool,
    **options: Any,
) -> Any:
    """The common path of the five functions: ``body`` on the prepared call."""
    name = function.__name__
    if segments.get("segment_ids") is None and (segments.get("num_segments") is not None
                                                or segments.get("ids_sorted") is not None):  # fmt: skip
        from linred._segment_ids import ids_arguments  # (raises: the ids' arguments without ids)

        ids_arguments(None, segments.get("num_segments"), segments.get("ids_sorted"), [])
    from linred import dask as linred_dask  # (imports no Dask: the type's module is read)

    if linred_dask.is_dask(x):  # (a Dask array: rechunked to whole segments, each chunk computed by this function)
        return linred_dask.composed(name.removeprefix("segmented_"), x, segments, axis, dtype, backend, stream, check,
                                    remainder, **options)  # fmt: skip
    if is_jax(x):
        return _call_jax(function, x, segments, stream, axis=axis, dtype=dtype, backend=backend, check=check,
                         remainder=remainder, **options)  # fmt: skip
    if remainder != "error":
        sl, off, ln = segments["segment_length"], segments["offsets"], segments["lengths"]
        x, sl, ln = _remainder(x, sl, off, ln, axis, remainder)
        segments = {**segments, "segment_length": sl, "lengths": ln}
    x, adapter = as_array(x)
    try:
        in_name = dtype_name(x.dtype)
    except TypeError:
        raise TypeError(f"{name}: x has an unsupported dtype {x.dtype} (supported: {', '.join(SUPPORTED)})") from None
    shape = tuple(x.shape)
    if not shape:
        raise ValueError(f"{name}: x must have at least one dimension; got a 0-d array")
    axis = normalize_axis(axis, len(shape))
    compute, result = _dtypes(name, in_name, dtype, complex_ok)
    xp = namespace(adapter.kind)
    if adapter.kind == "torch":
        from linred._torch_ops import refuse_forward_ad
        from linred.arrays._torch import aligned

        refuse_forward_ad(x)
        x = aligned(x)  # (the composition's PyTorch operations read it)
    # (the composition, without in-place operations, also inside torch.func transforms, whose
    # batched tensors take no out= and no kernel of linred's own)
    grad = adapter.kind == "torch" and ((x.requires_grad and xp.is_grad_enabled()) or _torch_transformed())
    device = adapter.device_of(x)
    # (inside torch.compile, which cannot ask for the current stream, None: the current one)
    traced = stream is None and adapter.kind == "torch" and _compiling()
    handle = None if traced else adapter.resolve_stream(stream, device)
    with contextlib.ExitStack() as stack:
        if adapter.kind == "cupy":
            stack.enter_context(xp.cuda.Device(device))
        # Everything runs on the call's stream, made current here (stream=None: it is the current
        # one already): linred's reductions are then called with stream=None (which also lets
        # PyTorch's autograd path take them).
        if stream is not None:
            stack.enter_context(adapter.on_stream(handle, device))
        segments = dict(segments)
        if segments.get("segment_ids") is not None:
            segments["segment_ids"] = unchecked_ids(segments["segment_ids"], check, segments.get("num_segments"))
        for key in ("offsets", "lengths", "segment_ids"):  # on the device once, not once per reduction
            value = segments.get(key)
            if value is not None:
                segments[key] = adapter.index_array(value, device, key)
                if grad and not isinstance(value, xp.Tensor):  # (kept for the backward: a copy of its own)
                    from linred._torch_ops import owned

                    segments[key] = owned(value, segments[key])
        if grad:
            from linred import _fused_grad

            if _fused_grad.takes(x, segments, compute):
                # Autograd records one Function: the forward as a call without autograd (one
                # kernel on the GPU), the backward its derivative (see linred._fused_grad).  A
                # float16 or bfloat16 result is the cast of the Function's result in the
                # computation dtype (float32), as the composition's is: the derivative is taken
                # at the float32 values, not at their rounding.
                inner = compute if result in HALF else result

                def run(detached: Any) -> Any:
                    return _compute(name, body, detached, adapter, xp, axis, in_name, compute, inner, False, backend,
                                    check, segments, device, handle, shape, options)  # fmt: skip

                offsets, lengths, length = segments.get("offsets"), segments.get("lengths"), segments["segment_length"]
                out = _fused_grad.FusedGrad.apply(x, offsets, lengths, length, axis, name, compute,
                                                  options.get("ddof", 0), run)  # fmt: skip
                return out if inner == result else out.to(getattr(xp, result))
        return _compute(name, body, x, adapter, xp, axis, in_name, compute, result, grad, backend, check, segments,
                        device, handle, shape, options)  # fmt: skip


def _compiling() -> bool:
    """Whether torch.compile is tracing the call: the NumPy views of CPU tensors cannot be traced
    (Dynamo stops at NumPy's ``astype``), the composition's PyTorch operations can."""
    import torch

    return torch.compiler.is_compiling()


def _compute(
    name: str,
    body: Callable[..., Any],
    x: Any,
    adapter: Any,
    xp: Any,
    axis: int,
    in_name: str,
    compute: str,
    result: str,
    grad: bool,
    backend: Any,
    check: Any,
    segments: dict[str, Any],
    device: Any,
    handle: Any,
    shape: tuple[int, ...],
    options: dict[str, Any],
) -> Any:
    """``name`` of ``x`` with the call's segments (on the device): one kernel on the GPU where
    :mod:`linred._softmax_kernel` serves the call, else the composition ``body`` (for a CPU
    tensor that autograd does not record, on the NumPy views of its memory: PyTorch's
    ``index_select`` on the host made the composition of 20,000 values 2.6x slower than
    NumPy's ``repeat``; not while torch.compile traces it)."""
    if adapter.kind == "torch" and device is None and not grad and backend in ("auto", "numpy") and not _compiling():
        names = tuple(k for k in ("offsets", "lengths", "segment_ids") if segments.get(k) is not None)
        views = None if result == "bfloat16" else numpy_views(x, *(segments[k] for k in names))
        if views is not None:
            xn, host_segments = views[0], {**segments, **dict(zip(names, views[1:], strict=True))}
            xn, host = as_array(xn)
            r = _compute(name, body, xn, host, np, axis, in_name, compute, result, False, backend, check,
                         host_segments, None, None, shape, options)  # fmt: skip
            return xp.from_numpy(r)
    if _pieces.serves(name, x, adapter, in_name, result, segments, backend, grad, check, axis):
        # var and std of segments too long or too few for the kernel's workers: their pieces'
        # moments by the kernel, joined (see linred._pieces)
        return _pieces.run(name, x, adapter, axis, result, segments, device, check, handle, options["ddof"])
    if _softmax_kernel.serves(name, x, adapter, in_name, result, segments, backend, grad, check, axis):
        # One kernel on the GPU, with the composition's results (see linred._softmax_kernel).
        return _softmax_kernel.run(name, x, adapter, axis, compute, result, segments, device, check, handle, **options)
    c = _Call(name, None, adapter, xp, axis, compute, result, grad, backend, check, segments, device, shape=shape)
    if adapter.kind == "numpy":  # (NumPy's warnings, a final cast's overflow say, at the caller's line)
        return call_at_caller(_composed, c, x, body, options)
    return _composed(c, x, body, options)


def _composed(c: _Call, x: Any, body: Callable[..., Any], options: dict[str, Any]) -> Any:
    c.x = _astype(c, x, c.compute)
    return body(c, **options)


def _torch_transformed() -> bool:
    """Whether a ``torch.func`` transform is in effect (for a tensor's call: PyTorch is imported)."""
    from linred._torch_ops import transformed

    return transformed()


def _call_jax(function: Callable[..., Any], x: Any, segments: dict[str, Any], stream: Any, **kwargs: Any) -> Any:
    """``function`` of a JAX array, through :func:`linred._jax.call_jax` (also for segment keywords
    other than offsets and lengths, which cross DLPack the same way)."""
    other = {k: v for k, v in segments.items() if k not in ("segment_length", "offsets", "lengths")}

    def local(a: Any, segment_length: Any, **kw: Any) -> Any:
        platform = "cpu" if isinstance(a, np.ndarray) else "gpu"
        return function(a, segment_length, **kw, **{k: _as_local(v, platform, k) for k, v in other.items()})

    return call_jax(local, x, segments.get("segment_length"), offsets=segments.get("offsets"),
                    lengths=segments.get("lengths"), out=None, stream=stream, **kwargs)  # fmt: skip


def _shift(c: _Call, finite_only: bool) -> Any:
    """Each segment's maximum, the shift that keeps ``exp`` from overflowing.

    Where the maximum is not finite the shift is 0 (``finite_only``, logsumexp: an all -inf
    segment gives -inf, one holding +inf gives +inf, NaN stays NaN), or only where it is -inf
    (softmax and log_softmax: an all -inf segment gives 0/0 = NaN, one holding +inf or NaN
    gives NaN everywhere, as ``torch.softmax`` does).  The shift cancels out of the result
    exactly, for any value, so it is taken without autograd history (no backward through the
    maximum, and every derivative of the result with respect to it is 0).
    """
    mx = c.first("max", c.detached())
    keep = c.xp.isfinite(mx) if finite_only else mx != -math.inf
    return c.where(keep, mx, 0.0)


def _logsumexp(c: _Call) -> Any:
    xp = c.xp
    shift = _shift(c, finite_only=True)
    with c.quiet():
        e = xp.subtract(c.view(c.x), c.spread(shift))
        e = xp.exp(e, out=c.out(e))
    s = c.reduce("sum", e)
    with c.quiet():  # log(0) = -inf: an empty or all -inf segment
        s = xp.log(s, out=c.out(s))
        s = xp.add(s, shift, out=c.out(s))
    return c.finish(s)


def _softmax(c: _Call) -> Any:
    xp = c.xp
    shift = _shift(c, finite_only=False)
    with c.quiet():
        e = xp.subtract(c.view(c.x), c.spread(shift))
        e = xp.exp(e, out=c.out(e))
    s = c.reduce("sum", e)
    with c.quiet():  # 0/0 = NaN: an all -inf segment
        e = xp.divide(e, c.spread(s), out=c.out(e))
    return c.finish(c.elements(c.unview(e)))


def _log_softmax(c: _Call) -> Any:
    xp = c.xp
    shift = _shift(c, finite_only=False)
    with c.quiet():
        d = xp.subtract(c.view(c.x), c.spread(shift))  # x - max, exact near the maximum
    s = c.reduce("sum", xp.exp(d))
    with c.quiet():  # -inf - log(0) = NaN: an all -inf segment
        s = xp.log(s, out=c.out(s))
        d = xp.subtract(d, c.spread(s), out=c.out(d))
    return c.finish(c.elements(c.unview(d)))


def _var(c: _Call, ddof: float, root: bool) -> Any:
    xp = c.xp
    # Two passes: the mean, then the squared deviations from it (never E[x^2] - E[x]^2, which
    # cancels catastrophically).  The mean keeps its autograd history: the first derivative
    # through it is 0 in exact arithmetic, the second is not (double backward).
    mean = c.first("mean", c.x)
    with c.quiet():  # inf - inf = NaN: a segment holding an infinity
        d = xp.subtract(c.view(c.x), c.spread(mean))
    if c.compute in COMPLEX:  # |d|^2, real
        sq = xp.square(d.real)
        sq = xp.add(sq, xp.square(d.imag), out=c.out(sq))
    else:
        sq = xp.multiply(d, d, out=c.out(d))
    ss = c.reduce("sum", sq)
    # A segment of length <= ddof has no variance: NaN (never a division by 0 or a negative
    # count).  The division is by a safe count where the result is NaN, so that autograd's
    # backward of the unselected branch stays finite.
    if c.length is not None:
        if c.length > ddof:
            var = xp.divide(ss, c.length - ddof, out=c.out(ss))
        else:
            var = c.where(xp.zeros_like(ss, dtype=xp.bool if c.kind == "torch" else bool), ss, math.nan)
    else:
        counts = _astype(c, c.counts(), c.real)
        keep = counts > ddof
        var = c.where(keep, xp.divide(ss, c.where(keep, counts - ddof, 1.0), out=c.out(ss)), math.nan)
    if root:
        # sqrt's derivative is infinite at 0 (0 * inf = NaN in a backward): a zero variance takes
        # the root of 1 and gives 0, so its gradient is 0, as torch.std's is
        positive = var > 0
        var = xp.where(positive, xp.sqrt(c.where(positive, var, 1.0)), var)
    return c.finish(var)


# --- the public functions ---


def _segments(*values: Any) -> dict[str, Any]:
    """The segment keywords of a call, by name (all of them are passed to linred's reductions)."""
    return dict(zip(_SEGMENT_KEYWORDS, values, strict=True))


def segmented_logsumexp(
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
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    segments = _segments(segment_length, offsets, lengths, segment_ids, num_segments, ids_sorted)
    return _run(segmented_logsumexp, _logsumexp, x, segments, axis, dtype, backend, stream, check, remainder, False)


def segmented_softmax(
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
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    segments = _segments(segment_length, offsets, lengths, segment_ids, num_segments, ids_sorted)
    return _run(segmented_softmax, _softmax, x, segments, axis, dtype, backend, stream, check, remainder, False)


def segmented_log_softmax(
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
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    segments = _segments(segment_length, offsets, lengths, segment_ids, num_segments, ids_sorted)
    return _run(segmented_log_softmax, _log_softmax, x, segments, axis, dtype, backend, stream, check, remainder,
                False)  # fmt: skip


def segmented_var(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    ddof: float = 0,
    dtype: Any = None,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    ddof = _check_ddof("segmented_var", ddof)
    segments = _segments(segment_length, offsets, lengths, segment_ids, num_segments, ids_sorted)
    return _run(segmented_var, functools.partial(_var, root=False), x, segments, axis, dtype, backend, stream, check,
                remainder, True, ddof=ddof)  # fmt: skip


def segmented_std(
    x: Any,
    segment_length: int | None = None,
    *,
    offsets: Any = None,
    lengths: Any = None,
    segment_ids: Any = None,
    num_segments: int | None = None,
    ids_sorted: bool | None = None,
    axis: int = 0,
    ddof: float = 0,
    dtype: Any = None,
    backend: BackendName = "auto",
    stream: Any = None,
    check: bool = True,
    remainder: str = "error",
) -> Any:
    ddof = _check_ddof("segmented_std", ddof)
    segments = _segments(segment_length, offsets, lengths, segment_ids, num_segments, ids_sorted)
    return _run(segmented_std, functools.partial(_var, root=True), x, segments, axis, dtype, backend, stream, check,
                remainder, True, ddof=ddof)  # fmt: skip


# --- the docstrings ---

_PARAMETERS = """\
Parameters
----------
x : array_like
    The data: a NumPy array, a CuPy array, a PyTorch tensor (CPU or CUDA), a JAX
    array (CPU or CUDA GPU; returned as a JAX array), or anything
    :func:`numpy.asarray` accepts.  Any layout; it is never modified.  {x_extra}
segment_length : int, optional
    Fixed segment length ``L >= 1`` dividing ``n = x.shape[axis]``, as in
    :func:`segmented_sum`.  The per-segment values are broadcast back through an
    ``(..., m, L, ...)`` view: no index is built.
offsets : array_like of int, optional
    CSR-style offsets, ``m + 1`` non-decreasing values from 0 to ``n``, as in
    :func:`segmented_sum`.
lengths : array_like of int, optional
    Segment lengths, ``m`` non-negative integers summing to ``n``, as in
    :func:`segmented_sum`.
segment_ids : array_like of int, optional
    One segment id per element along ``axis`` (PyG's ``batch`` vector), sorted
    or not, as in :func:`segmented_sum`.  The ids are each element's segment:
    per-segment values go back to the elements through them, with no sort.
    With ``check=False`` ids outside ``[0, num_segments)`` are dropped, as in
    the reductions: their elements belong to no segment, and softmax and
    log_softmax give them NaN.
num_segments : int, optional
    The number of segments named by ``segment_ids``, as in
    :func:`segmented_sum` (default ``max(segment_ids) + 1``).
ids_sorted : bool, optional
    Whether ``segment_ids`` never decrease, as in :func:`segmented_sum`.  The
    reductions after the first run unchecked: on a GPU, sorted ids not promised
    sorted here are sorted again by each of them.
axis : int, default 0
    The axis along which segments run; negative values count from the end.  The
    other axes are carried (feature dimensions, batch dimensions).{ddof}
dtype : dtype, optional
    The result dtype, a real floating dtype; the computation runs in it (in
    float32 for float16 and bfloat16).  By default float32 and float64 data are
    computed and returned in their own dtype, float16 and bfloat16 data are
    computed in float32 and returned in their own dtype, and bool and integer
    data are computed and returned in float64 (as :func:`numpy.mean`).{complex_dtype}
backend : {{"auto", "numpy", "nvmath", "cublas", "cub", "nvrtc"}}, default "auto"
    The backend of every reduction the call makes, as in :func:`segmented_sum`.
stream : optional
    CUDA stream for device data, as in :func:`segmented_sum`: every step of the
    call (reductions and elementwise operations) runs on it.  Must be None for
    host data and for JAX arrays.
check : bool, default True
    Validate ``offsets``, ``lengths`` or ``segment_ids``, once: the first
    reduction checks them, the later ones read the same segments unchecked.
remainder : {{"error", "drop", "keep"}}, default "error"
    As in :func:`segmented_sum`, for a ``segment_length`` that does not divide
    ``n``: refuse the call, drop the last ``n % L`` elements, or keep them as a
    last, shorter segment.{drop}

Returns
-------
array
    {returns}

Raises
------
TypeError, ValueError
    For bad arguments, with a message naming the argument.  {raises}
linred.BackendError
    If the requested backend cannot serve one of the reductions.
"""

_PER_SEGMENT = """\
Shape ``x.shape[:axis] + (m,) + x.shape[axis+1:]``, in the result dtype, of
    ``x``'s array type and on its device."""
_PER_ELEMENT = """\
Shaped like ``x``, in the result dtype, of ``x``'s array type and on its
    device."""
_DROP = """  With ``"drop"`` the result covers the
    elements kept (``n - n % L`` along ``axis``, where they are in ``x``)."""
_DDOF = """
ddof : int or float, default 0
    Delta degrees of freedom: the sum of squared deviations is divided by
    ``length - ddof`` (``ddof=1``: the unbiased sample variance).  A segment of
    length ``<= ddof`` (an empty segment among them) gives NaN."""

_SOFTMAX_NOTES = """\
Computed stably: each segment's maximum is subtracted before ``exp`` (where the
maximum is -inf, 0 is subtracted instead), so that ``exp`` never overflows and the
largest term of each segment's sum is 1.

On a GPU (CuPy arrays, CUDA tensors), C-contiguous float16, bfloat16, float32 or
float64 data with ``segment_length``, ``offsets`` or ``lengths`` and no gradient to
record (a tensor that does not require grad, or ``torch.no_grad``) is computed by one
NVRTC kernel with the same results: each segment is read for its maximum, again for
the sum of ``exp`` (mostly from the cache){write}.
A warp serves a segment, over its rows and features where the features are a power
of two up to 32, a thread a segment's feature otherwise.  ``check=True`` is done by
that kernel as it reads each segment's bounds.

Everything else is composed from linred's reductions and elementwise operations of
the array library (NumPy, CuPy, PyTorch), in {passes}
A per-segment value goes back to the elements through a view for
``segment_length`` and, for ``offsets`` and ``lengths``, a gather through an int64
element -> segment index made once per call on the data's device, without a
synchronization (NumPy data: repeated by the lengths; for ``segment_ids``, the ids
themselves, and each reduction by unsorted ids also sorts them and gathers its
input).  float16 and bfloat16 data cost a pass to convert to float32 and
one back.

For PyTorch tensors that require grad the result has a ``grad_fn``: the
elementwise operations and linred's sum have their backward, and the maximum is
taken without one (it cancels out of the result exactly).  Double backward works.
"""

_VAR_NOTES = """\
Two passes, numerically stable: each segment's mean (:func:`segmented_mean`), then
the sum of the squared deviations from it (:func:`segmented_sum`), divided by
``length - ddof``; never ``E[x^2] - E[x]^2``, which loses every digit when the
mean is large beside the spread.  For complex data the squared magnitudes
``|x - mean|^2`` are summed, so the result is real, as in :func:`numpy.var`.  An
infinity in a segment makes its result NaN; a NaN propagates.  A segment of length
``<= ddof`` gives NaN (NumPy gives NaN, or inf where the squared deviations do not
sum to 0, with a warning).

On a GPU, a call of CuPy arrays or CUDA tensors with nothing to differentiate runs as
one kernel (``linred/kernels/softmax.cuh``; docs/api.md says when): float16, bfloat16
and float32 data with a result of that width is read once, summing each segment's
deviations from its first value and their squares in float64 (the shifted-data
formula: its rounding is magnified by at most the segment's length, where that first
value is an extreme outlier, so a segment of more than 2**20 rows is read again, shifted
by its mean); float64 is read for the mean, then for the squared
deviations.  Elsewhere it is composed from linred's reductions and elementwise
operations of the array library (NumPy, CuPy, PyTorch): the mean reads the data, the
deviations read it again and are written to a temporary, squared in place and summed:
four passes over the data's size.  The means go
back to the elements through a view for ``segment_length``, a gather through an
int64 element -> segment index for ``offsets`` and ``lengths``, and a gather
through the ids for ``segment_ids`` (each reduction by unsorted ids also sorts them
and gathers its input; ids found sorted by the first, checked reduction are not sorted
again).

For PyTorch tensors that require grad the result has a ``grad_fn``, through the
mean and the sum (double backward works).
"""


def _fused_doc(summary: str, extended: str, see_also: str, notes: str, example: str, *, per_element: bool,
               var: bool) -> str:  # fmt: skip
    params = _PARAMETERS.format(
        x_extra="Complex data is\n    reduced through ``|x - mean|^2`` (a real result)."
        if var
        else "Complex data raises\n    ``TypeError`` (the maximum that keeps ``exp`` finite needs an order).",
        ddof=_DDOF if var else "",
        complex_dtype="  complex64 and\n    complex128 data give float32 and float64." if var else "",
        drop=_DROP if per_element else "",
        returns=_PER_ELEMENT if per_element else _PER_SEGMENT,
        raises="A negative ``ddof``\n    raises ``ValueError``." if var else "Complex input raises\n    ``TypeError``.",
    )
    return (
        f"{summary}\n\n{extended}\n\n{params}\nSee Also\n--------\n{see_also}\n\n"
        f"Notes\n-----\n{notes}\nExamples\n--------\n{example}"
    )


segmented_logsumexp.__doc__ = _fused_doc(
    "Log of the sum of the exponentials of each segment of ``x`` along ``axis``.",
    "``log(sum(exp(x)))`` per segment, without overflow: ``mx + log(sum(exp(x - mx)))``\n"
    "with ``mx`` the segment's maximum.  Where ``mx`` is not finite the shift is 0: a\n"
    "segment of -inf only gives -inf, one holding +inf gives +inf, a NaN gives NaN.  An\n"
    "empty segment gives -inf (the log of an empty sum).",
    "segmented_softmax : The softmax, ``exp(x - logsumexp)`` of each element.\n"
    "segmented_log_softmax : The log-softmax, ``x - logsumexp`` of each element.\n"
    "segmented_max : The maximum of each segment.",
    _SOFTMAX_NOTES.format(
        passes="three passes over the data: the maximum, ``exp(x - max)``\nwritten to a temporary, its sum.",
        write=",\nits logarithm written per segment",
    ),
    """\
>>> import numpy as np
>>> import linred
>>> x = np.array([1.0, 2.0, 3.0, 0.0, 1000.0, 1000.0])
>>> linred.segmented_logsumexp(x, offsets=[0, 3, 4, 4, 6])
array([   3.40760596,    0.        ,          -inf, 1000.69314718])
>>> linred.segmented_logsumexp(np.array([-np.inf, -np.inf, np.inf, 1.0]), 2)
array([-inf,  inf])

Segments along the last axis of a 2-D array:

>>> r = linred.segmented_logsumexp(np.arange(8, dtype=np.float32).reshape(2, 4), 2, axis=1)
>>> np.round(r, 4)
array([[1.3133, 3.3133],
       [5.3133, 7.3133]], dtype=float32)
""",
    per_element=False,
    var=False,
)
segmented_softmax.__doc__ = _fused_doc(
    "Softmax of each segment of ``x`` along ``axis``: ``exp(x)`` normalized to sum to 1 in each segment.",
    "Each element becomes ``exp(x - mx) / sum(exp(x - mx))`` over its segment, with\n"
    "``mx`` the segment's maximum: the attention weights of a graph attention layer\n"
    "(the scores of each node's incoming edges, normalized per node), or a softmax over\n"
    "ragged rows.  As ``torch.softmax``: a segment of -inf only gives NaN (0/0),\n"
    "and a segment holding +inf or NaN gives NaN for all its elements.",
    "segmented_log_softmax : Its log, computed without the log of a quotient.\n"
    "segmented_logsumexp : The log of each segment's normalizer.",
    _SOFTMAX_NOTES.format(
        passes="four passes over the data: the maximum, ``exp(x - max)``\n"
        "written to a temporary, its sum, the division written in place.",
        write=",\nonce more, to write each element",
    ),
    """\
>>> import numpy as np
>>> import linred

Attention over a graph's edges: the scores of 5 edges (2 heads), sorted by
destination node, node 0 receiving edges 0-1 and node 1 edges 2-4 (CSR
``dst_ptr``); each node's incoming weights sum to 1, per head:

>>> scores = np.array([[0.5, 1.0], [1.5, -1.0], [0.0, 0.0], [2.0, 0.5], [-1.0, 3.0]], dtype=np.float32)
>>> dst_ptr = np.array([0, 2, 5])
>>> alpha = linred.segmented_softmax(scores, offsets=dst_ptr)
>>> np.round(alpha, 4)
array([[0.2689, 0.8808],
       [0.7311, 0.1192],
       [0.1142, 0.044 ],
       [0.8438, 0.0725],
       [0.042 , 0.8835]], dtype=float32)
>>> messages = np.ones((5, 2, 3), dtype=np.float32)  # (edges, heads, features)
>>> linred.segmented_sum(alpha[:, :, None] * messages, offsets=dst_ptr).shape  # (nodes, heads, features)
(2, 2, 3)

A segment of -inf only gives NaN, as in PyTorch:

>>> linred.segmented_softmax(np.array([1.0, 1.0, -np.inf, -np.inf, 0.0, -np.inf]), lengths=[2, 2, 2])
array([0.5, 0.5, nan, nan, 1. , 0. ])
""",
    per_element=True,
    var=False,
)
segmented_log_softmax.__doc__ = _fused_doc(
    "Log-softmax of each segment of ``x`` along ``axis``: ``x - logsumexp`` of its segment.",
    "Each element becomes ``(x - mx) - log(sum(exp(x - mx)))`` over its segment, with\n"
    "``mx`` the segment's maximum: accurate also where the softmax itself underflows\n"
    "to 0 (no log of a quotient).  As ``torch.log_softmax``: a segment of -inf\n"
    "only gives NaN, and a segment holding +inf or NaN gives NaN for all its elements.",
    "segmented_softmax : Its exponential.\nsegmented_logsumexp : The log of each segment's normalizer.",
    _SOFTMAX_NOTES.format(
        passes="five passes over the data: the maximum, ``x - max`` written to\n"
        "a temporary, its ``exp`` written to another, their sum, the subtraction of the\nlog written in place.",
        write=",\nonce more, to write each element",
    ),
    """\
>>> import numpy as np
>>> import linred
>>> linred.segmented_log_softmax(np.array([1.0, 2.0, 3.0, 1e9, 1e9 + 1.0]), lengths=[3, 2])
array([-2.40760596, -1.40760596, -0.40760596, -1.31326169, -0.31326169])
""",
    per_element=True,
    var=False,
)
segmented_var.__doc__ = _fused_doc(
    "Variance of each segment of ``x`` along ``axis``.",
    "The mean of each segment's squared deviations from its mean, divided by\n"
    "``length - ddof`` instead of the length when ``ddof`` is given, as in\n"
    ":func:`numpy.var`.",
    "segmented_std : Its square root.\nsegmented_mean : The mean of each segment.",
    _VAR_NOTES,
    """\
>>> import numpy as np
>>> import linred
>>> x = np.array([1.0, 2.0, 3.0, 4.0, 10.0, 7.0])
>>> linred.segmented_var(x, lengths=[4, 1, 1, 0])
array([1.25, 0.  , 0.  ,  nan])
>>> linred.segmented_var(x, lengths=[4, 1, 1, 0], ddof=1)
array([1.66666667,        nan,        nan,        nan])

Complex data has a real variance:

>>> linred.segmented_var(np.array([1 + 1j, -1 - 1j, 2j, 2j]), 2)
array([2., 0.])
""",
    per_element=False,
    var=True,
)
segmented_std.__doc__ = _fused_doc(
    "Standard deviation of each segment of ``x`` along ``axis``.",
    "The square root of :func:`segmented_var` (same ``ddof``), as in :func:`numpy.std`.",
    "segmented_var : The variance of each segment.\nsegmented_mean : The mean of each segment.",
    _VAR_NOTES,
    """\
>>> import numpy as np
>>> import linred
>>> linred.segmented_std(np.array([2, 4, 4, 4, 5, 5, 7, 9]), 8)
array([2.])

Two passes keep the digits that E[x^2] - E[x]^2 would lose:

>>> linred.segmented_std(np.array([1e9 + 1, 1e9 + 2, 1e9 + 3]), 3)
array([0.81649658])
>>> r = linred.segmented_std(np.arange(12, dtype=np.float32).reshape(6, 2), offsets=[0, 2, 6], ddof=1)
>>> np.round(r, 4)
array([[1.4142, 1.4142],
       [2.582 , 2.582 ]], dtype=float32)
""",
    per_element=False,
    var=True,
)
