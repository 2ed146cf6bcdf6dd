"""The gradients of the fused functions (logsumexp, softmax, log_softmax, var, std) for PyTorch.

A tensor that requires grad used to take the composition of :mod:`linred._fused`, whose
autograd records every step: a segmented maximum, a gather, a subtraction, ``exp``, a
segmented sum, another gather and a division for a softmax, the same again backwards, and
on the GPU none of it in :mod:`linred._softmax_kernel`'s one kernel.  :class:`FusedGrad`
instead computes the forward as a call without autograd (the kernel where it serves the
call) and the backward from the derivative itself:

============  ===============================================================
softmax y     dx = y * (g - E(S(g * y)))
log_softmax y dx = g - exp(y) * E(S(g))
logsumexp r   dx = exp(x - E(r)) * E(g)
var v         dx = (x - E(mean)) * E(2 g / (count - ddof));  0 where count <= ddof
std s         dx = (x - E(mean)) * E(g / ((count - ddof) s)); 0 where count <= ddof or s is 0
============  ===============================================================

where ``S`` is a segmented sum and ``E`` spreads a per-segment value over its segment's
elements.  These are the composition's derivatives, written out: its non-finite cases give
the same NaN and 0 (a softmax segment of -inf, a logsumexp segment holding +inf, a variance
of too few elements); for var and std they are ``torch.var``'s and ``torch.std``'s, which
leave out the term through the mean (0 in exact arithmetic), so a segment holding an infinity
gives -inf and NaN where the composition gave NaN throughout.

On the GPU the backward is one kernel (``linred/kernels/softmax_grad.cuh``, where the
forward's kernel would take the call's workers); for one feature column of segments those
workers would each read alone (or long on average, or among which the checked forward's kernel
listed one far longer than the others), linred's reductions make the per-segment values (the
sum of ``g * y``, of ``g``, the mean) and one kernel writes ``dx`` (``grad_from_parts``); for
CPU tensors it is NumPy on the views of their memory.  Where the
backward records a graph (``create_graph=True``), and wherever neither applies, it is made of
PyTorch operations and linred's differentiable reductions, so that second derivatives come out
as the composition's did.

The composition keeps the calls that this does not take: segment ids, complex data,
``torch.func`` transforms and ``torch.compile`` (which trace it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from linred import _plan_cache, _softmax_kernel
from linred._dtypes import dtype_name
from linred._torch_ops import _expand, _index, _is_legacy_batched, _reduce, _spread_rows
from linred.backends import unavailable

__all__ = ["FusedGrad", "takes"]

_PER_ELEMENT = frozenset(("segmented_softmax", "segmented_log_softmax"))


def takes(x: Any, segments: dict[str, Any], compute: str) -> bool:
    """Whether :class:`FusedGrad` takes a call of tensor ``x`` that autograd records (eager,
    outside ``torch.func`` transforms): segments given as a fixed length, offsets or lengths, and
    a real computation dtype."""
    if torch.compiler.is_compiling() or torch._C._functorch.maybe_current_level() is not None:
        return False
    if segments.get("segment_ids") is not None or segments.get("num_segments") is not None:
        return False
    return compute in ("float16", "bfloat16", "float32", "float64")


class FusedGrad(torch.autograd.Function):
    """``name`` of ``x`` (``forward``: ``compute(x)`` without autograd) with its derivative.

    ``offsets`` and ``lengths`` are the call's (tensors on ``x``'s device, or None),
    ``segment_length`` its fixed length (or None), ``axis`` normalized, ``compute`` the
    computation dtype's name, ``ddof`` var's and std's.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        offsets: torch.Tensor | None,
        lengths: torch.Tensor | None,
        segment_length: int | None,
        axis: int,
        name: str,
        compute: str,
        ddof: float,
        run: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        _softmax_kernel.forget_listed()
        out = run(x.detach())
        # (a very long segment among the others, which the forward's kernel listed: its backward
        # from per-segment values, which spread it over the GPU, see _in_one_kernel)
        ctx.very_long = _softmax_kernel.listed_last()
        offsets, lengths = _index(offsets), _index(lengths)
        ctx.name, ctx.axis, ctx.ddof = name, axis, ddof
        ctx.segment_length = None if segment_length is None else int(segment_length)
        ctx.n, ctx.ndim, ctx.x_dtype = x.shape[axis], x.dim(), x.dtype
        ctx.compute = getattr(torch, compute)
        ctx.out_dtype = out.dtype
        # What the derivative reads, as torch.softmax's, torch.logsumexp's, torch.var's and
        # torch.std's backwards do: the result (softmax, log_softmax), the data and the result
        # (logsumexp, std), the data (var).  Modifying one of them in place before the backward
        # makes PyTorch's version check raise.
        if name in _PER_ELEMENT:
            ctx.save_for_backward(offsets, lengths, out)
        elif name == "segmented_var":
            ctx.save_for_backward(offsets, lengths, x)
        else:
            ctx.save_for_backward(offsets, lengths, x, out)
        return out

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        from linred._torch_ops import _NO_FORWARD_AD

        raise TypeError(_NO_FORWARD_AD)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        nones = (None,) * 8
        offsets, lengths, *saved = ctx.saved_tensors
        if ctx.n == 0 or g.numel() == 0:
            return (torch.zeros((*g.shape[: ctx.axis], ctx.n, *g.shape[ctx.axis + 1 :]), dtype=ctx.x_dtype,
                                device=g.device), *nones)  # fmt: skip
        spec = (offsets, None if offsets is not None else lengths, ctx.segment_length, ctx.axis)
        if _plain(g):  # (on the GPU its kernels, on the host NumPy)
            on = {"cuda": _in_one_kernel, "cpu": _on_the_host}.get(g.device.type)
            fast = on(ctx, g, offsets, lengths, saved) if on is not None else None
            if fast is not None:
                return (fast, *nones)
        seg = _Segments(ctx, spec, offsets, lengths)
        g = g.to(ctx.compute)
        name = ctx.name
        if name == "segmented_softmax":
            y = saved[0].to(ctx.compute)
            gx = y * (g - seg.spread(seg.sum(g * y)))
        elif name == "segmented_log_softmax":
            y = saved[0].to(ctx.compute)
            gx = g - y.exp() * seg.spread(seg.sum(g))
        elif name == "segmented_logsumexp":
            x, r = (t.to(ctx.compute) for t in saved)
            gx = (x - seg.spread(r)).exp() * seg.spread(g)
        else:  # var and std
            x = saved[0].to(ctx.compute)
            v = saved[1].to(ctx.compute) if name == "segmented_std" else None
            d = x - seg.spread(_reduce(x, spec, "mean"))
            free = seg.counts(g) - ctx.ddof  # (count - ddof, shaped like the result)
            if name == "segmented_var":
                keep, scale = free > 0, 2.0
            else:  # d std / d var = 1 / (2 std): a zero std passes nothing, a NaN one NaN
                keep, scale = (free > 0) & (v != 0), 1.0
                free = free * torch.where(keep, v, 1.0)
            gx = d * seg.spread(torch.where(keep, scale * g / torch.where(keep, free, 1.0), 0.0))
        return (gx.to(ctx.x_dtype), *nones)


_KERNEL_DTYPES = frozenset(("float16", "bfloat16", "float32", "float64"))


def _plain(g: torch.Tensor) -> bool:
    """Whether a backward's gradient ``g`` may be computed outside autograd: not a backward that
    records a graph (double backward needs the differentiable operations), not autograd's own
    batched gradients, not a ``torch.func`` wrapper or a traced tensor."""
    return (
        type(g) is torch.Tensor
        and not torch.is_grad_enabled()
        and not _is_legacy_batched(g)
        and torch._C._functorch.maybe_current_level() is None
    )


def _in_one_kernel(ctx: Any, g: torch.Tensor, offsets: Any, lengths: Any, saved: list) -> torch.Tensor | None:
    """The derivative of CUDA tensors (``g`` is :func:`_plain`) in one kernel
    (``linred/kernels/softmax_grad.cuh``, the same formulas), from per-segment values where one
    feature column's segments are long (:func:`_from_parts`), or None where neither applies:
    data that is not C-contiguous, feature rows that the workers' kernel would not take."""
    a = saved[0]  # (the result for softmax and log_softmax; else the data, then the result for logsumexp and std)
    names = (dtype_name(a.dtype), dtype_name(ctx.out_dtype), dtype_name(ctx.x_dtype))
    if not _KERNEL_DTYPES.issuperset(names) or not a.is_contiguous() or unavailable("nvrtc") is not None:
        return None
    device = g.device.index
    if "bfloat16" in names:
        from linred.backends.nvrtc import _compute_capability

        if _compute_capability(device) < (8, 0):
            return None
    if ctx.segment_length is not None:
        segments, m = {"segment_length": ctx.segment_length}, ctx.n // ctx.segment_length
    else:
        if offsets is None:
            offsets = torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0))
        segments, m = {"offsets": offsets}, offsets.shape[0] - 1
    one_column = math.prod(a.shape[ctx.axis + 1 :]) == 1  # (feature rows: never from the parts)
    least = _softmax_kernel.GRAD_PARTS_MIN_MEAN.get(ctx.name)
    # (long enough on average that two passes win; or one segment far longer than the others,
    # which one worker would read alone for as long as the rest of the call takes)
    if one_column and m > 0 and ((least is not None and ctx.n >= least * m) or ctx.very_long):
        return _from_parts(ctx, g, offsets, m, a, saved, names, device)
    if not _softmax_kernel._enough_workers(a, ctx.axis, segments, device, ctx.name, True, a.element_size()):
        return _from_parts(ctx, g, offsets, m, a, saved, names, device) if one_column else None
    g = g.to(ctx.out_dtype).contiguous()
    res = saved[1].contiguous() if ctx.name in ("segmented_logsumexp", "segmented_std") else None
    dx = torch.empty(a.shape, dtype=ctx.x_dtype, device=g.device)
    compute = dtype_name(ctx.compute)
    pointers = (a.data_ptr(), g.data_ptr(), 0 if res is None else res.data_ptr(), dx.data_ptr(),
                0 if offsets is None else offsets.data_ptr())  # fmt: skip
    index = None if offsets is None else dtype_name(offsets.dtype)
    stream = torch.cuda.current_stream(g.device).cuda_stream
    _softmax_kernel.run_backward(ctx.name, (names[0], names[1], names[2], compute), pointers, tuple(a.shape),
                                 ctx.axis, m, ctx.segment_length, index, ctx.ddof, device, stream)  # fmt: skip
    return dx


def _from_parts(
    ctx: Any, g: torch.Tensor, offsets: Any, m: int, a: torch.Tensor, saved: list, names: tuple, device: int
) -> torch.Tensor:
    """The derivative of one feature column of CUDA tensors whose segments the backward kernel's
    workers would each read alone (few, or long on average), from per-segment values
    (``linred_grad_from_parts``, softmax_grad.cuh): the sums and means linred's reductions make
    (softmax's of ``g * y``, log_softmax's of ``g``, var's and std's mean of ``x``), which spread a
    long segment over the whole GPU, then one pass over the elements (``a`` one column: feature
    rows keep the composition).  The composition's formulas, computed in float32 (float64 for
    float64)."""
    axis, shape = ctx.axis, tuple(a.shape)
    batch, n, name = math.prod(shape[:axis]), shape[axis], ctx.name
    c = "float64" if ctx.compute == torch.float64 else "float32"  # (the kernel's C)
    g = g.to(ctx.out_dtype).contiguous()

    def per_segment(reduction: str, v: torch.Tensor) -> torch.Tensor:  # (unchecked: the forward checked them)
        return _plan_cache.call(reduction, v, ctx.segment_length, offsets, None, axis, c, None, "auto", None, False)

    p = res = None
    if name == "segmented_softmax":
        tc = getattr(torch, c)
        p = per_segment("sum", g.to(tc) * a.to(tc))
    elif name == "segmented_log_softmax":
        p = per_segment("sum", g)
    elif name in ("segmented_var", "segmented_std"):
        p = per_segment("mean", a)
    if name in ("segmented_logsumexp", "segmented_std"):
        res = saved[1].contiguous()
    dx = torch.empty(shape, dtype=ctx.x_dtype, device=g.device)
    pointers = (a.data_ptr(), g.data_ptr(), 0 if res is None else res.data_ptr(), 0 if p is None else p.data_ptr(),
                dx.data_ptr(), 0 if offsets is None else offsets.data_ptr())  # fmt: skip
    index = None if offsets is None else dtype_name(offsets.dtype)
    stream = torch.cuda.current_stream(g.device).cuda_stream
    _softmax_kernel.run_grad_from_parts(name, (names[0], names[1], names[2], c), pointers, batch, n, m,
                                        ctx.segment_length, index, ctx.ddof, device, stream)  # fmt: skip
    return dx


def _on_the_host(ctx: Any, g: torch.Tensor, offsets: Any, lengths: Any, saved: list) -> torch.Tensor | None:
    """The derivative of CPU tensors (``g`` is :func:`_plain`) on the NumPy views of their memory
    (the same formulas; the sums are linred's, the spreads ``np.repeat``), or None where NumPy
    cannot view a tensor (bfloat16, a conjugate or negative bit).  PyTorch's
    ``repeat_interleave`` on the host cost more than the rest of the backward."""
    try:
        gn, a = g.numpy(), saved[0].numpy()
        res = saved[1].numpy() if len(saved) > 1 else None
        offs = None if offsets is None else offsets.numpy()
        lens = None if lengths is None or offs is not None else lengths.numpy()
        x_dtype = torch.empty(0, dtype=ctx.x_dtype).numpy().dtype
    except (RuntimeError, TypeError):
        return None
    compute = np.float64 if ctx.compute == torch.float64 else np.float32
    axis, length, name = ctx.axis, ctx.segment_length, ctx.name
    counts = length if length is not None else (np.diff(offs) if offs is not None else lens)

    def reduce(reduction: str, v: Any) -> Any:  # (checked by the forward)
        return _plan_cache.call(reduction, v, length, offs, lens, axis, None, None, "auto", None, False)

    def spread(r: Any) -> Any:
        return np.repeat(r, counts, axis=axis)

    gg = gn.astype(compute, copy=False)

    def quiet() -> Any:  # (elementwise NaN and infinities are the results, as PyTorch's)
        return np.errstate(all="ignore")

    # (linred's sums outside it: their warnings reach the caller's line, as the forward's do)
    if name in _PER_ELEMENT:
        y = a.astype(compute, copy=False)
        if name == "segmented_softmax":
            with quiet():
                gy = gg * y
            total = spread(reduce("sum", gy))
            with quiet():
                gx = y * (gg - total)
        else:
            total = spread(reduce("sum", gg))
            with quiet():
                gx = gg - np.exp(y) * total
    elif name == "segmented_logsumexp":
        with quiet():
            gx = np.exp(a.astype(compute, copy=False) - spread(res.astype(compute, copy=False))) * spread(gg)
    else:  # var and std
        xc = a.astype(compute, copy=False)
        mean = spread(reduce("mean", xc))
        shape = [1] * gg.ndim
        shape[axis] = -1
        free = np.reshape(np.asarray(counts, dtype=compute), shape if length is None else ()) - compute(ctx.ddof)
        with quiet():
            if name == "segmented_var":
                scale = np.where(free > 0, 2 * gg / np.where(free > 0, free, 1), 0)
            else:
                sd = res.astype(compute, copy=False)
                keep = (free > 0) & (sd != 0)
                scale = np.where(keep, gg / np.where(keep, free * sd, 1), 0)
            gx = (xc - mean) * spread(scale.astype(compute, copy=False))
    return torch.from_numpy(np.ascontiguousarray(gx.astype(x_dtype, copy=False)))


class _Segments:
    """The backward's per-segment plumbing: ``sum`` (linred's, unchecked: the forward checked the
    segments), ``spread`` (per-segment values over their elements) and ``counts``."""

    def __init__(self, ctx: Any, spec: tuple, offsets: Any, lengths: Any) -> None:
        self.ctx, self.spec, self.offsets, self._lengths = ctx, spec, offsets, lengths

    @property
    def lengths(self) -> torch.Tensor:
        """The segments' lengths (made from the offsets the first time they are needed)."""
        if self._lengths is None:
            self._lengths = self.offsets.diff()
        return self._lengths

    def sum(self, v: torch.Tensor) -> torch.Tensor:
        if _is_legacy_batched(v):
            # (autograd's own vmap, jacobian(vectorize=True): a batched tensor has no memory that
            # linred's reductions could read; PyTorch's segmented sum runs under its vmap)
            ctx = self.ctx
            if ctx.segment_length is not None:
                shape = (*v.shape[: ctx.axis], -1, ctx.segment_length, *v.shape[ctx.axis + 1 :])
                return v.reshape(shape).sum(ctx.axis + 1)
            offsets = self.offsets
            if offsets is None:
                offsets = torch.nn.functional.pad(torch.cumsum(self.lengths, 0), (1, 0))
            offsets = offsets.long().expand(*v.shape[: ctx.axis], -1)
            return torch.segment_reduce(v, "sum", offsets=offsets, axis=ctx.axis, unsafe=True)
        return _reduce(v, self.spec, "sum")

    def spread(self, r: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        if ctx.segment_length is not None:
            return _expand(ctx, r, None)
        fast = _spread_rows(_SpreadContext(ctx, r.dtype), r, self.offsets, self._lengths, "sum")
        return fast if fast is not None else _expand(ctx, r, self.lengths)

    def counts(self, like: torch.Tensor) -> torch.Tensor:
        """Each segment's element count in ``like``'s dtype, broadcastable against ``like``."""
        ctx = self.ctx
        if ctx.segment_length is not None:
            return torch.full((), ctx.segment_length, dtype=like.dtype, device=like.device)
        shape = [1] * like.dim()
        shape[ctx.axis] = -1
        return self.lengths.to(like.dtype).reshape(shape)


class _SpreadContext:
    """``ctx`` as :func:`linred._torch_ops._spread_rows` reads it, for values of ``dtype``."""

    def __init__(self, ctx: Any, dtype: torch.dtype) -> None:
        self.segment_length, self.axis, self.ndim, self.n = ctx.segment_length, ctx.axis, ctx.ndim, ctx.n
        self.x_dtype = dtype
