"""The GPU plumbing under every GPU backend: CuPy and PyTorch arrays, streams, stream order.

No backend imports another; what they share on the GPU is here (and the kernels
they share are in :mod:`linred.kernels`).  Three groups:

- CuPy helpers, for the backends that run CuPy (``cub``, ``cublas``): a CuPy
  stream object for a raw ``cudaStream_t`` (:func:`cupy_stream`,
  :func:`on_stream`), zero-copy CuPy views of CuPy arrays and CUDA tensors
  (:func:`as_cupy`, :func:`bits16`, :func:`span_view`) and device pointers
  (:func:`data_ptr`);
- array operations on a stream, one class per array library (:class:`CupyOps`,
  :class:`TorchOps`, chosen by :func:`ops_for`), for the backends that work on
  the caller's own arrays (``nvmath``, ``nvrtc``); :class:`StreamOrder` orders a
  call on a new stream after the previous call of the same executor;
- pointer alignment (:func:`alignment`).

CuPy is imported here when it is installed; PyTorch only by :class:`TorchOps`.
The ``nvmath`` and ``nvrtc`` backends run on PyTorch alone, so nothing here needs
CuPy unless it is called with CuPy arrays.  What host and device executors share
(NumPy views of host data, PyTorch's lazy conjugate bit) is in
:mod:`linred.arrays.views`.

A handle becomes a stream object of the array library: for PyTorch, handle 0
(the legacy default stream, which is PyTorch's default stream) must not go
through ``torch.cuda.ExternalStream``, which reads 0 as "no handle given" and
returns a stream from PyTorch's pool instead: work enqueued there is not
ordered with the default stream the libraries' kernels run on.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from linred.arrays._context import driver as cuda_driver
from linred.arrays._context import is_current, on_device

try:
    import cupy
except Exception:  # not installed, or a broken CUDA install (it raises more than ImportError)
    cupy = None  # PyTorch alone: only TorchOps, StreamOrder, physical and alignment serve it

# --- CuPy: streams, views and pointers ---------------------------------------------

_streams: dict[tuple[int, int], Any] = {}
_streams_lock = threading.Lock()


def cupy_stream(handle: int, device: int) -> Any:
    """A CuPy stream object for a raw ``cudaStream_t`` on ``device`` (cached)."""
    key = (handle, device)
    stream = _streams.get(key)
    if stream is None:
        from linred.arrays._cupy import external_stream

        with _streams_lock:
            stream = _streams.setdefault(key, external_stream(handle, device))
    return stream


class on_stream:
    """Make ``device`` current and ``handle`` CuPy's current stream for the block.

    CuPy kernels, CuPy's cuBLAS wrappers (which set the handle's stream to CuPy's
    current stream on every call) and CuPy's memory pool all follow CuPy's
    current stream, so entering this is what puts their work on the resolved
    stream instead of the legacy default stream.
    """

    __slots__ = ("_device", "_stream")

    def __init__(self, handle: int, device: int) -> None:
        self._device = cupy.cuda.Device(device)
        self._stream = cupy_stream(handle, device)

    def __enter__(self) -> Any:
        self._device.__enter__()
        self._stream.__enter__()
        return self._stream

    def __exit__(self, *exc: object) -> None:
        try:
            self._stream.__exit__(*exc)
        finally:
            self._device.__exit__(*exc)


def as_cupy(a: Any) -> Any:
    """``a`` as a CuPy array without copying (CuPy arrays pass through; CUDA tensors via DLPack).

    bfloat16 tensors have no CuPy dtype: view them with :func:`bits16` first.
    Call it on the stream the result will be used on: PyTorch orders its
    current stream before that stream when it exports a tensor.
    """
    if isinstance(a, cupy.ndarray):
        return a
    return cupy.from_dlpack(a)


def data_ptr(a: Any) -> int:
    """The device address of element ``[0, ..., 0]`` of a CuPy array or CUDA tensor."""
    if isinstance(a, cupy.ndarray):
        return a.data.ptr
    return a.data_ptr()


def bits16(a: Any) -> Any:
    """A 16-bit floating array (float16, bfloat16) viewed as int16, same kind, no copy."""
    if isinstance(a, cupy.ndarray):
        return a.view(cupy.int16)
    import torch

    return a.view(torch.int16)


def span_view(a: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[Any, int]:
    """A 1-D contiguous view of the memory an array spans, and its first element's index in it.

    ``strides`` are in elements.  The view starts at the lowest address the
    array touches and ends at the highest, so gaps between rows are included
    but never read; kernels address element ``idx`` of the array as
    ``base + sum(idx[k] * strides[k])`` in the view.
    """
    if any(s == 0 for s in shape):
        raise ValueError("span_view of an empty array")
    low = sum(s * (n - 1) for n, s in zip(shape, strides, strict=True) if s < 0)
    high = sum(s * (n - 1) for n, s in zip(shape, strides, strict=True) if s > 0)
    base = -low
    length = high - low + 1
    if isinstance(a, cupy.ndarray):
        itemsize = a.dtype.itemsize
        mem = a.data + low * itemsize
        return cupy.ndarray((length,), dtype=a.dtype, memptr=mem), base
    import torch

    # PyTorch has no negative strides, so ``a`` starts at the lowest address.
    return torch.as_strided(a, (length,), (1,)), base


# --- array operations on a stream, per array library -------------------------------

_torch_streams: dict[tuple[int, int], Any] = {}
_torch_streams_lock = threading.Lock()


#: per device: linred's own stream (a raw handle), where executors that are dropped in any order
#: keep their long-lived buffers (:class:`StreamOrder` with ``own=True``): made through the driver
#: (non-blocking), never destroyed, and no other code's (PyTorch's pooled streams are handed out
#: round-robin, to the caller's ``torch.cuda.Stream()`` too)
_own_streams: dict[int, int] = {}
_own_streams_lock = threading.Lock()


def own_stream(device: int) -> int:
    """The handle of linred's own stream on ``device`` (made at first use)."""
    handle = _own_streams.get(device)
    if handle is None:
        with _own_streams_lock:
            handle = _own_streams.get(device)
            if handle is None:
                from cuda.bindings import driver

                with on_device(device):  # (a stream belongs to the context current when it is made)
                    flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
                    handle = _own_streams[device] = int(_checked(driver.cuStreamCreate(flags), "create a stream"))
    return handle


class _DriverOrdering:
    """What both array libraries' operations share for :class:`StreamOrder`: capture queries and
    events through the driver, on the operations' ``device``."""

    device: int

    def capturing(self, stream: int) -> bool:
        with on_device(self.device):  # (handle 0 is the current context's null stream)
            return capturing(stream)

    def record_unless_capturing(self, event: Any, stream: int) -> bool:
        """Record ``event`` on ``stream`` unless the stream is being captured into a CUDA graph;
        whether it was recorded.  (What :meth:`StreamOrder.end` does on every call: two driver
        calls, without the nested blocks of :meth:`capturing` and the event's own methods.)"""
        if is_current(self.device):  # (handle 0 is the current context's null stream)
            return _record_unless_capturing(event.handle, stream)
        with on_device(self.device):
            return _record_unless_capturing(event.handle, stream)

    def record(self, event: Any, stream: int) -> None:
        """Record ``event`` on ``stream``, which the caller knows is not being captured."""
        if is_current(self.device):
            _record(event.handle, stream)
            return
        with on_device(self.device):
            _record(event.handle, stream)

    def event(self) -> Any:
        return DriverEvent(self.device)

    @staticmethod
    def wait(stream: int, event: Any) -> None:
        event.wait_on(stream)


class CupyOps(_DriverOrdering):
    """The operations the executors run on CuPy arrays, on device ``device``."""

    def __init__(self, device: int) -> None:
        self.device = device

    def current_stream(self) -> int:
        """The handle of CuPy's current stream on the device (where its pool allocates now)."""
        return cupy.cuda.get_current_stream(self.device).ptr

    def current_stream_object(self) -> Any:
        """CuPy's current stream on the device (held, its handle stays valid)."""
        return cupy.cuda.get_current_stream(self.device)

    def lasting(self, stream: Any, handle: int) -> bool:
        """Whether holding ``stream``, whose handle is ``handle``, keeps its CUDA stream alive: a
        stream CuPy made, not a wrapper of a raw handle (a ``cupy.cuda.ExternalStream``, or one
        linred made for a handle the caller named: :func:`linred.arrays._cupy.external_stream`),
        which the caller may destroy."""
        wrapper = getattr(stream, "_linred_wraps", False) or isinstance(stream, cupy.cuda.ExternalStream)
        return not wrapper and (handle, self.device) not in _streams

    def own_stream(self) -> tuple[int, Any]:
        """linred's own stream on the device (:func:`own_stream`): its handle, and CuPy's object of it."""
        handle = own_stream(self.device)
        return handle, cupy_stream(handle, self.device)

    @contextlib.contextmanager
    def on(self, stream: int) -> Iterator[None]:
        with cupy.cuda.Device(self.device), cupy_stream(stream, self.device):
            yield

    def synchronize(self, stream: int) -> None:
        cupy_stream(stream, self.device).synchronize()

    @staticmethod
    def view(base: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        itemsize = base.itemsize
        return cupy.lib.stride_tricks.as_strided(base, shape, tuple(s * itemsize for s in strides))

    @staticmethod
    def pointer(a: Any) -> int:
        return a.data.ptr

    @staticmethod
    def ones(size: int, dtype: str) -> Any:
        return cupy.ones(size, dtype=dtype)

    @staticmethod
    def empty(shape: tuple[int, ...], dtype: str) -> Any:
        return cupy.empty(shape, dtype=dtype)

    @staticmethod
    def arange(size: int, dtype: str) -> Any:
        return cupy.arange(size, dtype=dtype)

    @staticmethod
    def contiguous(a: Any, dtype: str) -> Any:
        """``a`` itself if it is C-contiguous of ``dtype``, else a contiguous converted copy."""
        if a.dtype.name == dtype and a.flags.c_contiguous:
            return a
        return cupy.ascontiguousarray(a, dtype=dtype)

    @staticmethod
    def copy(dst: Any, src: Any) -> None:
        dst[...] = src

    @staticmethod
    def cast(dst: Any, src: Any) -> None:
        """``dst[...] = src`` converting the dtype (rounded to nearest)."""
        cupy.copyto(dst, src, casting="unsafe")

    @staticmethod
    def divide_by_lengths(sums: Any, offsets: Any, out: Any, stream: int) -> None:
        """``out = sums / lengths`` per segment, NaN for an empty one; ``sums`` may be ``out``."""
        from linred.kernels.elementwise import divide_by_lengths

        divide_by_lengths(sums, offsets, out, stream)


class TorchOps(_DriverOrdering):
    """The operations the executors run on CUDA PyTorch tensors, on device ``device``."""

    def __init__(self, device: int) -> None:
        import torch

        from linred.arrays._torch import torch_dtype, torch_stream

        self._torch = torch
        self._torch_dtype = torch_dtype
        self._torch_stream = torch_stream
        self.device = device
        self._device = torch.device("cuda", device)

    def current_stream(self) -> int:
        """The handle of PyTorch's current stream on the device (where its allocator allocates now)."""
        return self._torch.cuda.current_stream(self.device).cuda_stream

    def current_stream_object(self) -> Any:
        """PyTorch's current stream on the device (held, its handle stays valid)."""
        return self._torch.cuda.current_stream(self.device)

    def lasting(self, stream: Any, handle: int) -> bool:
        """Whether the stream of ``handle`` stays alive: PyTorch's own streams are never destroyed;
        a handle linred wrapped (:func:`linred.arrays._torch.torch_stream`, which :meth:`stream`
        calls too) may be.  (PyTorch's current stream object does not tell:
        ``torch.cuda.current_stream()`` is a plain ``Stream`` also where an ``ExternalStream`` is
        current; a caller's own ``ExternalStream`` is the caller's to keep.)"""
        from linred.arrays._torch import WRAPPED

        return (handle, self.device) not in WRAPPED

    def own_stream(self) -> tuple[int, Any]:
        """linred's own stream on the device (:func:`own_stream`): its handle, and PyTorch's object of it."""
        handle = own_stream(self.device)
        return handle, self.stream(handle)

    def stream(self, handle: int) -> Any:
        """The PyTorch stream object of a raw handle (cached); 0 is the device's default stream."""
        key = (handle, self.device)
        s = _torch_streams.get(key)
        if s is None:
            made = self._torch_stream(handle, self._device)  # 0: the default stream, not a pooled one
            with _torch_streams_lock:
                s = _torch_streams.setdefault(key, made)
        return s

    @contextlib.contextmanager
    def on(self, stream: int) -> Iterator[None]:
        with self._torch.cuda.device(self.device), self._torch.cuda.stream(self.stream(stream)):
            yield

    def synchronize(self, stream: int) -> None:
        self.stream(stream).synchronize()

    @staticmethod
    def view(base: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        return base.as_strided(shape, strides)

    @staticmethod
    def pointer(a: Any) -> int:
        return a.data_ptr()

    def ones(self, size: int, dtype: str) -> Any:
        return self._torch.ones(size, dtype=self._torch_dtype(dtype), device=self._device)

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        return self._torch.empty(shape, dtype=self._torch_dtype(dtype), device=self._device)

    def arange(self, size: int, dtype: str) -> Any:
        return self._torch.arange(size, dtype=self._torch_dtype(dtype), device=self._device)

    def contiguous(self, a: Any, dtype: str) -> Any:
        """``a`` itself if it is contiguous of ``dtype``, else a contiguous converted copy."""
        return a.to(self._torch_dtype(dtype)).contiguous()

    @staticmethod
    def copy(dst: Any, src: Any) -> None:
        dst.copy_(src)

    @staticmethod
    def cast(dst: Any, src: Any) -> None:
        dst.copy_(src)

    def divide_by_lengths(self, sums: Any, offsets: Any, out: Any, stream: int) -> None:
        """``out = sums / lengths`` per segment (0 / 0 = NaN for an empty one), in the sums' precision.

        ``sums`` and ``out`` are ``(batch, m, features)``; float32 sums of float16 or
        bfloat16 data are divided in float32 and rounded once into ``out``.
        """
        torch = self._torch
        double = sums.dtype in (torch.float64, torch.complex128)
        lengths = torch.diff(offsets).to(torch.float64 if double else torch.float32).view(1, -1, 1)
        if sums.is_complex():
            # Parts divided separately: a complex division turns an infinite part into NaN.
            torch.div(torch.view_as_real(sums), lengths.unsqueeze(-1), out=torch.view_as_real(out))
        else:
            torch.div(sums, lengths, out=out)


def ops_for(kind: str, device: int) -> CupyOps | TorchOps:
    """The operations for arrays of ``kind`` (``"cupy"``, else PyTorch) on ``device``."""
    return CupyOps(device) if kind == "cupy" else TorchOps(device)


def capturing(stream: int) -> bool:
    """Whether ``stream`` (a raw handle) is being captured into a CUDA graph (asked in the current
    context: handle 0 is its null stream)."""
    driver, implicit, none = _capture_names or _load_capture_names()
    err, status = driver.cuStreamIsCapturing(stream)
    if err:  # (CUDA_SUCCESS is 0)
        if err == implicit:
            return True  # the legacy default stream, while another stream captures in global mode
        raise RuntimeError(f"cannot tell whether stream {stream:#x} is being captured: {err}")
    return status != none


#: (the driver, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CU_STREAM_CAPTURE_STATUS_NONE), looked up once:
#: :func:`capturing` is asked on every call of an executor with scratch
_capture_names: tuple[Any, Any, Any] | None = None


def _load_capture_names() -> tuple[Any, Any, Any]:
    global _capture_names
    driver = cuda_driver()
    _capture_names = (
        driver,
        driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE,
    )
    return _capture_names


def _record_unless_capturing(event: Any, stream: int) -> bool:
    """:meth:`_DriverOrdering.record_unless_capturing` in the current context (``event`` a handle)."""
    if capturing(stream):
        return False
    _record(event, stream)
    return True


def _record(event: Any, stream: int) -> None:
    """Record ``event`` (a handle) on ``stream`` in the current context."""
    (err,) = cuda_driver().cuEventRecord(event, stream)
    if err:
        raise RuntimeError(f"cannot record an event: {err}")


class StreamOrder:
    """Orders a call on a new stream after the previous call of the same executor.

    Executors reuse their scratch buffers and workspaces (nvmath's ``Matmul``
    objects one workspace) on whatever stream each call names; a call on another
    stream than the previous one must not start before that one is done.  Each
    call records an event on its stream (one driver call: the streams' own
    objects cost microseconds more per call); a call on another stream waits on
    it (no host synchronization).  The event is recorded after the call, not
    looked for on the previous stream at the next one: that stream may be gone.
    """

    def __init__(self, ops: CupyOps | TorchOps, own: bool = False) -> None:
        self._ops = ops
        self._event: Any = None
        self._last: int | None = None
        #: the stream whose memory pool the owner's buffers come from (:attr:`home`): linred's
        #: own stream of the device with ``own`` (for owners that allocate their buffers there),
        #: else the one current when it was made.  Its stream object is held, so that the handle
        #: :meth:`release` names is still a stream (a stream the caller made and dropped since
        #: would otherwise be destroyed, and a driver call on its handle may crash); where the
        #: object does not keep the stream alive (a wrapper of a raw handle the caller passed),
        #: :meth:`release` waits on the host instead of naming it.
        if own:
            self._home, self._held = ops.own_stream()
            self._lasting = True
        else:
            self._home = ops.current_stream()
            hold = getattr(ops, "current_stream_object", None)
            self._held = hold() if hold is not None else None
            # (the default streams, 0 and the per-thread and legacy handles 1 and 2, never go)
            self._lasting = self._held is None or self._home in (0, 1, 2) or ops.lasting(self._held, self._home)

    def begin(self, stream: int) -> None:
        if self._last is not None and stream != self._last:
            if self._ops.capturing(stream):
                # A capture can neither wait on work outside it nor let the host wait.
                raise RuntimeError(
                    "this plan's previous call ran on another stream, and a CUDA graph capture cannot wait "
                    "for it; make the warm-up calls on the stream that captures (torch.cuda.graph(g, stream=s) "
                    "after warming up on s), or call backend='nvrtc' or 'cub' inside the capture"
                )
            self._ops.wait(stream, self._event)

    def end(self, stream: int, capturing: bool | None = None) -> None:
        """After a call on ``stream``; ``capturing``: whether the stream is being captured into a
        CUDA graph, where the caller asked already (else asked here: a driver call)."""
        if self._event is None:
            self._event = self._ops.event()
        # An event recorded in a capture cannot order later eager calls: none is kept.  (A
        # graph's replays share the plan's workspace with eager calls of the same plan: they
        # must not run at the same time, as with any captured workspace.)
        if capturing is None:
            self._last = stream if self._ops.record_unless_capturing(self._event, stream) else None
        elif capturing:
            self._last = None
        else:
            self._ops.record(self._event, stream)
            self._last = stream

    def idle(self) -> None:
        """After a call on a stream the host has waited for since :meth:`begin`: that call's work
        is done, and so is any earlier call's it waited for, so a later call waits for nothing
        (and no event is recorded: a driver call saved)."""
        self._last = None

    def wait_idle(self) -> None:
        """Block until the last call's work is done: its buffers may then be released to any stream."""
        if self._event is not None:
            self._event.synchronize()
        self._last = None

    @property
    def home(self) -> int:
        """The stream the owner allocates its long-lived buffers on (``with ops.on(order.home)``),
        then waits for before another stream reads them.  Not the first call's stream: the
        caller may destroy that one before the owner goes, and :meth:`release` must name a
        live stream then."""
        return self._home

    def release(self) -> None:
        """Before the owner's buffers go back to the memory pool of the stream they were allocated
        on: that stream waits for the last call, where it ran on another one (no host wait; the
        pool orders the memory's next use on that stream after it).  Nothing where the last call
        ran there, where the host has waited for it, or where that stream is being captured into
        a CUDA graph (which cannot wait on work outside it).  The host waits for the last call
        where the home stream may be gone (see ``__init__``)."""
        last, home = self._last, self._home
        if last is None or last == home or self._event is None:
            return
        if not self._lasting:
            self._event.synchronize()
            return
        if self._ops.capturing(home):
            return
        self._ops.wait(home, self._event)


class ReleasedInOrder:
    """What an executor with a :class:`StreamOrder` (``self._order``) and scratch buffers does
    when it is dropped without :meth:`free` (a plan evicted from the functions' cache, a dropped
    cache entry): its buffers were allocated on the stream current when it was planned, and
    CuPy's and PyTorch's pools hand memory back to that stream's allocations without waiting
    for the streams later calls used (a kernel still running there would write into another
    array), so that stream first waits for its last call (:meth:`StreamOrder.release`)."""

    def __del__(self) -> None:
        order = getattr(self, "_order", None)
        if order is not None:
            try:  # noqa: SIM105 (at interpreter exit contextlib may be gone, and the driver: nothing to order)
                order.release()
            except Exception:
                pass


class DriverEvent:
    """A CUDA event without timing on ``device``, recorded
    (:meth:`_DriverOrdering.record_unless_capturing`) and waited on through the driver (one call
    each, where the array libraries' event and stream objects cost microseconds)."""

    __slots__ = ("_device", "_driver", "handle")

    def __init__(self, device: int) -> None:
        self._device = device
        from cuda.bindings import driver

        self._driver = driver
        with on_device(device):  # (an event belongs to the context current when it is made)
            flags = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
            self.handle = _checked(driver.cuEventCreate(flags), "create an event")

    def wait_on(self, stream: int) -> None:
        """Make ``stream`` wait for the work before the last record (no host synchronization)."""
        with on_device(self._device):
            _checked(self._driver.cuStreamWaitEvent(stream, self.handle, 0), "wait on an event")

    def synchronize(self) -> None:
        _checked(self._driver.cuEventSynchronize(self.handle), "wait for an event")

    def __del__(self) -> None:
        try:  # noqa: SIM105 (at interpreter exit, contextlib may be gone already)
            self._driver.cuEventDestroy(self.handle)
        except Exception:  # (and so may the driver)
            pass


def _checked(result: tuple, what: str) -> Any:
    err, *rest = result
    if err:  # (CUDA_SUCCESS is 0)
        raise RuntimeError(f"cannot {what}: {err}")
    return rest[0] if rest else None


# --- alignment -----------------------------------------------------------------------


def alignment(pointer: int) -> int:
    """The largest power of two (at most 256) that divides ``pointer``."""
    return min(256, pointer & -pointer) if pointer else 256
