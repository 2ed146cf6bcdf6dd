"""Helpers of the test suite (conftest.py keeps only pytest's hooks and fixtures).

- :mod:`support.arrays`: what this machine has (``HAS_CUPY_GPU``, ``HAS_TORCH``, ...), the
  array kinds and :func:`to_kind` / :func:`to_numpy`;
- :mod:`support.dtypes`: dtype names, the result dtypes the contract promises, test data;
- :mod:`support.reference`: the float64 reference and :func:`assert_reduction`;
- :mod:`support.backends`: the backends under test and the ``(array_kind, backend)`` pairs;
- :mod:`support.refusals`: the refusals each backend is documented to make; a test declares
  those it expects (:func:`expect_refusal`, :func:`run_or_refused`) and shows them as skips;
- :mod:`support.differential`: the machinery of tests/test_differential.py (not re-exported);
- :mod:`support.calls`: :func:`count_calls`, the calls a test routes through a launcher or a
  check, counted (not re-exported);
- :mod:`support.scripts`: :func:`run_script`, a test's source run in a fresh interpreter, for
  calls that may end the process (not re-exported).

Tests import from here: ``from support import assert_reduction, to_kind``.
"""

from support.arrays import (
    GPU_COUNT,
    GPU_KINDS,
    HAS_CUPY_GPU,
    HAS_GPU,
    HAS_TORCH,
    HAS_TORCH_CUDA,
    HOST_KINDS,
    KINDS,
    assert_same_kind,
    cupy,
    device_of,
    empty_like_kind,
    is_gpu_kind,
    is_host_array,
    kind_of,
    synchronize,
    to_kind,
    to_numpy,
    xp_of,
)
from support.backends import (
    CONTRACT_BACKENDS,
    FUNCTIONS,
    GPU_BACKENDS,
    HOST_BACKEND_PARAMS,
    HOST_BACKENDS,
    KIND_BACKEND_PARAMS,
    KIND_PARAMS,
    REDUCTIONS,
    backend_available,
    long_feature_segments_forced,
)
from support.dtypes import (
    ALL_DTYPES,
    COMPLEX,
    HALF,
    INTEGER,
    REAL,
    SIGNED,
    UNSIGNED,
    accumulation,
    canonical,
    dtype_of,
    expected_dtype,
    finfo,
    make_data,
    ml_dtypes,
    np_dtype,
    torch,
)
from support.reference import assert_reduction, error_bound, identity, reference, segment_bounds
from support.refusals import (
    DOCUMENTED_REFUSALS,
    NOT_HERE,
    Refused,
    call_or_refused,
    check_refusal,
    documented_refusal,
    expect_refusal,
    refusal,
    run_or_refused,
)

__all__ = [
    "ALL_DTYPES",
    "COMPLEX",
    "CONTRACT_BACKENDS",
    "DOCUMENTED_REFUSALS",
    "FUNCTIONS",
    "GPU_BACKENDS",
    "GPU_COUNT",
    "GPU_KINDS",
    "HALF",
    "HAS_CUPY_GPU",
    "HAS_GPU",
    "HAS_TORCH",
    "HAS_TORCH_CUDA",
    "HOST_BACKENDS",
    "HOST_BACKEND_PARAMS",
    "HOST_KINDS",
    "INTEGER",
    "KINDS",
    "KIND_BACKEND_PARAMS",
    "KIND_PARAMS",
    "NOT_HERE",
    "REAL",
    "REDUCTIONS",
    "SIGNED",
    "UNSIGNED",
    "Refused",
    "accumulation",
    "assert_reduction",
    "assert_same_kind",
    "backend_available",
    "call_or_refused",
    "canonical",
    "check_refusal",
    "cupy",
    "device_of",
    "documented_refusal",
    "dtype_of",
    "empty_like_kind",
    "error_bound",
    "expect_refusal",
    "expected_dtype",
    "finfo",
    "identity",
    "is_gpu_kind",
    "is_host_array",
    "kind_of",
    "long_feature_segments_forced",
    "make_data",
    "ml_dtypes",
    "np_dtype",
    "reference",
    "refusal",
    "run_or_refused",
    "segment_bounds",
    "synchronize",
    "to_kind",
    "to_numpy",
    "torch",
    "xp_of",
]
