"""The backends under test and the ``(array_kind, backend)`` pairs the contract tests run on.

- host kinds (``numpy``, ``torch-cpu``) with the ``numpy`` backend, ``nvmath`` when it is
  available, and ``auto``;
- GPU kinds (``cupy``, ``torch-cuda``), present only when a GPU is, with every registered
  backend but ``numpy`` (``nvmath``, ``cublas``, ``cub``, ...) and ``auto``, marked ``gpu``.

conftest.py's ``pytest_generate_tests`` parametrizes ``array_kind`` / ``backend`` /
``host_backend`` arguments with :data:`KIND_PARAMS`, :data:`KIND_BACKEND_PARAMS` and
:data:`HOST_BACKEND_PARAMS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import linred
import linred.backends as registry
from support.arrays import KINDS, is_gpu_kind

#: the backends of the public contract; the registry may list more
CONTRACT_BACKENDS = ("numpy", "nvmath", "cublas", "cub")
#: every registered backend but the host-only numpy one runs on GPU data
GPU_BACKENDS = tuple(b for b in registry.BACKENDS if b != "numpy")
REDUCTIONS = ("sum", "mean", "max", "min")
FUNCTIONS = {
    "sum": linred.segmented_sum,
    "mean": linred.segmented_mean,
    "max": linred.segmented_max,
    "min": linred.segmented_min,
}


def backend_available(name: str) -> bool:
    """Whether backend ``name`` can run here; a backend module that fails to import counts as unavailable."""
    try:
        return registry.unavailable(name) is None
    except Exception:
        return False


HOST_BACKENDS = ("numpy", "nvmath") if backend_available("nvmath") else ("numpy",)


def _kind_param(kind: str) -> Any:
    return pytest.param(kind, id=kind, marks=[pytest.mark.gpu] if is_gpu_kind(kind) else [])


def _kind_backend_params() -> list[Any]:
    params = []
    for kind in KINDS:
        names = (*GPU_BACKENDS, "auto") if is_gpu_kind(kind) else (*HOST_BACKENDS, "auto")
        marks = [pytest.mark.gpu] if is_gpu_kind(kind) else []
        params += [pytest.param(kind, name, id=f"{kind}-{name}", marks=marks) for name in names]
    return params


KIND_PARAMS = [_kind_param(k) for k in KINDS]
KIND_BACKEND_PARAMS = _kind_backend_params()
HOST_BACKEND_PARAMS = [pytest.param(b, id=b) for b in (*HOST_BACKENDS, "auto")]


@contextlib.contextmanager
def long_feature_segments_forced() -> Iterator[None]:
    """nvrtc plans, made inside, that cut every feature segment longer than the average (and a
    tile) into tiles whatever the call's size, as on a GPU of one SM: features_reduce, not
    features_split, then takes the segments of a test's small calls, unless they are very few
    (narrow rows, of 64 bytes or less, are cut only where their segments are too short for
    lanes).  (Needs the GPU modules.)"""
    from linred.backends.nvrtc import DEFAULT_OPTIONS, executors

    launcher = executors._Launcher

    class OneSM(launcher):
        def __init__(self, problem: Any) -> None:
            super().__init__(problem)
            self.sms = 1

    registry.configure("nvrtc", feature_long_min_bytes=1, feature_long_factor=1)
    executors._Launcher = OneSM
    linred.clear_plan_cache()
    try:
        yield
    finally:
        executors._Launcher = launcher
        registry.configure("nvrtc", feature_long_min_bytes=DEFAULT_OPTIONS.feature_long_min_bytes,
                           feature_long_factor=DEFAULT_OPTIONS.feature_long_factor)  # fmt: skip
        linred.clear_plan_cache()
