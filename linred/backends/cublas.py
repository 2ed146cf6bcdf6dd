"""The cuBLAS backend: fixed-length segmented sums and means as GEMV, called directly.

A fixed-length segmented sum is the ``(m, L)`` view of the data times a vector
of ones.  This backend makes exactly the cuBLAS calls that compute it, on the
data's own memory, through the thin wrappers of ``cupy_backends``:

- one feature (``features == 1``), segments contiguous: one GEMV,
  ``y = X^T ones`` with ``X`` the column-major ``(L, m)`` matrix of leading
  dimension ``L`` (batches whose rows follow each other fold into the same
  call; others become one strided-batched GEMM over the batch);
- feature dimensions (``features > 1``): a strided-batched GEMM with ``N = 1``,
  one ``(features, L)`` block per segment, reading the features either as rows
  (unit feature stride, leading dimension = the stride between elements of a
  segment) or as columns (unit stride along the segment, leading dimension =
  the feature stride);
- the mean multiplies by ``alpha = 1/L`` inside the same call.

Strides become leading dimensions and batch strides, so strided views are read
in place; a layout no leading dimension can describe is refused with a reason,
never copied.  CuPy arrays and CUDA PyTorch tensors are handled alike, by
their device pointers, on the resolved stream.

Precision: float32 is accumulated in float32 and never in TF32.  The backend
uses its own cuBLAS handle (one per device and thread) in
``CUBLAS_PEDANTIC_MATH`` mode, and its ``cublasGemmEx`` calls name
``CUBLAS_COMPUTE_32F_PEDANTIC`` / ``CUBLAS_COMPUTE_64F_PEDANTIC``, so neither
the handle settings of other libraries (CuPy's ``CUPY_TF32``, PyTorch's
``allow_tf32``) nor cuBLAS's TF32 or emulation switches can lower the
precision.  float16 and bfloat16 are read as they are and accumulated in float32
(``cublasGemmEx``).

Complex data is summed as real data: the ``(batch, n, features)`` complex view
is the ``(batch, n, 2 * features)`` real view of its interleaved real and
imaginary parts, when the features are contiguous (always, for one feature).
A complex GEMV with ones would multiply each part by the ``0`` of ``1 + 0j``,
so an infinite real or imaginary part would turn the other into NaN.

PyTorch's ``torch.mv``/``torch.matmul`` are not used: they copy operands whose
strides BLAS cannot take, without saying so, and their float32 precision
follows ``torch.backends.cuda.matmul.allow_tf32``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from linred._dtypes import INTEGER, itemsize
from linred.backends.base import Backend, cupy_gpu_unavailable, vendor_float32_reason
from linred.problem import Problem
from linred.segments import Segments

#: the most cuBLAS calls one reduction may take (layouts needing more are refused)
MAX_CALLS = 256
#: use the legacy ``?gemv`` for one-feature float32/float64 problems
#: (``cublasGemmEx`` otherwise); both are exact, the faster is kept
USE_GEMV = True

_INT32_MAX = (1 << 31) - 1

#: the (input, accumulation, result) dtypes cuBLAS computes in one call
SUPPORTED_DTYPES = {
    ("float32", "float32", "float32"),
    ("float64", "float64", "float64"),
    ("complex64", "complex64", "complex64"),
    ("complex128", "complex128", "complex128"),
    ("float16", "float32", "float16"),
    ("bfloat16", "float32", "bfloat16"),
    ("float16", "float32", "float32"),
    ("bfloat16", "float32", "float32"),
}


@dataclass(frozen=True, slots=True)
class Call:
    """One cuBLAS call of a plan; offsets are in elements from ``x[0, 0, 0]`` and ``out[0, 0, 0]``.

    ``kind`` is ``"gemv"`` (``y = op(A) x``, A of ``rows x cols``), ``"gemm"``
    (``C = op(A) ones``, ``C`` of ``M x 1``) or ``"batched"`` (``batch`` such
    GEMMs, ``A`` and ``C`` advancing by ``stride_a`` and ``stride_c``).
    """

    kind: str
    trans: bool
    rows: int  # gemv: rows of A; gemm/batched: M
    cols: int  # gemv: cols of A; gemm/batched: K (= L)
    lda: int
    x_offset: int
    out_offset: int
    batch: int = 1
    stride_a: int = 0
    stride_c: int = 0


def _chunks(total: int, limit: int = _INT32_MAX) -> list[tuple[int, int]]:
    return [(start, min(start + limit, total)) for start in range(0, total, limit)]


_PARTS = {"complex64": "float32", "complex128": "float64"}


def real_view(problem: Problem) -> Problem | str:
    """A complex problem as the real problem over its interleaved (real, imaginary) parts.

    The ``(batch, n, features)`` complex data is the ``(batch, n, 2 * features)``
    real data at twice the strides, and the result likewise, when the features
    are contiguous; otherwise the reason there is no such view.  Real problems
    are returned as they are.
    """
    real = _PARTS.get(problem.dtype)
    if real is None:
        return problem
    sB, sN, sD = problem.strides
    D = problem.features
    if D > 1 and sD != 1:
        return (
            f"complex data is summed as its real and imaginary parts, which needs contiguous features "
            f"(the feature stride is {sD}); backend='cub' serves this layout"
        )
    if problem.n == 1:
        sN = D  # never stepped over; any value a library gave a length-1 dimension
    return dataclasses.replace(
        problem, dtype=real, acc_dtype=real, out_dtype=real, features=2 * D, strides=(2 * sB, 2 * sN, 1)
    )


def plan_calls(problem: Problem, use_gemv: bool | None = None) -> list[Call] | str:
    """The cuBLAS calls that compute ``problem`` (fixed length), or why there are none.

    Pure index arithmetic: it runs without a GPU.  Complex problems are planned
    as their :func:`real_view`; the offsets are then in real elements.
    """
    real = real_view(problem)
    if isinstance(real, str):
        return real
    problem = real
    if use_gemv is None:
        use_gemv = USE_GEMV
    B, _, D = problem.in_shape
    L = problem.segment_length
    m = problem.num_segments
    if L is None:
        return "cuBLAS has no segmented GEMV for variable lengths; backend='cub' or 'nvmath' serve offsets"
    sB, sN, sD = problem.strides
    if B == 1:
        sB = 0
    if D == 1:
        sD = 1
    if min(sB, sN, sD) < 0:
        return "cuBLAS needs non-negative strides; backend='cub' serves reversed views"
    if L > _INT32_MAX or D > _INT32_MAX:
        return (
            f"cuBLAS's 32-bit dimensions cannot hold a segment of {L} elements or {D} features; backend='cub' serves it"
        )
    gemv_ok = use_gemv and problem.dtype == problem.out_dtype and problem.dtype in ("float32", "float64")
    calls: list[Call] = []
    if D == 1:
        # Each segment is a column of a column-major (L, m) matrix: unit stride along
        # the segment, leading dimension = the distance between segments.
        if L > 1 and sN != 1:
            return (
                f"the segments are strided (element stride {sN}) and cuBLAS needs unit stride along a "
                "segment or along the features; backend='cub' serves strided data"
            )
        lda = L * sN
        if lda < 1 or lda > _INT32_MAX:
            return f"the distance between segments ({lda} elements) is no valid cuBLAS leading dimension"
        if B == 1 or sB == m * lda:
            for k0, k1 in _chunks(B * m):
                if gemv_ok:
                    calls.append(Call("gemv", True, L, k1 - k0, lda, k0 * lda, k0))
                else:
                    calls.append(Call("gemm", True, k1 - k0, L, lda, k0 * lda, k0))
        else:
            for i0, i1 in _chunks(m):
                for b0, b1 in _chunks(B):
                    calls.append(
                        Call("batched", True, i1 - i0, L, lda, b0 * sB + i0 * lda, b0 * m + i0, b1 - b0, sB, m)
                    )
    else:
        if sD == 1 and sN >= D:
            trans, lda = False, sN  # block (D, L): features are rows
        elif sN == 1 and sD >= L:
            trans, lda = True, sD  # block (L, D): the segment runs down the columns
        else:
            return (
                f"neither the features (stride {sD}) nor the segments (stride {sN}) are contiguous with a "
                "valid leading dimension, which cuBLAS needs; backend='cub' serves this layout"
            )
        if lda > _INT32_MAX:
            return f"the leading dimension {lda} does not fit cuBLAS's 32-bit int; backend='cub' serves it"
        seg_stride = L * sN
        if B == 1 or sB == m * seg_stride:
            for k0, k1 in _chunks(B * m):
                calls.append(Call("batched", trans, D, L, lda, k0 * seg_stride, k0 * D, k1 - k0, seg_stride, D))
        elif m >= B:
            for b in range(B):
                for i0, i1 in _chunks(m):
                    calls.append(
                        Call(
                            "batched",
                            trans,
                            D,
                            L,
                            lda,
                            b * sB + i0 * seg_stride,
                            (b * m + i0) * D,
                            i1 - i0,
                            seg_stride,
                            D,
                        )
                    )
        else:
            for i in range(m):
                for b0, b1 in _chunks(B):
                    calls.append(
                        Call(
                            "batched", trans, D, L, lda, b0 * sB + i * seg_stride, (b0 * m + i) * D, b1 - b0, sB, m * D
                        )
                    )
    if len(calls) > MAX_CALLS:
        return (
            f"this layout needs {len(calls)} cuBLAS calls (more than {MAX_CALLS}); "
            "backend='cub' or 'nvmath' serve it in one pass"
        )
    return calls


# --- cuBLAS handles ----------------------------------------------------------------


class _Handle:
    """A cuBLAS handle in pedantic math mode, destroyed with its thread's storage."""

    __slots__ = ("_cublas", "ptr")

    def __init__(self) -> None:
        from cupy_backends.cuda.libs import cublas

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
        from cupy_backends.cuda.api import runtime
        from cupy_backends.cuda.libs import cublas

        self.cublas = cublas
        self.get_device = runtime.getDevice
        import cupy

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
        import cupy

        if self._in_dtype == "bfloat16":
            return cupy.full(self._length, 0x3F80, dtype=cupy.int16)  # bfloat16 1.0
        return cupy.ones(self._length, dtype=self._in_dtype)

    def _first_call(self, stream: int) -> None:
        from linred.backends._gpu import cupy_stream, on_stream

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
            from linred.backends._gpu import on_stream

            with on_stream(stream, self._device):
                self._run(lib, x, out, stream)
            return
        self._run(lib, x, out, stream)

    def _run(self, lib: _Library, x: Any, out: Any, stream: int) -> None:
        from linred.backends._gpu import data_ptr

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


class CublasBackend(Backend):
    name = "cublas"
    summary = "cuBLAS GEMV/strided-batched GEMM on the data in place: fixed-length sum and mean, float and complex"

    def unavailable(self) -> str | None:
        reason = cupy_gpu_unavailable()
        if reason is not None:
            return reason
        try:
            from cupy_backends.cuda.libs import cublas  # noqa: F401
        except Exception as e:
            return f"cuBLAS is not loadable ({type(e).__name__}: {e})"
        return None

    def unsupported(self, problem: Problem) -> str | None:
        if problem.device is None:
            return (
                f"it runs on CUDA devices and the data is a {problem.kind} array on the host; "
                "backend='numpy' or 'nvmath' serve host data"
            )
        if problem.reduction in ("max", "min"):
            return f"segmented_{problem.reduction} is not linear, so no GEMV computes it; backend='cub' serves it"
        if not problem.fixed:
            return "cuBLAS has no segmented GEMV for variable lengths; backend='cub' or 'nvmath' serve offsets"
        if problem.dtype in INTEGER or problem.acc_dtype in INTEGER:
            return f"cuBLAS has no integer GEMV ({problem.dtype}); backend='cub' serves integer sums"
        if (problem.dtype, problem.acc_dtype, problem.out_dtype) not in SUPPORTED_DTYPES:
            return (
                f"cuBLAS computes {problem.dtype} input into {problem.out_dtype} (accumulating in "
                f"{problem.acc_dtype}) in no single call; backend='cub' or 'nvmath' serve it"
            )
        reason = vendor_float32_reason(problem, "cuBLAS")
        if reason is not None:
            return reason
        calls = plan_calls(problem)
        return calls if isinstance(calls, str) else None

    def plan(self, problem: Problem) -> CublasExecutor:
        calls = plan_calls(problem)
        assert not isinstance(calls, str), calls
        real = real_view(problem)
        assert not isinstance(real, str), real
        return CublasExecutor(real, calls)


BACKEND = CublasBackend()
