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

The package: this module plans the calls (:func:`plan_calls`, pure index
arithmetic, no CUDA library imported); :mod:`.executor` makes them through
CuPy's cuBLAS bindings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from linred._dtypes import INTEGER
from linred.backends.base import (
    INT32_MAX,
    Backend,
    Executor,
    Options,
    cupy_gpu_unavailable,
    segment_chunks,
    vendor_float32_reason,
)
from linred.problem import Problem

#: the most cuBLAS calls one reduction may take (layouts needing more are refused)
MAX_CALLS = 256


@dataclass(frozen=True, slots=True)
class CublasOptions(Options):
    """The cuBLAS backend's knobs; change them with ``linred.backends.configure("cublas", ...)``."""

    #: use the legacy ``?gemv`` for one-feature float32/float64 problems
    #: (``cublasGemmEx`` otherwise); both are exact, the faster is kept
    gemv: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.gemv, bool):
            raise ValueError(f"cublas option gemv must be a bool; got {self.gemv!r}")


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


def plan_calls(problem: Problem, use_gemv: bool = True) -> list[Call] | str:
    """The cuBLAS calls that compute ``problem`` (fixed length), or why there are none.

    Pure index arithmetic: it runs without a GPU.  Complex problems are planned
    as their :func:`real_view`; the offsets are then in real elements.  ``use_gemv``
    is :attr:`CublasOptions.gemv`.
    """
    real = real_view(problem)
    if isinstance(real, str):
        return real
    problem = real
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
    if L > INT32_MAX or D > INT32_MAX:
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
        if lda < 1 or lda > INT32_MAX:
            return f"the distance between segments ({lda} elements) is no valid cuBLAS leading dimension"
        if B == 1 or sB == m * lda:
            for k0, k1 in segment_chunks(B * m):
                if gemv_ok:
                    calls.append(Call("gemv", True, L, k1 - k0, lda, k0 * lda, k0))
                else:
                    calls.append(Call("gemm", True, k1 - k0, L, lda, k0 * lda, k0))
        else:
            for i0, i1 in segment_chunks(m):
                for b0, b1 in segment_chunks(B):
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
        if lda > INT32_MAX:
            return f"the leading dimension {lda} does not fit cuBLAS's 32-bit int; backend='cub' serves it"
        seg_stride = L * sN
        if B == 1 or sB == m * seg_stride:
            for k0, k1 in segment_chunks(B * m):
                calls.append(Call("batched", trans, D, L, lda, k0 * seg_stride, k0 * D, k1 - k0, seg_stride, D))
        elif m >= B:
            for b in range(B):
                for i0, i1 in segment_chunks(m):
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
                for b0, b1 in segment_chunks(B):
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


class CublasBackend(Backend):
    options = CublasOptions()
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
        calls = plan_calls(problem, self.options.gemv)
        return calls if isinstance(calls, str) else None

    def plan(self, problem: Problem) -> Executor:
        from linred.backends.cublas.executor import CublasExecutor

        calls = plan_calls(problem, self.options.gemv)
        assert not isinstance(calls, str), calls
        real = real_view(problem)
        assert not isinstance(real, str), real
        return CublasExecutor(real, calls)


BACKEND = CublasBackend()
