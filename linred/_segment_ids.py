"""Segments named by ids: one integer per element along the axis, as PyG's ``batch`` vector and
``jax.ops.segment_sum``'s ``segment_ids`` name them.

Element ``j`` belongs to segment ``segment_ids[j]``; segment ``i`` gathers every element
with id ``i``, in the order they come.  A call with ids becomes a call with offsets:

- **sorted ids** (the common ``batch`` vector): the elements of each segment are already
  contiguous, and ``offsets = searchsorted(ids, arange(num_segments + 1))`` names them.  No
  data moves: one binary search per segment over the ids.
- **unsorted ids**: a stable sort of the ids, and the data gathered in that order (one
  copy of ``x``, made by the array library), then the same offsets.  Elements of a segment
  keep their relative order, so the result is deterministic (no atomics): the sum of a
  segment is the sum of its elements in the order they appear in ``x``.

Cost model: sorted ids cost a pass over the ids (the check) and ``num_segments`` binary
searches; unsorted ids cost a sort of ``n`` ids and a gather of ``x`` (read and written
once more than the reduction itself).

``check=True`` reads the ids once (their minimum, maximum and whether they are sorted: one
synchronization on a GPU) and refuses ids outside ``[0, num_segments)``.  ``check=False``
reads nothing of device ids: sorted ids must then be promised with ``ids_sorted=True``
(otherwise the ids are sorted, which is right for any ids), and ids outside
``[0, num_segments)`` are dropped, as ``jax.ops.segment_sum`` drops them (two sentinel segments
before and after the real ones collect them; their results are left out).  Host ids are
always read: where some lie outside, only the data between their elements is reduced.
Without ``num_segments`` it is found as ``max(segment_ids) + 1``, which on a GPU is one
synchronization even with ``check=False``.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import numpy as np

from linred._frontend import check_flag, described, normalize_axis, validate_out
from linred._jax import call_jax, is_jax
from linred.arrays import _device_checks, _device_gather, _device_ids, as_array, namespace
from linred.arrays._base import adapters
from linred.backends.base import INT32_MAX
from linred.segments import _refuse_capture

__all__ = ["reduce_by_ids"]


def unchecked_ids(ids: Any, check: Any, num_segments: Any) -> Any:
    """``segment_ids`` as a call reads them: with ``check=False`` and ``num_segments`` given, host
    ids past the int64 range (a NumPy ``uint64`` array, or Python integers of a list) clipped to
    its bounds, outside ``[0, num_segments)`` whatever ``num_segments``: dropped, as every
    id out of range is (a device array's conversion wraps them to negative ids, dropped too; the
    clip keeps sorted ids sorted).  Otherwise (the ids checked, or their largest the count of
    segments) the conversion names them in its ``ValueError``."""
    if check is not False or num_segments is None:
        return ids
    low, high = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
    if isinstance(ids, (list, tuple)):  # (NumPy makes float64 of ints past int64: clipped as ints)
        try:
            as_array = np.asarray(ids)
        except (TypeError, ValueError, OverflowError):
            return ids
        if as_array.dtype.kind in "iub":
            return as_array  # (converted once: the ids' conversion takes the array as it is)
        flat = np.asarray(ids, dtype=object).reshape(-1)
        if flat.size and all(type(v) is int for v in flat) and any(not low <= v <= high for v in flat):
            return np.array([min(max(v, low), high) for v in flat], dtype=np.int64).reshape(np.shape(ids))
        return ids
    if isinstance(ids, np.ndarray) and ids.dtype.kind == "u" and ids.dtype.itemsize == 8 and ids.size:
        return np.minimum(ids, np.uint64(high))  # (either byte order: the result is native)
    torch_ids = type(ids).__module__.partition(".")[0] == "torch" and str(ids.dtype) == "torch.uint64"
    if torch_ids and ids.device.type == "cpu" and ids.numel():
        from linred._fused import _compiling  # (linred._fused imports this module)

        if not _compiling():  # (a trace reads no values: NumPy's operations would be traced as torch's)
            return np.minimum(ids.numpy(), np.uint64(high))  # (as NumPy's: torch has few uint64 operations)
    return ids


class _Ops:
    """The few array operations ids need, in the data's library (NumPy, CuPy or PyTorch)."""

    def __init__(self, adapter: Any, x: Any) -> None:
        self.adapter = adapter
        self.kind = adapter.kind
        self.xp = namespace(self.kind)
        self.device = x.device if self.kind == "torch" else None

    def ids(self, ids: Any, device: int | None) -> Any:
        """``ids`` as int64 in the data's library and on its device, converted and refused as offsets
        are (host ids for device data are copied; device ids for host data, non-integers refused)."""
        a = self.adapter.index_array(ids, device, "segment_ids")
        if self.kind == "torch" and _batched(a):
            raise TypeError(
                "segment_ids is batched by torch.func.vmap (a batch of ids): linred reads one set of ids "
                "a call; give ids without the batch dimension (the same for every element), or offsets "
                "or lengths, whose batches vmap serves"
            )
        if a.ndim != 1:
            raise ValueError(f"segment_ids must be 1-D (one id per element along axis); got shape {tuple(a.shape)}")
        return a.long() if self.kind == "torch" else a.astype(self.xp.int64, copy=False)

    def arange(self, n: int) -> Any:
        return self.xp.arange(n, device=self.device) if self.kind == "torch" else self.xp.arange(n, dtype=self.xp.int64)

    def searchsorted(self, sorted_ids: Any, values: Any) -> Any:
        return self.xp.searchsorted(sorted_ids, values)  # the first position of each value (left)

    def argsort(self, ids: Any) -> Any:
        if self.kind == "torch":
            return self.xp.argsort(ids, stable=True)
        if self.kind == "numpy":
            return np.argsort(ids, kind="stable")
        return self.xp.argsort(ids)  # CuPy's argsort is a stable radix sort (CUB)

    def part(self, a: Any, axis: int, start: int, stop: int) -> Any:
        """``a[start:stop]`` along ``axis`` (a view; PyTorch's ``narrow``, a third of indexing's
        host time: 1.2 against 3.5-4.4 µs on an H200 host)."""
        if self.kind == "torch":
            return a.narrow(axis, start, stop - start)
        return a[(slice(None),) * axis + (slice(start, stop),)]

    def transformed(self) -> bool:
        """Whether a torch.func transform is in effect (its tensors have no memory of their own)."""
        return self.kind == "torch" and self.xp._C._functorch.maybe_current_level() is not None

    def take(self, a: Any, index: Any, axis: int) -> Any:
        # (inside torch.compile no size is tested: a test of the size would add a guard on it)
        traced = self.kind == "torch" and self.xp.compiler.is_compiling()
        gathered = (
            self._gather(a, index) if GATHER_KERNEL and axis == 0 and self.kind != "numpy" and not traced else None
        )
        if gathered is not None:
            return gathered
        if self.kind == "torch":
            from linred.arrays._torch import index_select

            return index_select(a, axis, index)
        return self.xp.take(a, index, axis=axis)

    def _gather(self, a: Any, index: Any) -> Any:
        """``a``'s rows ``index`` (int64 positions, contiguous) by gather.cuh's kernel, or None
        where it does not serve: fewer rows than :data:`GATHER_MIN_ROWS`, host data, a view that
        is not C-contiguous, a tensor autograd records or a dual tensor of forward-mode AD (their
        gather is the library's, which autograd knows), torch.func (torch.compile: see
        :meth:`take`)."""
        adapter = self.adapter
        device = adapter.device_of(a)
        if (
            index.shape[0] < GATHER_MIN_ROWS
            or device is None
            or not a.ndim
            or not adapter.is_c_contiguous(a)
            or index.dtype.itemsize != 8
        ):
            return None
        xp = self.xp
        if self.kind == "torch":
            forward_ad = xp.autograd.forward_ad
            if (
                (a.requires_grad and xp.is_grad_enabled())
                or a.is_conj()
                or a.is_neg()
                or self.transformed()
                or (forward_ad._current_level >= 0 and forward_ad.unpack_dual(a).tangent is not None)
                or not index.is_contiguous()
            ):
                return None
            out = xp.empty((index.shape[0], *a.shape[1:]), dtype=a.dtype, device=a.device)
        else:
            if not index.flags.c_contiguous:
                return None
            out = xp.empty((index.shape[0], *a.shape[1:]), dtype=a.dtype)
        row_bytes = out.itemsize if self.kind != "torch" else out.element_size()
        for d in a.shape[1:]:
            row_bytes *= d
        pointer = adapter.pointer
        stream = adapter.resolve_stream(None, device)
        if not _device_gather.gather_rows(pointer(a), pointer(index), pointer(out), index.shape[0], row_bytes, device,
                                          stream):  # fmt: skip
            return None
        return out

    def pad(self, offsets: Any, n: int) -> Any:
        """``[0, offsets..., n]``: sentinel segments before and after the named ones."""
        xp = self.xp
        if self.kind == "torch":
            zero, end = xp.zeros(1, dtype=xp.int64, device=self.device), xp.full((1,), n, device=self.device)
            return xp.cat([zero, offsets, end])
        return xp.concatenate([xp.zeros(1, dtype=xp.int64), offsets, xp.full(1, n, dtype=xp.int64)])

    def summary(self, ids: Any) -> tuple[int, int, bool]:
        """``(min, max, sorted)`` of non-empty ``ids``, one read back on a device."""
        xp = self.xp
        if self.kind == "torch" and self.device.type == "cpu":
            # (a CPU tensor's ids read through NumPy, a view: torch's small operations cost
            # about 50 µs of a 2,000-row call, NumPy's a few; not a torch.func transform's
            # tensor, which has no storage of its own)
            with contextlib.suppress(RuntimeError):
                ids = ids.numpy()
        if type(ids) is np.ndarray:
            return int(ids.min()), int(ids.max()), not bool((ids[1:] < ids[:-1]).any())
        down = (ids[1:] < ids[:-1]).any()
        lo, hi, d = xp.stack(
            [ids.min(), ids.max(), down.to(xp.int64) if self.kind == "torch" else down.astype(xp.int64)]
        ).tolist()
        return lo, hi, not d


def outside_error(ids: Any, num_segments: int) -> ValueError:
    """The ``ValueError`` of ids (NumPy, CuPy or PyTorch, in the caller's order) of which some lie
    outside ``[0, num_segments)``: it names the first of them (a read back on a device)."""
    bad = (ids < 0) | (ids >= num_segments)
    i = int((bad.int() if hasattr(bad, "int") else bad).argmax())  # (PyTorch has no argmax of bools)
    return ValueError(
        f"segment_ids must lie in [0, num_segments) = [0, {num_segments}); segment_ids[{i}] = {int(ids[i])}"
    )


def _reads_ids(check: bool, device: int | None) -> bool:
    """Whether a call reads its ids (their minimum, maximum and order): checked calls, and host
    ids (NumPy's or a CPU tensor's), where reading costs less than a sort; else the caller's
    word is taken for them."""
    return bool(check) or device is None


def _batched(t: Any) -> bool:
    """Whether tensor ``t`` is a torch.func transform's batched tensor (one id array a sample)."""
    import torch

    if torch.compiler.is_compiling():  # (which cannot trace the question; a vmap's ids are refused eagerly)
        return False
    functorch = torch._C._functorch
    return functorch.maybe_current_level() is not None and functorch.is_batchedtensor(t)


def _num_segments(num_segments: Any) -> int:
    if isinstance(num_segments, bool) or not hasattr(num_segments, "__index__"):
        raise TypeError(f"num_segments must be an integer; got {type(num_segments).__name__}")
    ns = operator.index(num_segments)
    if ns < 0:
        raise ValueError(f"num_segments must be >= 0; got {ns}")
    return ns


def ids_arguments(segment_ids: Any, num_segments: Any, ids_sorted: Any, segments_given: list[str]) -> int | None:
    """The ``num_segments`` of a call naming its segments by ids (None: not given), once the ids
    arguments are checked: ``segment_ids`` given, and alone (``segments_given`` names the other
    segment arguments the caller passed), ``ids_sorted`` None or a bool."""
    if segment_ids is None:
        name = "num_segments" if num_segments is not None else "ids_sorted"
        raise TypeError(f"{name} applies to segment_ids only; give segment_ids as well")
    if segments_given:
        raise TypeError(f"give one of segment_length, offsets, lengths or segment_ids; got segment_ids and "
                        f"{' and '.join(segments_given)}")  # fmt: skip
    if ids_sorted is not None and not isinstance(ids_sorted, (bool, np.bool_)):  # (NumPy's: (np.diff(ids) >= 0).all())
        raise TypeError(f"ids_sorted must be None, True or False; got {described(ids_sorted)}")
    return None if num_segments is None else _num_segments(num_segments)


def reduce_by_ids(
    function: Any,
    x: Any,
    segment_ids: Any,
    num_segments: Any,
    ids_sorted: Any,
    segments_given: list[str],
    axis: Any,
    out: Any,
    check: Any,
    positions: bool = False,
    **kwargs: Any,
) -> Any:
    """``function(x, ...)`` over the segments that ``segment_ids`` names (see the module's notes).

    ``segments_given`` names the other segment arguments the caller passed (refused with ids);
    ``positions`` says that the results are positions along the axis (argmax, argmin), which
    are mapped back through the sort of unsorted ids.  ``kwargs`` go to ``function``.
    """
    unsorted_inside = False
    if type(num_segments) is int and not (segments_given or positions):
        result = _device_batch(function, x, segment_ids, num_segments, ids_sorted, axis, out, check, kwargs)
        if result is _UNSORTED:
            unsorted_inside = True  # (found so by the kernel: not converted by it again, nor read)
        elif result is not _GENERAL:
            return result
    ns = ids_arguments(segment_ids, num_segments, ids_sorted, segments_given)
    ids_sorted = None if ids_sorted is None else bool(ids_sorted)
    check_flag(check)
    if is_jax(x):  # reduced where it lies, ids and all (linred._jax)
        ids_kwargs = {"segment_ids": segment_ids, "num_segments": num_segments, "ids_sorted": ids_sorted}
        return call_jax(function, x, None, offsets=None, lengths=None, out=out, axis=axis, check=check,
                        **ids_kwargs, **kwargs)  # fmt: skip
    from linred.dask import is_dask  # (linred.dask imports linred: not at this module's import)

    if is_dask(x):  # ids read on the host as offsets are: offsets, the data moved into the ids' order if need be
        from linred.dask import by_ids_order, ids_offsets, map_reduce_by_ids, positions_back

        offsets, order, host_ids = ids_offsets(x, segment_ids, ns, axis)
        if not positions:  # (the arg-reductions take no out=)
            kwargs["out"] = out
        if order is None:
            return function(x, offsets=offsets, axis=axis, check=check, **kwargs)
        if out is None and kwargs.get("stream") is None:  # (else refused below, as the functions refuse them)
            name = function.__name__.removeprefix("segmented_")
            reduced = map_reduce_by_ids(name, x, host_ids, len(offsets) - 1, axis, kwargs.get("dtype"),
                                        kwargs.get("backend", "auto"), check)  # fmt: skip
            if reduced is not None:
                return reduced
        result = function(by_ids_order(x, order, axis), offsets=offsets, axis=axis, check=check, **kwargs)
        return positions_back(result, order, len(order)) if positions else result
    x, adapter = as_array(x)  # (refuses what the functions refuse: masked, sparse, other libraries' arrays)
    if not x.shape:
        raise ValueError("x must have at least one dimension; got a 0-d array")
    device = adapter.device_of(x)
    # The ids' sort and search run on the call's stream, ahead of the reduction that reads them
    # (inside torch.compile, which cannot ask for the stream, the current one: _by_ids_traced).
    stream = kwargs.get("stream")
    compiling = adapter.kind == "torch" and namespace("torch").compiler.is_compiling()
    if compiling and (stream is not None or out is not None):  # (as the operator refuses them, with offsets)
        raise TypeError("out= and stream= are not supported inside torch.compile: the result is a new tensor on the "
                        "current stream")  # fmt: skip
    if compiling:
        on_stream = contextlib.nullcontext()
    else:
        on_stream = adapter.on_stream(adapter.resolve_stream(stream, device), device)
    with on_stream:
        return _by_ids(function, adapter, x, device, segment_ids, ns, ids_sorted, axis, out, check, positions,
                       kwargs, unsorted_inside)  # fmt: skip


#: what :func:`_device_batch` returns for a call it leaves to the general route, and what
#: :func:`_by_ids_kernel` returns for checked ids its kernel found out of order, every one within
#: ``[0, num_segments)`` (the general route sorts them, neither converting them by the kernel
#: again nor reading them)
_GENERAL, _UNSORTED = object(), object()


def _device_batch(function: Any, x: Any, ids: Any, ns: int, ids_sorted: Any, axis: Any, out: Any, check: Any,
                  kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """The call PyG's ``batch`` vector makes (the common one), by :func:`_by_ids_kernel` with only
    the tests that call needs, or :data:`_GENERAL`: a CuPy array or a tensor on a CUDA device,
    ``segment_ids`` an int32 or int64 1-D contiguous array of the same type on the same device,
    ``num_segments`` an int, on the current stream, outside torch.compile and torch.func.
    Whatever this route cannot take (and every error to raise) goes the general way, through
    the same kernel: the two give the same results.  (The general route's tests of the
    arguments and of the ids, and its conversions of what the kernel cannot read, cost about a
    third of a small call's 60-80 µs of host time on the H200.)"""
    adapter = adapters.get(type(x))
    if (
        adapter is None
        or adapter.kind == "numpy"
        or type(ids) is not type(x)
        or ns < 0
        or type(check) is not bool
        or (ids_sorted is not None and type(ids_sorted) is not bool)
        or kwargs.get("stream") is not None
        or not IDS_KERNEL
    ):
        return _GENERAL
    if adapter.kind == "torch":
        torch = namespace("torch")
        if (
            torch.compiler.is_compiling()
            or torch._C._functorch.maybe_current_level() is not None
            or not (ids.dtype == torch.int64 or (ids.dtype == torch.int32 and ns <= INT32_MAX))
            or not ids.is_contiguous()
            or x.layout != torch.strided
            or (out is not None and x.requires_grad)
        ):
            return _GENERAL
    elif (
        ids.dtype.kind != "i"
        or not (ids.dtype.itemsize == 8 or (ids.dtype.itemsize == 4 and ns <= INT32_MAX))
        or not ids.flags.c_contiguous
    ):
        return _GENERAL  # (int32 ids against a count past int32 compare as the general route's int64 ones)
    device = adapter.device_of(x)
    if device is None or adapter.device_of(ids) != device or ids.ndim != 1 or not x.ndim:
        return _GENERAL
    if adapter.kind == "cupy" and device != namespace("cupy").cuda.runtime.getDevice():
        return _GENERAL  # (CuPy's operations run on the current device: the general route makes it x's)
    try:
        ax = normalize_axis(axis, x.ndim)
    except (TypeError, ValueError, IndexError):
        return _GENERAL
    if ids.shape[0] != x.shape[ax] or not ids.shape[0]:
        return _GENERAL
    result = _by_ids_kernel(function, adapter, _Ops(adapter, x), x, ids, ns, ids_sorted, ax, out, check, kwargs,
                            device)  # fmt: skip
    return _GENERAL if result is None else result  # (_UNSORTED: the general route sorts them)


def _by_ids(
    function: Any,
    adapter: Any,
    x: Any,
    device: int | None,
    segment_ids: Any,
    ns: int | None,
    ids_sorted: Any,
    axis: Any,
    out: Any,
    check: bool,
    positions: bool,
    kwargs: dict[str, Any],
    unsorted_inside: bool = False,
) -> Any:
    """:func:`reduce_by_ids` once ``x`` is known to be an array of a library linred reads
    (``unsorted_inside``: device ids that ids.cuh's kernel found out of order and within
    ``[0, num_segments)``, which need not be read again)."""
    ops, kind = _Ops(adapter, x), adapter.kind
    ax = normalize_axis(axis, len(x.shape))
    n = x.shape[ax]
    ids = ops.ids(unchecked_ids(segment_ids, check, ns), device)
    if ids.shape[0] != n:
        raise ValueError(f"segment_ids must have one id per element along axis {ax} ({n}); got {ids.shape[0]}")

    if kind == "torch" and out is not None and x.requires_grad and ops.xp.is_grad_enabled():
        # (as the functions refuse it: the reduction below may compute aside and copy into out)
        raise TypeError("out= and stream= are not supported for a tensor that requires grad: the result is a new "
                        "tensor on the current stream")  # fmt: skip
    if kind == "torch" and ops.xp.compiler.is_compiling():
        return _by_ids_traced(function, ops, x, ids, ns, ids_sorted, ax, out, check, positions, kwargs)
    if device is not None and ns is not None and n > 0 and not positions and IDS_KERNEL and not unsorted_inside:
        result = _by_ids_kernel(function, adapter, ops, x, ids, ns, ids_sorted, ax, out, check, kwargs, device)
        if result is _UNSORTED:
            unsorted_inside = True
        elif result is not None:
            return result
    known = n > 0 and _reads_ids(check, device)
    if unsorted_inside:  # (checked by the kernel: in [0, ns), out of order)
        lo, hi, is_sorted = 0, ns - 1, False
    else:
        if known and device is not None:
            _refuse_capture(adapter, ids, "segment_ids")  # (a read back: no capture allows it)
        lo, hi, is_sorted = ops.summary(ids) if known else (0, -1, n == 0 or ids_sorted is True)
    if ns is None:
        ns = hi + 1 if known else (int(ids.max()) + 1 if n else 0)  # (a read back on a device)
        ns = max(ns, 0)
    inside = known and lo >= 0 and hi < ns
    if check and known and not inside:
        raise outside_error(ids, ns)

    order = None
    if not is_sorted:
        order = ops.argsort(_sort_keys(ops, ids, ns, device, known and inside))
        ids = ops.take(ids, order, 0)
        x = ops.take(x, order, ax)
    trim = not inside and n > 0
    padded = None
    if device is not None and n > 0 and IDS_KERNEL and not ops.transformed():  # (else five library operations)
        padded = _kernel_offsets(adapter, ids, ns, device, adapter.resolve_stream(None, device))
    if padded is not None:  # (a device's ids are read only to be checked: inside, or trimmed by the sentinels)
        offsets = padded if trim else ops.part(padded, 0, 1, ns + 2)
    else:
        offsets = ops.searchsorted(ids, ops.arange(ns + 1))
    if trim and padded is None and known and not positions:
        # Ids read (on the host) that lie outside [0, ns): in the ids' order their elements come
        # before offsets[0] and from offsets[ns] on, and the data between is reduced alone (none
        # of theirs is read: no overflow of theirs warns, no gradient of theirs is computed).
        first, end = int(offsets[0]), int(offsets[-1])
        x = x[(slice(None),) * ax + (slice(first, end),)]
        offsets = offsets - first
        trim = False
    if trim:  # ids outside [0, ns) may be there: sentinel segments take them, then go
        offsets = offsets if padded is not None else ops.pad(offsets, n)
        x = _dropped_as_ones(function, ops, x, ids, ns, ax)
    if not positions:  # (argmax and argmin take no out=)
        kwargs["out"] = None if trim else out
    result = function(x, offsets=offsets, axis=ax, check=False, **kwargs)
    if trim:
        result = ops.part(result, ax, 1, ns + 1)
    if positions and order is not None:
        result = _unsort_positions(ops, result, order, n)
    return _into(out, result, adapter, ops, device)


#: whether device rows gathered into the ids' order are copied by gather.cuh's kernel
#: (:mod:`linred.arrays._device_gather`) rather than the array library's gather
GATHER_KERNEL = True
#: ... for this many rows or more: below, the launch through the driver costs more host time than
#: the library's gather takes (H200, torch, unsorted ids of float32 rows, check=False, µs a call
#: with a synchronize: 2,000 x 64 233 against 222 by index_select, 50,000 x 128 312 against
#: 293; 10^6 x 64 411 against 889, 4 x 10^6 x 16 676 against 2,939, 10^7 x 1 1,000 against 1,005)
GATHER_MIN_ROWS = 1 << 17
#: fewest device ids from which their sort reads them as int32 keys (clamped to [-1,
#: num_segments] first where they are not known to lie in [0, num_segments): every id below 0
#: then sorts first and every id of num_segments or more last, as before, and the ids in
#: range in their order): half the radix passes of int64 keys, for one or two elementwise
#: operations more (H200, stable torch.argsort with a synchronize: 2,000 ids 62 us int64 against
#: 52 int32; 50,000 110 against 73; 10^6 179 against 108; 10^7 1,020 against 502; the clamp and
#: the conversion 23 us at 10^6, 85 at 10^7)
NARROW_KEYS_MIN = 1 << 15


def _sort_keys(ops: _Ops, ids: Any, ns: int, device: int | None, inside: bool) -> Any:
    """What the stable sort of ``ids`` (int64) reads: int32 keys for many device ids where
    ``num_segments`` fits (:data:`NARROW_KEYS_MIN`), else the ids."""
    if device is None or ids.shape[0] < NARROW_KEYS_MIN or ns >= INT32_MAX:
        return ids
    xp = ops.xp
    if ops.kind == "torch":
        return (ids if inside else xp.clamp(ids, -1, ns)).to(xp.int32)
    return (ids if inside else xp.clip(ids, -1, ns)).astype(xp.int32)


def _kernel_offsets(adapter: Any, ids: Any, ns: int, device: int, stream: int, word: int = 0) -> Any:
    """The offsets of device ``ids`` (contiguous int32 or int64; for sorted ids, exact) framed by
    sentinel segments, ``[0, offsets..., n]``, written by ids.cuh's kernel in one launch on
    ``stream`` (testing the ids' rules into ``word`` where it is not 0), or None where the kernel
    cannot run (the caller then takes the array library's operations)."""
    padded = adapter.empty((ns + 3,), "int64", device)
    wide = ids.dtype.itemsize == 8
    if not _device_ids.to_offsets(adapter.pointer(ids), wide, ids.shape[0], ns, adapter.pointer(padded), word, device,
                                  stream):  # fmt: skip
        return None
    return padded


def _into(out: Any, result: Any, adapter: Any, ops: _Ops, device: int | None) -> Any:
    """``result``, copied into ``out`` where one was given and the result was computed aside (out
    must then be what the call itself accepts)."""
    if out is not None and result is not out:
        validate_out(out, adapter, tuple(result.shape), adapter.info(result).dtype, device)
        if ops.kind == "torch":
            out.copy_(result)
        else:
            ops.xp.copyto(out, result)
        return out
    return result


#: whether device ids with num_segments become offsets by ids.cuh's kernel (linred.arrays._device_ids:
#: one launch, the ids' rules tested on the way) rather than the array library's operations
IDS_KERNEL = True


def _by_ids_kernel(function: Any, adapter: Any, ops: _Ops, x: Any, ids: Any, ns: int, ids_sorted: Any, ax: int,
                   out: Any, check: bool, kwargs: dict[str, Any], device: int) -> Any:  # fmt: skip
    """:func:`_by_ids` of device data with ``num_segments`` through ``ids.cuh`` (one launch writes
    the offsets and tests the ids), or None where that does not serve the call: ids said to be
    unsorted, or not promised sorted and unchecked (sorted by the caller's route, which reads
    nothing), a torch.func transform's tensors, or a device the kernel cannot run on; or
    :data:`_UNSORTED` for ids it found out of order.  A checked call waits for the kernel
    once and raises on ids outside [0, ns); its offsets are then exact.  An unchecked call with
    sorted ids promised reads nothing back: sentinel segments take the ids outside [0, ns), as
    :func:`_by_ids` arranges them."""
    if ids_sorted is False or (not check and ids_sorted is not True):
        return None
    if ops.transformed():
        return None
    if check:
        _refuse_capture(adapter, ids, "segment_ids")  # (a read back: no capture allows it)
    stream = adapter.resolve_stream(None, device)
    padded = _kernel_offsets(adapter, ids, ns, device, stream, adapter.check_word(ids) if check else 0)
    if padded is None:
        return None
    if check:
        # (the verdict before the reduction: offsets of unsorted ids may decrease, and no
        # reduction reads such offsets but on the caller's promise, check=False)
        _device_checks.passed(stream, device)
        flags = _device_checks.word_value()
        if flags & _device_ids.OUTSIDE:
            raise outside_error(ids, ns)
        if flags & _device_ids.UNSORTED:
            return _UNSORTED  # (in [0, ns): sorted by the caller's route, which need not read them)
        kwargs["out"] = out  # (ids in [0, ns), in order: the offsets between the sentinels are exact)
        return function(x, offsets=ops.part(padded, 0, 1, ns + 2), axis=ax, check=False, **kwargs)
    x = _dropped_as_ones(function, ops, x, ids, ns, ax)
    kwargs["out"] = None
    result = function(x, offsets=padded, axis=ax, check=False, **kwargs)
    return _into(out, ops.part(result, ax, 1, ns + 1), adapter, ops, device)


def _by_ids_traced(function: Any, ops: _Ops, x: Any, ids: Any, ns: int | None, ids_sorted: Any, ax: int, out: Any,
                   check: bool, positions: bool, kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """:func:`_by_ids` inside ``torch.compile``, which cannot read the ids (a value read back is a
    graph break, and an error with ``fullgraph=True``): ``num_segments`` must be given; the ids
    are sorted unless promised sorted with ``check=False`` on a CUDA device (host ids are sorted
    always: outside the compiler they are read, and a wrong promise does not count); with
    ``check=True`` an operator checks them as it makes the offsets (the ``ValueError`` of ids
    outside ``[0, num_segments)``, as outside the compiler), with ``check=False`` such ids are
    dropped, as outside the compiler."""
    if ns is None:
        raise TypeError("inside torch.compile, segment_ids needs num_segments: the result's shape cannot depend "
                        "on the ids' values")  # fmt: skip
    n = x.shape[ax]
    order = None
    given = ids
    if n and not (ids_sorted is True and not check and x.is_cuda):
        order = ops.argsort(ids)
        ids = ops.take(ids, order, 0)
        x = ops.take(x, order, ax)
    if check:
        from linred._torch_ops import segment_ids_offsets

        offsets = segment_ids_offsets(given, ids, ns)  # (valid offsets once it returns)
    else:  # sentinel segments take the ids outside [0, ns), then go
        offsets = ops.pad(ops.searchsorted(ids, ops.arange(ns + 1)), n)
        x = _dropped_as_ones(function, ops, x, ids, ns, ax)
    result = function(x, offsets=offsets, axis=ax, check=False, **kwargs)
    if not check:
        result = result[(slice(None),) * ax + (slice(1, ns + 1),)]
    if positions and order is not None:
        result = _unsort_positions(ops, result, order, n)
    return result


def _dropped_as_ones(function: Any, ops: _Ops, x: Any, ids: Any, ns: int, ax: int) -> Any:
    """``x`` for a call whose ids outside ``[0, ns)`` go to sentinel segments: for a product that
    autograd records, their elements as 1 (their product's derivative, 0 times the product of
    the others, would be NaN where that product overflows; 1's derivative here is 0)."""
    if not (ops.kind == "torch" and function.__name__ == "segmented_prod" and x.requires_grad
            and ops.xp.is_grad_enabled()):  # fmt: skip
        return x
    shape = [1] * x.dim()
    shape[ax] = x.shape[ax]
    return ops.xp.where(((ids < 0) | (ids >= ns)).reshape(shape), 1.0, x)


def _unsort_positions(ops: _Ops, result: Any, order: Any, n: int) -> Any:
    """Positions into the sorted data made positions into the caller's (``n``, none, stays ``n``)."""
    xp = ops.xp
    if n == 0:
        return result
    safe = xp.clamp(result, max=n - 1) if ops.kind == "torch" else xp.minimum(result, n - 1)
    mapped = order[safe]
    return xp.where(result < n, mapped, result)
