"""linred: segmented reductions as linear algebra, on the GPU and the CPU.

A segmented sum splits an array into contiguous segments and sums each.  linred
computes it as a matrix product: the data viewed as a matrix with one row per
segment, times a vector of ones, run through NVIDIA's math libraries (cuBLASLt
through nvmath-python, cuBLAS) on the GPU and BLAS on the CPU.  linred's own
CUDA kernels and CUB serve what a matrix product does not do well or at all:
short and variable-length segments, integer sums, max and min.

>>> import numpy as np
>>> import linred
>>> linred.segmented_sum(np.arange(1, 13, dtype=np.float32), 4)
array([10., 26., 42.], dtype=float32)

``import linred`` imports NumPy only; CuPy, PyTorch, nvmath-python and
cuda.compute are imported when a call first needs them.
"""

import sys

from linred._dynamo import register_torch
from linred._functions import (
    segmented_argmax,
    segmented_argmin,
    segmented_max,
    segmented_mean,
    segmented_min,
    segmented_prod,
    segmented_sum,
)
from linred._fused import (
    segmented_log_softmax,
    segmented_logsumexp,
    segmented_softmax,
    segmented_std,
    segmented_var,
)
from linred._plan_cache import clear_plan_cache, plan_cache_info, set_plan_cache_size
from linred._version import __version__
from linred.backends import available_backends
from linred.errors import BackendError
from linred.plan import SegmentedReduction

if "torch" in sys.modules:  # imported before linred: compiled functions may call linred first
    register_torch()

__all__ = [
    "BackendError",
    "SegmentedReduction",
    "__version__",
    "available_backends",
    "clear_plan_cache",
    "plan_cache_info",
    "segmented_argmax",
    "segmented_argmin",
    "segmented_log_softmax",
    "segmented_logsumexp",
    "segmented_max",
    "segmented_mean",
    "segmented_min",
    "segmented_prod",
    "segmented_softmax",
    "segmented_std",
    "segmented_sum",
    "segmented_var",
    "set_plan_cache_size",
]
