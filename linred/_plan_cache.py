"""The functions' plans: a bounded, thread-safe LRU of :class:`~linred.plan.SegmentedReduction`.

``linred.segmented_sum(x, ...)`` is a cached plan call.  :func:`call` describes
the call cheaply (the reduction, the array's type and layout key, the segment
arguments, axis, dtype, backend and check, the backends' options generation and
the thread) and looks the plan up; the first call of a description validates it
and builds the plan, later ones run it.  Offsets and lengths are arguments of
each call: they are converted and (with ``check=True``) validated on every call,
and only their array type, shape and dtype are part of the description.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import linred.backends as _backends
from linred._frontend import check_reduction, request
from linred.arrays import adapter_for, adapters
from linred.plan import SegmentedReduction
from linred.segments import VariableSegments, explain, parse_lengths, parse_offsets, verify

__all__ = ["call", "clear_plan_cache", "plan_cache_info", "set_plan_cache_size"]


class PlanCache:
    """A bounded LRU of plans keyed by a call's description and thread.

    A hit stamps its plan with the hit count (its last use); the least recently
    used plan is looked for only when one must be evicted, which keeps a hit to one
    dictionary read.  Plans hold per-plan state (library handles, operand bindings)
    that is not safe to share between threads, so each thread gets its own; the
    lock guards only the dictionary's updates.  An evicted plan is dropped, not
    freed: a call in another thread may still be running it, and its resources are
    released with the last reference to it (after the lock; see
    :class:`linred.backends._device.ReleasedInOrder` for GPU scratch).
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.plans: dict[tuple, SegmentedReduction] = {}
        self._lock = threading.Lock()
        self.misses = 0

    # Evicted plans are let go after the lock is released: dropping a GPU plan makes driver calls
    # (:class:`linred.backends._device.ReleasedInOrder`), which other threads need not wait for.

    def put(self, key: tuple, plan: SegmentedReduction) -> None:
        plan._last_use = _hits
        with self._lock:
            if self.maxsize:
                self.plans[key] = plan
            dropped = self._evict(self.maxsize)
        del dropped

    def _evict(self, maxsize: int) -> list[SegmentedReduction]:
        plans = self.plans
        dropped = []
        while len(plans) > maxsize:
            dropped.append(plans.pop(min(plans, key=lambda k: plans[k]._last_use)))
        return dropped

    def resize(self, maxsize: int) -> None:
        with self._lock:
            self.maxsize = maxsize
            dropped = self._evict(maxsize)
        del dropped

    def clear(self) -> None:
        with self._lock:
            dropped = list(self.plans.values())
            self.plans.clear()
        del dropped


_cache = PlanCache(64)
#: calls that found their plan; also each plan's last-use stamp
_hits = 0
_plans = _cache.plans  # read without the lock: a call's lookup is one dict access
_get_ident = threading.get_ident
# Plans keep the options they were made with; those made with replaced ones are unreachable.
_backends._on_configure.append(_cache.clear)


def _spec(obj: Any) -> Any:
    """The part of a call's key an offsets or lengths argument contributes: its type, shape
    (length) and dtype; the values are checked on every call."""
    if obj is None:
        return None
    shape = getattr(obj, "shape", None)
    return (type(obj), len(obj) if shape is None else shape, getattr(obj, "dtype", None))


def call(
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
    """The body of the public functions: find the call's plan (or make it) and run it."""
    adapter = adapters.get(type(x))
    key = None
    if adapter is not None:
        fixed = offsets is None and lengths is None
        try:
            key = (
                reduction,
                adapter.key(x),  # (the adapter knows one array type: the key names it)
                segment_length,
                type(segment_length),  # 4.0 and True equal 4 and 1, and must still be refused
                None if fixed else (_spec(offsets), _spec(lengths)),
                axis,
                type(axis),
                dtype,
                backend,
                check,
                type(check),
                _backends._generation,
                _get_ident(),
            )
            plan = _plans.get(key)
        except (TypeError, RuntimeError):
            # An unhashable argument, or an array that cannot describe itself (a torch tensor of a
            # sparse compressed or nested layout has no strides): described and refused (or
            # served) below, as the first call of its description is.
            plan = key = None
        if plan is not None:
            global _hits
            _hits += 1  # (a module global: a call's cheapest counter)
            plan._last_use = _hits
            if stream is None:
                handle, named = plan._current_stream and plan._current_stream(), False
            else:  # (a named stream: the result is allocated on it, see SegmentedReduction._run)
                handle, named = plan._stream(stream), True
            if fixed:
                return plan._run(x, out, handle, plan._segments, named)
            if (
                plan._offsets_as_given
                and type(offsets) is plan._type
                and offsets.dtype == plan._offsets_dtype
                and plan._device_of(offsets) == plan._device
                and plan._contiguous(offsets)
            ):
                # Contiguous offsets of the first call's array type, shape (the key), dtype and
                # device: used as they are, as parse_offsets would return them.
                if check is False:
                    return plan._run(x, out, handle, VariableSegments(offsets, plan._count), named)
                if plan._armed and stream is None and not plan._capturing(offsets):
                    # Checked by the kernel that reads them (as parse_offsets arranges it when
                    # deferred): this thread's word armed, one wait for the stream after the call.
                    segments = VariableSegments(offsets, plan._count, word=plan._arm(offsets))
                    if plan._ahead:
                        return _checked_ahead(plan, x, out, handle, segments, None)
                    result = plan._run(x, out, handle, segments)
                    if not plan._check_passed(handle, plan._device):
                        req = plan._request
                        explain(segments, req.adapter, None, n=req.problem.n, axis=req.axis, device=plan._device)
                    return result
            segments = _segments(plan, offsets, lengths, check, stream, handle)
            if segments.offsets.dtype == plan._offsets_dtype:
                if not segments.word:
                    return plan._run(x, out, handle, segments, named)
                if plan._ahead:
                    return _checked_ahead(plan, x, out, handle, segments, lengths, named)
                # Checked by the kernel that reads them: one wait for the stream, after the call.
                result = plan._run(x, out, handle, segments, named)
                req = plan._request
                verify(segments, req.adapter, handle, lengths, n=req.problem.n, axis=req.axis, device=plan._device)
                return result
            # (a list whose values convert to another dtype than the plan's: planned anew below)
    elif _first_tensor(x):
        from linred import _dynamo

        return _dynamo.run(reduction, x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
    elif adapter_for(x) is not None and type(x) in adapters:
        # The first array of a library linred knows: looking up its adapter registered it, so
        # this call is keyed and its plan cached like the calls after it.
        return call(reduction, x, segment_length, offsets, lengths, axis, dtype, out, backend, stream, check)
    check_reduction(reduction)
    req, x, handle = request(
        reduction,
        x,
        segment_length=segment_length,
        offsets=offsets,
        lengths=lengths,
        axis=axis,
        dtype=dtype,
        backend=backend,
        check=check,
        stream=stream,
    )
    _cache.misses += 1
    plan = SegmentedReduction._from_request(req, x)
    if plan._prepare is not None and key is not None and key[1] != plan._x_key:
        # The calls of this key bring arrays that preparing changes (a PyTorch tensor with its
        # conjugate or negative bit, say): each is prepared in full.
        plan._prepare = req.adapter.prepare
    segments = req.segments
    # (offsets that parse_offsets returned as they came: a later unchecked call may skip it)
    plan._offsets_as_given = lengths is None and segments.__class__ is VariableSegments and segments.offsets is offsets
    # (offsets on a device that the plan's kernel checks as it reads them: a later checked call
    # with offsets of this layout arms the check word itself, as parse_offsets would)
    plan._armed = plan._offsets_as_given and plan._checks_offsets and plan._device is not None and segments.count > 0
    # (a large call whose offsets are few: the verdict from a check enqueued ahead of the reduction)
    plan._ahead = _ahead(plan, segments) if check and plan._checks_offsets and plan._device is not None else False
    if key is not None and _cache.maxsize:
        _cache.put(key, plan)
    return plan._run(x, out, handle, req.segments, stream is not None)


def _ahead(plan: SegmentedReduction, segments: Any) -> bool:
    """Whether the plan's checked calls take their verdict from the offsets check launched ahead
    of the reduction (:func:`linred.arrays._device_checks.ahead_pays`); if so, the plan gets what
    :func:`_checked_ahead` calls."""
    if segments.__class__ is not VariableSegments or not segments.count:
        return False
    from linred._dtypes import itemsize
    from linred.arrays import _device_checks

    problem = plan._request.problem
    offsets = segments.offsets
    data = problem.batch * problem.n * problem.features * itemsize(problem.dtype)
    if not _device_checks.ahead_pays(data, (segments.count + 1) * offsets.itemsize):
        return False
    plan._wide = offsets.itemsize == 8
    plan._check_ahead = _device_checks.check_ahead
    plan._verdict = _device_checks.verdict
    return True


def _checked_ahead(plan: SegmentedReduction, x: Any, out: Any, handle: Any, segments: VariableSegments,
                   lengths: Any, named: bool = False) -> Any:  # fmt: skip
    """A checked call (``segments.word`` armed) whose verdict comes from the offsets check
    enqueued ahead of its reduction: it waits for that check, not for the reduction, and
    returns while the reduction runs (the next call's host work overlaps it).  Bad offsets
    are read by the checking reduction as empty segments; the call then waits for the stream
    and raises the ValueError that names them, as a call that waits for its reduction does."""
    req, device = plan._request, plan._device
    if plan._check_ahead(plan._pointer(segments.offsets), plan._wide, segments.count, req.problem.n, device, handle):
        try:
            result = plan._run(x, out, handle, segments, named)
            passed = plan._verdict(device)
        except BaseException:
            # The check, and any reduction behind it, end before this thread's word is armed again
            # (the reduction may still write it).
            plan._check_passed(handle, device)
            raise
        if passed:
            return result
    else:  # (the check cannot run on this device: the reduction's own check, waited for)
        result = plan._run(x, out, handle, segments, named)
    verify(segments, req.adapter, handle, lengths, n=req.problem.n, axis=req.axis, device=device)
    return result


def _first_tensor(x: Any) -> bool:
    """Whether ``x`` is the first PyTorch tensor linred meets, after linred was imported before
    PyTorch: looking up its adapter registers PyTorch's operator (:mod:`linred._dynamo`), and this
    call must take that path too, or a tensor that requires grad would lose its gradient."""
    from linred import _dynamo

    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor) or _dynamo.run is not call:
        return False  # (not a tensor, or the operator is registered already: a subclass, say)
    from linred.arrays import adapter_for

    adapter_for(x)  # (registers PyTorch's adapter and, with it, the operator)
    return _dynamo.run is not call  # this call switched the route


def _segments(plan: SegmentedReduction, offsets: Any, lengths: Any, check: bool, stream: Any, handle: Any) -> Any:
    """A call's offsets or lengths, converted and checked (as its plan's first call did)."""
    req = plan._request
    device = req.problem.device
    parse = parse_offsets if lengths is None else parse_lengths
    value = offsets if lengths is None else lengths
    deferred = plan._checks_offsets
    if stream is None:  # the library's current stream: where its own operations run anyway
        return parse(value, req.problem.n, req.axis, req.adapter, device, check, deferred)
    with req.adapter.on_stream(handle, device):  # moved, checked and derived on the call's stream
        return parse(value, req.problem.n, req.axis, req.adapter, device, check, deferred)


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
    are released once no running call uses it; where a GPU plan's last call ran
    on another stream than the one it was planned on, that stream is first made
    to wait for the call (its buffers go back to that stream's memory pool; the
    host does not wait).  The hit and miss counters are kept.

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
    _cache.clear()


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
    return {"size": len(_cache.plans), "maxsize": _cache.maxsize, "hits": _hits, "misses": _cache.misses}
