"""linred's reductions as a PyTorch operator: autograd and ``torch.compile``.

``linred::segmented_reduce`` is registered through :mod:`torch.library` (a
``custom_op`` with a fake implementation for tracing and an autograd formula), so
that a tensor that requires grad gets a ``grad_fn`` and ``torch.compile`` (also with
``fullgraph=True``) puts the reduction in its graph instead of breaking it.  The
operator's implementation is linred's own call path (:func:`linred._plan_cache.call`):
the same backends, plans and checks as any other call.

The public functions take this route only where it is needed, so that an ordinary
call pays nothing for it: inside ``torch.compile``.  An eager call on a tensor that
requires grad (grad mode on) records the same backward through a plain
``torch.autograd.Function``, whose dispatch costs far less than the operator's; so does
a call inside a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``), whose
``setup_context`` and ``vmap`` rule that Function has (the operator's autograd, built by
PyTorch, has no ``setup_context``).  Everything else goes straight to the plan cache.

Gradients (see docs/torch.md):

- sum: each element gets its segment's gradient; mean: divided by the segment length.
  Their backward is made of differentiable PyTorch operations, so double backward works.
- max/min: the gradient goes to one element per segment, the first that attains the
  maximum (minimum), as :func:`linred.segmented_argmax` (``argmin``) finds it; the others get 0.
"""

import functools
import math
import re
from typing import Any, Optional

import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor

from linred import _plan_cache
from linred._arg import first_positions
from linred._dtypes import FLOATING, dtype_name, resolve
from linred._frontend import check_flag, normalize_axis
from linred.arrays.views import numpy_views
from linred.segments import segment_length_value

__all__ = ["run", "segmented_reduce"]


#: the backends a CPU tensor's call may take as the NumPy view of its memory (:func:`_call`);
#: other backends refuse host data, and keep naming the tensor in their messages
_HOST_BACKENDS = frozenset(("auto", "numpy"))


def _call(
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
    """:func:`linred._plan_cache.call`, with CPU tensors served as NumPy arrays.

    A CPU tensor, its CPU offsets or lengths and a CPU ``out`` go in as the NumPy views of
    their memory (no copy): the call then takes the plans of NumPy arrays, whose host
    executors read NumPy's arrays directly, where a tensor's call would make NumPy views of
    every array inside every call, and allocate and reshape through PyTorch (2 cores, 64 x 4
    float32 rows in 4 segments: 63 against 19 µs a call; the same results, which the NumPy
    backend computes either way).  The result comes back as a tensor over the result's memory.
    Tensors NumPy cannot view (bfloat16, a conjugate or negative bit; complex32 is refused) and calls
    with a stream or another backend take the tensor's own route.
    """
    if type(x) is Tensor and x.is_cpu and stream is None and type(backend) is str and backend in _HOST_BACKENDS:
        # (a CUDA segment tensor is refused by the tensor's route with its own message, and an out
        # that requires grad refused or detached there: those calls take it; so do outs that are
        # not tensors)
        views = (
            None
            if out is not None and type(out) is not Tensor
            else numpy_views(x.detach() if x.requires_grad else x, offsets, lengths, out)
        )
        if views is not None:
            xn, offs, lens, outn = views
            result = _plan_cache.call(reduction, xn, segment_length, offs, lens, axis, dtype, outn, backend, None,
                                      check)  # fmt: skip
            if out is not None:
                torch.autograd.graph.increment_version(out)  # (written through its NumPy view)
                return out
            # (dtype="bfloat16": ml_dtypes' type, which torch cannot take; kind first: .name is slow)
            if result.dtype.kind == "V" and result.dtype.name == "bfloat16":
                return torch.from_numpy(result.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(result)
    return _plan_cache.call(reduction, x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)


_call._torchdynamo_disable = True  # type: ignore[attr-defined]  (as the plan cache: run eagerly)
_call._torchdynamo_disable_msg = "linred runs this call eagerly, outside the graph"  # type: ignore[attr-defined]


@torch.library.custom_op("linred::segmented_reduce", mutates_args=())
def segmented_reduce(
    x: Tensor,
    offsets: Optional[Tensor],  # noqa: UP045 (torch.library reads these annotations at runtime)
    lengths: Optional[Tensor],  # noqa: UP045
    segment_length: Optional[int],  # noqa: UP045
    axis: int,
    reduction: str,
    dtype: Optional[str],  # noqa: UP045
    backend: str,
    check: bool,
) -> Tensor:
    """One linred call: ``segmented_<reduction>(x, segment_length, offsets=..., lengths=..., ...)``."""
    return _call(reduction, x, segment_length, offsets, lengths, axis, dtype, None, backend, None, check)


@segmented_reduce.register_fake
def _(x, offsets, lengths, segment_length, axis, reduction, dtype, backend, check):
    axis = axis % x.dim()
    if segment_length is not None:
        m = x.shape[axis] // segment_length
    elif offsets is not None:
        m = offsets.shape[0] - 1
    else:
        m = lengths.shape[0]
    _, out_dtype = resolve(reduction, dtype_name(x.dtype), dtype)
    shape = list(x.shape)
    shape[axis] = m
    return x.new_empty(shape, dtype=getattr(torch, out_dtype))  # linred's dtype names are torch's


@torch.library.custom_op("linred::segment_ids_offsets", mutates_args=())
def segment_ids_offsets(ids: Tensor, sorted_ids: Tensor, num_segments: int) -> Tensor:
    """The offsets of ``num_segments`` segments that ``sorted_ids`` (``ids`` sorted) make, after
    the ``ValueError`` of ids outside ``[0, num_segments)``, which names the first one in the
    caller's order (one read back on a device): a checked call with segment ids inside
    ``torch.compile`` raises what it raises outside, not the offsets' error (in-range sorted ids
    make valid offsets: the reduction need not check them again)."""
    if ids.shape[0]:
        if ids.is_cuda:
            from linred.arrays import adapter_for
            from linred.segments import _refuse_capture  # (a read back: no capture allows it)

            _refuse_capture(adapter_for(ids), ids, "segment_ids")
        if bool(((ids < 0) | (ids >= num_segments)).any()):
            from linred._segment_ids import outside_error

            raise outside_error(ids, num_segments)
    values = torch.arange(num_segments + 1, device=sorted_ids.device, dtype=sorted_ids.dtype)
    return torch.searchsorted(sorted_ids, values)


@segment_ids_offsets.register_fake
def _(ids, sorted_ids, num_segments):
    return sorted_ids.new_empty((num_segments + 1,), dtype=torch.int64)


def _index(t: Tensor | None) -> Tensor | None:
    """Offsets or lengths as the backward's operations take them: int32 and int64 as they are,
    narrower or unsigned integers as int64 (``repeat_interleave``, ``diff`` and ``cumsum`` have no
    kernels for int8, int16 or the unsigned types)."""
    return t if t is None or t.dtype in (torch.int64, torch.int32) else t.long()


def _setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, offsets, lengths, segment_length, axis, reduction = inputs[:6]
    offsets, lengths = _index(offsets), _index(lengths)
    ctx.axis = axis % x.dim()
    ctx.segment_length = segment_length
    ctx.reduction = reduction
    ctx.n = x.shape[ctx.axis]
    ctx.x_dtype = x.dtype
    ctx.ndim = x.dim()
    if reduction in ("max", "min", "prod"):
        ctx.save_for_backward(offsets, lengths, x, output)
    else:
        ctx.save_for_backward(offsets, lengths)


def _expand(ctx: Any, t: Tensor, lengths: Optional[Tensor]) -> Tensor:  # noqa: UP045
    """``t`` (one value per segment along the axis) repeated over each segment's elements."""
    if ctx.segment_length is not None:
        return t.repeat_interleave(ctx.segment_length, dim=ctx.axis)
    # output_size: the length is known, so no synchronization to learn it
    return t.repeat_interleave(lengths, dim=ctx.axis, output_size=ctx.n)


def _saved(ctx: Any) -> tuple:
    """The tensors the forward saved; outside any ``torch.func`` transform, a torch.func wrapper
    among them (``vjp``'s pullback called after ``vjp`` returned: its level is over) is the tensor
    it wraps, which linred's kernels can read (the wrapper has no memory of its own)."""
    saved = ctx.saved_tensors
    if _transform_level() is not None:
        return saved
    return tuple(_unwrapped(t) for t in saved)


def _unwrapped(t: Tensor | None) -> Tensor | None:
    while t is not None and torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def _backward(ctx: Any, grad: Tensor) -> tuple:
    nones = (None,) * 8
    if ctx.reduction in ("max", "min"):
        offsets, lengths, x, extreme = _saved(ctx)
        if ctx.n == 0:
            return (torch.zeros(x.shape, dtype=ctx.x_dtype, device=x.device), *nones)
        arg = _arg(ctx, x, extreme, offsets, lengths)
        # (in place into new zeros, except under torch.func, or a batched backward such as
        # jacobian(vectorize=True), whose vmap takes no in-place write of a batched gradient into
        # an unbatched tensor)
        batched = _transform_level() is not None or _is_legacy_batched(grad)
        scatter_add = torch.Tensor.scatter_add if batched else torch.Tensor.scatter_add_
        if ctx.axis == 0:
            # An empty segment's position is n: its gradient goes to a row past the end, cut off.
            gx = torch.zeros((ctx.n + 1, *x.shape[1:]), dtype=grad.dtype, device=grad.device)
            gx = scatter_add(gx, 0, arg, grad)[: ctx.n]
        else:  # (the same, without a cut along another axis, which would leave a strided gradient)
            chosen = arg < ctx.n  # empty segments choose no element
            gx = torch.zeros(x.shape, dtype=grad.dtype, device=grad.device)
            gx = scatter_add(gx, ctx.axis, arg.clamp(max=ctx.n - 1), grad.masked_fill(~chosen, 0))
        return (gx.to(ctx.x_dtype), *nones)
    if ctx.reduction == "prod":
        return (_prod_backward(ctx, grad), *nones)
    offsets, lengths = _saved(ctx)
    fast = _spread_rows(ctx, grad, offsets, lengths)
    if fast is not None:
        return (fast, *nones)
    if lengths is None and offsets is not None:
        lengths = offsets.diff()
    if ctx.reduction == "mean":
        if ctx.segment_length is not None:
            grad = grad / ctx.segment_length
        else:
            shape = [1] * ctx.ndim
            shape[ctx.axis] = -1
            grad = grad / lengths.clamp(min=1).to(grad.dtype).reshape(shape)
    return (_expand(ctx, grad, lengths).to(ctx.x_dtype), *nones)


def _spread_rows(
    ctx: Any,
    grad: Tensor,
    offsets: Tensor | None,
    lengths: Tensor | None,
    reduction: str | None = None,
    differentiable: bool = True,
) -> Tensor | None:
    """The gradient of a sum or mean of CUDA feature rows with offsets (or lengths) along axis 0,
    through ``torch.segment_reduce``'s own backward kernel, or None where it does not apply.

    PyTorch's gather kernels, which ``repeat_interleave`` and ``index_select`` use, spread
    per-segment rows slowly: 10^7 x 16 float32 rows from 10^5 segments took 6.1 ms on an H100,
    against 0.44 ms through this kernel (the same bits; 1.8x at 10^6 x 128).  With one feature
    column it is the slower (0.2 against 0.1 ms), and it has no derivative of its own, so
    double backward (grad mode on inside the backward) and traced calls (fake tensors) keep
    the differentiable ``_expand``.  ``reduction="sum"`` with ``differentiable=False`` spreads
    values that need no gradient (a max's result, to compare each element with).
    """
    if (
        ctx.segment_length is not None
        or ctx.axis != 0
        or ctx.ndim < 2
        or grad.device.type != "cuda"
        or type(grad) is not Tensor  # (a FakeTensor or FunctionalTensor under tracing)
        or _transform_level() is not None  # (a torch.func wrapper: no batching rule for the kernel)
        or _is_legacy_batched(grad)  # (autograd's own vmap: jacobian(vectorize=True); repeat_interleave has a rule)
        or (differentiable and torch.is_grad_enabled())
        or grad.dtype != ctx.x_dtype
        or grad.shape[0] == 0  # (no segment: nothing for the kernel; grad[0] would not exist)
        or math.prod(grad.shape[1:]) < 2
    ):
        return None
    if offsets is None:
        offsets = torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0))
    try:
        return torch.ops.aten._segment_reduce_backward(
            grad.contiguous(), grad, grad.new_empty((ctx.n, *grad.shape[1:])), reduction or ctx.reduction,
            offsets=offsets.long(), axis=0,
        )  # fmt: skip
    except (RuntimeError, AttributeError, NotImplementedError):  # a PyTorch without it, or a dtype it lacks
        return None


def _reduce(x: Tensor, spec: tuple, reduction: str) -> Tensor:
    """``segmented_<reduction>(x)`` over ``spec`` (offsets, lengths, segment length, axis), unchecked,
    inside a backward: through the operator where it is traced (fake tensors, or inside
    ``torch.compile``), else straight to the plan cache (the operator's dispatch costs about 45 µs
    a call on the host), or through :class:`_EagerReduce` where double backward needs its graph
    (:class:`_TransformedReduce` inside ``torch.func`` transforms, whose tensors may be wrappers)."""
    args = (x, *spec, reduction, None, "auto", False)
    if type(x) is not Tensor or torch.compiler.is_compiling():
        return segmented_reduce(*args)
    if _transform_level() is not None:
        return _TransformedReduce.apply(*args)
    if x.requires_grad and torch.is_grad_enabled():
        return _EagerReduce.apply(*args)
    offsets, lengths, segment_length, axis = spec
    return _call(reduction, x, segment_length, offsets, lengths, axis, None, None, "auto", None, False)


def _prod_backward(ctx: Any, grad: Tensor) -> Tensor:
    """d prod / d x_j = the product of the segment's other elements, without dividing by zero:
    ``prod / x_j`` in a segment with no zero; in a segment with one zero ``z``, the product of
    the other elements for ``z`` and ``z * (the product of the other non-zeros)`` (0, with its
    derivative in ``z``; that product is ``others / x_j``, or for an infinite or NaN ``x_j`` the
    product of the finite non-zeros where it is the segment's only such element) for the rest;
    0 throughout a segment with two or more zeros.  Complex gradients are
    conjugated, as PyTorch's are.  Double backward is exact where a segment holds at most one
    zero (with two or more, the second derivatives between its zeros come out 0)."""
    offsets, lengths, x, product = _saved(ctx)
    if lengths is None and offsets is not None:
        lengths = offsets.diff()
    spec = (offsets, None if offsets is not None else lengths, ctx.segment_length, ctx.axis)
    zero = x == 0
    ones = torch.where(zero, torch.ones_like(x), x)
    zeros = _reduce(zero.to(torch.int64), spec, "sum")
    # the product of the non-zeros, in the result's dtype (dtype=float64 of float32 data: the
    # derivative of the one zero is that product, as precise as the result's)
    others = _reduce(ones if ones.dtype == product.dtype else ones.to(product.dtype), spec, "prod")
    # the zero itself (0 in value), kept in the graph so that double backward sees it
    the_zero = _reduce(torch.where(zero, x, torch.zeros_like(x)), spec, "sum")
    zeros, others, product, the_zero, g = (_expand(ctx, t, lengths) for t in (zeros, others, product, the_zero, grad))
    # The product of the other non-zeros, for x_j not 0: others / x_j where x_j is finite; where
    # x_j is infinite or NaN (others / x_j would be inf / inf or NaN), the product of the finite
    # non-zeros if x_j is the segment's only such element (so that z times it is 0, as
    # torch.prod's gradient gives), else others (inf or NaN: z times it is NaN, as IEEE says)
    # (always both reductions: a test of whether any element is infinite would synchronize, and
    # break torch.compile's graph)
    finite = torch.isfinite(x)
    unusual = _reduce((~finite).to(torch.int64), spec, "sum")
    plain = torch.where(finite, ones, torch.ones_like(ones))
    finite_others = _reduce(plain if plain.dtype == product.dtype else plain.to(product.dtype), spec, "prod")
    unusual, finite_others = (_expand(ctx, t, lengths) for t in (unusual, finite_others))
    quotient = torch.where(finite, others / ones, torch.where(unusual == 1, finite_others, others))
    # A finite others / x_j past the dtype's range (a tiny x_j): the zero times it is 0, as
    # torch.prod's gradient gives, not 0 * inf = NaN
    overflow = finite & torch.isfinite(others) & ~torch.isfinite(quotient)
    one_zero = torch.where(zero, others, torch.where(overflow, torch.zeros_like(quotient), the_zero * quotient))
    local = torch.where(zeros == 0, product / ones, torch.where(zeros == 1, one_zero, torch.zeros_like(x)))
    if local.is_complex():
        local = local.conj()
    return (g * local).to(ctx.x_dtype)


def _torch_adapter() -> Any:
    from linred.arrays._torch import TORCH  # (imported here: that module imports this one)

    return TORCH


def _arg(ctx: Any, x: Tensor, extreme: Tensor, offsets: Optional[Tensor], lengths: Optional[Tensor]) -> Tensor:  # noqa: UP045
    """The first position along the axis that attains each segment's extreme (``n`` for an
    empty segment), from the saved input and result (or, where the result has another dtype than
    the input, the extreme in the input's dtype): where eager, as ``segmented_argmax`` finds
    it (one kernel on the GPU, a loop over segments for wide rows on the host), else torch
    operations and linred's minimum, so that it is traced as it is (also with fake tensors, by
    torch.compile's backward)."""
    n = ctx.n
    x, extreme = x.detach(), extreme.detach()
    if extreme.dtype != x.dtype:
        # A result of another dtype (dtype=) is the extreme rounded: no element may equal it.  The
        # selected element is the extreme of x itself, found again in x's dtype.
        extreme = _reduce(x, (offsets, lengths, ctx.segment_length, ctx.axis), ctx.reduction)
    if type(x) is Tensor and not torch.compiler.is_compiling() and _transform_level() is None:
        # One kernel on the GPU, a loop over segments on the host, where they take the call
        # (linred._arg.first_positions), in place of the operations below.
        TORCH = _torch_adapter()
        first = first_positions(TORCH, TORCH.info(x), x, extreme, ctx.segment_length, offsets, lengths, ctx.axis,
                                "auto", None)  # fmt: skip
        if first is not None:
            return first
    spread = _spread_rows(ctx, extreme, offsets, lengths, "sum", differentiable=False)
    if spread is None:
        spread = _expand(ctx, extreme, offsets.diff() if lengths is None and offsets is not None else lengths)
    hit = (x == spread) | (x.isnan() & spread.isnan()) if x.is_floating_point() else x == spread
    shape = [1] * ctx.ndim
    shape[ctx.axis] = n
    index = torch.arange(n, device=x.device).reshape(shape)
    positions = torch.where(hit, index, n)
    first = _reduce(positions, (offsets, lengths, ctx.segment_length, ctx.axis), "min")
    return first.clamp(max=n)


segmented_reduce.register_autograd(_backward, setup_context=_setup_context)


class _EagerReduce(torch.autograd.Function):
    """The same forward and backward as the operator, for eager calls that need a gradient.

    Outside ``torch.compile`` nothing needs the operator's schema or fake implementation,
    and the dispatch through them costs about 100 us per call (measured on the CPU: forward
    223 us through the operator, 128 us without a graph); an autograd Function records the
    same backward (``_backward``, made of differentiable operations: double backward works)
    for a fraction of that.  (Its forward takes ``ctx``: a Function with ``setup_context``
    binds its arguments to the forward's signature on every call, which doubled the time of
    a small call; :class:`_TransformedReduce` has it, for ``torch.func``.)
    """

    @staticmethod
    def forward(ctx, x, offsets, lengths, segment_length, axis, reduction, dtype, backend, check):
        out = _call(reduction, x, segment_length, offsets, lengths, axis, dtype, None, backend, None, check)
        _setup_context(ctx, (x, offsets, lengths, segment_length, axis, reduction), out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _backward(ctx, grad)


class _TransformedReduce(torch.autograd.Function):
    """:class:`_EagerReduce` for calls inside ``torch.func`` transforms, with the ``setup_context``
    and ``vmap`` rule they need (PyTorch's operators from ``torch.library.custom_op`` have
    neither): ``grad``, ``vjp`` and ``jacrev`` run the forward on the tensors below their level,
    and ``vmap`` reduces the whole batch in one call (the batch is one more leading dimension of
    ``x``; offsets or lengths that differ across the batch take one call per element).  Forward
    mode (``jvp``, ``jacfwd``) is refused."""

    @staticmethod
    def forward(x, offsets, lengths, segment_length, axis, reduction, dtype, backend, check):
        return _call(reduction, x, segment_length, offsets, lengths, axis, dtype, None, backend, None, check)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad):
        return _backward(ctx, grad)

    @staticmethod
    def jvp(ctx, *tangents):
        raise TypeError(_NO_FORWARD_AD)

    @staticmethod
    def vmap(info, in_dims, *args):
        return _vmap_rule(_TransformedReduce.apply, info, in_dims, *args)


def _vmap_rule(reduce: Any, info: Any, in_dims: tuple, x: Tensor, offsets: Optional[Tensor],  # noqa: UP045
               lengths: Optional[Tensor], *rest: Any) -> tuple[Tensor, int]:  # noqa: UP045  # fmt: skip
    """``torch.vmap``'s rule for ``reduce`` (the autograd Function's ``apply``, or the operator),
    whose arguments come positionally (linred calls both so): the batch becomes a leading
    dimension of ``x`` and the segment axis moves one further, so the whole batch is one call;
    offsets or lengths batched too (each element its own segments) take one call per element."""
    x_dim, offsets_dim, lengths_dim = in_dims[:3]
    segment_length, axis, *options = rest
    ndim = x.dim() - (x_dim is not None)  # (an element's dimensions)
    if ndim == 0:
        raise ValueError("x must have at least one dimension; got a 0-d array")
    axis = normalize_axis(axis, ndim)  # (an element's axis: out of range, or a bool, raises as without vmap)
    if offsets_dim is None and lengths_dim is None:
        x = x.movedim(x_dim, 0)  # (x is batched: nothing else can be)
        try:
            return reduce(x, offsets, lengths, segment_length, axis + 1, *options), 0
        except ValueError as e:  # (its message names the batch's axis: the element's, as without vmap)
            message = re.sub(rf"\baxis {axis + 1}\b", f"axis {axis}", str(e))
            if message == str(e):
                raise
            raise ValueError(message) from None
    if info.batch_size == 0:  # (no element to reduce: the result of an empty batch, from a stand-in element)
        xb = x if x_dim is None else x.new_zeros(x.movedim(x_dim, 0).shape[1:])
        n = xb.shape[axis]

        def last_n(t: Tensor | None) -> Tensor | None:  # (offsets or lengths [0, ..., 0, n]: valid for the stand-in)
            return None if t is None else torch.nn.functional.pad(t.new_zeros(t.shape[-1] - 1), (0, 1), value=n)

        ob, lb = last_n(offsets), last_n(lengths)
        one = reduce(xb, ob, lb, segment_length, axis, *options)
        return one.new_empty((0, *one.shape)), 0
    results = []
    for b in range(info.batch_size):
        xb = x if x_dim is None else x.select(x_dim, b)
        ob = offsets if offsets_dim is None else offsets.select(offsets_dim, b)
        lb = lengths if lengths_dim is None else lengths.select(lengths_dim, b)
        results.append(reduce(xb, ob, lb, segment_length, axis, *options))
    return torch.stack(results), 0


segmented_reduce.register_vmap(functools.partial(_vmap_rule, segmented_reduce))


_NO_FORWARD_AD = (
    "forward-mode AD (torch.autograd.forward_ad, torch.func.jvp, torch.func.jacfwd) is not supported: linred's "
    "result would carry no tangent; use reverse mode (backward, torch.autograd.grad, torch.func.grad, "
    "torch.func.jacrev)"
)

#: the level of the innermost ``torch.func`` transform (``grad``, ``vmap``, ...) in effect, or None
_transform_level = torch._C._functorch.maybe_current_level
#: whether a tensor is batched by autograd's own vmap (``jacobian(vectorize=True)``,
#: ``grad(is_grads_batched=True)``), which no torch.func level shows
_is_legacy_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)


def refuse_forward_ad(x: Tensor) -> None:
    """Raise the documented TypeError for a dual tensor of forward-mode AD (its result would
    come back without its tangent)."""
    if _forward_ad._current_level >= 0 and _forward_ad.unpack_dual(x).tangent is not None:
        raise TypeError(_NO_FORWARD_AD)


def transformed() -> bool:
    """Whether a ``torch.func`` transform may be in effect: linred's tensors may then be wrappers
    (batched, or tracking a gradient) with no memory of their own, which only the autograd
    Function's rules take apart.  Inside ``torch.compile``, which cannot trace the question (a
    ``vmap`` it compiles), the answer is yes: the compositions without in-place operations and
    kernels of linred's own, which trace with or without a transform."""
    return torch.compiler.is_compiling() or _transform_level() is not None


def _as_dtype_name(dtype: Any) -> Any:
    if dtype is None or isinstance(dtype, str):
        return dtype
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return dtype_name(dtype)


def _refuse_integer_result(reduction: str, x: Tensor, dtype: str) -> None:
    """The TypeError of ``dtype=`` an integer result of a sum or product for a tensor that
    requires grad (a result autograd cannot differentiate, which would come back without a
    ``grad_fn``: the caller's training would silently stop learning through it), as ``torch.sum``
    and ``torch.prod`` refuse it.  (Max and min with an integer ``dtype=`` are the extreme found in
    x's dtype, then converted, as ``x.amax().to(int)`` is: no gradient, as there.)"""
    try:
        _, out = resolve(reduction, dtype_name(x.dtype), dtype)
    except (TypeError, ValueError):
        return  # (the call's own refusal names it)
    if out not in FLOATING:
        raise TypeError(
            f"segmented_{reduction}: dtype={out} gives an integer result, which autograd cannot differentiate, "
            f"and x requires grad; pass a floating dtype, or x.detach() for a result without a gradient"
        )


def _index_tensor(obj: Any, device: Any, name: str) -> Tensor:
    """Offsets or lengths given as a sequence or an array of another library, as a tensor on
    ``device``, converted and refused as every call's are (the torch adapter's ``index_array``:
    an empty list as int64, a NumPy array of another byte order or negative strides copied,
    integers past int64 and Dask arrays refused by name); a copy of their own (:func:`owned`)."""
    t = _torch_adapter().index_array(obj, None if device.type == "cpu" else device.index, name)
    return owned(obj, t)


def owned(obj: Any, t: Tensor) -> Tensor:
    """``t``, the tensor made of a call's segment argument ``obj`` that is not a tensor, as a copy
    that shares no memory with ``obj``: autograd keeps it for the backward, and a NumPy or CuPy
    array changed in place before ``backward()`` would otherwise change the gradient silently (a
    tensor's own version counter makes PyTorch raise instead).  (A NumPy array's tensor on a
    CUDA device, or a list's, is a copy already.)"""
    if (isinstance(obj, np.ndarray) and t.is_cpu) or (hasattr(obj, "__cuda_array_interface__") and t.is_cuda):
        return t.clone()
    return t


def _check_arguments(x: Tensor, segment_length: Any, axis: Any, check: Any) -> None:
    """The eager call's errors of ``segment_length``, ``axis``, ``check`` and a 0-d ``x``, raised
    before the operator: inside torch.compile its fake would otherwise take ``True`` for 1 (or
    divide by a length of 0) where the eager call refuses them."""
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension; got a 0-d array")
    if segment_length is not None:
        segment_length_value(segment_length)
    normalize_axis(axis, x.dim())
    check_flag(check)


def _through_op(
    reduction: str,
    x: Tensor,
    segment_length: Any,
    offsets: Any,
    lengths: Any,
    axis: Any,
    dtype: Any,
    out: Any,
    backend: Any,
    stream: Any,
    check: Any,
) -> Tensor:
    if out is not None or stream is not None:
        if torch.compiler.is_compiling():
            what = "inside torch.compile"
        elif x.requires_grad and torch.is_grad_enabled():
            what = "for a tensor that requires grad"
        else:
            what = "inside torch.func transforms"
        raise TypeError(f"out= and stream= are not supported {what}: the result is a new tensor on the current stream")
    if offsets is not None and not isinstance(offsets, Tensor):
        offsets = _index_tensor(offsets, x.device, "offsets")
    if lengths is not None and not isinstance(lengths, Tensor):
        lengths = _index_tensor(lengths, x.device, "lengths")
    _check_arguments(x, segment_length, axis, check)
    if segment_length is not None:
        segment_length = int(segment_length)
    dtype = _as_dtype_name(dtype)
    if dtype is not None and reduction in ("sum", "prod") and x.requires_grad and torch.is_grad_enabled():
        _refuse_integer_result(reduction, x, dtype)
    from linred.arrays._torch import aligned  # (not at import: that module registers this one)

    x = aligned(x)  # (the backward's PyTorch operations read it)
    args = (x, offsets, lengths, segment_length, axis, reduction, dtype, backend, check)
    if torch.compiler.is_compiling():
        return segmented_reduce(*args)
    if _transform_level() is not None:
        return _TransformedReduce.apply(*args)
    return _EagerReduce.apply(*args)


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
    """The public functions' body once PyTorch is in use: the operator where it is needed."""
    if isinstance(x, Tensor):
        refuse_forward_ad(x)
        if (
            torch.compiler.is_compiling()
            or (x.requires_grad and torch.is_grad_enabled() and reduction in _DIFFERENTIABLE)
            or _transform_level() is not None  # (inside torch.func.vmap, say: x may have no memory of its own)
        ):
            return _through_op(reduction, x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
        return _call(reduction, x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
    # (the plan cache is opaque to TorchDynamo: inside torch.compile, NumPy or CuPy data runs eagerly)
    return _plan_cache.call(reduction, x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)


_DIFFERENTIABLE = frozenset(("sum", "mean", "max", "min", "prod"))
