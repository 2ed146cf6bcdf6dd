"""The nvmath backend: segmented sums and means as matrix products through nvmath-python.

- **Host data** (NumPy arrays, CPU PyTorch tensors), fixed-length segments: the
  generic ``nvmath.linalg.Matmul`` executed on the CPU by MKL (``ExecutionCPU``;
  the ``cpu`` extra installs it), writing into the result in place
  (``inplace=True``, ``c`` = the result, ``beta = 0``).  MKL's products take
  float32, float64, complex64 and complex128, one dtype for data and result.
- **Device data** (CuPy arrays, CUDA PyTorch tensors), fixed-length segments:
  ``nvmath.linalg.advanced.Matmul`` (cuBLASLt) with the compute type pinned
  (``COMPUTE_32F`` for float32, float16, bfloat16 and complex64: never TF32;
  ``COMPUTE_64F`` for float64 and complex128), planned on the first call of a
  plan and rebound to each call's arrays.  float16/bfloat16 accumulate in
  float32 and return their own dtype (or float32 with ``dtype=float32``).
- **Device data, offsets or lengths**: the segment indicator matrix ``S`` (CSR:
  ``data = ones(n)``, ``indices = arange(n)``, ``indptr = offsets``) times the data,
  by cuSPARSE SpMM driven through ``nvmath.bindings.cusparse``; a batch
  (``axis > 0``) is one SpMM (more than 8 vectors: the columns of one matrix; feature rows:
  a strided batch with ``S`` broadcast), or one SpMM a vector for up to 8.  ``data`` and
  ``indices`` depend on ``n`` only and are built once per plan (``n`` elements
  each: memory that a cached plan keeps); ``indptr`` is each call's offsets.
  float16/bfloat16 data is summed into float32 (cuSPARSE's mixed precision) and
  rounded once into the result (or returned as float32 with ``dtype=float32``).
- A mean multiplies by ``alpha = 1/L`` (fixed length) or divides by the segment
  lengths after the product (offsets; an empty segment's mean is NaN).
- Complex data is multiplied as real data with its real and imaginary parts as
  two features: a complex product with ones would turn ``inf + 0j`` into
  ``inf + nan*j``.

The package: this module decides (availability, refusals) and imports nothing
from nvmath; the matrix forms (rows, features, columns, levels of chunks on the
host) are in :mod:`.layout` (pure stride arithmetic); they cover contiguous data
along any axis, sliced rows and columns and transposed (column-major) data, all
without copying the input.  The executors: :mod:`.host` (MKL), :mod:`.dense`
(cuBLASLt), :mod:`.sparse` (cuSPARSE).

Refused, with a reason: max/min (not linear), integer data (no integer matrix
products), offsets on the host (nvmath's sparse matmul runs on the GPU only),
float16/bfloat16 and ``dtype=`` changes on the host (MKL would need a converted
copy), layouts BLAS cannot address without copying the input, and matrix
extents beyond 2^31 - 1 on the GPU (cuBLASLt has no kernel for a segment of
2^31 elements or more).

nvmath logs every planning and execution step at INFO level; it is given the
logger ``"linred.nvmath"``, set to WARNING unless configured otherwise, so that an
application's INFO logging is not flooded.

On the GPU, the first call of a plan builds nvmath's objects (cuBLASLt's
heuristic query synchronizes that call's stream once); later calls rebind
operands and enqueue work on the given stream without synchronizing.  A call on
another stream than the previous call of the same plan waits (on the GPU) for
that call, whose workspace it reuses.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from linred.backends.base import (
    INT32_MAX,
    VENDOR_FLOAT32_LONGEST_SPARSE,
    VENDOR_FLOAT32_LONGEST_SPARSE_COLUMNS,
    Backend,
    Executor,
    Options,
    vendor_float32_reason,
)
from linred.backends.nvmath import layout as layouts
from linred.problem import Problem

LOGGER = logging.getLogger("linred.nvmath")
if LOGGER.level == logging.NOTSET:
    LOGGER.setLevel(logging.WARNING)

#: how cuSPARSE reduces a batch of variable-length segments (``axis > 0``): ``"batched"``, one
#: SpMM over the whole batch (more than 8 vectors as the columns of one matrix, feature rows as a
#: strided batch with the segment matrix broadcast; up to 8 vectors one SpMM each, which is
#: faster: see ``layout.LOOP_VECTORS``); ``"loop"``, one SpMM per batch slice (more launches)
BATCH_STRATEGIES = ("batched", "loop")


@dataclass(frozen=True, slots=True)
class NvmathOptions(Options):
    """The nvmath backend's knobs; change them with ``linred.backends.configure("nvmath", ...)``."""

    batch_strategy: str = "batched"  #: one of :data:`BATCH_STRATEGIES`

    def __post_init__(self) -> None:
        if self.batch_strategy not in BATCH_STRATEGIES:
            raise ValueError(
                f"nvmath option batch_strategy must be one of {', '.join(map(repr, BATCH_STRATEGIES))}; "
                f"got {self.batch_strategy!r}"
            )


@functools.cache
def _import_error() -> str | None:
    try:
        import nvmath  # noqa: F401
        from nvmath.linalg import Matmul  # noqa: F401
    except Exception as e:
        return (
            f"nvmath-python cannot be imported ({type(e).__name__}: {e}); "
            "pip install 'nvmath-python[cpu]' (linred's extra: '.[mkl]')"
        )
    return None


@functools.cache
def _host_product(batched: bool) -> str | None:
    """Run a tiny product on the CPU (batched: a stack of two), or say why it fails."""
    try:
        import numpy as np
        from nvmath.linalg import Matmul, MatmulOptions
        from nvmath.linalg.generic import ExecutionCPU

        a = np.arange(12 if batched else 6, dtype=np.float32).reshape((2, 3, 2) if batched else (3, 2))
        ones = np.ones((2, 2, 1) if batched else (2, 1), dtype=np.float32)
        c = np.empty((2, 3, 1) if batched else (3, 1), dtype=np.float32)
        options = MatmulOptions(inplace=True, logger=LOGGER)
        with Matmul(a, ones, c=c, beta=0.0, options=options, execution=ExecutionCPU()) as mm:
            mm.plan()
            mm.execute()
        expected = a.astype(np.float64).sum(axis=-1, keepdims=True)
        if not np.array_equal(c, expected):
            return f"nvmath's CPU matmul returned a wrong result ({c.ravel().tolist()})"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


@functools.cache
def _host_error() -> str | None:
    """Why nvmath cannot multiply on the CPU (it needs MKL: the ``cpu`` extra), or None."""
    reason = _host_product(batched=False)
    if reason is None:
        return None
    return (
        f"nvmath cannot execute on the CPU ({reason}); it needs MKL: "
        "pip install 'nvmath-python[cpu]' (linred's extra: '.[mkl]')"
    )


@functools.cache
def _host_batched_error() -> str | None:
    """Why nvmath cannot run batched products on the CPU, or None.

    A CPU BLAS other than MKL (found by nvmath where MKL is missing) may serve
    plain products but lack the strided-batched ones that feature columns need.
    """
    reason = _host_product(batched=True)
    if reason is None:
        return None
    return (
        f"nvmath's CPU library has no batched matmul here ({reason}); it needs MKL: "
        "pip install 'nvmath-python[cpu]'; backend='numpy' serves it"
    )


def _gpu_count() -> int:
    try:
        from cuda.bindings import runtime

        err, count = runtime.cudaGetDeviceCount()
        return int(count) if int(err) == 0 else 0
    except Exception:
        return 0


@functools.cache
def _device_error() -> str | None:
    try:
        from nvmath.bindings import cublasLt

        cublasLt.get_version()
    except Exception as e:
        return f"nvmath cannot load cuBLASLt ({type(e).__name__}: {e}); install nvmath-python[cu12] or [cu13]"
    return None


@functools.cache
def _sparse_error() -> str | None:
    try:
        from nvmath.bindings import cusparse

        cusparse.get_property(0)
    except Exception as e:
        return f"nvmath cannot load cuSPARSE ({type(e).__name__}: {e}); install nvmath-python[cu12] or [cu13]"
    return None


def _negative_strides(problem: Problem, serves: str) -> str:
    return (
        f"nvmath's matmul takes non-negative strides, and the data's are {problem.strides}; "
        f"backend={serves!r} serves them"
    )


class NvmathBackend(Backend):
    options = NvmathOptions()
    name = "nvmath"
    summary = (
        "nvmath-python: cuBLASLt matmul (GPU, fixed lengths), cuSPARSE SpMM (GPU, offsets), "
        "MKL matmul (host, fixed lengths)"
    )

    def unavailable(self) -> str | None:
        reason = _import_error()
        if reason is not None:
            return reason
        host = _host_error()
        if host is None or _gpu_count() > 0:
            return None  # host problems check _host_error() again in unsupported()
        return f"{host}, and no CUDA GPU is visible"

    def unsupported(self, problem: Problem) -> str | None:
        reason = layouts.dtype_reason(problem)
        if reason is not None:
            return reason
        if not problem.on_gpu and not problem.fixed:
            return (
                "offsets and lengths need nvmath's sparse matmul, which runs on the GPU only (cuSPARSE); "
                "backend='numpy' serves variable-length segments of host data"
            )
        if problem.n == 0 or problem.batch * problem.num_segments * problem.features == 0:
            return None  # nothing to multiply: the caller fills the result
        if not problem.on_gpu:
            return self._host_unsupported(problem)
        reason = _device_error()
        if reason is not None:
            return reason
        if problem.fixed:
            reason = vendor_float32_reason(problem, "cuBLASLt")
        else:
            # (several vectors as the columns of one matrix: cuSPARSE's CSR_ALG2)
            columns = layouts.sparse_columns(problem.batch, problem.features, self.options.batch_strategy)
            if problem.acc_dtype == "float32" and columns:
                reason = vendor_float32_reason(problem, "cuSPARSE (CSR_ALG2)", VENDOR_FLOAT32_LONGEST_SPARSE_COLUMNS)
            else:
                reason = vendor_float32_reason(problem, "cuSPARSE", VENDOR_FLOAT32_LONGEST_SPARSE)
        if reason is not None:
            return reason
        if problem.fixed:
            layout = layouts.dense_layout(problem, host=False)
            if isinstance(layout, str):
                return f"{layout}; a contiguous copy of the data or backend='cub' serves it"
            if any(s < 0 for s in problem.strides):
                return _negative_strides(problem, "cub")
            return layouts.check_device_extents(layout)
        reason = _sparse_error()
        if reason is not None:
            return reason
        strides = layouts.sparse_dense_strides(problem)
        if isinstance(strides, str):
            return f"{strides}; backend='cub' serves it"
        if problem.batch > INT32_MAX:
            return (
                f"it needs a batch of {problem.batch} products, more than cuSPARSE's 2^31 - 1; backend='cub' serves it"
            )
        return None

    @staticmethod
    def _host_unsupported(problem: Problem) -> str | None:
        reason = _host_error()
        if reason is not None:
            return reason
        layout = layouts.dense_layout(problem, host=True)
        if isinstance(layout, str):
            return f"{layout}; backend='numpy' serves any layout"
        if any(s < 0 for s in problem.strides):
            return _negative_strides(problem, "numpy")
        L = problem.segment_length
        if layout.form != "rows" and L > layouts.HOST_SEQUENTIAL_MAX and problem.acc_dtype in ("float32", "complex64"):
            return (
                f"MKL adds the {L} rows of a segment one after another in each feature column, which loses float32 "
                f"digits past {layouts.HOST_SEQUENTIAL_MAX} rows (2^22 rows: 4e-3 relative); backend='numpy' sums them "
                "in blocks"
            )
        if any(len(v.shape) > 2 for p in layout.products for v in (p.a, p.b, p.c)):
            reason = _host_batched_error()
            if reason is not None:
                return reason
        return layouts.check_int32(layout)

    def plan(self, problem: Problem) -> Executor:
        real = layouts.as_real(problem)  # complex data is multiplied as its real and imaginary parts
        assert not isinstance(real, str), real
        complex_as_real = real is not problem
        if not problem.on_gpu:
            from linred.backends.nvmath.host import HostExecutor

            layout = layouts.dense_layout(problem, host=True)
            assert not isinstance(layout, str), layout
            return HostExecutor(real, layout, LOGGER, complex_as_real=complex_as_real)
        if problem.fixed:
            from linred.backends.nvmath.dense import DenseExecutor

            layout = layouts.dense_layout(problem, host=False)
            assert not isinstance(layout, str), layout
            return DenseExecutor(real, layout, LOGGER, complex_as_real=complex_as_real)
        from linred.backends.nvmath.sparse import SparseExecutor

        return SparseExecutor(real, LOGGER, batch_strategy=self.options.batch_strategy, complex_as_real=complex_as_real)


BACKEND = NvmathBackend()
