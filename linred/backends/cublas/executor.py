"""The cuBLAS backend's executor: the calls of :func:`linred.backends.cublas.plan_calls`, made
through CuPy's cuBLAS bindings on the data's own pointers, on the resolved stream."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import cupy
import numpy as np
from cupy_backends.cuda.api import runtime
from cupy_backends.cuda.libs import cublas

from linred._dtypes import itemsize
from linred.backends._device import cupy_stream, data_ptr, on_stream
from linred.backends.cublas import Call
from linred.problem import Problem
from linred.segments import Segments

# --- cuBLAS handles ----------------------------------------------------------------


class _Handle:
    """A cuBLAS handle in pedantic math mode, destroyed with its thread's storage."""

    __slots__ = ("_cublas", "ptr")

    def __init__(self) -> None:
        self._cublas = cublas
        self.ptr = cublas.create()
        cublas.setMathMode(self.ptr, getattr(cublas, "CUBLAS_PEDANTIC_MATH", 2))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown, or the device is gone
            self._cublas.destroy(self.ptr)


_local = threading.local()


def _handle(device: int) -> int:
    """This thread's cuBLAS handle for ``device`` (which must be current)."""
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    h = handles.get(device)
    if h is None:
        h = handles[device] = _Handle()
    return h.ptr


# --- the executor ------------------------------------------------------------------


class _Library:
    """cuBLAS entry points and constants, imported once on first use."""

    def __init__(self) -> None:
        self.cublas = cublas
        self.get_device = runtime.getDevice
        self.current_stream = cupy.cuda.get_current_stream
        self.op_n = getattr(cublas, "CUBLAS_OP_N", 0)
        self.op_t = getattr(cublas, "CUBLAS_OP_T", 1)
        self.algo = getattr(cublas, "CUBLAS_GEMM_DEFAULT", -1)
        self.compute_32f = getattr(cublas, "CUBLAS_COMPUTE_32F_PEDANTIC", 69)
        self.compute_64f = getattr(cublas, "CUBLAS_COMPUTE_64F_PEDANTIC", 71)
        self.data_type = {
            "float16": runtime.CUDA_R_16F,
            "bfloat16": runtime.CUDA_R_16BF,
            "float32": runtime.CUDA_R_32F,
            "float64": runtime.CUDA_R_64F,
        }
        self.gemv = {
            "float32": cublas.sgemv,
            "float64": cublas.dgemv,
        }


_lib: _Library | None = None


def _library() -> _Library:
    global _lib
    if _lib is None:
        _lib = _Library()
    return _lib


_SCALAR = {
    "float16": np.float32,
    "bfloat16": np.float32,
    "float32": np.float32,
    "float64": np.float64,
}


class CublasExecutor:
    """Runs a list of :class:`Call` on the data's pointers, on the resolved stream."""

    def __init__(self, problem: Problem, calls: list[Call]) -> None:
        lib = _library()
        self._lib = lib
        self._calls = calls
        self._device = problem.device
        self._in_dtype = problem.dtype
        self._in_size = itemsize(problem.dtype)
        self._out_size = itemsize(problem.out_dtype)
        self._length = problem.segment_length
        scale = 1.0 / problem.segment_length if problem.reduction == "mean" else 1.0
        scalar = _SCALAR[problem.dtype]
        self._alpha = np.array([scale], dtype=scalar)
        self._beta = np.zeros(1, dtype=scalar)
        self._a_type = lib.data_type[problem.dtype]
        self._c_type = lib.data_type[problem.out_dtype]
        self._compute = lib.compute_64f if problem.acc_dtype == "float64" else lib.compute_32f
        self._gemv = lib.gemv.get(problem.dtype)
        self._ones: Any = None

    def _make_ones(self) -> Any:
        if self._in_dtype == "bfloat16":
            return cupy.full(self._length, 0x3F80, dtype=cupy.int16)  # bfloat16 1.0
        return cupy.ones(self._length, dtype=self._in_dtype)

    def _first_call(self, stream: int) -> None:
        with on_stream(stream, self._device):
            # Read-only from now on: once it is complete, any stream may read it, so
            # the first call waits for it once and no call orders streams after that.
            self._ones = self._make_ones()
            self._ones_ptr = self._ones.data.ptr
            cupy_stream(stream, self._device).synchronize()
        # The scalars' addresses are fixed for the plan's life: taken once, not per call.
        self._alpha_ptr = self._alpha.ctypes.data
        self._beta_ptr = self._beta.ctypes.data

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        if self._ones is None:
            self._first_call(stream)
        lib = self._lib
        # CuPy's cuBLAS wrappers point the handle at CuPy's current stream before every
        # call, and handles belong to a device: run under the call's stream and device.
        if lib.get_device() != self._device or lib.current_stream().ptr != stream:
            with on_stream(stream, self._device):
                self._run(lib, x, out, stream)
            return
        self._run(lib, x, out, stream)

    def _run(self, lib: _Library, x: Any, out: Any, stream: int) -> None:
        cublas = lib.cublas
        handle = _handle(self._device)
        cublas.setStream(handle, stream)
        xp = data_ptr(x)
        op = data_ptr(out)
        ones, alpha, beta = self._ones_ptr, self._alpha_ptr, self._beta_ptr
        xs, os = self._in_size, self._out_size
        for c in self._calls:
            a = xp + c.x_offset * xs
            y = op + c.out_offset * os
            trans = lib.op_t if c.trans else lib.op_n
            if c.kind == "gemv":
                self._gemv(handle, trans, c.rows, c.cols, alpha, a, c.lda, ones, 1, beta, y, 1)
            elif c.kind == "gemm":
                cublas.gemmEx(
                    handle, trans, lib.op_n, c.rows, 1, c.cols, alpha, a, self._a_type, c.lda,
                    ones, self._a_type, c.cols, beta, y, self._c_type, c.rows, self._compute, lib.algo,
                )  # fmt: skip
            else:
                cublas.gemmStridedBatchedEx(
                    handle, trans, lib.op_n, c.rows, 1, c.cols, alpha, a, self._a_type, c.lda, c.stride_a,
                    ones, self._a_type, c.cols, 0, beta, y, self._c_type, c.rows, c.stride_c, c.batch,
                    self._compute, lib.algo,
                )  # fmt: skip

    def free(self) -> None:
        self._ones = None
