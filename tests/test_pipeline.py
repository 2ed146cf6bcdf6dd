"""The per-call pipeline: one path for every call form, short in steady state.

A repeated call finds its plan by a cheap description and runs it: it never goes
back through the validation of :mod:`linred._frontend`, whatever the call form
(an ``int`` or ``np.int64`` length, ``dtype=``, offsets, ``out=``, the plan object).
The call counts below are what :func:`sys.setprofile` sees of linred's own Python
functions; they bound the pipeline so that it stays short.
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np
import pytest

import linred
import linred.backends
from linred import _plan_cache

ROOT = os.path.dirname(linred.__file__)


def _linred_calls(call) -> list[tuple[str, str]]:
    """(module file, function) of each linred function entered by the second of two calls."""
    call()
    seen: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            seen.append((os.path.relpath(frame.f_code.co_filename, ROOT), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def _switches(calls: list[tuple[str, str]]) -> int:
    modules = [m for m, _ in calls]
    return sum(1 for a, b in itertools.pairwise(modules) if a != b)


X = np.arange(1024, dtype=np.float32)
OUT = np.empty(32, np.float32)
OFFSETS = np.arange(0, 1025, 32)

#: call form -> (the call, the most linred functions it may enter, the most module switches)
FORMS = {
    "int length, out": (lambda: linred.segmented_sum(X, 32, out=OUT), 8, 6),
    "np.int64 length": (lambda: linred.segmented_sum(X, np.int64(32)), 6, 5),
    "dtype": (lambda: linred.segmented_sum(X, 32, dtype="float32"), 6, 5),
    "offsets, check=False": (lambda: linred.segmented_sum(X, offsets=OFFSETS, check=False), 12, 10),
    "lengths, check=False": (lambda: linred.segmented_sum(X, lengths=np.full(32, 32), check=False), 14, 12),
    "max, axis=-1": (lambda: linred.segmented_max(X.reshape(4, 256), 8, axis=-1), 6, 5),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_repeated_call_runs_its_plan_without_validating_again(form, clean_plan_cache):
    call, most_calls, most_switches = FORMS[form]
    calls = _linred_calls(call)
    modules = {m for m, _ in calls}
    assert "_frontend.py" not in modules, calls
    assert ("_plan_cache.py", "call") in calls and ("plan.py", "_run") in calls
    torch = "torch" in sys.modules  # then one more: linred._torch_ops.run, which sends arrays on
    assert len(calls) <= most_calls + torch, calls
    assert _switches(calls) <= most_switches + torch, calls
    # ... and gives the float64 reference
    ref = X.astype(np.float64).reshape(-1, 32).sum(1) if "max" not in form else None
    if ref is not None:
        np.testing.assert_allclose(np.asarray(call()).astype(np.float64), ref, rtol=1e-6)


def test_the_plan_call_is_the_shortest(clean_plan_cache):
    plan = linred.SegmentedReduction(X, 32)
    calls = _linred_calls(lambda: plan(X, out=OUT))
    function = _linred_calls(lambda: linred.segmented_sum(X, 32, out=OUT))
    assert len(calls) < len(function), (calls, function)
    assert calls[0] == ("plan.py", "execute") and "_frontend.py" not in {m for m, _ in calls}
    np.testing.assert_array_equal(OUT, X.reshape(32, 32).sum(1))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"segment_length": True}, TypeError, "segment_length must be an integer"),
        ({"segment_length": 4.0}, TypeError, "segment_length must be an integer"),
        ({"segment_length": 4, "axis": True}, TypeError, "axis must be an integer"),
        ({"segment_length": 4, "check": 1}, TypeError, "check must be True or False"),
        ({"segment_length": 4, "dtype": ["float32"]}, TypeError, "dtype"),
    ],
)
def test_a_cached_plan_does_not_accept_arguments_that_only_compare_equal(kwargs, error, match, clean_plan_cache):
    """``True == 1`` and ``4.0 == 4`` hash alike: a plan cached for ``1`` or ``4`` must not serve them."""
    x = np.arange(8.0)
    linred.segmented_sum(x, 1)
    linred.segmented_sum(x, 4)
    linred.segmented_sum(x, 4, axis=0)
    with pytest.raises(error, match=match):
        linred.segmented_sum(x, **kwargs)


def test_offsets_are_checked_on_every_call_with_a_cached_plan(clean_plan_cache):
    x = np.arange(12.0)
    good = np.array([0, 4, 12])
    np.testing.assert_array_equal(linred.segmented_sum(x, offsets=good), [6, 60])
    bad = np.array([0, 13, 12])
    with pytest.raises(ValueError, match=r"offsets must be non-decreasing: offsets\[2\]=12 < offsets\[1\]=13"):
        linred.segmented_sum(x, offsets=bad)
    assert linred.plan_cache_info()["size"] == 1  # the same plan, its offsets checked again


def test_offsets_as_a_list_convert_on_every_call(clean_plan_cache):
    x = np.arange(12.0)
    np.testing.assert_array_equal(linred.segmented_sum(x, offsets=[0, 4, 12]), [6, 60])
    np.testing.assert_array_equal(linred.segmented_sum(x, offsets=[0, 8, 12]), [28, 38])
    with pytest.raises(ValueError, match=r"offsets\[-1\] must equal"):
        linred.segmented_sum(x, offsets=[0, 4, 11])


def test_empty_segments_with_unchecked_offsets(clean_plan_cache):
    x = np.arange(1.0, 9.0)
    for _ in range(2):  # planned, then from the cache
        np.testing.assert_array_equal(
            linred.segmented_sum(x, offsets=np.array([0, 0, 3, 3, 8, 8]), check=False), [0, 6, 0, 30, 0]
        )
        np.testing.assert_array_equal(
            linred.segmented_max(x, offsets=np.array([0, 0, 3, 8, 8]), check=False), [-np.inf, 3, 8, -np.inf]
        )


def test_changed_options_make_a_new_plan(clean_plan_cache):
    x = np.arange(8.0)
    linred.segmented_sum(x, 4)
    before = linred.plan_cache_info()
    linred.backends.configure("numpy")  # no change: same generation
    linred.segmented_sum(x, 4)
    assert linred.plan_cache_info()["misses"] == before["misses"]
    generation = linred.backends.options_generation()
    for callback in linred.backends._on_configure:  # what a changed option does
        callback()
    linred.backends._generation += 1
    try:
        linred.segmented_sum(x, 4)
        assert linred.plan_cache_info()["misses"] == before["misses"] + 1
    finally:
        linred.backends._generation = generation


def test_the_cache_evicts_the_least_recently_used_plan(clean_plan_cache):
    linred.set_plan_cache_size(2)
    try:
        a, b, c = np.arange(4.0), np.arange(6.0), np.arange(8.0)
        linred.segmented_sum(a, 2)
        linred.segmented_sum(b, 2)
        linred.segmented_sum(a, 2)  # a is now the most recent
        linred.segmented_sum(c, 2)  # evicts b
        misses = linred.plan_cache_info()["misses"]
        linred.segmented_sum(a, 2)
        assert linred.plan_cache_info()["misses"] == misses
        linred.segmented_sum(b, 2)
        assert linred.plan_cache_info()["misses"] == misses + 1
        assert len(_plan_cache._cache.plans) == 2
    finally:
        linred.set_plan_cache_size(64)


def test_an_input_whose_3d_view_is_a_copy_is_read_through_that_view(clean_plan_cache):
    """Executors that read the caller's array as it comes cannot read one that the
    (batch, n, features) reshape copies; the plan gives them the view instead."""
    base = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)
    x = base.transpose(1, 0, 2)  # axis 2: batch = 3 x 2, not mergeable without a copy
    ref = x.astype(np.float64).reshape(6, 2, 4).sum(-1).reshape(3, 2, 2)
    for _ in range(2):
        np.testing.assert_array_equal(linred.segmented_sum(x, 4, axis=2), ref)
