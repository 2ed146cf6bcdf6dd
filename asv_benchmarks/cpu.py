"""CPU benchmarks: linred's host backends beside NumPy's own ways to do a segmented sum.

n = 2^24 float32 (64 MiB): twice a 32 MiB L3 cache, so the figures are memory bandwidth, not cache
bandwidth (at 2^22, 16 MiB stays in such a cache between runs and reads at several times DRAM speed).
``track_gbps`` reports (bytes read + bytes written) / median time in GB/s.
"""

from __future__ import annotations

import numpy as np

from ._common import check, geometric_offsets, host_data, linred_call, median_seconds

N = 1 << 24
FIXED_LENGTHS = [2, 8, 32, 128, 1024, 1 << 20]


class FixedLength:
    """Segments of a fixed length L: x viewed as an (m, L) matrix."""

    params = (
        ["linred-auto", "linred-numpy", "linred-nvmath", "np.add.reduceat", "reshape-sum", "matmul-ones"],
        FIXED_LENGTHS,
    )
    param_names = ("method", "L")
    timeout = 120

    def setup(self, method: str, L: int) -> None:
        x = host_data(N)
        m = N // L
        out = np.empty(m, dtype=np.float32)
        if method.startswith("linred-"):
            self.f = linred_call(method, x, out, segment_length=L)
        elif method == "np.add.reduceat":
            starts = np.arange(0, N, L)
            self.f = lambda: np.add.reduceat(x, starts, out=out)
        elif method == "reshape-sum":
            view = x.reshape(m, L)
            self.f = lambda: view.sum(axis=1, out=out)
        else:  # "matmul-ones": the formulation linred is built on, straight through NumPy's BLAS
            view, ones = x.reshape(m, L), np.ones(L, dtype=np.float32)
            self.f = lambda: np.matmul(view, ones, out=out)
        out.fill(np.nan)
        self.f()  # warm-up (and planning)
        check(out, x.reshape(m, L).sum(axis=1, dtype=np.float64), L, method)
        self.nbytes = x.nbytes + out.nbytes

    def time_sum(self, method: str, L: int) -> None:
        self.f()

    def track_gbps(self, method: str, L: int) -> float:
        return round(self.nbytes / median_seconds(self.f) / 1e9, 2)

    track_gbps.unit = "GB/s"


class VariableLength:
    """Offsets of segments with geometric lengths (>= 1: np.add.reduceat mishandles empty ones)."""

    params = (["linred-auto", "linred-numpy", "linred-nvmath", "np.add.reduceat"], [16, 256])
    param_names = ("method", "mean_length")
    timeout = 120

    def setup(self, method: str, mean_length: int) -> None:
        x = host_data(N)
        offsets = geometric_offsets(N, mean_length)
        m = offsets.shape[0] - 1
        out = np.empty(m, dtype=np.float32)
        if method.startswith("linred-"):
            self.f = linred_call(method, x, out, offsets=offsets)
        else:
            starts = offsets[:-1]
            self.f = lambda: np.add.reduceat(x, starts, out=out)
        out.fill(np.nan)
        self.f()
        reference = np.add.reduceat(x, offsets[:-1], dtype=np.float64)
        check(out, reference, int(np.diff(offsets).max()), method)
        self.nbytes = x.nbytes + out.nbytes + offsets.nbytes

    def time_sum(self, method: str, mean_length: int) -> None:
        self.f()

    def track_gbps(self, method: str, mean_length: int) -> float:
        return round(self.nbytes / median_seconds(self.f) / 1e9, 2)

    track_gbps.unit = "GB/s"


def timeraw_import_linred() -> str:
    """``import linred`` in a fresh interpreter (it must stay light: NumPy only)."""
    return "import linred"
