"""``segmented_argmax`` and ``segmented_argmin``: where each segment's extreme is.

An arg-reduction is two of linred's reductions and one comparison pass:

1. the segments' maximum (minimum), by any backend that serves max (min);
2. each element compared with its segment's extreme: elements that attain it keep
   their position along the axis, the others become ``n`` (past the end);
3. the segments' minimum of those positions (an int64 reduction): the first element
   that attains the extreme.

A NaN is the extreme of its segment (as in ``segmented_max``), and its index is that
of the segment's first NaN, as :func:`numpy.argmax` does.  An empty segment has no
element to point at: its index is ``n = x.shape[axis]``, one past the end, so that
using it to index ``x`` raises instead of reading another segment's element.

Steps 2 and 3 read the data again and write an int64 position per element.  On the GPU
(CuPy arrays and CUDA tensors, C-contiguous, with the backend ``"auto"`` or ``"nvrtc"``) one
kernel does them instead, reading the data once (:mod:`linred._arg_kernel`); the result is
the same.
"""

from __future__ import annotations

from typing import Any

from linred import _arg_kernel
from linred._frontend import normalize_axis
from linred.arrays import as_array, namespace


def argextreme(
    which: str,
    x: Any,
    segment_length: Any,
    offsets: Any,
    lengths: Any,
    axis: Any,
    backend: Any,
    stream: Any,
    check: Any,
) -> Any:
    """``segmented_arg<which>`` (``which`` is ``"max"`` or ``"min"``)."""
    from linred import _dynamo

    x, adapter = as_array(x)
    info = adapter.info(x)
    if len(info.shape) == 0:
        raise ValueError("x must have at least one dimension; got a 0-d array")
    axis = normalize_axis(axis, len(info.shape))
    if info.dtype.startswith("complex"):
        raise TypeError(f"segmented_arg{which}: complex numbers have no order")
    extreme = _dynamo.run(which, x, segment_length, offsets, lengths, axis, None, None, backend, stream, check)
    n = info.shape[axis]
    handle = adapter.resolve_stream(stream, info.device)
    if (
        _arg_kernel.serves(adapter, x, info.dtype, backend)
        and adapter.info(extreme).dtype == info.dtype
        and adapter.is_c_contiguous(extreme)
    ):
        # One kernel over the data where the GPU takes it (see linred._arg_kernel).
        with adapter.on_stream(handle, info.device):
            if segment_length is None:
                offsets = device_offsets(adapter, offsets, lengths, info.device)
            else:
                segment_length = int(segment_length)
            return _arg_kernel.first_hit(adapter, x, extreme, axis, segment_length, offsets, info.device, handle)
    with adapter.on_stream(handle, info.device):
        positions = _positions(adapter, info, x, extreme, segment_length, offsets, lengths, axis)
    # (the offsets were checked by the first reduction; the second reads the same ones)
    first = _dynamo.run("min", positions, segment_length, offsets, lengths, axis, None, None, backend, stream, False)
    with adapter.on_stream(handle, info.device):  # an empty segment's minimum is int64's largest
        if adapter.kind == "torch":
            first.clamp_(max=n)
        else:
            namespace(adapter.kind).minimum(first, n, out=first)
    return first


def device_offsets(adapter: Any, offsets: Any, lengths: Any, device: int) -> Any:
    """The segments' offsets as a contiguous int32 or int64 array on ``device``, from ``offsets`` or
    ``lengths`` (whichever is given)."""
    if offsets is None:
        return adapter.lengths_to_offsets(adapter.index_array(lengths, device, "lengths"))
    return adapter.index_array(offsets, device, "offsets")


def _positions(adapter: Any, info: Any, x: Any, extreme: Any, segment_length: Any, offsets: Any, lengths: Any,
               axis: int) -> Any:  # fmt: skip
    """Each element's position along the axis where it attains its segment's extreme, else n."""
    kind, n = adapter.kind, info.shape[axis]
    xp = namespace(kind)
    index = xp.arange(n, device=x.device) if kind == "torch" else xp.arange(n)
    if segment_length is not None:
        segment = index // int(segment_length)
    else:
        if offsets is None:
            offsets = adapter.lengths_to_offsets(adapter.index_array(lengths, info.device, "lengths"))
        else:
            offsets = adapter.index_array(offsets, info.device, "offsets")
        if kind == "torch":
            segment = xp.searchsorted(offsets, index, right=True) - 1
        else:
            segment = xp.searchsorted(offsets, index, side="right") - 1
    spread = xp.index_select(extreme, axis, segment) if kind == "torch" else xp.take(extreme, segment, axis=axis)
    hit = x == spread
    if info.dtype in ("float16", "bfloat16", "float32", "float64"):
        hit = hit | (xp.isnan(x) & xp.isnan(spread))
    shape = [1] * len(info.shape)
    shape[axis] = n
    index = index.reshape(shape)
    if kind == "torch":
        return xp.where(hit, index, n)
    return xp.where(hit, index, n).astype(xp.int64)
