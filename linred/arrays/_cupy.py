"""The CuPy adapter (CUDA device arrays).  Imported only when a CuPy array is seen."""

from __future__ import annotations

import contextlib
from typing import Any

import cupy
import numpy

from linred._dtypes import dtype_name
from linred.arrays import _device_checks, _device_scan
from linred.arrays._base import ArrayAdapter, ArrayInfo, adapters, byte_range, ranges_overlap
from linred.arrays._numpy import _int_array, _lengths_summary, _lengths_to_offsets, _offsets_summary
from linred.arrays._streams import ProtocolStream, stream_handle

__all__ = ["CUPY", "CupyAdapter", "external_stream", "stream_handle"]


def external_stream(handle: int, device: int) -> Any:
    """A CuPy stream object for the raw handle ``handle`` of a stream on ``device``.

    CuPy 14 deprecates ``ExternalStream`` for ``Stream.from_external`` (the CUDA stream
    protocol), whose stream does not destroy the handle it wraps and belongs to the device
    current when it is made; older CuPy has only ``ExternalStream``.
    """
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is None:
        made = cupy.cuda.ExternalStream(handle, device)
    else:
        with cupy.cuda.Device(device):
            made = from_external(ProtocolStream(handle))
    # (marked: holding it does not keep the stream alive; see linred.backends._device.StreamOrder)
    with contextlib.suppress(AttributeError, TypeError):
        made._linred_wraps = True
    return made


@contextlib.contextmanager
def _on_device_stream(device: int, stream: int) -> Any:
    """``device`` current and the stream ``stream`` (a raw handle) of it current for the block."""
    with cupy.cuda.Device(device), external_stream(stream, device):
        yield


def _pinned_words() -> tuple[Any, int]:
    memory = cupy.cuda.alloc_pinned_memory(8)  # (the check's word and a note: linred.arrays._device_checks)
    return memory, memory.ptr


def _range(a: cupy.ndarray) -> tuple[int, int]:
    return byte_range(a.data.ptr, a.shape, a.strides, a.dtype.itemsize)


#: the dtypes the kernels read offsets as
_OFFSET_DTYPES = (numpy.dtype(numpy.int32), numpy.dtype(numpy.int64))


def _pointer(a: cupy.ndarray) -> int:
    return a.data.ptr


class CupyAdapter(ArrayAdapter):
    kind = "cupy"
    type_name = "cupy.ndarray"
    pointer = staticmethod(_pointer)

    def span(self, x: cupy.ndarray) -> tuple[int, int]:
        return _range(x)

    def info(self, x: cupy.ndarray) -> ArrayInfo:
        itemsize = x.dtype.itemsize
        plain = x.data.ptr % itemsize == 0 and all(s % itemsize == 0 for s in x.strides)
        return ArrayInfo(x.shape, tuple(s // itemsize for s in x.strides), dtype_name(x.dtype), x.device.id, plain)

    def device_of(self, x: cupy.ndarray) -> int:
        return x.device.id

    def reshape(self, x: cupy.ndarray, shape: tuple[int, ...]) -> cupy.ndarray:
        return x.reshape(shape)

    def is_c_contiguous(self, x: cupy.ndarray) -> bool:
        return x.flags.c_contiguous

    @contextlib.contextmanager
    def _writing(self, x: cupy.ndarray, stream: Any) -> Any:
        """``x``'s device and ``stream`` (or the current stream) current, for work that writes ``x``."""
        with x.device:
            target = cupy.cuda.get_current_stream() if stream is None else external_stream(stream, x.device.id)
            with target:
                yield

    def fill(self, x: cupy.ndarray, value: Any, stream: Any = None) -> None:
        with self._writing(x, stream):
            x.fill(value)

    def copy(self, dst: cupy.ndarray, src: cupy.ndarray, stream: Any = None) -> None:
        with self._writing(dst, stream):
            dst[...] = src

    def overlaps(self, a: cupy.ndarray, b: cupy.ndarray) -> bool:
        if a.device.id != b.device.id:
            return False
        return ranges_overlap(_range(a), _range(b))

    def index_array(self, obj: Any, device: int | None, name: str) -> cupy.ndarray:
        if (
            type(obj) is cupy.ndarray
            and obj.dtype in _OFFSET_DTYPES
            and obj.flags.c_contiguous
            and obj.device.id == device
        ):
            return obj  # (the common case, as it comes: no device switch, no asarray)
        if isinstance(obj, cupy.ndarray):
            if obj.device.id != device:
                raise ValueError(f"{name} is on CUDA device {obj.device.id} but x is on CUDA device {device}")
        elif type(obj).__module__.split(".")[0] == "torch":
            if obj.device.type == "cuda" and obj.device.index != device:
                raise ValueError(f"{name} is on CUDA device {obj.device.index} but x is on CUDA device {device}")
            if obj.device.type != "cuda":
                obj = obj.numpy()
        with cupy.cuda.Device(device):
            # The kernels read offsets as a plain array: a strided view is made contiguous.
            a = _int_array(cupy, obj, name)
            return a if a.flags.c_contiguous else cupy.ascontiguousarray(a)

    def key(self, x: cupy.ndarray) -> tuple:
        # The pointer's misalignment decides plainness with the strides.
        return (x.shape, x.strides, x.dtype, x.data.device_id, x.data.ptr % x.itemsize)

    def out_key(self, shape: tuple[int, ...], dtype: str, device: int | None) -> tuple:
        dt = cupy.dtype(dtype)
        strides, step = [], dt.itemsize
        for d in reversed(shape):
            strides.append(step)
            step *= max(d, 1)
        return (tuple(shape), tuple(reversed(strides)), dt, device, 0)

    def allocator(self, dtype: str, device: int | None) -> Any:
        get_device = cupy.cuda.runtime.getDevice
        ndarray, dt = cupy.ndarray, cupy.dtype(dtype)  # resolved once: calls are counted in microseconds

        def empty(shape: tuple[int, ...]) -> cupy.ndarray:
            if get_device() == device:
                return ndarray(shape, dt)
            with cupy.cuda.Device(device):
                return ndarray(shape, dt)

        return empty

    def capturing(self, x: cupy.ndarray) -> bool:
        """Whether the current stream of ``x``'s device (the stream its call runs on) is being
        captured into a CUDA graph, whichever device is current (asked with ``x``'s device
        current: the null stream's handle 0 names the current device's)."""
        device = x.device.id
        if device == cupy.cuda.runtime.getDevice():
            return cupy.cuda.get_current_stream().is_capturing()
        with cupy.cuda.Device(device):
            return cupy.cuda.get_current_stream().is_capturing()

    def current_stream(self, device: int) -> Any:
        current = cupy.cuda.get_current_stream
        return lambda: current(device).ptr

    def on_stream(self, stream: Any, device: int | None) -> Any:
        # CuPy's operations run on the current device, whichever device their arrays are on (and
        # read another device's through peer access): the data's device is made current too.
        switch = device is not None and device != cupy.cuda.runtime.getDevice()
        if stream == cupy.cuda.get_current_stream(device).ptr:
            return cupy.cuda.Device(device) if switch else contextlib.nullcontext()
        return _on_device_stream(device, stream) if switch else external_stream(stream, device)

    def resolve_stream(self, stream: Any, device: int | None) -> int:
        if stream is None:
            # CuPy keeps a current stream per device; that of the data's device is the default.
            with cupy.cuda.Device(device):
                return int(cupy.cuda.get_current_stream().ptr)
        return stream_handle(stream, device)

    def offsets_ok(self, offsets: cupy.ndarray, n: int) -> bool | None:
        device = offsets.device.id
        stream = cupy.cuda.get_current_stream(device).ptr
        wide = offsets.dtype == cupy.int64
        return _device_checks.offsets_ok(offsets.data.ptr, wide, offsets.shape[0] - 1, n, device, stream, _pinned_words)

    def check_word(self, offsets: cupy.ndarray) -> int:
        return _device_checks.arm(_pinned_words)

    def check_passed(self, stream: Any, device: int | None) -> bool:
        return _device_checks.passed(stream, device)

    def offsets_summary(self, offsets: cupy.ndarray) -> tuple[int, int, int, int, int]:
        with offsets.device:
            return _offsets_summary(cupy, offsets)

    def lengths_summary(self, lengths: cupy.ndarray, offsets: cupy.ndarray) -> tuple[int, int, int, bool, int]:
        with lengths.device:
            return _lengths_summary(cupy, lengths, offsets)

    def lengths_to_offsets(self, lengths: cupy.ndarray) -> cupy.ndarray:
        with lengths.device:
            m = lengths.shape[0]
            if _device_scan.serves(m) and lengths.dtype in _SCANNED and lengths.flags.c_contiguous:
                # One launch (scan.cuh): cupy.cumsum(out=) costs a call about 40 us of host time.
                buffer = cupy.empty(_device_scan.words(m), cupy.int64)
                stream = cupy.cuda.get_current_stream().ptr
                wide = lengths.dtype == _INT64
                if _device_scan.scan(lengths.data.ptr, wide, m, buffer.data.ptr, lengths.device.id, stream):
                    return buffer[: m + 1]
            return _lengths_to_offsets(cupy, lengths)


#: the lengths dtypes scan.cuh reads (index_array gives one of them)
_SCANNED = (numpy.dtype(numpy.int32), numpy.dtype(numpy.int64))
_INT64 = numpy.dtype(numpy.int64)


CUPY = CupyAdapter()
adapters[cupy.ndarray] = CUPY
