"""Array operations the nvmath backend needs on the GPU, for CuPy arrays and CUDA PyTorch tensors.

Each operation runs on a given ``cudaStream_t`` handle and device.  nvmath is
given native arrays of the caller's library (PyTorch tensors, bfloat16
included, or CuPy arrays), so the results land in the caller's ``out`` directly.

A handle becomes a stream object of the array library: for PyTorch, handle 0
(the legacy default stream, which is PyTorch's default stream) must not go
through ``torch.cuda.ExternalStream``, which reads 0 as "no handle given" and
returns a stream from PyTorch's pool instead: work enqueued there is not
ordered with the default stream nvmath's kernels run on.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_torch_streams: dict[tuple[int, int], Any] = {}
_torch_streams_lock = threading.Lock()


class CupyOps:
    kind = "cupy"

    def __init__(self, device: int) -> None:
        import cupy

        from linred.backends._gpu import cupy_stream

        self._cupy = cupy
        self._cupy_stream = cupy_stream
        self.device = device

    @contextlib.contextmanager
    def on(self, stream: int) -> Iterator[None]:
        with self._cupy.cuda.Device(self.device), self._cupy_stream(stream, self.device):
            yield

    def synchronize(self, stream: int) -> None:
        self._cupy_stream(stream, self.device).synchronize()

    def event(self) -> Any:
        with self._cupy.cuda.Device(self.device):
            return self._cupy.cuda.Event(disable_timing=True)

    def record(self, event: Any, stream: int) -> None:
        event.record(self._cupy_stream(stream, self.device))

    def wait(self, stream: int, event: Any) -> None:
        self._cupy_stream(stream, self.device).wait_event(event)

    def dtype(self, name: str) -> Any:
        return self._cupy.dtype(name)

    def view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        itemsize = base.itemsize
        return self._cupy.lib.stride_tricks.as_strided(base, shape, tuple(s * itemsize for s in strides))

    @staticmethod
    def pointer(a: Any) -> int:
        return a.data.ptr

    def ones(self, size: int, dtype: str) -> Any:
        return self._cupy.ones(size, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        return self._cupy.empty(shape, dtype=dtype)

    def arange(self, size: int, dtype: str) -> Any:
        return self._cupy.arange(size, dtype=dtype)

    def astype(self, a: Any, dtype: str) -> Any:
        return a.astype(dtype)

    def contiguous(self, a: Any, dtype: str) -> Any:
        """``a`` itself if it is C-contiguous of ``dtype``, else a contiguous converted copy."""
        if a.dtype.name == dtype and a.flags.c_contiguous:
            return a
        return self._cupy.ascontiguousarray(a, dtype=dtype)

    @staticmethod
    def copy(dst: Any, src: Any) -> None:
        dst[...] = src

    def cast(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` converting the dtype (rounded to nearest)."""
        self._cupy.copyto(dst, src, casting="unsafe")

    def divide_by_lengths(self, sums: Any, offsets: Any, out: Any, stream: int) -> None:
        """``out = sums / lengths`` per segment, NaN for an empty one; ``sums`` may be ``out``."""
        from linred.backends._gpu import divide_by_lengths

        divide_by_lengths(sums, offsets, out, stream)

    @staticmethod
    def dtype_name(a: Any) -> str:
        return a.dtype.name


class TorchOps:
    kind = "torch"

    def __init__(self, device: int) -> None:
        import torch

        from linred.arrays._torch import torch_dtype, torch_stream

        self._torch = torch
        self._torch_dtype = torch_dtype
        self._torch_stream = torch_stream
        self.device = device
        self._device = torch.device("cuda", device)

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

    def event(self) -> Any:
        return self._torch.cuda.Event()

    def record(self, event: Any, stream: int) -> None:
        event.record(self.stream(stream))

    def wait(self, stream: int, event: Any) -> None:
        self.stream(stream).wait_event(event)

    def dtype(self, name: str) -> Any:
        return self._torch_dtype(name)

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

    def astype(self, a: Any, dtype: str) -> Any:
        return a.to(self._torch_dtype(dtype))

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

    @staticmethod
    def dtype_name(a: Any) -> str:
        return str(a.dtype).removeprefix("torch.")


class StreamOrder:
    """Orders a call on a new stream after the previous call of the same executor.

    nvmath's ``Matmul`` objects reuse one workspace (and the executors their
    constants) on whatever stream each call names; a call on another stream than
    the previous one must not start before that one is done.  The new stream
    waits on an event (no host synchronization).
    """

    def __init__(self, ops: CupyOps | TorchOps) -> None:
        self._ops = ops
        self._event: Any = None
        self._last: int | None = None

    def begin(self, stream: int) -> None:
        if self._last is not None and stream != self._last:
            self._ops.wait(stream, self._event)

    def end(self, stream: int) -> None:
        if self._event is None:
            self._event = self._ops.event()
        self._ops.record(self._event, stream)
        self._last = stream

    def wait_idle(self) -> None:
        """Block until the last call's work is done: its buffers may then be released to any stream."""
        if self._event is not None:
            self._event.synchronize()


def ops_for(kind: str, device: int) -> CupyOps | TorchOps:
    return CupyOps(device) if kind == "cupy" else TorchOps(device)


def physical(x: Any) -> tuple[Any, bool]:
    """``x`` without PyTorch's lazy conjugate and negative bits, and whether the result must be conjugated.

    BLAS reads the memory, not the bits: a conjugate view is summed as stored
    (the bit cleared, no copy) and the sum conjugated afterwards.  A negative
    view (the imaginary part of a conjugate view) is materialized, as PyTorch
    offers no public way to clear the bit without a copy.
    """
    if type(x).__module__.split(".")[0] != "torch":
        return x, False
    if x.is_neg():
        x = x.resolve_neg()
    if x.is_conj():
        return x.conj(), True
    return x, False


def alignment(pointer: int) -> int:
    """The largest power of two (at most 256) that divides ``pointer``."""
    return min(256, pointer & -pointer) if pointer else 256
