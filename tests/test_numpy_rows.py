"""The NumPy backend's feature rows with offsets (the GNN pooling case): every dispatch branch of
``_variable_rows`` against a float64 reference, non-finite values kept in their own segment and
feature, no spurious floating-point warnings, thread counts and accuracy."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from support import HAS_TORCH, to_kind, to_numpy

import linred
from linred.backends import numpy as numpy_backend

T = numpy_backend.TILE_ROWS
FEW = numpy_backend.TILE_MIN_SEGMENTS
MIN_ELEMENTS = numpy_backend.TILE_MIN_ELEMENTS
KINDS = ["numpy", "torch-cpu"] if HAS_TORCH else ["numpy"]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _lengths(rng: np.random.Generator, branch: str) -> np.ndarray:
    """Segment lengths (with empty segments) that the backend serves by ``branch``."""
    if branch == "tiles":  # geometric lengths, a quarter of them empty
        lengths = rng.geometric(1 / 60, 300)
        lengths[rng.random(300) < 0.25] = 0
    elif branch == "tiles, crowded":  # one tile meets 127 segments of one row, the others a few
        lengths = np.concatenate([rng.integers(100, 400, 40), np.ones(127, dtype=np.int64), rng.integers(0, 300, 40)])
    elif branch == "tiles, long and empty":  # one segment over many tiles, runs of empty ones
        lengths = np.zeros(FEW + 40, dtype=np.int64)
        lengths[5] = 50 * T + 3
        lengths[20:40] = rng.integers(1, 3 * T, 20)
        lengths[-1] = 7
    elif branch == "tiles, one segment":  # every row in one segment, the others empty
        lengths = np.zeros(FEW + 1, dtype=np.int64)
        lengths[FEW // 2] = 40 * (FEW + 1) + 5
    elif branch == "tiles, on tile edges":  # whole tiles and pairs of half tiles
        lengths = np.tile([T, T // 2, T // 2, 2 * T, 0], FEW // 4)
    elif branch == "loop, few segments":
        lengths = rng.geometric(1 / 200, FEW)
        lengths[::7] = 0
    elif branch == "loop, long segments":
        lengths = rng.integers(3000, 6000, FEW + 1)
        lengths[3] = 0
    elif branch == "reduceat, short segments":
        lengths = rng.geometric(1 / 6, 300)
    else:
        raise ValueError(branch)
    return lengths.astype(np.int64)


BRANCHES = {
    "tiles": "_tile_rows",
    "tiles, crowded": "_tile_rows",
    "tiles, long and empty": "_tile_rows",
    "tiles, one segment": "_tile_rows",
    "tiles, on tile edges": "_tile_rows",
    "loop, few segments": "_loop_rows",
    "loop, long segments": "_loop_rows",
    "reduceat, short segments": None,
}


def _reference(x: np.ndarray, offsets: np.ndarray, reduction: str, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 sums (means) of each segment along ``axis`` (0 or 1), and the sums of |x|."""
    x64 = np.moveaxis(np.asarray(x, dtype=np.float64), axis, 0)
    m = len(offsets) - 1
    ref = np.zeros((m, *x64.shape[1:]))
    size = np.zeros_like(ref)
    with np.errstate(invalid="ignore"):
        for i in range(m):
            lo, hi = offsets[i], offsets[i + 1]
            ref[i] = x64[lo:hi].sum(axis=0)
            size[i] = np.abs(x64[lo:hi]).sum(axis=0)
            if reduction == "mean":
                ref[i] = ref[i] / (hi - lo) if hi > lo else np.nan
                size[i] /= max(hi - lo, 1)
    return np.moveaxis(ref, 0, axis), np.moveaxis(size, 0, axis)


def _check(got: np.ndarray, ref: np.ndarray, size: np.ndarray, dtype: str) -> None:
    got = np.asarray(got, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    tau = 1e-6 if dtype == "float32" else 1e-12
    err = np.abs(got[finite] - ref[finite])
    bound = tau * size[finite] + 2 * np.finfo(dtype).eps * np.abs(ref[finite]) + np.finfo(dtype).tiny
    assert (err <= bound).all(), float(np.max(err / bound))


def _spy_on_rows(monkeypatch) -> list[str]:
    """The names of the row functions the NumPy backend plans with from now on (spied on)."""
    names: list[str] = []
    for name in ("_tile_rows", "_loop_rows", "_blocked_rows"):
        real = getattr(numpy_backend, name)

        def spy(problem, real=real, name=name):
            names.append(name)
            return real(problem)

        monkeypatch.setattr(numpy_backend, name, spy)
    return names


@pytest.fixture
def planned(monkeypatch, clean_plan_cache):
    """The names of the row functions the NumPy backend planned with; the tiles serve calls of
    any size (TILE_MIN_ELEMENTS keeps small ones off them, for speed only)."""
    monkeypatch.setattr(numpy_backend, "TILE_MIN_ELEMENTS", 0)
    return _spy_on_rows(monkeypatch)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("branch", BRANCHES)
def test_rows_with_offsets_match_float64(planned, rng, branch, batch, reduction, dtype, kind):
    offsets = _offsets(_lengths(rng, branch))
    n, d = int(offsets[-1]), 3 if branch == "loop, long segments" else 16
    x = rng.standard_normal((batch, n, d) if batch > 1 else (n, d)).astype(dtype)
    axis = 1 if batch > 1 else 0
    fn = getattr(linred, f"segmented_{reduction}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # finite data: no warning at all (mean of empty segments: NaN, silently)
        got = fn(to_kind(x, kind), offsets=offsets, axis=axis, backend="numpy", check=bool(batch % 2))
    assert planned == ([BRANCHES[branch]] if BRANCHES[branch] else [])
    assert got.shape == (*x.shape[:axis], len(offsets) - 1, d)
    _check(to_numpy(got), *_reference(x, offsets, reduction, axis), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("branch", ["tiles", "tiles, crowded", "tiles, on tile edges", "loop, few segments"])
def test_non_finite_values_stay_in_their_segment_and_feature(planned, rng, branch, dtype):
    """0 * inf of the tiles' products must not reach the other segments or features, nor warn."""
    offsets = _offsets(_lengths(rng, branch))
    n, d = int(offsets[-1]), 16
    x = rng.standard_normal((2, n, d)).astype(dtype)
    rows = rng.choice(n, 12, replace=False)
    x[0, rows[:4], 1] = np.inf  # several +inf in one feature: inf, never inf - inf
    x[1, rows[4:8], 5] = -np.inf
    x[0, rows[8], 7] = np.nan
    x[1, rows[9:], rng.integers(0, d, 3)] = np.inf
    ref = _reference(x, offsets, "sum", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = linred.segmented_sum(x, offsets=offsets, axis=1, backend="numpy")
        mean = linred.segmented_mean(x, offsets=offsets, axis=1, backend="numpy")
    assert planned[0] == BRANCHES[branch]
    assert np.isinf(got).sum() >= 6 and np.isnan(got).sum() == 1
    _check(got, *ref, dtype)
    _check(mean, *_reference(x, offsets, "mean", 1), dtype)


def test_inf_minus_inf_in_a_segment_warns_once_at_the_callers_line(planned, rng):
    offsets = _offsets(_lengths(rng, "tiles"))
    x = rng.standard_normal((int(offsets[-1]), 16)).astype(np.float32)
    seg = int(np.flatnonzero(np.diff(offsets) >= 2)[3])
    x[offsets[seg], 2], x[offsets[seg] + 1, 2] = np.inf, -np.inf
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = linred.segmented_sum(x, offsets=offsets, axis=0, backend="numpy")
    assert planned == ["_tile_rows"]
    assert [w.category for w in caught] == [RuntimeWarning], [str(w.message) for w in caught]
    assert "invalid value" in str(caught[0].message) and caught[0].filename == __file__
    assert np.isnan(got).sum() == 1 and np.isnan(got[seg, 2])
    _check(got, *_reference(x, offsets, "sum", 0), "float32")


def test_overflow_in_a_pool_thread_warns_at_the_callers_line(planned, monkeypatch, rng):
    monkeypatch.setattr(numpy_backend, "num_threads", lambda: 2)
    monkeypatch.setattr(numpy_backend, "TILE_THREAD_ELEMENTS", 1)
    offsets = _offsets(np.full(FEW + 1, 2 * T))
    x = np.ones((int(offsets[-1]), 16))
    x[-T:] = 1e308  # the last tile: the second thread's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = linred.segmented_sum(x, offsets=offsets, axis=0, backend="numpy")
    assert planned == ["_tile_rows"]
    assert [w.category for w in caught] == [RuntimeWarning] and "overflow" in str(caught[0].message)
    assert caught[0].filename == __file__
    assert np.isinf(got[-1]).all() and (got[:-1] == 2 * T).all()


def test_overflow_in_every_thread_warns_once(planned, monkeypatch, rng):
    """Where the caller's thread and a pool thread both overflow, one warning, as one NumPy call
    issues one (the caller's own chunk warned at once, then the pool's again)."""
    monkeypatch.setattr(numpy_backend, "num_threads", lambda: 2)
    monkeypatch.setattr(numpy_backend, "TILE_THREAD_ELEMENTS", 1)
    offsets = _offsets(np.full(FEW + 1, 2 * T))
    x = np.full((int(offsets[-1]), 16), 1e308)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        linred.segmented_sum(x, offsets=offsets, axis=0, backend="numpy")
    assert planned == ["_tile_rows"]
    assert [str(w.message) for w in caught] == ["overflow encountered in a segmented reduction"]
    assert caught[0].filename == __file__


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_threads_give_the_bits_of_one_thread(planned, monkeypatch, rng, reduction):
    offsets = _offsets(_lengths(rng, "tiles, crowded"))
    x = rng.standard_normal((2, int(offsets[-1]), 16)).astype(np.float32)
    fn = getattr(linred, f"segmented_{reduction}")
    monkeypatch.setattr(numpy_backend, "TILE_THREAD_ELEMENTS", 1)
    monkeypatch.setattr(numpy_backend, "num_threads", lambda: 3)
    threaded = fn(x, offsets=offsets, axis=1, backend="numpy")
    monkeypatch.setattr(numpy_backend, "num_threads", lambda: 1)
    linred.clear_plan_cache()
    single = fn(x, offsets=offsets, axis=1, backend="numpy")
    assert planned == ["_tile_rows", "_tile_rows"]
    np.testing.assert_array_equal(threaded, single, strict=True)


@pytest.mark.parametrize("more", [0, 1])
def test_small_calls_keep_the_loop(planned, monkeypatch, rng, more):
    offsets = _offsets(np.full(FEW + 1, 40))
    x = rng.standard_normal((int(offsets[-1]), 32)).astype(np.float32)  # (wider than BLOCKED_MAX_FEATURES)
    monkeypatch.setattr(numpy_backend, "TILE_MIN_ELEMENTS", x.size + more)
    got = linred.segmented_sum(x, offsets=offsets, axis=0, backend="numpy")
    assert planned == ["_loop_rows" if more else "_tile_rows"]
    _check(got, *_reference(x, offsets, "sum", 0), "float32")


@pytest.mark.parametrize("kind", KINDS)
def test_float32_accuracy_of_long_segments(monkeypatch, planned, rng, kind):
    """Positive float32 data (errors add up) in segments over many tiles: within 1e-6 of float64
    (at the module's constants: two threads where there are two cores)."""
    monkeypatch.setattr(numpy_backend, "TILE_MIN_ELEMENTS", MIN_ELEMENTS)
    lengths = rng.integers(1000, 6000, FEW + 8)  # (3,500 rows on average: the tiles)
    lengths[::9] = 0
    offsets = _offsets(lengths)
    x = (1000 + rng.random((int(offsets[-1]), 4))).astype(np.float32)
    got = to_numpy(linred.segmented_sum(to_kind(x, kind), offsets=offsets, axis=0, backend="numpy"))
    ref, _ = _reference(x, offsets, "sum", 0)
    nonempty = lengths > 0
    assert planned == ["_tile_rows"]
    assert (got[~nonempty] == 0).all()
    assert np.max(np.abs(got[nonempty] - ref[nonempty]) / ref[nonempty]) <= 1e-6


def test_the_interval_table_is_each_intervals_indicator():
    table = numpy_backend._interval_table(8, np.dtype(np.float32))
    assert table.shape == (45, 8) and not table.flags.writeable
    for hi in range(9):
        for lo in range(hi + 1):
            np.testing.assert_array_equal(table[hi * (hi + 1) // 2 + lo], (np.arange(8) >= lo) & (np.arange(8) < hi))


# --- narrow rows of a small call: reduceat over blocks of TILE_ROWS rows (_blocked_rows) ---


@pytest.fixture
def blocked(monkeypatch, clean_plan_cache):
    """The names of the row functions planned, at the module's constants."""
    return _spy_on_rows(monkeypatch)


def _narrow_lengths(rng: np.random.Generator, layout: str) -> np.ndarray:
    """Lengths long enough on average for the rows' BLAS paths (ROWS_LOOP_MIN_ELEMENTS with 2
    features), and few enough rows for BLOCKED_MAX_BYTES with 8 float64 features and 2 rows of a
    batch."""
    if layout == "geometric with empty":  # 60 segments of ~400 rows, some empty, most over blocks
        lengths = rng.geometric(1 / 400, 60)
        lengths[rng.random(60) < 0.2] = 0
    elif layout == "on block edges":  # whole blocks, k*T - 1 and k*T + 1
        lengths = np.tile([T, T - 1, T + 1, 2 * T, 0, 2 * T + 1, 4 * T, 4 * T - 1, 4 * T + 1], 10)
    elif layout == "one segment":
        lengths = np.zeros(40, dtype=np.int64)
        lengths[7] = 600 * 40
    elif layout == "one block each":  # none empty, none over a block: reduceat's sums as they are
        lengths = rng.integers(T // 2, T + 1, 100)
        lengths[::7] = T
    else:
        raise ValueError(layout)
    return lengths.astype(np.int64)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("d", [2, 4, 8, 16])
@pytest.mark.parametrize("layout", ["geometric with empty", "on block edges", "one segment", "one block each"])
def test_narrow_rows_of_small_calls_match_float64(blocked, rng, layout, d, batch, reduction, dtype, kind):
    lengths = _narrow_lengths(rng, layout)
    if layout == "one block each" and lengths.mean() * d < numpy_backend.ROWS_LOOP_MIN_ELEMENTS:
        pytest.skip("segments of at most a block of so few features take the paths of short segments")
    if d > numpy_backend.BLOCKED_NARROW_FEATURES:  # (a call of at most BLOCKED_WIDE_MAX_BYTES)
        if layout == "one segment":
            pytest.skip("one segment of more than BLOCKED_MAX_ROWS rows takes the loop")
        rows = numpy_backend.BLOCKED_WIDE_MAX_BYTES // (batch * d * np.dtype(dtype).itemsize)
        lengths = lengths[np.cumsum(lengths) <= rows]
    offsets = _offsets(lengths)
    n = int(offsets[-1])
    x = rng.standard_normal((batch, n, d) if batch > 1 else (n, d)).astype(dtype)
    axis = 1 if batch > 1 else 0
    fn = getattr(linred, f"segmented_{reduction}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(to_kind(x, kind), offsets=offsets, axis=axis, backend="numpy", check=bool(batch % 2))
    assert blocked == ["_blocked_rows"]
    _check(to_numpy(got), *_reference(x, offsets, reduction, axis), dtype)


def test_narrow_rows_non_finite_values_stay_in_their_segment_and_feature(blocked, rng):
    offsets = _offsets(_narrow_lengths(rng, "geometric with empty"))
    x = rng.standard_normal((int(offsets[-1]), 4)).astype(np.float32)
    rows = rng.choice(x.shape[0], 6, replace=False)
    x[rows[:3], 1] = np.inf
    x[rows[3], 2] = np.nan
    x[rows[4:], 0] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = linred.segmented_sum(x, offsets=offsets, axis=0, backend="numpy")
    assert blocked == ["_blocked_rows"]
    _check(got, *_reference(x, offsets, "sum", 0), "float32")


@pytest.mark.parametrize(
    "case, expected",
    [
        ("bytes", "_blocked_rows"),
        ("bytes + 1 row", "_tile_rows"),
        ("rows", "_blocked_rows"),
        ("rows + 1", "_loop_rows"),
        ("8 features over tiles", "_tile_rows"),
        ("4 features over tiles", "_blocked_rows"),
        ("16 features", "_blocked_rows"),
        ("17 features", "_loop_rows"),
        ("16 features, wide bytes", "_blocked_rows"),
        ("16 features, wide bytes + 1 row", "_loop_rows"),
    ],
)
def test_where_narrow_rows_take_blocks(blocked, case, expected):
    """The switches (BLOCKED_MAX_BYTES, BLOCKED_MAX_ROWS, BLOCKED_MAX_FEATURES,
    BLOCKED_OVER_TILES_FEATURES, BLOCKED_WIDE_MAX_BYTES past BLOCKED_NARROW_FEATURES), each one
    step either side."""
    most_rows = numpy_backend.BLOCKED_MAX_ROWS
    if case.startswith("bytes"):  # float32 rows of 4 features filling BLOCKED_MAX_BYTES, 8 segments
        n = numpy_backend.BLOCKED_MAX_BYTES // 16 + (1 if "+" in case else 0)
        m, d = 1024, 4
        if n > most_rows * m:
            m = -(-n // most_rows)
    elif case.startswith("rows"):  # mean length BLOCKED_MAX_ROWS, then one row more than that
        m, d = 4, 4
        n = most_rows * m + (1 if "+" in case else 0)
    elif case.endswith("over tiles"):  # many segments of 200 rows: the tiles' call
        d = 8 if case.startswith("8") else 4
        m, n = numpy_backend.TILE_MIN_SEGMENTS + 1, 200 * (numpy_backend.TILE_MIN_SEGMENTS + 1)
        if d * n < numpy_backend.TILE_MIN_ELEMENTS:
            n = -(-numpy_backend.TILE_MIN_ELEMENTS // (d * m)) * m
    elif case.startswith("16 features, wide bytes"):  # float32 rows of 16 features, 32 segments
        m, d = 32, 16
        n = numpy_backend.BLOCKED_WIDE_MAX_BYTES // 64 + (1 if "+" in case else 0)
    else:
        m, d, n = 8, int(case.split()[0]), 8 * 200
    x = np.ones((n, d), dtype=np.float32)
    offsets = np.linspace(0, n, m + 1).astype(np.int64)
    got = linred.segmented_sum(x, offsets=offsets, axis=0, backend="numpy")
    assert blocked == [expected]
    np.testing.assert_array_equal(got, np.diff(offsets)[:, None] * np.ones((1, d), np.float32))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("share", [0.0005, 0.5])
def test_many_non_finite_segments_are_summed_again_at_once(planned, rng, reduction, share):
    """NaN or infinities in many segments (more than 1 / REDO_ALL_FRACTION of them): the tiles'
    call is summed again by the loop for all segments, a few again one by one; the same results."""
    offsets = _offsets(_lengths(rng, "tiles"))
    x = rng.standard_normal((int(offsets[-1]), 16)).astype(np.float32)
    x[rng.random(x.shape[0]) < share, 3] = np.nan
    x[rng.random(x.shape[0]) < share / 4, 9] = np.inf
    fn = getattr(linred, f"segmented_{reduction}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(x, offsets=offsets, axis=0, backend="numpy")
    assert planned == (["_tile_rows", "_loop_rows"] if share > 0.01 else ["_tile_rows"])  # (the loop: all again)
    assert np.isnan(got).any()
    _check(got, *_reference(x, offsets, reduction, 0), "float32")


@pytest.mark.parametrize("share", [0.001, 0.5])
def test_many_non_finite_short_segments_of_narrow_rows(rng, share):
    """The stacked identity's products with zeros (many short fixed segments of narrow rows): a
    NaN column, or a few NaN, summed again the plain way; each value stays in its own feature."""
    m, L, d = 2 * numpy_backend.IDENTITY_PRODUCT_MIN_SEGMENTS, 2, 4
    x = rng.standard_normal((m * L, d)).astype(np.float32)
    x[rng.random(m * L) < share, 2] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = linred.segmented_sum(x, L, axis=0, backend="numpy")
    ref = x.astype(np.float64).reshape(m, L, d).sum(axis=1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-6, atol=1e-6)


# --- max and min of feature rows: one ufunc.reduce per segment where rows are wide (_loop_extreme) ---


def _extreme_reference(x: np.ndarray, offsets: np.ndarray, reduction: str, axis: int) -> np.ndarray:
    """Each segment's maximum (minimum) along ``axis``, NaN where it holds one, the identity where empty."""
    moved = np.moveaxis(x, axis, 0)
    pick = np.max if reduction == "max" else np.min
    fill = (-np.inf if reduction == "max" else np.inf) if x.dtype.kind == "f" else None
    if fill is None:
        info = np.iinfo(x.dtype)
        fill = info.min if reduction == "max" else info.max
    out = np.empty((len(offsets) - 1, *moved.shape[1:]), dtype=x.dtype)
    for i in range(len(offsets) - 1):
        lo, hi = offsets[i], offsets[i + 1]
        out[i] = pick(moved[lo:hi], axis=0) if hi > lo else fill
    return np.moveaxis(out, 0, axis)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize(
    ("d", "mean_length", "batch", "dtype", "loop"),
    [
        (16, 100, 1, "float32", True),  # 1,600 elements a segment: the loop
        (16, 99, 1, "float32", False),  # 1,584: reduceat
        (15, 2000, 1, "float32", False),  # too narrow for the loop at any length
        (32, 8, 1, "float32", True),  # wide rows: 256 elements a segment
        (32, 7, 1, "float32", False),  # 224
        (33, 9, 3, "float64", True),  # a batch along axis 1
        (64, 40, 1, "int32", True),
        (128, 12, 1, "float16", True),
    ],
)
def test_max_min_of_wide_rows_loop_per_segment(monkeypatch, clean_plan_cache, rng, d, mean_length, batch, dtype,
                                               loop, reduction, kind):  # fmt: skip
    """The per-segment loop where rows are wide and segments hold enough elements (and reduceat
    elsewhere), both with the same values: empty segments first, inside and last, NaN in one
    segment and feature."""
    planned = []
    real = numpy_backend._loop_extreme

    def spy(problem):
        run = real(problem)
        planned.append(run is not None)
        return run

    monkeypatch.setattr(numpy_backend, "_loop_extreme", spy)
    monkeypatch.setattr(numpy_backend, "EXTREME_LOOP_MIN_BYTES", 0)  # (small data, the rule's other terms)
    monkeypatch.setattr(numpy_backend, "ROWS_STEPS_MAX_MEAN", 0)  # (the steps of short segments: below)
    m = 200
    lengths = rng.integers(mean_length // 2, mean_length + 1, m)
    lengths[[0, 77, m - 1]] = 0
    lengths[1] = 0
    lengths[1] = mean_length * m - lengths.sum()  # the mean exactly mean_length (one longer segment)
    offsets = _offsets(lengths)
    n = int(offsets[-1])
    shape = (batch, n, d) if batch > 1 else (n, d)
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    if dtype.startswith("float"):
        x[..., offsets[5] + 1, 3] = np.nan
    axis = 1 if batch > 1 else 0
    got = getattr(linred, f"segmented_{reduction}")(to_kind(x, kind), offsets=offsets, axis=axis, backend="numpy")
    assert planned == [loop]
    np.testing.assert_array_equal(to_numpy(got), _extreme_reference(x, offsets, reduction, axis))


def test_max_of_wide_rows_keeps_reduceat_for_data_in_the_cache(clean_plan_cache, monkeypatch, rng):
    planned = []
    real = numpy_backend._loop_extreme
    monkeypatch.setattr(numpy_backend, "_loop_extreme", lambda p: planned.append(real(p) is not None) or real(p))
    x = rng.standard_normal((2000, 64)).astype(np.float32)  # 512 KB
    linred.segmented_max(x, offsets=[0, 700, 2000], backend="numpy")
    y = rng.standard_normal((5000, 64)).astype(np.float32)  # 1.3 MB
    linred.segmented_max(y, offsets=[0, 700, 5000], backend="numpy")
    assert planned == [False, True]


# --- max and min of feature rows in short segments: the segments' k-th rows a step at a time ---


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize(
    ("d", "lengths", "batch", "dtype"),
    [
        (16, "short", 1, "float32"),
        (64, "short", 3, "float64"),  # a batch along axis 1
        (32, "steps-1", 1, "float32"),  # the longest segment one row short of the steps' end
        (32, "steps", 1, "int32"),  # exactly the steps
        (32, "steps+1", 1, "float32"),  # one row past them: the rest in one reduce
        (17, "long", 2, "float16"),  # a segment of 500 rows among short ones
        (128, "short", 1, "uint8"),
        (20, "short", 1, "bool"),
    ],
)
def test_max_min_of_short_segments_a_row_at_a_time(monkeypatch, clean_plan_cache, rng, d, lengths, batch, dtype,
                                                   reduction, kind):  # fmt: skip
    """The steps over the segments' k-th rows give reduceat's values: empty segments first, inside
    and last, NaN in one segment and feature, segments ending at, before and past the last step."""
    planned = []
    real = numpy_backend._rows_steps
    monkeypatch.setattr(numpy_backend, "_rows_steps", lambda p: planned.append(r := real(p)) or r)
    monkeypatch.setattr(numpy_backend, "ROWS_STEPS_MIN_BYTES", 0)  # (small data, the rule's other terms)
    steps = numpy_backend.ROWS_STEPS_MAX_STEPS
    m = 300
    sizes = rng.integers(1, 9, m)
    sizes[[0, 150, m - 1]] = 0
    extra = {"short": 0, "steps-1": steps - 1, "steps": steps, "steps+1": steps + 1, "long": 500}[lengths]
    if extra:
        sizes[7] = extra
        sizes[8] = extra  # (two of that length: the sort keeps both first)
    offsets = _offsets(sizes)
    n = int(offsets[-1])
    shape = (batch, n, d) if batch > 1 else (n, d)
    x = (rng.standard_normal(shape) * 100).astype(dtype) if dtype != "bool" else rng.random(shape) < 0.3
    if dtype.startswith("float"):
        x[..., offsets[5] + 1, 3] = np.nan
        x[..., offsets[7] + extra - 1 if extra else offsets[7], 2] = np.nan  # (the last row of a long one)
    axis = 1 if batch > 1 else 0
    got = getattr(linred, f"segmented_{reduction}")(to_kind(x, kind), offsets=offsets, axis=axis, backend="numpy")
    assert planned and planned[0] is not None
    if dtype == "bool":
        expected = np.moveaxis(
            np.stack([
                (np.any if reduction == "max" else np.all)(np.moveaxis(x, axis, 0)[lo:hi], axis=0)
                for lo, hi in itertools.pairwise(offsets)
            ]), 0, axis)  # fmt: skip
    else:
        expected = _extreme_reference(x, offsets, reduction, axis)
    np.testing.assert_array_equal(to_numpy(got), expected)


@pytest.mark.parametrize(
    ("d", "mean_rows", "nbytes", "steps"),
    [
        (16, 32, 1 << 20, True),  # 32 rows a segment on average
        (16, 33, 1 << 20, False),  # 33: the loop or reduceat
        (8, 16, 1 << 20, True),  # narrow rows: 16 rows
        (8, 17, 1 << 20, False),
        (7, 4, 1 << 20, False),  # too narrow
        (128, 16, 1 << 22, True),  # wide rows: 16 rows
        (128, 17, 1 << 22, False),  # 17: the per-segment loop
        (128, 17, 1 << 19, True),  # ... unless the data is small enough for reduceat, which is slower
        (64, 4, (1 << 17) - 256, False),  # under 128 KiB: reduceat
        (64, 4, 1 << 17, True),
    ],
)
def test_where_max_and_min_take_the_steps(clean_plan_cache, monkeypatch, d, mean_rows, nbytes, steps):
    planned = []
    real = numpy_backend._rows_steps
    monkeypatch.setattr(numpy_backend, "_rows_steps", lambda p: planned.append(real(p) is not None) or real(p))
    n = nbytes // (4 * d)
    m = max(1, n // mean_rows)
    n = m * mean_rows
    x = np.zeros((n, d), np.float32)
    linred.segmented_max(x, offsets=np.arange(0, n + 1, mean_rows), backend="numpy")
    assert planned == [steps]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reduction", ["sum", "mean", "prod"])
@pytest.mark.parametrize(
    ("d", "extra", "batch", "dtype"),
    [
        (8, 0, 1, "float32"),
        (64, 0, 3, "float64"),  # a batch along axis 1
        (16, 63, 1, "float32"),  # the longest segment one row short of the steps' end
        (16, 64, 1, "int32"),  # exactly the steps (int32 data, int64 sums)
        (16, 65, 1, "float32"),  # one row past them: the rest in BLAS blocks, added in float64
        (9, 700, 2, "float16"),  # float16 data summed in float32 (the rest: converted blocks)
        (32, 300, 1, "int8"),
    ],
)
def test_sums_of_short_segments_a_row_at_a_time(monkeypatch, clean_plan_cache, rng, d, extra, batch, dtype,
                                                reduction, kind):  # fmt: skip
    """Sums, means and products of short segments of feature rows a row at a time, against float64:
    empty segments first, inside and last, segments ending at, before and past the last step."""
    planned = []
    real = numpy_backend._rows_steps
    monkeypatch.setattr(numpy_backend, "_rows_steps", lambda p: planned.append(r := real(p)) or r)
    monkeypatch.setattr(numpy_backend, "ROWS_STEPS_MIN_BYTES", 0)  # (small data, the rule's other terms)
    m = 300
    sizes = rng.integers(1, 9, m)
    sizes[[0, 150, m - 1]] = 0
    if extra:
        sizes[7] = sizes[8] = extra
    offsets = _offsets(sizes)
    n = int(offsets[-1])
    shape = (batch, n, d) if batch > 1 else (n, d)
    if reduction == "prod":
        x = rng.choice([-1, 1], size=shape).astype(dtype) if dtype.startswith("int") else (
            rng.uniform(0.9, 1.1, shape).astype(dtype))  # fmt: skip
    else:
        x = (rng.standard_normal(shape) * 10).astype(dtype) if dtype.startswith("float") else (
            rng.integers(-100, 100, shape).astype(dtype))  # fmt: skip
    axis = 1 if batch > 1 else 0
    call = getattr(linred, f"segmented_{reduction}")
    try:
        got = call(to_kind(x, kind), offsets=offsets, axis=axis, backend="numpy")
    except TypeError:  # (the mean of integers is refused or served elsewhere: not this path)
        assert reduction == "mean" and dtype.startswith("int")
        return
    served = planned and planned[0] is not None
    moved = np.moveaxis(x.astype(np.float64), axis, 0)
    op = {"sum": np.sum, "mean": np.mean, "prod": np.prod}[reduction]
    fill = {"sum": 0.0, "prod": 1.0, "mean": np.nan}[reduction]
    ref = np.stack([op(moved[lo:hi], axis=0) if hi > lo else np.full(moved.shape[1:], fill)
                    for lo, hi in itertools.pairwise(offsets)])  # fmt: skip
    ref = np.moveaxis(ref, 0, axis)
    tol = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}.get(dtype, 0)
    got = to_numpy(got).astype(np.float64)
    scale = np.abs(ref[np.isfinite(ref)]).max() if np.isfinite(ref).any() else 1.0
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * scale, equal_nan=True)
    expected_served = not (reduction == "mean" and dtype.startswith("int")) and not (
        dtype == "float16" and reduction != "max"
    )  # float16 results of float32 sums: another path
    if expected_served:
        assert served, planned


def test_steps_with_a_dtype_of_another_kind(clean_plan_cache, rng):
    """A dtype= the data does not cast to without loss (float data to int64 sums, signed to
    unsigned) keeps reduceat, which casts each element first, rather than failing in the steps."""
    x = np.ones((4096, 16), np.float32) * 1.5
    offsets = np.arange(0, 4097, 4)
    np.testing.assert_array_equal(linred.segmented_sum(x, offsets=offsets, dtype="int64")[:2, 0], [4, 4])
    y = np.ones((4096, 16), np.int32)
    np.testing.assert_array_equal(linred.segmented_sum(y, offsets=offsets, dtype="uint8")[:2, 0], [4, 4])
    np.testing.assert_array_equal(linred.segmented_prod(y * 2, offsets=offsets, dtype="uint64")[:2, 0], [16, 16])


_INTEGER_REQUESTS = [("uint8", "int64"), ("bool", "uint8"), ("uint16", "int32"), ("uint32", "int64"),
                     ("uint8", "int16"), ("int8", "int64"), ("uint8", "uint64")]  # fmt: skip


@pytest.mark.parametrize(
    ("reduction", "dtype", "request_dtype"),
    [(r, d, q) for r in ("sum", "prod") for d, q in _INTEGER_REQUESTS]
    + [(r, d, None) for r in ("max", "min") for d in ("uint8", "bool", "uint16", "int8")],
)
def test_steps_rest_of_a_long_segment_in_the_requested_integer_dtype(clean_plan_cache, rng, reduction, dtype,
                                                                     request_dtype):  # fmt: skip
    """Integer data with an integer dtype= that takes it (uint8 summed as int64, bool as uint8):
    the rest of a segment past the steps' end is reduced in that dtype too (NumPy's reduce of
    uint8 rows gives uint64, which int64 promotes to float64: a UFuncTypeError before)."""
    lengths = [100, 70] + [4] * 998
    x = rng.integers(0, 2 if dtype == "bool" else 3, (sum(lengths), 32)).astype(dtype)
    kwargs = {} if request_dtype is None else {"dtype": request_dtype}
    got = getattr(linred, f"segmented_{reduction}")(x, lengths=lengths, **kwargs)
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[reduction]
    expected = ufunc.reduceat(x.astype(np.float64), np.r_[0, np.cumsum(lengths)[:-1]], axis=0)
    assert got.dtype == np.dtype(request_dtype or dtype)
    np.testing.assert_array_equal(got, expected.astype(request_dtype or dtype))


def test_steps_products_of_long_segments_overflow_as_one_product(clean_plan_cache):
    """A product past the steps' end is one reduce over the whole segment: its first rows'
    overflow and the rest's underflow give what the plain product gives (inf, or 0), never inf * 0."""
    offsets = np.concatenate(([0], np.arange(200, 4097, 4)))
    for first, rest, expected in ((1e10, 1e-10, np.inf), (1e-10, 1e10, 0.0)):
        z = np.ones((4096, 16), np.float32)
        z[:64, 0], z[64:200, 0] = first, rest
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = linred.segmented_prod(z, offsets=offsets)
            plain = np.multiply.reduceat(z, offsets[:-1], axis=0)
        assert got[0, 0] == plain[0, 0] == expected


def test_steps_warn_once_at_the_callers_line(clean_plan_cache):
    """inf - inf met at several steps warns once (as one reduceat would), naming this file."""
    y = np.zeros((4096, 16), np.float32)
    y[0, 0], y[1, 0] = np.inf, -np.inf
    y[4, 1], y[6, 1] = np.inf, -np.inf
    offsets = np.arange(0, 4097, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = linred.segmented_sum(y, offsets=offsets)
    assert np.isnan(result[0, 0]) and np.isnan(result[1, 1])
    assert [(w.category, w.filename) for w in caught] == [(RuntimeWarning, __file__)]
    assert "invalid value" in str(caught[0].message)


@pytest.mark.parametrize("spec", ["fixed", "lengths"])
def test_float32_worst_case_runs_stay_within_the_documented_bound(clean_plan_cache, spec):
    """docs/api.md, Accuracy: data whose roundings in a run all go one way (a 1, then values
    just under half its ulp) loses at most about (run length) * 2^-24 * S in float32, 128 * 2^-24
    for the host's runs; dtype="float64" keeps it to float64's rounding."""
    t = np.float32(0.99 * 2.0**-24)
    seg = np.full((129, 16), t, np.float32)
    seg[0] = 1
    x = np.tile(seg, (300, 1))
    kwargs = {"segment_length": 129} if spec == "fixed" else {"lengths": [129] * 300}
    exact = 1 + 128 * float(t)  # (S: every value is positive)
    got = linred.segmented_sum(x, **kwargs)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= 128 * 2.0**-24 * exact)
    wide = linred.segmented_sum(x, dtype="float64", **kwargs)
    np.testing.assert_allclose(wide, exact, rtol=1e-15)
