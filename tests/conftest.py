"""pytest's hooks and fixtures for the test suite; the helpers live in ``tests/support/``.

Every numerical test compares linred with ``support.reference``, a deliberately naive
float64 NumPy loop over explicit segment bounds, written without any of linred's code.
Tests are parametrized over ``(array_kind, backend)`` pairs by :func:`pytest_generate_tests`
(the pairs are ``support.backends.KIND_BACKEND_PARAMS``):

- host kinds (``numpy``, ``torch-cpu``) with the ``numpy`` backend, ``nvmath``
  when it is available, and ``auto``;
- GPU kinds (``cupy``, ``torch-cuda``), present only when a GPU is, with every
  registered backend but ``numpy`` (``nvmath``, ``cublas``, ``cub``, ...) and
  ``auto``, marked ``gpu``.

A named backend may refuse a call, but only with :class:`linred.BackendError` naming itself
and a reason it is documented to give (``support.refusals``); such a test stops there and
is reported as skipped, with the backend and its reason.  ``auto`` must never refuse a valid
call, and the ``numpy`` backend never refuses host data.

On a GPU machine the same files run the GPU contract: ``python -m pytest -q -m gpu``
(``-m "gpu and not slow"`` leaves out the > 2^31-element tests).
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from support.arrays import GPU_COUNT, HAS_GPU, HAS_TORCH_CUDA, KINDS
from support.backends import HOST_BACKEND_PARAMS, HOST_BACKENDS, KIND_BACKEND_PARAMS, KIND_PARAMS
from support.differential import DIFFERENTIAL

# JAX takes 75% of a GPU's memory when it first uses it; the test workers share the GPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# The dispatch tables ``linred tune`` caches for this machine (GPU and host) would change what
# backend="auto" picks: the tests see the shipped table alone unless told otherwise.
os.environ.setdefault("LINRED_TUNE_CACHE", os.path.join(tempfile.mkdtemp(prefix="linred-tests-"), "dispatch.json"))

import linred

settings.register_profile("linred", max_examples=50, deadline=None, derandomize=True, database=None)
settings.load_profile("linred")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``array_kind`` and ``backend`` arguments are parametrized together: only meaningful pairs."""
    names = metafunc.fixturenames
    if "array_kind" in names and "backend" in names:
        metafunc.parametrize(("array_kind", "backend"), KIND_BACKEND_PARAMS)
    elif "array_kind" in names:
        metafunc.parametrize("array_kind", KIND_PARAMS)
    elif "host_backend" in names:
        metafunc.parametrize("host_backend", HOST_BACKEND_PARAMS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240607)


@pytest.fixture
def clean_plan_cache():
    """Start and end with an empty plan cache of the default size."""
    linred.set_plan_cache_size(64)
    linred.clear_plan_cache()
    yield
    linred.set_plan_cache_size(64)
    linred.clear_plan_cache()


@pytest.fixture
def differential_counts(request: pytest.FixtureRequest):
    """Records the differential calls a test checked on its report (summed by the main process,
    also across pytest-xdist workers: see pytest_runtest_logreport)."""
    before = collections.Counter(DIFFERENTIAL)
    yield
    delta = collections.Counter(DIFFERENTIAL)
    delta.subtract(before)
    request.node.user_properties.append(("differential", dict(delta)))


#: whether this process is a pytest-xdist controller: the tests run in workers, whose counts of
#: differential calls arrive on their reports
_CONTROLLER = False


def pytest_configure(config: pytest.Config) -> None:
    global _CONTROLLER
    _CONTROLLER = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _CONTROLLER and report.when == "teardown":
        for key, value in report.user_properties:
            if key == "differential":
                DIFFERENTIAL.update(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if DIFFERENTIAL:
        terminalreporter.section("differential suite")
        terminalreporter.write_line(
            f"{DIFFERENTIAL['calls']} calls checked against the float64 reference "
            f"({DIFFERENTIAL['refused']} documented refusals by named backends), {DIFFERENTIAL['failed']} wrong"
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        available = linred.available_backends()
    except Exception as e:  # a backend module that fails to import is reported by the tests
        available = f"error: {type(e).__name__}: {e}"
    return [
        f"linred {linred.__version__} from {linred.__file__}; python {sys.version.split()[0]}",
        f"GPUs: {GPU_COUNT} (cupy), torch cuda: {HAS_TORCH_CUDA}; kinds: {', '.join(KINDS)}",
        f"host backends under test: {', '.join(HOST_BACKENDS)}; available_backends(): {available}",
    ]
