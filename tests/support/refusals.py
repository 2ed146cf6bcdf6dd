"""Backend refusals: a test declares the refusals it expects, and a refusal shows as a skip.

A named backend may refuse a call, but only with :class:`linred.BackendError` naming itself
and a reason (:func:`check_refusal`), and only for something it is documented to refuse
(:data:`DOCUMENTED_REFUSALS`, after docs/backends.md) or because it cannot run on this machine.
``auto`` must never refuse a valid call, and the ``numpy`` backend never refuses host data.

- :func:`run_or_refused` makes a call and, when the backend refuses, checks the refusal with
  :func:`expect_refusal`: a proper, expected refusal ends the test as *skipped* with the
  backend and its reason; a malformed or undocumented one fails it.
- :func:`call_or_refused` is the same for loops that count refusals instead of stopping:
  it raises :class:`Refused` (an expected refusal) for the caller to record.

A refusal is never a pass: a test that could not check what it is about says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

import linred
import linred.backends as registry
from support.arrays import is_host_array

#: raw-pointer backends (all but numpy) refuse views NumPy's own operations read
_RAW_POINTERS = {"byte-swapped, unaligned or structured-field views": r"it reads the data through raw pointers"}
#: cuBLAS, cuBLASLt (nvmath) and cuSPARSE (nvmath) refuse float32 sums longer than they keep accurate
_VENDOR_FLOAT32 = {
    "float32 sums longer than the library keeps within linred's accuracy": (
        r"sums float32 .* less accurately than linred's 1e-6"
    )
}
#: a product is not linear algebra: only numpy and nvrtc compute it
_PROD = {"segmented_prod": r"it does not compute segmented_prod"}
_HOST_DATA = r"it runs on CUDA devices and the data is a .*(array on the host|host .* array)"

#: What each backend is documented to refuse (docs/backends.md: the table's "refuses" column,
#: "Refusals every backend but numpy shares" and the per-backend notes), as ``{what: pattern}``;
#: the pattern is searched for in the refusal's reason.  A refusal that matches none of its
#: backend's (and is not the backend's being unavailable here) is undocumented, and fails.
DOCUMENTED_REFUSALS: dict[str, dict[str, str]] = {
    "numpy": {"device arrays": r"it runs on the host and the data is a .* array on CUDA device"},
    "nvmath": {
        "max/min": r"segmented_(max|min) is not a linear-algebra operation",
        "integers": r"BLAS has no integer matrix product",
        "offsets on the host": r"offsets and lengths need nvmath's sparse matmul, which runs on the GPU only",
        "float16/bfloat16 on the host": r"nvmath's host Matmul \(MKL\) multiplies float32, float64, complex64 and "
        r"complex128 only",
        "dtype= changes on the host": r"nvmath's host Matmul needs one dtype for the data and the result",
        "dtype= on the GPU other than float32 results of 16-bit data": r"cuBLASLt cannot multiply .* inputs into",
        "layouts BLAS cannot read without a copy": (
            r"its complex features have stride|its segments overlap in memory|its batch axis \(stride|"
            r"block has strides|axes do not merge|have no unit stride|its segment axis has stride|matrix has strides"
        ),
        "negative strides": r"nvmath's matmul takes non-negative strides",
        "float32 feature rows of more than 1024 rows per segment (MKL)": r"MKL adds the \d+ rows of a segment one "
        r"after another",
        "matrix dimensions beyond 2^31 - 1": r"2\^31 - 1",
        **_RAW_POINTERS,
        **_VENDOR_FLOAT32,
        **_PROD,
    },
    "cublas": {
        "host arrays": _HOST_DATA,
        "max/min": r"segmented_(max|min) is not linear, so no GEMV computes it",
        "integers": r"cuBLAS has no integer GEMV",
        "offsets": r"cuBLAS has no segmented GEMV for variable lengths",
        "dtype= other than float32 results of 16-bit data": r"cuBLAS computes .* in no single call",
        "negative strides": r"cuBLAS needs non-negative strides",
        "complex data with non-contiguous features": r"complex data is summed as its real and imaginary parts, "
        r"which needs contiguous features",
        "layouts no leading dimension describes or that would take more than 256 cuBLAS calls": (
            r"leading dimension|cuBLAS needs unit stride along a segment|cuBLAS calls \(more than|"
            r"cuBLAS's 32-bit dimensions"
        ),
        **_RAW_POINTERS,
        **_VENDOR_FLOAT32,
        **_PROD,
    },
    "cub": {"host arrays": _HOST_DATA, **_RAW_POINTERS, **_PROD},
    "nvrtc": {
        "host arrays": _HOST_DATA,
        "complex data": r"its kernels handle real and integer data",
        **_RAW_POINTERS,
    },
}

#: what this machine lacks for a backend that is available but cannot serve part of its problems
#: (nvmath without MKL's batched products or without cuBLASLt/cuSPARSE; bfloat16 before sm_80)
_PARTLY_UNAVAILABLE = {
    "nvmath": r"nvmath cannot execute on the CPU|has no batched matmul here|nvmath cannot load cu(BLASLt|SPARSE)",
    "nvrtc": r"its bfloat16 conversions need compute capability 8\.0",
}
NOT_HERE = "not available on this machine"


class Refused(Exception):
    """An expected refusal: a proper BackendError of a named backend, for something it is
    documented to refuse (``what``)."""

    def __init__(self, backend: str, reason: str, what: str) -> None:
        super().__init__(f"backend {backend!r} refused ({what}): {reason}")
        self.backend = backend
        self.reason = reason
        self.what = what

    @property
    def skip_reason(self) -> str:
        reason = self.reason if len(self.reason) <= 200 else self.reason[:197] + "..."
        if self.what == NOT_HERE:
            return f"{self.backend} is {NOT_HERE} (declared): {reason}"
        return f"{self.backend} refuses {self.what} (declared): {reason}"


def check_refusal(error: BaseException, backend: str) -> None:
    """Assert that ``error`` is a well-formed refusal by ``backend``."""
    assert isinstance(error, linred.BackendError), f"expected BackendError, got {type(error).__name__}: {error}"
    assert error.backend == backend, f"BackendError names {error.backend!r}, not the requested {backend!r}"
    assert f"{backend!r}" in str(error), f"the message does not name the backend: {error}"
    assert isinstance(error.reason, str) and error.reason.strip(), "BackendError without a reason"


def documented_refusal(backend: str, reason: str) -> str | None:
    """Which documented refusal of ``backend`` ``reason`` is (:data:`NOT_HERE` when the backend
    cannot run here), or None."""
    try:
        unavailable = registry.unavailable(backend)
    except Exception:  # pragma: no cover - a backend module that fails to import
        unavailable = None
    if unavailable is not None and reason == unavailable:
        return NOT_HERE
    if backend in _PARTLY_UNAVAILABLE and re.search(_PARTLY_UNAVAILABLE[backend], reason):
        return NOT_HERE
    for what, pattern in DOCUMENTED_REFUSALS.get(backend, {}).items():
        if re.search(pattern, reason):
            return what
    return None


def refusal(error: BaseException, backend: str, *expected: str) -> Refused:
    """The :class:`Refused` for ``error`` if it is a proper refusal by ``backend`` of something the
    caller expects; else an AssertionError.

    ``expected`` names entries of ``DOCUMENTED_REFUSALS[backend]``; none: any of them.  A
    backend that cannot run on this machine is always an expected refusal.
    """
    check_refusal(error, backend)
    reason = error.reason
    what = documented_refusal(backend, reason)
    assert what is not None, (
        f"backend {backend!r} refused with an undocumented reason: {reason!r} "
        "(document it in docs/backends.md and tests/support/refusals.py, or serve the call)"
    )
    for name in expected:
        assert name in DOCUMENTED_REFUSALS.get(backend, {}), f"{name!r} is no documented refusal of {backend!r}"
    assert not expected or what in (*expected, NOT_HERE), (
        f"backend {backend!r} refused {what!r}, where this test expects only {', '.join(map(repr, expected))}: {reason}"
    )
    return Refused(backend, reason, what)


def expect_refusal(error: BaseException, backend: str, *expected: str) -> NoReturn:
    """End the test as skipped if ``error`` is an expected refusal by ``backend`` (see
    :func:`refusal`); fail it otherwise."""
    r = refusal(error, backend, *expected)
    pytest.skip(r.skip_reason)


def _refusal_of_call(
    error: linred.BackendError, args: tuple[Any, ...], backend: str, expected: tuple[str, ...]
) -> Refused:
    if backend == "auto":
        raise AssertionError(f"backend='auto' refused a valid call: {error}") from error
    check_refusal(error, backend)
    if backend == "numpy" and args and is_host_array(args[0]):
        raise AssertionError(f"the numpy backend must serve every host call: {error}") from error
    return refusal(error, backend, *expected)


def call_or_refused(
    fn: Callable[..., Any], *args: Any, backend: str, expected: tuple[str, ...] = (), **kwargs: Any
) -> Any:
    """``fn(*args, backend=backend, **kwargs)``; raises :class:`Refused` for an expected refusal.

    ``auto`` must never refuse a valid call, and the numpy backend must serve every host
    call; a refusal that is malformed or not ``expected`` (see :func:`refusal`) is an
    AssertionError, and any other exception propagates.
    """
    try:
        return fn(*args, backend=backend, **kwargs)
    except linred.BackendError as e:
        raise _refusal_of_call(e, args, backend, expected) from e


def run_or_refused(
    fn: Callable[..., Any], *args: Any, backend: str, expected: tuple[str, ...] = (), **kwargs: Any
) -> Any:
    """``fn(*args, backend=backend, **kwargs)``; an expected refusal by a named backend ends the
    test as skipped (with the backend and its reason), anything else as :func:`call_or_refused`."""
    try:
        return fn(*args, backend=backend, **kwargs)
    except linred.BackendError as e:
        r = _refusal_of_call(e, args, backend, expected)
    pytest.skip(r.skip_reason)
