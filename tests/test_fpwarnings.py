"""NumPy's floating-point warnings from a host reduction name the caller's line and keep its modes."""

import warnings

import numpy as np
import pytest

import linred

pytestmark = pytest.mark.skipif(
    not hasattr(np, "_core") or not hasattr(np._core.umath, "_extobj_contextvar"),
    reason="NumPy < 2 keeps its error modes per thread; the warnings keep NumPy's own location",
)

HUGE = np.full(8, 1e308)
CALLS = {
    "sum fixed": lambda: linred.segmented_sum(HUGE, 4),
    "mean fixed": lambda: linred.segmented_mean(HUGE, 4),
    "sum offsets": lambda: linred.segmented_sum(HUGE, offsets=[0, 3, 8]),
    "mean lengths": lambda: linred.segmented_mean(HUGE, lengths=[5, 0, 3]),
    "sum rows": lambda: linred.segmented_sum(np.full((8, 3), 1e308), 4, axis=0),
    "sum plan": lambda: linred.SegmentedReduction(HUGE, 4)(HUGE),
    "mean strided": lambda: linred.segmented_mean(np.full(16, 1e308)[::2], 4),
    # integer data into a float16 result: the cast overflows (warned inside linred before)
    "max int into float16": lambda: linred.segmented_max(np.array([70000, 1, 2, 3], np.int32), 2, dtype="float16"),
    "max int offsets into float16": lambda: linred.segmented_max(
        np.array([70000, 1, 2, 3], np.int32), offsets=[0, 1, 4], dtype="float16"
    ),
    # the composed functions' final cast (warned inside linred/_fused.py before)
    "logsumexp into float16": lambda: linred.segmented_logsumexp(np.array([1e5, 1, 2, 3]), 2, dtype="float16"),
    "var into float16": lambda: linred.segmented_var(np.array([0.0, 1000.0, 2, 3]), offsets=[0, 2, 4], dtype="float16"),
}


@pytest.mark.parametrize("name", CALLS)
def test_overflow_warning_names_the_callers_line(name):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CALLS[name]()
    assert np.isinf(np.asarray(result)).any()
    assert [w.category for w in caught] == [RuntimeWarning]
    assert caught[0].filename == __file__, caught[0].filename
    assert "overflow" in str(caught[0].message)


def test_invalid_value_warning_names_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = linred.segmented_mean(np.array([np.inf, -np.inf, 1.0, 2.0]), 2)
    np.testing.assert_array_equal(np.isnan(result), [True, False])
    assert [(w.category, w.filename) for w in caught] == [(RuntimeWarning, __file__)]
    assert "invalid value" in str(caught[0].message)


def test_callers_modes_are_kept():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with np.errstate(all="ignore"):
            linred.segmented_sum(HUGE, 4)
    assert caught == []
    with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow"):
        linred.segmented_sum(HUGE, 4)
    seen = []
    with np.errstate(all="call", call=lambda kind, flag: seen.append(kind)):
        linred.segmented_sum(HUGE, 4)
    assert seen == ["overflow"]
    # and the caller's modes are back once the call returns
    assert np.geterr()["over"] == "warn" and np.geterrcall() is None


def test_finite_results_warn_nothing_and_integers_are_not_switched():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(linred.segmented_sum(np.arange(8.0), 4), [6.0, 22.0])
        np.testing.assert_array_equal(linred.segmented_sum(np.arange(8), 4), [6, 22])


def test_error_state_cache_stays_bounded():
    """Every np.errstate block is a new error state; the cache of their switched forms is bounded."""
    from linred import _fpwarnings

    for _ in range(3 * _fpwarnings._CACHE_SIZE):
        with np.errstate(over="ignore"):
            linred.segmented_sum(np.arange(8.0), 4)
    assert len(_fpwarnings._redirected) <= _fpwarnings._CACHE_SIZE


def test_pool_threads_follow_the_callers_modes(monkeypatch):
    """A long 1-D input with offsets is cut across the host pool: its threads run in the caller's context."""
    from linred.backends import numpy as host

    monkeypatch.setattr(host, "THREAD_ELEMENTS", 64)
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv("LINRED_NUM_THREADS", raising=False)
    x = np.full(4096, 1e300)
    offsets = np.arange(0, 4097, 64)
    linred.clear_plan_cache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with np.errstate(over="ignore"):
            linred.segmented_prod(x, offsets=offsets)
    assert caught == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        linred.segmented_prod(x, offsets=offsets)
    assert caught and {w.filename for w in caught} == {__file__}
    linred.clear_plan_cache()


def test_many_short_segments_of_feature_rows_warn_only_for_their_own_sums():
    """The host sums many short segments of narrow rows as one product with a stacked identity;
    its 0 * inf must not warn, a segment whose own sum is inf - inf must (at the caller's line)."""
    x = np.ones((2 * 4096, 4))
    x[10, 2] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = linred.segmented_sum(x, 2, axis=0)
    assert np.isinf(result[5, 2]) and np.isfinite(np.delete(result.ravel(), 5 * 4 + 2)).all()
    x[11, 2] = -np.inf
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = linred.segmented_sum(x, 2, axis=0)
    assert np.isnan(result[5, 2]) and np.isfinite(np.delete(result.ravel(), 5 * 4 + 2)).all()
    assert [(w.category, w.filename) for w in caught] == [(RuntimeWarning, __file__)]
    assert "invalid value" in str(caught[0].message)


@pytest.mark.parametrize("L", [4, 12, 100])
def test_extremes_of_bfloat16_with_a_nan_warn_nothing(L):
    """A NaN is the maximum and minimum of its segment without a warning, as for NumPy's own
    floating-point types: ml_dtypes' bfloat16 ``maximum.reduce`` warns "invalid value" where a
    segment holds one (the plain float32 call does not)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.arange(2 * L, dtype=np.float32)
    x[3] = np.nan
    xb = x.astype(ml_dtypes.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("max", "min"):
            got = getattr(linred, f"segmented_{name}")(xb, L).astype(np.float32)
            assert np.isnan(got[0]) and got[1] == (2 * L - 1 if name == "max" else L)
            got = getattr(linred, f"segmented_{name}")(xb, offsets=[0, 5, 2 * L]).astype(np.float32)
            assert np.isnan(got[0])
        for name in ("argmax", "argmin"):
            np.testing.assert_array_equal(getattr(linred, f"segmented_{name}")(xb, L)[0], 3)
