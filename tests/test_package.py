"""The package as a whole: import hygiene, public names, version, docstring examples."""

from __future__ import annotations

import doctest
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import linred

HEAVY = ("cupy", "torch", "nvmath", "cuda.compute", "cuda.core", "cuda.bindings", "numba")

_HYGIENE = """
import sys
import numpy as np
heavy = {heavy!r}
import linred
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, f"import linred imported {{loaded}}"
r = linred.segmented_sum(np.arange(1, 13, dtype=np.float32), 4)
assert r.tolist() == [10.0, 26.0, 42.0], r
r = linred.segmented_mean(np.arange(12.0), offsets=[0, 0, 12])
r = linred.segmented_max(np.arange(12), lengths=[3, 9])
with linred.SegmentedReduction(np.arange(12.0), 4) as plan:
    plan(np.ones(12))
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, f"a NumPy call imported {{loaded}}"
print("clean")
"""


def test_import_is_light():
    """``import linred`` and NumPy calls with backend='auto' import none of the heavy packages."""
    root = str(Path(linred.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", _HYGIENE.format(heavy=HEAVY)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "clean"


def test_public_names():
    expected = {
        "segmented_sum",
        "segmented_mean",
        "segmented_max",
        "segmented_min",
        "available_backends",
        "BackendError",
        "SegmentedReduction",
        "__version__",
    }
    assert expected <= set(linred.__all__)
    for name in linred.__all__:
        assert hasattr(linred, name), name


def test_version():
    assert isinstance(linred.__version__, str)
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[\w.]+)?", linred.__version__)


@pytest.mark.parametrize("name", ["segmented_sum", "segmented_mean", "segmented_max", "segmented_min"])
def test_signature(name):
    import inspect

    params = inspect.signature(getattr(linred, name)).parameters
    assert list(params) == [
        "x",
        "segment_length",
        "offsets",
        "lengths",
        "axis",
        "dtype",
        "out",
        "backend",
        "stream",
        "check",
    ]
    kw_only = [p for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [p.name for p in kw_only] == ["offsets", "lengths", "axis", "dtype", "out", "backend", "stream", "check"]
    defaults = {p.name: p.default for p in params.values() if p.default is not inspect.Parameter.empty}
    assert defaults == {
        "segment_length": None,
        "offsets": None,
        "lengths": None,
        "axis": 0,
        "dtype": None,
        "out": None,
        "backend": "auto",
        "stream": None,
        "check": True,
    }
    doc = getattr(linred, name).__doc__
    assert "Examples" in doc and "Parameters" in doc and ">>>" in doc


DOCTEST_MODULES = ["linred", "linred.reductions", "linred.plan", "linred.errors", "linred.backends"]


def test_doctests_cover_every_module_with_public_names():
    """Each module that defines a name of ``linred.__all__`` has its docstring examples run below."""
    objects = [getattr(linred, name) for name in linred.__all__]
    modules = {obj.__module__ for obj in objects if callable(obj)}  # __version__, a str, has no docstring
    missing = sorted(modules - set(DOCTEST_MODULES))
    assert not missing, f"DOCTEST_MODULES lacks {missing}"


@pytest.mark.parametrize("module_name", DOCTEST_MODULES)
def test_docstring_examples(module_name, clean_plan_cache):
    """The examples in the docstrings are true."""
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed (output above)"
    assert result.attempted > 0
