"""GPU benchmarks: linred's GPU backends beside CuPy's, PyTorch's and cuSPARSE's ways to a segmented sum.

Skipped (NotImplementedError in ``setup``, asv's n/a) where no CUDA device is visible.
Each case streams ``N_GPU`` float32 elements' worth of bytes (2^28: 1 GiB, as
``linred bench``), random normal data: a CuPy array, or a CUDA PyTorch tensor for
bfloat16, which CuPy lacks (PyTorch methods get a zero-copy DLPack view of a CuPy
array).  ``time_sum`` synchronizes the device inside the timed function;
``track_gbps`` is (bytes read + bytes written) / the median time of one call between
two CUDA events, in GB/s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._common import (
    N_GPU,
    _Case,
    _SegmentedSum,
    check,
    cuda_seconds,
    gpu_or_skip,
    import_torch,
    linred_sum,
    make_case,
    relative_error,
    torch_peer,
)

LINRED = ["linred-auto", "linred-nvmath", "linred-cublas", "linred-cub", "linred-nvrtc"]
FIXED_PEERS = ["cupy-sum", "cupy-matmul-ones", "torch-sum"]


class _Inputs:
    """One case's data on the GPU, its segments and its float64 reference."""

    def __init__(self, cupy: Any, case: _Case) -> None:
        self.cupy, self.case = cupy, case
        if case.dtype == "bfloat16":
            torch = import_torch()
            generator = torch.Generator(device="cuda").manual_seed(case.seed)
            self.x = torch.randn(case.array_shape, dtype=torch.bfloat16, device="cuda", generator=generator)
        else:
            rng = cupy.random.default_rng(case.seed)
            wide = "float32" if case.dtype == "float16" else case.dtype
            skip = case.shape.skip
            shape = (case.array_shape[0] + skip, *case.array_shape[1:])
            self.x = rng.standard_normal(shape, dtype=cupy.dtype(wide)).astype(case.dtype, copy=False)[skip:]
        self.offsets = None if case.fixed else cupy.asarray(case.offsets)

    @property
    def is_torch(self) -> bool:
        return type(self.x).__module__.startswith("torch")

    def float64(self, a: Any) -> Any:
        """``a`` (a CuPy array or a CUDA tensor) as a CuPy float64 array."""
        if type(a).__module__.startswith("torch"):
            torch = import_torch()
            return self.cupy.from_dlpack(a.detach().to(torch.float64).contiguous())
        return a.astype(self.cupy.float64)

    def reference(self) -> Any:
        case, x64 = self.case, self.float64(self.x)
        if case.fixed:
            return x64.reshape(case.m, case.shape.length, *x64.shape[1:]).sum(axis=1)
        # Differences of a float64 prefix sum: error about 1e-16 * |prefix|, far below float32's.
        prefix = self.cupy.zeros((x64.shape[0] + 1, *x64.shape[1:]))
        self.cupy.cumsum(x64, axis=0, out=prefix[1:])
        return prefix[self.offsets[1:]] - prefix[self.offsets[:-1]]

    def torch(self, a: Any) -> Any:
        return a if type(a).__module__.startswith("torch") else import_torch().from_dlpack(a)


def _peer(method: str, inp: _Inputs) -> Callable[[], Any]:
    cupy, case, x = inp.cupy, inp.case, inp.x
    rest = tuple(x.shape[1:])
    if method.startswith("cupy"):
        if inp.is_torch:
            raise NotImplementedError(f"CuPy has no {case.dtype} dtype")
        if method == "cupy-sum":  # with CuPy's default accelerators
            view = x.reshape(case.m, case.shape.length, *rest)
            return lambda: view.sum(axis=1)
        if method == "cupy-matmul-ones":
            if not rest:
                view, ones = x.reshape(case.m, case.shape.length), cupy.ones(case.shape.length, dtype=x.dtype)
                return lambda: view @ ones
            view3, ones_row = x.reshape(case.m, case.shape.length, *rest), cupy.ones((1, case.shape.length), x.dtype)
            return lambda: cupy.matmul(ones_row, view3).reshape(case.m, *rest)
        if method == "cupy-csr-spmv":
            # A CSR indicator matrix (ones as values) times x: the best peer for short variable segments.
            # Ones, never the data, as values: cupyx would sum duplicates on first use and time nothing.
            if case.dtype not in ("float32", "float64") or rest or case.rows >= 2**31:
                raise NotImplementedError("cuSPARSE SpMV through cupyx: 1-D float32/float64, n < 2^31")
            from cupyx.scipy import sparse

            indicator = sparse.csr_matrix(
                (cupy.ones(case.rows, x.dtype), cupy.arange(case.rows, dtype=cupy.int32), inp.offsets.astype("int32")),
                shape=(case.m, case.rows),
            )
            return lambda: indicator @ x
    return torch_peer(method, case, inp.torch(x), None if case.fixed else inp.torch(inp.offsets))


class _DeviceSum(_SegmentedSum):
    timeout = 300  # a first call may compile kernels

    def prepare(self, method: str, shape: str, dtype: str) -> tuple[Callable[[], Any], int]:
        cupy = self.cupy = gpu_or_skip()
        if method.startswith("cupy") and dtype == "bfloat16":  # before allocating anything
            raise NotImplementedError("CuPy has no bfloat16 dtype")
        case = make_case(shape, dtype, getattr(self, "n", N_GPU))
        inp = _Inputs(cupy, case)
        if method.startswith("linred-"):
            segments = {"segment_length": case.shape.length} if case.fixed else {"offsets": inp.offsets}
            fn, result = linred_sum(method, inp.x, segments)
        else:
            fn = _peer(method, inp)
            result = fn()  # warm-up
        check(*relative_error(cupy, inp.float64(result), inp.reference()), dtype, method)
        del result
        cupy.get_default_memory_pool().free_all_blocks()  # the reference's buffers
        self.sync()
        return fn, case.nbytes

    def sync(self) -> None:
        self.cupy.cuda.runtime.deviceSynchronize()  # every stream: CuPy's and PyTorch's alike

    def seconds(self) -> float:
        return cuda_seconds(self.cupy, self.fn)


class GpuFixed(_DeviceSum):
    """Fixed segment lengths over float32: the shapes of ``linred bench`` (fixed and features groups)."""

    params = (
        [*LINRED, *FIXED_PEERS],
        ["L=2", "L=8", "L=32", "L=128", "L=1024", "L=16384", "L=2^20", "L=2^24", "d=64 L=8", "d=64 L=128"],
        ["float32"],
    )


class GpuDtypes(_DeviceSum):
    """The other floating dtypes at the same bytes: float16 and bfloat16 (accumulated in float32), float64."""

    params = ([*LINRED, *FIXED_PEERS], ["L=32", "L=4096"], ["float16", "bfloat16", "float64"])


class GpuVariable(_DeviceSum):
    """Variable lengths from offsets: geometric means 16/256/8192 and the skewed layouts."""

    params = (
        [*LINRED, "linred-auto-checked", "cupy-csr-spmv", "torch-segment_reduce"],
        ["geom 16", "geom 256", "geom 8192", "half empty", "zipf 1.5", "one huge"],
        ["float32"],
    )


class GpuVariableMid(_DeviceSum):
    """Variable lengths in mid-size calls (2^24 float32 values, 64 MiB: a kernel of tens of
    microseconds), one segment among them, and data one element past a 16-byte boundary (a slice
    ``buf[1:]``)."""

    n = N_GPU >> 4
    params = (
        ["linred-auto", "linred-auto-checked", "linred-nvrtc", "torch-segment_reduce"],
        ["geom 16", "geom 256", "one segment", "geom 16 +1", "one segment +1"],
        ["float32"],
    )
