"""GPU benchmarks on CuPy arrays: linred's GPU backends beside CuPy's and cuSPARSE's ways.

Skipped (NotImplementedError in ``setup``) where no CUDA device is visible.
n = 2^28 float32 (1 GiB, far larger than L2); every timed call is followed by a
synchronize inside the timed function, and ``track_gbps`` times with CUDA events.
"""

from __future__ import annotations

import numpy as np

from ._common import check, cuda_median_seconds, geometric_offsets, gpu_or_skip, linred_call

N = 1 << 28
GPU_METHODS = ["linred-auto", "linred-nvmath", "linred-cublas", "linred-cub"]


def _data(cupy):
    x = cupy.random.default_rng(0).random(N, dtype=cupy.float32)
    x += 1
    return x


class GpuFixedLength:
    params = (
        [*GPU_METHODS, "cupy-sum", "cupy-matmul-ones"],
        [2, 8, 32, 128, 1024, 1 << 14, 1 << 20, 1 << 24],
    )
    param_names = ("method", "L")
    timeout = 300

    def setup(self, method: str, L: int) -> None:
        cupy = self.cupy = gpu_or_skip()
        x = _data(cupy)
        m = N // L
        out = cupy.empty(m, dtype=cupy.float32)
        view = x.reshape(m, L)
        if method.startswith("linred-"):
            self.f = linred_call(method, x, out, segment_length=L)
        elif method == "cupy-sum":
            self.f = lambda: view.sum(axis=1, out=out)
        else:
            ones = cupy.ones(L, dtype=cupy.float32)
            self.f = lambda: cupy.matmul(view, ones, out=out)
        out.fill(np.nan)
        self.f()
        self.stream = cupy.cuda.get_current_stream()
        self.stream.synchronize()
        reference = cupy.asnumpy(view.sum(axis=1, dtype=cupy.float64))
        check(cupy.asnumpy(out), reference, L, method)
        self.nbytes = x.nbytes + out.nbytes

    def time_sum(self, method: str, L: int) -> None:
        self.f()
        self.stream.synchronize()

    def track_gbps(self, method: str, L: int) -> float:
        return round(self.nbytes / cuda_median_seconds(self.cupy, self.f) / 1e9, 1)

    track_gbps.unit = "GB/s"


class GpuVariableLength:
    params = ([*GPU_METHODS, "cusparse-indicator", "torch-segment_reduce"], [16, 256, 8192])
    param_names = ("method", "mean_length")
    timeout = 300

    def setup(self, method: str, mean_length: int) -> None:
        cupy = self.cupy = gpu_or_skip()
        x = _data(cupy)
        offsets_host = geometric_offsets(N, mean_length)
        m = offsets_host.shape[0] - 1
        offsets = cupy.asarray(offsets_host)
        out = cupy.empty(m, dtype=cupy.float32)
        out.fill(np.nan)
        if method.startswith("linred-"):
            self.f = linred_call(method, x, out, offsets=offsets)
        elif method == "cusparse-indicator":
            # The best peer for short variable segments: a CSR matrix of ones times x.
            # Unique column indices, so cupyx's sum_duplicates never does the work up front.
            import cupyx.scipy.sparse as sparse

            indicator = sparse.csr_matrix(
                (cupy.ones(N, cupy.float32), cupy.arange(N, dtype=cupy.int32), offsets.astype(cupy.int32)), shape=(m, N)
            )
            self.f = lambda: indicator @ x
        else:
            try:
                import torch
            except ImportError:
                raise NotImplementedError("torch is not installed") from None
            xt, ot = torch.from_dlpack(x), torch.from_dlpack(offsets)
            self.f = lambda: torch.segment_reduce(xt, "sum", offsets=ot)
        result = self.f()
        self.stream = cupy.cuda.get_current_stream()
        self.stream.synchronize()
        cs = np.concatenate([[0.0], np.cumsum(cupy.asnumpy(x), dtype=np.float64)])
        reference = cs[offsets_host[1:]] - cs[offsets_host[:-1]]
        check(cupy.asnumpy(cupy.from_dlpack(result)), reference, int(np.diff(offsets_host).max()), method)
        self.nbytes = x.nbytes + out.nbytes + offsets.nbytes

    def time_sum(self, method: str, mean_length: int) -> None:
        self.f()
        self.stream.synchronize()

    def track_gbps(self, method: str, mean_length: int) -> float:
        return round(self.nbytes / cuda_median_seconds(self.cupy, self.f) / 1e9, 1)

    track_gbps.unit = "GB/s"
