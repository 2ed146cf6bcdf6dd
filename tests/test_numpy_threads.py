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


def _crossing_offsets(rng: np.random.Generator, n: int, block: int, empty: bool) -> np.ndarray:
    """Offsets whose segments end at and around multiples of ``block`` (k * block - 1, k * block,
    k * block + 1), with segments longer than a block, short ones and (``empty``) empty ones."""
    lengths = list(rng.choice([1, 2, 5, block - 1, block, block + 1, 3 * block + 7], size=n // 8))
    if empty:
        lengths = [0 if rng.random() < 0.2 else v for v in lengths]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.append(offsets[offsets < n], n)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("reduction", ["sum", "mean", "prod"])
@pytest.mark.parametrize(
    "dtype, requested",
    [
        ("int8", None),
        ("uint8", None),
        ("bool", None),
        ("int32", None),
        ("float16", None),
        ("float32", "float64"),
        ("int16", "float64"),
    ],
)
@pytest.mark.parametrize("empty", [False, True], ids=["no empty", "empty segments"])
@pytest.mark.parametrize("shape", [(3000,), (2, 1500, 3)], ids=["1-D", "batch and features"])
def test_converted_data_in_blocks(monkeypatch, rng, threads, reduction, dtype, requested, empty, shape):
    """Offsets over data read in another dtype than its own (integers summed in int64, float16 in
    float32, dtype=) are converted a block of CONVERT_ELEMENTS at a time (here 64), segments ending
    around the blocks' edges and longer than a block: integer results exact (NumPy's int64
    reduceat of the converted data), float ones within linred's bound, one thread's bits on three."""
    if reduction == "prod" and (requested is not None or dtype in ("float16", "bool")):
        pytest.skip("(products of these take other routes)")
    monkeypatch.setattr(numpy_backend, "CONVERT_ELEMENTS", 64)
    monkeypatch.setattr(numpy_backend, "THREAD_ELEMENTS", 64)
    monkeypatch.setattr(numpy_backend, "num_threads", lambda: threads)
    linred.clear_plan_cache()
    x = rng.integers(-3, 4, shape).astype(dtype) if dtype != "bool" else rng.integers(0, 2, shape).astype(bool)
    if reduction == "prod":
        x = np.where(rng.random(shape) < 0.8, 1, x).astype(dtype)  # (products that stay in range)
    axis = 0 if len(shape) == 1 else 1
    offsets = _crossing_offsets(rng, shape[axis], 64, empty)
    fn = getattr(linred, f"segmented_{reduction}")
    got = fn(x, offsets=offsets, axis=axis, backend="numpy", dtype=requested)
    monkeypatch.setattr(numpy_backend, "CONVERT_ELEMENTS", 1 << 20)
    linred.clear_plan_cache()
    whole = fn(x, offsets=offsets, axis=axis, backend="numpy", dtype=requested)
    assert got.dtype == whole.dtype
    if np.dtype(got.dtype).kind in "iub":  # exact: NumPy's reduceat of the data converted at once
        np.testing.assert_array_equal(got, whole, strict=True)
    else:
        assert_reduction(got, reduction, x, segments=segment_bounds(shape[axis], offsets=offsets), axis=axis,
                         dtype=requested)  # fmt: skip


def test_converted_data_takes_bounded_memory():
    """int8 data summed in int64 by offsets: the call's peak memory is a few blocks (it was eight
    times the data's bytes, NumPy's reduceat converting all of it first)."""
    import tracemalloc

    n = 1 << 23
    x = np.ones(n, dtype=np.int8)
    offsets = np.array([0, 5, n // 2, n])
    linred.segmented_sum(x, offsets=offsets, backend="numpy")  # (planned before measuring)
    tracemalloc.start()
    try:
        got = linred.segmented_sum(x, offsets=offsets, backend="numpy")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, [5, n // 2 - 5, n - n // 2])
    assert peak <= 4 * numpy_backend.CONVERT_ELEMENTS * 8, peak  # (8 MiB blocks; the data is 8 MiB)
