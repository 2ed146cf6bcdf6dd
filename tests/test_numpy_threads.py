"""The NumPy backend's threaded ``reduceat``: the same bits as one thread, against float64 too."""

from __future__ import annotations

import numpy as np
import pytest
from support import assert_reduction, segment_bounds

import linred
from linred.backends import numpy as numpy_backend


@pytest.fixture
def many_threads(monkeypatch):
    """Cut even small inputs across 3 threads (the machine may have fewer cores; that is fine)."""
    monkeypatch.setattr(numpy_backend, "THREAD_ELEMENTS", 64)
    monkeypatch.setattr(numpy_backend, "num_threads", lambda: 3)


def _offsets(rng: np.random.Generator, n: int, empty: bool) -> np.ndarray:
    lengths = rng.geometric(1 / 12, size=n // 4)
    if empty:
        lengths[rng.random(lengths.shape[0]) < 0.3] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.append(offsets[offsets < n], n)


@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "float64"])
@pytest.mark.parametrize("empty", [False, True], ids=["no empty", "empty segments"])
@pytest.mark.parametrize("shape", [(3000,), (2, 1500, 3)], ids=["1-D", "batch and features"])
def test_threads_give_the_bits_of_one_thread(many_threads, monkeypatch, rng, reduction, dtype, empty, shape):
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    axis = 0 if len(shape) == 1 else 1
    offsets = _offsets(rng, shape[axis], empty)
    fn = getattr(linred, f"segmented_{reduction}")
    threaded = fn(x, offsets=offsets, axis=axis, backend="numpy")
    monkeypatch.setattr(numpy_backend, "num_threads", lambda: 1)
    linred.clear_plan_cache()
    single = fn(x, offsets=offsets, axis=axis, backend="numpy")
    np.testing.assert_array_equal(threaded, single, strict=True)
    assert_reduction(threaded, reduction, x, segments=segment_bounds(shape[axis], offsets=offsets), axis=axis)


def test_fewer_segments_than_threads(many_threads):
    x = np.arange(1000, dtype=np.float64)
    got = linred.segmented_sum(x, offsets=[0, 999, 1000], backend="numpy")
    np.testing.assert_array_equal(got, [x[:999].sum(), 999.0])


@pytest.mark.parametrize("value, expected", [("1", 1), ("2", 2), (" ", None), ("", None)])
def test_num_threads_env(monkeypatch, value, expected):
    monkeypatch.setenv("LINRED_NUM_THREADS", value)
    got = numpy_backend.num_threads()
    assert got >= 1
    if expected is not None:
        assert got <= expected


@pytest.mark.parametrize("value", ["two", "1.5", "0", "-2"])
def test_num_threads_env_rejects_non_integers(monkeypatch, value):
    monkeypatch.setenv("LINRED_NUM_THREADS", value)
    with pytest.raises(ValueError, match="LINRED_NUM_THREADS must be a positive integer"):
        numpy_backend.num_threads()


def test_a_bad_thread_cap_is_reported_by_the_first_call_not_only_a_large_one(monkeypatch, clean_plan_cache):
    monkeypatch.setenv("LINRED_NUM_THREADS", "abc")
    with pytest.raises(ValueError, match=r"LINRED_NUM_THREADS must be a positive integer; got 'abc'"):
        linred.segmented_sum(np.ones(4), 2, backend="numpy")
