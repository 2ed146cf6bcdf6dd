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
kernel does them instead, reading the data once (:mod:`linred._arg_kernel`); on the host, for
rows of many features, a loop over segments does (:func:`host_first`).  The result is the same.
"""

from __future__ import annotations

import contextlib
import math
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
    # (None: the library's current stream, where the operations below run anyway; not asked
    # for here, since inside torch.compile the query cannot be traced)
    handle = None if stream is None else adapter.resolve_stream(stream, info.device)
    first = first_positions(adapter, info, x, extreme, segment_length, offsets, lengths, axis, backend, handle)
    if first is not None:
        return first
    with _on_stream(adapter, handle, info.device):
        positions = _positions(adapter, info, x, extreme, segment_length, offsets, lengths, axis)
    # (the offsets were checked by the first reduction; the second reads the same ones)
    first = _dynamo.run("min", positions, segment_length, offsets, lengths, axis, None, None, backend, stream, False)
    with _on_stream(adapter, handle, info.device):  # an empty segment's minimum is int64's largest
        if adapter.kind == "torch":
            from linred._torch_ops import transformed

            # (not in place inside torch.func transforms: vmap has no in-place rule for clamp)
            first = first.clamp(max=n) if transformed() else first.clamp_(max=n)
        else:
            namespace(adapter.kind).minimum(first, n, out=first)
    return first


def first_positions(adapter: Any, info: Any, x: Any, extreme: Any, segment_length: Any, offsets: Any, lengths: Any,
                    axis: int, backend: Any, handle: Any) -> Any:  # fmt: skip
    """Steps 2 and 3 without the composition, or None where neither way takes the call: on the
    GPU one kernel (:mod:`linred._arg_kernel`, on ``handle``), on the host a loop over segments
    (:func:`host_first`).  ``extreme`` is step 1's result for ``x`` (``info``: its adapter's
    description); the segments are as the call gave them; ``handle`` None is the current stream."""
    if adapter.kind == "torch":
        from linred._torch_ops import transformed

        if transformed():  # (torch.func's tensors have no memory of their own: the composition)
            return None
    if (
        _arg_kernel.serves(adapter, x, info.dtype, backend)
        and adapter.info(extreme).dtype == info.dtype
        and adapter.is_c_contiguous(extreme)
    ):
        if handle is None:
            handle = adapter.resolve_stream(None, info.device)
        with adapter.on_stream(handle, info.device):
            if segment_length is None:
                offsets = device_offsets(adapter, offsets, lengths, info.device)
            else:
                segment_length = int(segment_length)
            return _arg_kernel.first_hit(adapter, x, extreme, axis, segment_length, offsets, info.device, handle)
    if info.device is None and backend in ("auto", "numpy"):
        return host_first(adapter, info, x, extreme, segment_length, offsets, lengths, axis)
    return None


def _on_stream(adapter: Any, handle: Any, device: Any) -> Any:
    """``adapter.on_stream(handle, device)``; where ``handle`` is None (the current stream
    already), nothing to enter but, for CuPy, the data's device (CuPy's operations run on the
    current device, whichever device their arrays are on)."""
    if handle is not None:
        return adapter.on_stream(handle, device)
    if adapter.kind == "cupy" and device is not None:
        return adapter.on_stream(adapter.resolve_stream(None, device), device)
    return contextlib.nullcontext()


#: host data: each segment's positions found by a loop over segments (:func:`host_first`) where
#: rows hold at least HOST_LOOP_MIN_FEATURES values and a segment, on average, at least
#: HOST_LOOP_MIN_ELEMENTS; the composition's passes over data-sized arrays cost more there (2
#: cores, float32 positions of 50,000 x 128 rows in 256 segments: 92 ms composed, 17 ms in the
#: loop; 2,000 x 64 in 32: 3.8 against 0.6), its one pass each costs less for many short segments
#: (100,000 x 64 in 20,000: 137 against 153)
HOST_LOOP_MIN_FEATURES = 16
HOST_LOOP_MIN_ELEMENTS = 1024


def host_first(adapter: Any, info: Any, x: Any, extreme: Any, segment_length: Any, offsets: Any, lengths: Any,
                axis: int) -> Any:  # fmt: skip
    """The first positions of host data (NumPy arrays, CPU tensors) segment by segment, or None
    where the composition is the faster (see :data:`HOST_LOOP_MIN_FEATURES`): per segment, the
    first row equal to its extreme, column by column (``argmax`` of the comparison; for a NaN
    extreme, of ``isnan``)."""
    import numpy as np

    shape = info.shape
    n, features = shape[axis], math.prod(shape[axis + 1 :])
    m = extreme.shape[axis]
    if not (m and features >= HOST_LOOP_MIN_FEATURES and n * features >= HOST_LOOP_MIN_ELEMENTS * m):
        return None
    if adapter.kind == "torch":
        from linred.arrays.views import host_view

        if x.is_neg() or x.is_conj():  # (a lazy negation or conjugation: no NumPy view; the composition)
            return None
        try:  # (bfloat16 through ml_dtypes' type, which Tensor.numpy() does not give)
            xs, es = host_view(x.detach()), host_view(extreme.detach())
        except TypeError:  # bfloat16 without ml_dtypes: the composition
            return None
    elif adapter.kind == "numpy":
        xs, es = np.asarray(x), np.asarray(extreme)
    else:
        return None
    batch = math.prod(shape[:axis])
    x3, e3 = xs.reshape(batch, n, features), es.reshape(batch, m, features)
    if segment_length is not None:
        bounds = list(range(0, (m + 1) * int(segment_length), int(segment_length)))
    else:
        bounds = np.asarray(device_offsets(adapter, offsets, lengths, None)).tolist()
    floating = xs.dtype.kind == "f" or info.dtype in ("float16", "bfloat16")
    out = np.full((batch, m, features), n, dtype=np.int64)
    for b in range(batch):
        rows, ext, first = x3[b], e3[b], out[b]
        for s in range(m):
            lo, hi = bounds[s], bounds[s + 1]
            if hi <= lo:
                continue
            segment, e = rows[lo:hi], ext[s]
            first[s] = (segment == e).argmax(axis=0) + lo
            if floating:
                nan = np.isnan(e)
                if nan.any():  # (a NaN extreme: the segment's first NaN in that column)
                    first[s, nan] = np.isnan(segment[:, nan]).argmax(axis=0) + lo
    result = out.reshape(extreme.shape)
    if adapter.kind == "torch":
        import torch

        return torch.from_numpy(result)
    return result


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
    if kind == "torch":
        from linred.arrays._torch import index_select

        spread = index_select(extreme, axis, segment)
    else:
        spread = xp.take(extreme, segment, axis=axis)
    hit = x == spread
    if info.dtype in ("float16", "bfloat16", "float32", "float64"):
        hit = hit | (xp.isnan(x) & xp.isnan(spread))
    shape = [1] * len(info.shape)
    shape[axis] = n
    index = index.reshape(shape)
    if kind == "torch":
        return xp.where(hit, index, n)
    return xp.where(hit, index, n).astype(xp.int64)
