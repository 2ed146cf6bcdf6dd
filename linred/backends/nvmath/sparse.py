"""The nvmath backend on the GPU, variable-length segments: cuSPARSE SpMM through ``nvmath.bindings.cusparse``.

A segmented sum is ``out3[b] = S @ x3[b]`` with ``S`` the ``(m, n)`` segment
indicator matrix, in CSR form exactly the segment description: ``indptr`` is the
offsets, ``indices = arange(n)`` and ``data = ones(n)``.  ``indices`` and ``data``
depend on ``n`` alone and are built once per executor (``n`` elements each:
memory that a cached plan keeps); ``indptr`` is each call's offsets (converted
when their dtype is not the index dtype, int32 for ``n < 2^31`` and int64
beyond, or when they are strided).  A batch (``axis > 0``) is one SpMM (a batch of
vectors: the columns of one column-major matrix, whose leading dimension is the batch
stride; a batch of feature rows: a strided-batch SpMM with ``S`` broadcast), or one SpMM per
batch slice (the nvmath option ``batch_strategy``).  See :data:`SPMM_ALG_COLUMNS` for the
algorithm of several columns.

cuSPARSE is driven directly: the descriptors are made on the first call and
only their pointers are rebound afterwards, whatever the array library (CuPy
arrays and CUDA PyTorch tensors alike, by address); the executors of a thread
share one cuSPARSE handle per device.  ``nvmath.sparse.Matmul``
is not used because it requires one dtype for ``S``, the data and the result:
cuSPARSE's SpMM adds partial sums of long rows in the result's dtype (on an
H100, float16 and bfloat16 sums of rows of about 100 elements came out several
units in the last place off when the product had several columns or a batch),
so float16 and bfloat16 data is summed into a float32 buffer instead (cuSPARSE's
mixed precision: float16/bfloat16 ``S`` and data, float32 result and compute
type) and then divided (a mean) and rounded once into the result.  float32
data accumulates in float32 and float64 data in float64.

Empty segments come out as 0 (their rows of ``S`` are empty); a mean divides by
the segment lengths afterwards, 0 / 0 giving NaN.  Complex data is multiplied as
its real and imaginary parts side by side (a complex product would turn
``inf + 0j`` into ``inf + nan*j``).  The first call synchronizes its home stream once
(the index arrays are built then); later calls enqueue their work without
synchronizing.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
from nvmath import CudaDataType
from nvmath.bindings import cusparse

from linred._dtypes import HALF
from linred.arrays.views import physical
from linred.backends._device import ReleasedInOrder, StreamOrder, ops_for
from linred.backends.base import INT32_MAX
from linred.backends.nvmath.layout import sparse_columns, sparse_dense_strides, sparse_loops
from linred.problem import Problem
from linred.segments import Segments, VariableSegments

DATA_TYPE = {
    "float16": CudaDataType.CUDA_R_16F,
    "bfloat16": CudaDataType.CUDA_R_16BF,
    "float32": CudaDataType.CUDA_R_32F,
    "float64": CudaDataType.CUDA_R_64F,
}
#: the SpMM algorithm (``cusparseSpMMAlg_t``) of a vector's sums and of feature rows' (one
#: dense column, or row-major columns), and of a batch of vectors (the columns of one
#: column-major matrix).  The default algorithm (and CSR_ALG1, CSR_ALG3) of several
#: column-major columns gave NaN as the last segment's sum of a column whose first element
#: was NaN or infinite (on an H200, CUDA 13: lanes past the last row's end read the column's
#: first element and multiply it by 0); CSR_ALG2 gave the right sums in every case tried.
SPMM_ALG = cusparse.SpMMAlg.DEFAULT
SPMM_ALG_COLUMNS = cusparse.SpMMAlg.CSR_ALG2
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
INDEX_TYPE = {"int32": cusparse.IndexType.INDEX_32I, "int64": cusparse.IndexType.INDEX_64I}


#: one cuSPARSE handle per (device, thread): executors of a thread share it and set its stream per call
_handles: dict[tuple[int, int], int] = {}


def _handle(device: int) -> int:
    """This thread's cuSPARSE handle for ``device``, which is current (made on first use, kept)."""
    key = (device, threading.get_ident())
    handle = _handles.get(key)
    if handle is None:
        handle = cusparse.create()
        cusparse.set_pointer_mode(handle, cusparse.PointerMode.HOST)
        _handles[key] = handle
    return handle


def _destroy(library: Any, descriptors: dict[str, int]) -> None:
    """Destroy the descriptors left in ``descriptors`` (host objects: no GPU work is waited for)."""
    if "a" in descriptors:
        library.destroy_sp_mat(descriptors.pop("a"))
    for key in ("b", "c"):
        if key in descriptors:
            library.destroy_dn_mat(descriptors.pop(key))


def sums_dtype(dtype: str) -> str:
    """The dtype cuSPARSE writes the sums of (real) ``dtype`` data in: float32 for 16-bit data."""
    return "float32" if dtype in HALF else dtype


class SparseExecutor(ReleasedInOrder):
    """``out3 = S @ x3`` (and a division by the segment lengths for a mean).

    ``problem`` is the real problem: complex data as its real and imaginary
    parts (:func:`linred.backends.nvmath.layout.as_real`).
    """

    def __init__(
        self, problem: Problem, logger: Any, *, batch_strategy: str = "batched", complex_as_real: bool = False
    ) -> None:
        self._ops = ops_for(problem.kind, problem.device)
        self._order = StreamOrder(self._ops, own=True)  # (its buffers on linred's own stream)
        self._logger = logger
        self._mean = problem.reduction == "mean"
        self._dtype = problem.dtype
        self._sums_dtype = sums_dtype(problem.dtype)
        # 16-bit results are rounded from a float32 buffer; a float32 (dtype=) or wider result takes the sums
        self._buffered = problem.out_dtype != self._sums_dtype
        assert not (complex_as_real and self._buffered), "complex sums are written into the result directly"
        self._batch, self._n, self._features = problem.in_shape
        self._m = problem.num_segments
        self._index_dtype = "int32" if problem.n <= INT32_MAX else "int64"
        strides = sparse_dense_strides(problem)
        assert not isinstance(strides, str), strides
        self._row_stride = strides[0]
        # (a few vectors: one SpMM each beats one of several columns, which needs CSR_ALG2; see
        # SPMM_ALG_COLUMNS: 2 float64 vectors of 16M values 314 against 950 us on an H200, 8 of
        # 4M 397 against 383)
        B, D = self._batch, self._features
        self._loop = sparse_loops(B, D, batch_strategy)
        columns = sparse_columns(B, D, batch_strategy)  # (the vectors as the columns of one matrix)
        self._algorithm = SPMM_ALG_COLUMNS if columns else SPMM_ALG
        self._batch_stride = problem.strides[0]
        # a batch slice's step in bytes, for the per-slice loop
        self._x_step = self._batch_stride * ITEMSIZE[self._dtype]
        self._sums_step = self._m * self._features * ITEMSIZE[self._sums_dtype]
        self._compute = DATA_TYPE["float64" if self._sums_dtype == "float64" else "float32"]
        scalar = np.float64 if self._sums_dtype == "float64" else np.float32
        # read by cuSPARSE on the host (pointer mode HOST) when each product is enqueued
        self._alpha = np.ones(1, dtype=scalar)
        self._beta = np.zeros(1, dtype=scalar)
        self._device = problem.device
        self._handle = 0
        self._descriptors: dict[str, int] = {}
        # an executor dropped without free() (an evicted plan) still destroys its descriptors
        self._finalizer = weakref.finalize(self, _destroy, cusparse, self._descriptors)
        self._finalizer.atexit = False
        self._indices: Any = None
        self._values: Any = None
        self._workspace: Any = None
        self._workspace_ptr = 0

    def _plan(self, indptr: int, x: int, sums: int, stream: int) -> None:
        """Make the handle, the descriptors and the workspace for the first call's pointers."""
        ops = self._ops
        B, n, D, m = self._batch, self._n, self._features, self._m
        home = self._order.home
        with ops.on(home):  # the executor's own buffers (see StreamOrder.home)
            self._indices = ops.arange(n, self._index_dtype)
            self._values = ops.ones(n, self._dtype)
        self._handle = _handle(self._device)
        cusparse.set_stream(self._handle, stream)
        index = INDEX_TYPE[self._index_dtype]
        d = self._descriptors
        d["a"] = cusparse.create_csr(
            m,
            n,
            n,
            indptr,
            ops.pointer(self._indices),
            ops.pointer(self._values),
            index,
            index,
            cusparse.IndexBase.ZERO,
            DATA_TYPE[self._dtype],
        )
        if D == 1:  # vectors, column-major: a batch of them is the columns of one matrix
            cols, ld = (1, n) if self._loop or B == 1 else (B, max(n, self._batch_stride))
            d["b"] = cusparse.create_dn_mat(n, cols, ld, x, DATA_TYPE[self._dtype], cusparse.Order.COL)
            d["c"] = cusparse.create_dn_mat(m, cols, m, sums, DATA_TYPE[self._sums_dtype], cusparse.Order.COL)
        else:  # row-major: unit stride along the features, the result C-contiguous
            d["b"] = cusparse.create_dn_mat(n, D, self._row_stride, x, DATA_TYPE[self._dtype], cusparse.Order.ROW)
            d["c"] = cusparse.create_dn_mat(m, D, D, sums, DATA_TYPE[self._sums_dtype], cusparse.Order.ROW)
        if B > 1 and D > 1 and not self._loop:
            cusparse.csr_set_strided_batch(d["a"], B, 0, 0)  # S broadcast over the batch
            cusparse.dn_mat_set_strided_batch(d["b"], B, self._batch_stride)
            cusparse.dn_mat_set_strided_batch(d["c"], B, m * D)
        size = cusparse.sp_mm_buffer_size(*self._arguments())
        if size:
            with ops.on(home):
                self._workspace = ops.empty((size,), "uint8")
            self._workspace_ptr = ops.pointer(self._workspace)
        self._logger.debug(
            "cuSPARSE SpMM planned: S (%d, %d) %s, data %s, sums %s, batch %d%s, workspace %d bytes",
            m,
            n,
            self._index_dtype,
            self._dtype,
            self._sums_dtype,
            B,
            " (loop)" if self._loop else "",
            size,
        )
        # the index arrays are then valid on any stream, and the workspace's earlier users on
        # the home stream are done before the first call's stream writes it
        ops.synchronize(home)

    def _arguments(self) -> tuple:
        """The arguments cusparseSpMM_bufferSize takes (cusparseSpMM adds the workspace)."""
        d = self._descriptors
        op = cusparse.Operation.NON_TRANSPOSE
        return (
            self._handle,
            op,
            op,
            self._alpha.ctypes.data,
            d["a"],
            d["b"],
            self._beta.ctypes.data,
            d["c"],
            self._compute,
            self._algorithm,
        )

    def _multiply(self, indptr: int, x: int, sums: int, stream: int) -> None:
        d = self._descriptors
        cusparse.set_stream(self._handle, stream)
        cusparse.csr_set_pointers(d["a"], indptr, self._ops.pointer(self._indices), self._ops.pointer(self._values))
        arguments = self._arguments()
        for b in range(self._batch) if self._loop else (0,):
            cusparse.dn_mat_set_values(d["b"], x + b * self._x_step)
            cusparse.dn_mat_set_values(d["c"], sums + b * self._sums_step)
            cusparse.sp_mm(*arguments, self._workspace_ptr)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: int) -> None:
        assert isinstance(segments, VariableSegments)
        ops = self._ops
        with ops.on(stream):
            self._order.begin(stream)
            x, conjugate = physical(x)
            # cuSPARSE reads the offsets as indptr: contiguous, of the index dtype
            indptr = ops.contiguous(segments.offsets, self._index_dtype)
            sums = ops.empty(tuple(out.shape), self._sums_dtype) if self._buffered else out
            pointers = (ops.pointer(indptr), ops.pointer(x), ops.pointer(sums))
            if not self._descriptors:
                try:
                    self._plan(*pointers, stream)
                except Exception:
                    self.free()
                    raise
            self._multiply(*pointers, stream)
            if self._mean:
                ops.divide_by_lengths(sums, indptr, out, stream)
            elif self._buffered:
                ops.cast(out, sums)
            if conjugate:  # a lazily conjugated tensor, summed as stored
                out.imag.neg_()
            self._order.end(stream)

    def free(self) -> None:
        self._order.wait_idle()  # the workspace and index arrays go back to the pool
        _destroy(cusparse, self._descriptors)
        self._handle = 0
        self._workspace = self._indices = self._values = None
        self._workspace_ptr = 0
