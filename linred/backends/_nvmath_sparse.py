"""The nvmath backend on the GPU, variable-length segments: cuSPARSE SpMM through ``nvmath.sparse.Matmul``.

A segmented sum is ``out3[b] = S @ x3[b]`` with ``S`` the ``(m, n)`` segment
indicator matrix, in CSR form exactly the segment description: ``indptr`` is the
offsets, ``indices = arange(n)`` and ``data = ones(n)``.  ``indices`` and ``data``
depend on ``n`` alone and are built once per executor; ``indptr`` is each call's
offsets (converted to the index dtype when they differ: int32 for ``n < 2^31``,
int64 beyond).  A batch (``axis > 0``) is one batched SpMM with ``S`` broadcast.

The sparse operand is a ``cupyx.scipy.sparse.csr_matrix`` for CuPy data and a
PyTorch sparse CSR tensor for PyTorch data (nvmath pairs each with dense
operands of its own library).  The CuPy matrix is built once as an empty shell
and its three arrays are set directly: its constructor would synchronize to
check ``indptr`` and refuses float16 data, which cuSPARSE accepts.

cuSPARSE adds every product into a float32 (float64 for float64) accumulator,
also for float16/bfloat16 data; empty segments come out as 0.  Complex data is
multiplied as its real and imaginary parts side by side (a complex product
would turn ``inf + 0j`` into ``inf + nan*j``).  A
mean divides the sums by the segment lengths afterwards (NaN for an empty
segment).  Planning on the first call synchronizes its stream once (the index
arrays are built then); later calls enqueue their work without synchronizing.
"""

from __future__ import annotations

import warnings
from typing import Any

import nvmath.sparse

from linred._dtypes import HALF
from linred.backends._nvmath_gpu_arrays import StreamOrder, ops_for, physical
from linred.backends._nvmath_layout import INT32_MAX, sparse_dense_strides
from linred.problem import Problem
from linred.segments import Segments, VariableSegments

#: "batched": one SpMM over the whole batch with the segment matrix broadcast;
#: "loop": one SpMM per batch slice (more launches, no batched-SpMM requirement)
BATCH_STRATEGY = "batched"


def sparse_compute_type(dtype: str) -> nvmath.sparse.ComputeType:
    ct = nvmath.sparse.ComputeType
    return {
        "float16": ct.CUDA_R_32F,
        "bfloat16": ct.CUDA_R_32F,
        "float32": ct.CUDA_R_32F,
        "float64": ct.CUDA_R_64F,
        "complex64": ct.CUDA_C_32F,
        "complex128": ct.CUDA_C_64F,
    }[dtype]


class SparseExecutor:
    """``out3 = S @ x3`` (and a division by the segment lengths for a mean)."""

    def __init__(self, problem: Problem, logger: Any, *, complex_as_real: bool = False) -> None:
        self._ops = ops_for(problem.kind, problem.device)
        self._order = StreamOrder(self._ops)
        self._real = complex_as_real
        self._kind = problem.kind
        self._dtype = problem.dtype
        self._mean = problem.reduction == "mean"
        self._batch, self._n, self._features = problem.in_shape
        self._m = problem.num_segments
        self._index_dtype = "int32" if problem.n <= INT32_MAX else "int64"
        strides = sparse_dense_strides(problem)
        assert not isinstance(strides, str), strides
        self._dense_strides = strides
        self._batch_stride = problem.strides[0]
        self._loop = self._batch > 1 and BATCH_STRATEGY == "loop"
        self._options = nvmath.sparse.MatmulOptions(compute_type=sparse_compute_type(problem.dtype), logger=logger)
        self._indices: Any = None
        self._values: Any = None
        self._shell: Any = None  # the cupyx csr_matrix whose arrays are set per call
        self._mm: Any = None

    def _prepare(self, stream: int) -> None:
        ops = self._ops
        self._indices = ops.arange(self._n, self._index_dtype)
        self._values = ops.ones(self._n, self._dtype)
        if self._kind == "cupy":
            import cupyx.scipy.sparse

            # (m, n) shape-only construction allocates an empty matrix without synchronizing
            shell = cupyx.scipy.sparse.csr_matrix((self._m, self._n), dtype="float32")
            shell.indices = self._indices
            shell.data = self._values
            self._shell = shell
        ops.synchronize(stream)  # the index arrays are then valid on any stream

    def _segment_matrix(self, offsets: Any) -> Any:
        if self._shell is not None:
            self._shell.indptr = offsets
            return self._shell
        import torch

        with warnings.catch_warnings():
            # PyTorch warns once per process that sparse CSR tensors are in beta; nothing for users to act on
            warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
            return torch.sparse_csr_tensor(
                offsets, self._indices, self._values, size=(self._m, self._n), check_invariants=False
            )

    def _operands(self, x: Any, out: Any) -> tuple[Any, list[tuple[Any, Any]]]:
        """The result as ``(B, m, D)`` and the (data, result) operand pairs of the products.

        One pair for the batched SpMM, or one per batch slice.  Complex arrays are
        taken as their real and imaginary parts (``.real`` views, twice the features).
        """
        ops = self._ops
        if self._real:
            x, out = x.real, out.real
        B, n, D, m = self._batch, self._n, self._features, self._m
        s_n, s_d = self._dense_strides
        result = ops.view(out, (B, m, D), (m * D, D, 1))
        if B == 1:
            return result, [(ops.view(x, (n, D), (s_n, s_d)), result[0])]
        if self._loop:
            sB = self._batch_stride
            slices = [ops.view(x, (B, n, D), (sB, s_n, s_d))[b] for b in range(B)]
            return result, [(data, result[b]) for b, data in enumerate(slices)]
        return result, [(ops.view(x, (B, n, D), (self._batch_stride, s_n, s_d)), result)]

    def __call__(self, x: Any, out: Any, segments: Segments, stream: int) -> None:
        assert isinstance(segments, VariableSegments)
        ops = self._ops
        with ops.on(stream):
            if self._indices is None:
                self._prepare(stream)
            self._order.begin(stream)
            offsets = segments.offsets
            if ops.dtype_name(offsets) != self._index_dtype:
                offsets = ops.astype(offsets, self._index_dtype)
            matrix = self._segment_matrix(offsets)
            x, conjugate = physical(x)
            result, pairs = self._operands(x, out)
            for data, res in pairs:
                if self._mm is None:
                    self._mm = nvmath.sparse.Matmul(matrix, data, c=res, beta=0.0, options=self._options, stream=stream)
                    self._mm.plan(stream=stream)
                else:
                    self._mm.reset_operands_unchecked(a=matrix, b=data, c=res)
                self._mm.execute(stream=stream)
                self._mm.release_operands()  # keep no reference to the caller's arrays
            if self._shell is not None:
                self._shell.indptr = None
            if self._mean:
                self._divide(result, segments.offsets, stream)
            if conjugate:  # a lazily conjugated tensor, summed as stored
                out.imag.neg_()
            self._order.end(stream)

    def _divide(self, out: Any, offsets: Any, stream: int) -> None:
        """``out /= lengths`` in float32 or wider arithmetic; 0/0 gives NaN for empty segments."""
        m = self._m
        if self._kind == "cupy":
            if self._dtype in HALF:
                import cupy

                lengths = cupy.diff(offsets).astype(cupy.float32)
                cupy.divide(out, lengths.reshape(1, m, 1), out=out)
            else:
                from linred.backends._gpu import divide_by_lengths

                divide_by_lengths(out, offsets, out, stream)
            return
        import torch

        lengths = torch.diff(offsets)
        if self._dtype in HALF:
            out.copy_(out.float() / lengths.to(torch.float32).view(1, m, 1))
        else:
            out.div_(lengths.to(out.dtype).view(1, m, 1))

    def free(self) -> None:
        if self._mm is not None:
            self._mm.free()
            self._mm = None
        self._shell = self._indices = self._values = None
