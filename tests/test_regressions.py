"""Regression tests at the exact calls that once came back silently wrong or leaked an internal error.

Each test names the defect it guards; the differential suite (``tests/test_differential.py``)
covers the same families over whole shape spaces.
"""

from __future__ import annotations

import itertools
import sys
import threading

import numpy as np
import pytest
from support import (
    FUNCTIONS,
    HAS_TORCH,
    REDUCTIONS,
    assert_reduction,
    expect_refusal,
    make_data,
    segment_bounds,
    to_kind,
    to_numpy,
    torch,
)

import linred

DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "int32", "int64", "uint8", "bool")


def _strided(a, kind):
    """A view of every other element of a twice longer array of ``kind``."""
    buf = np.zeros(2 * a.shape[0], dtype=a.dtype)
    buf[::2] = a
    return to_kind(buf, kind)[::2]


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L", [1, 2, 3])
def test_short_segments_with_a_ragged_last_tile(array_kind, L, dtype, reduction, layout, rng):
    """L*itemsize < 16 with m not a multiple of the tile: every 128th/256th/512th result was never
    written (warp_reduce left a segment ending exactly at a run's end to a fix-up it skipped)."""
    if array_kind == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16 dtype")
    for m in (1365, 2 * 1365 + 1, 4097):
        x = make_data(dtype, m * L, rng)
        xk = to_kind(x, array_kind) if layout == "contiguous" else _strided(x, array_kind)
        got = FUNCTIONS[reduction](xk, L)
        assert_reduction(got, reduction, x, segments=segment_bounds(m * L, L), like=xk)


def test_issue_example_every_256th_sum(array_kind):
    """The report: segmented_sum(x, 2)[[255, 511, ...]] came back 0.0."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(2 * 1365).astype(np.float32)
    got = to_numpy(linred.segmented_sum(to_kind(x, array_kind), 2))
    np.testing.assert_allclose(got, x.reshape(-1, 2).astype(np.float64).sum(1), rtol=1e-6, atol=1e-6)


def test_integer_mean_accumulates_in_float64(array_kind):
    """Six epoch-nanosecond timestamps per segment: the int64 sum overflowed (mean -1.37e18)."""
    ts = np.array([1_700_000_000_000_000_000 + 10**9 * i for i in range(12)], dtype=np.int64)
    got = to_numpy(linred.segmented_mean(to_kind(ts, array_kind), 6))
    expected = ts.reshape(2, 6).astype(np.float64).mean(1)  # NumPy's own mean accumulates in float64
    np.testing.assert_allclose(got, expected, rtol=1e-15)
    assert got.dtype == np.float64


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("shape", ["one segment", "feature rows"])
def test_one_long_float32_segment(array_kind, shape, reduction):
    """One float32 segment of 2^24 positive values: the CPU GEMV's sequential sum was 3.4e-3 off."""
    rng = np.random.default_rng(1)
    x = (1000 + rng.random(2**24)).astype(np.float32)
    if shape == "feature rows":
        x = x.reshape(-1, 4)
    got = to_numpy(FUNCTIONS[reduction](to_kind(x, array_kind), x.shape[0])).astype(np.float64)
    ref = x.astype(np.float64).sum(0) / (x.shape[0] if reduction == "mean" else 1)
    assert np.max(np.abs(got - ref) / np.abs(ref)) <= 1e-6


def test_out_overlapping_x(array_kind):
    """out=x[:3] was overwritten while x was still being read: [nan, nan, 8.5] for [2.5, nan, 8.5]."""
    x = to_kind(np.arange(1, 13, dtype=np.float64), array_kind)
    got = linred.segmented_mean(x, offsets=[0, 4, 4, 12], out=x[:3])
    np.testing.assert_array_equal(to_numpy(got), [2.5, np.nan, 8.5])
    x = to_kind(np.arange(1, 13, dtype=np.float32), array_kind)
    got = linred.segmented_sum(x, 4, out=x[1:4])  # the fixed-length (fast) path too, twice
    np.testing.assert_array_equal(to_numpy(got), [10, 26, 42])
    x = to_kind(np.arange(1, 13, dtype=np.float32), array_kind)
    linred.segmented_sum(x, 4, out=x[1:4])
    np.testing.assert_array_equal(to_numpy(x)[:5], [1, 10, 26, 42, 5])


def test_out_overlapping_the_inputs_of_a_cached_call(array_kind):
    """A repeated call (its plan cached) tells from the pointers whether out overlaps x or the
    offsets: out at either end of x, inside the offsets' memory, and apart from both."""
    values = np.arange(1, 13, dtype=np.float64)
    offsets = np.array([0, 4, 4, 12])
    want = [2.5, np.nan, 8.5]
    for _ in range(2):  # planned, then cached
        got = linred.segmented_mean(to_kind(values, array_kind), offsets=to_kind(offsets, array_kind))
        np.testing.assert_array_equal(to_numpy(got), want)
    for where in ("start", "end", "offsets", "apart"):
        x = to_kind(values, array_kind)
        off = to_kind(offsets, array_kind)
        if where == "offsets":  # the offsets' bytes, read as float64
            torch = sys.modules.get("torch")
            out = (off.view(torch.float64) if type(off).__module__.startswith("torch") else off.view("float64"))[:3]
        else:
            out = {"start": x[:3], "end": x[9:], "apart": to_kind(np.zeros(3), array_kind)}[where]
        got = linred.segmented_mean(x, offsets=off, out=out)
        assert got is out
        np.testing.assert_array_equal(to_numpy(got), want, err_msg=where)


def test_out_overlapping_x_from_threads():
    """Wrong in 19 of 30 trials with threads."""
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            x = rng.standard_normal(4096)
            ref = x.reshape(-1, 16).mean(1)
            got = linred.segmented_mean(x, offsets=np.arange(0, 4097, 16), out=x[100 : 100 + 256])
            if not np.allclose(got, ref):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: np.ma.array(np.arange(12.0), mask=np.arange(12) > 5), "masked array"),
        (lambda: np.matrix(np.arange(12.0)), "numpy.matrix"),
    ],
    ids=["masked", "matrix"],
)
def test_refused_numpy_kinds_name_x(make, match):
    with pytest.raises(TypeError, match=rf"^x .*{match}"):
        linred.segmented_sum(make(), 4)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_sparse_tensor_is_refused_naming_x():
    with pytest.raises(TypeError, match=r"^x is a torch tensor of layout torch.sparse_coo"):
        linred.segmented_sum(torch.arange(12.0).to_sparse(), 4)


def test_masked_out_is_refused():
    with pytest.raises(TypeError, match=r"^out is a NumPy masked array"):
        linred.segmented_sum(np.arange(12.0), 4, out=np.ma.zeros(3))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"offsets": [0, 2**63 - 1, -2, 12]}, r"offsets must be non-decreasing: offsets\[2\]=-2 < offsets\[1\]="),
        ({"offsets": np.array([0, 2**31 - 1, -2, 12], np.int32)}, r"offsets must be non-decreasing"),
        ({"lengths": [2**63 - 1, 2**63 - 1, 14]}, r"lengths must sum to .* exceeds the int64 range"),
        ({"lengths": [2**62, 2**62, 2**62, 2**62, 12]}, r"lengths must sum to .* exceeds the int64 range"),
        ({"offsets": np.array([0, 2**64 - 1, 12], np.uint64)}, r"offsets must fit in int64"),
    ],
    ids=["int64 wrap", "int32 wrap", "lengths wrap", "lengths wrap to n", "uint64"],
)
def test_offsets_that_wrap_are_refused(array_kind, kwargs, match):
    if array_kind != "numpy" and np.asarray(next(iter(kwargs.values()))).dtype == np.uint64:
        pytest.skip("the uint64 range check is the NumPy adapter's (device offsets fail the order check)")
    kwargs = {k: to_kind(np.asarray(v), array_kind) if array_kind != "numpy" else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        linred.segmented_sum(to_kind(np.arange(12.0), array_kind), **kwargs)


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint64", "int16"])
def test_the_host_summary_of_offsets_is_the_comparisons(dtype):
    """The NumPy adapter's summary of offsets (first, last, the first decrease, the shortest and
    longest segment) takes the differences where they cannot have wrapped around and compares the
    offsets otherwise: the same summary as comparing them, on random offsets, decreasing ones and
    offsets near the dtype's limits whose differences wrap."""
    from linred.arrays._numpy import NUMPY

    def compared(c: np.ndarray) -> tuple[int, int, int, int, int]:
        first, last = int(c[0]), int(c[-1])
        if c.shape[0] < 2:
            return first, last, -1, 0, 0
        down = c[1:] < c[:-1]
        if down.any():
            return first, last, int(np.argmax(down)), 0, 0
        steps = [int(b) - int(a) for a, b in itertools.pairwise(c.tolist())]
        return first, last, -1, min(steps), max(steps)

    info = np.iinfo(dtype)
    rng = np.random.default_rng(len(dtype))
    top, bottom = int(info.max), int(info.min)
    fixed = [[0], [0, 3, 3, 7], [0, 5, 3, 7], [5, 7, 9], [0, top, bottom, 0], [0, top // 2, top, bottom, 4]]
    fixed += [[0, top // 4, top // 2, bottom // 2 if bottom else 1, 0, 9]]
    cases = [np.array(values, dtype) for values in fixed]
    for _ in range(300):
        scale = int(rng.choice([10, 1000, int(info.max) // 3]))
        values = [0]
        for _ in range(int(rng.integers(0, 11))):  # (steps up to a third of the range: some wrap)
            values.append(min(int(info.max), values[-1] + int(rng.random() * scale)))
        if rng.random() < 0.4 and len(values) > 1:  # (a decrease somewhere)
            i = int(rng.integers(1, len(values)))
            values[i] = max(int(info.min), values[i - 1] - 1)
        cases.append(np.array(values, dtype))
    for c in cases:
        assert NUMPY.offsets_summary(c) == compared(c), c


@pytest.mark.parametrize(
    "kind", ["numpy", pytest.param("torch", marks=pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch"))]
)
@pytest.mark.parametrize(
    "kwargs", [{"offsets": [0, 2**64, 12]}, {"lengths": [2**65, 1]}, {"offsets": [0, -(2**64), 12]}], ids=str
)
def test_integers_beyond_int64_in_a_list_are_out_of_range(kind, kwargs):
    """A list holding integers beyond int64 and uint64 (NumPy keeps them as objects) is refused
    as out of range (ValueError, as a uint64 array's values beyond int64 are), not as a list of
    the wrong type (TypeError before)."""
    x = np.arange(12.0) if kind == "numpy" else to_kind(np.arange(12.0), "torch-cpu")
    with pytest.raises(ValueError, match=r"(offsets|lengths) must fit in int64; got -?\d+"):
        linred.segmented_sum(x, **kwargs)
    with pytest.raises(TypeError, match=r"offsets must be an array of integers; got dtype"):
        linred.segmented_sum(x, offsets=[0, "6", 12])


@pytest.mark.parametrize(
    "kind", ["numpy", pytest.param("torch", marks=pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch"))]
)
def test_object_arrays_of_small_integers_are_taken_as_lists(kind):
    """An object array of Python integers that fit in int64 is taken as the list it holds (it was
    refused as not fitting in int64, naming a value that fits); one beyond int64 is refused."""
    x = np.arange(12.0) if kind == "numpy" else to_kind(np.arange(12.0), "torch-cpu")
    for kwargs in ({"offsets": np.array([0, 5, 12], dtype=object)}, {"lengths": np.array([5, 7], dtype=object)},
                   {"segment_ids": np.array([0] * 5 + [1] * 7, dtype=object)}):  # fmt: skip
        np.testing.assert_array_equal(np.asarray(linred.segmented_sum(x, **kwargs)), [10.0, 56.0])
    with pytest.raises(ValueError, match=r"offsets must fit in int64; got 1180591620717411303424"):
        linred.segmented_sum(x, offsets=np.array([0, 5, 2**70], dtype=object))
    with pytest.raises(ValueError, match=r"offsets must fit in int64; got 9223372036854775808"):
        linred.segmented_sum(x, offsets=np.array([0, -(2**63), 2**63, 12], dtype=object))  # (|-2**63| ties 2**63)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("name", ["sum", "max", "argmax", "var", "softmax", "plan"])
@pytest.mark.parametrize("order", [">i8", ">i4", ">u2"])
def test_byte_swapped_index_arrays_with_tensors(name, order):
    """Big-endian NumPy offsets, lengths and ids with a tensor's data: the functions that convert
    them with ``torch.as_tensor`` (argmax, var, softmax, plans, ids) raised TypeError ("byte order
    different from the native byte order") where sum and max took them."""
    x_np = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
    x = to_kind(x_np, "torch-cpu")
    specs = {
        "offsets": np.array([0, 2, 6], dtype=order),
        "lengths": np.array([2, 4], dtype=order),
        "segment_ids": np.array([0, 0, 1, 1, 1, 1], dtype=order),
    }
    for key, value in specs.items():
        if name == "plan" and key == "segment_ids":
            continue  # (a plan takes offsets, lengths or a fixed length)
        if name == "plan":
            got = linred.SegmentedReduction(x, **{key: value})(x)
            expected = [4.0, 19.0]
        else:
            got = getattr(linred, f"segmented_{name}")(x, **{key: value})
            expected = {
                "sum": [4.0, 19.0],
                "max": [3.0, 9.0],
                "argmax": [0, 5],
                "var": [np.var(x_np[:2]), np.var(x_np[2:])],
                "softmax": np.concatenate([np.exp(x_np[:2]) / np.exp(x_np[:2]).sum(),
                                           np.exp(x_np[2:]) / np.exp(x_np[2:]).sum()]),
            }[name]  # fmt: skip
        np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-12)


def _unusual_layout(layout: str) -> np.ndarray:
    """``np.arange(1, 13)`` as float32: big-endian, a field of a structured array (5-byte strides)
    or at an odd address."""
    if layout == "big-endian":
        return np.arange(1, 13, dtype=">f4")
    if layout == "field":
        rec = np.zeros(12, dtype=[("a", "i1"), ("b", "<f4")])
        rec["b"] = np.arange(1, 13)
        return rec["b"]
    raw = np.zeros(49, np.uint8)
    unaligned = raw[1:].view(np.float32)
    unaligned[:] = np.arange(1, 13)
    return unaligned


@pytest.mark.parametrize("layout", ["big-endian", "field", "unaligned"])
@pytest.mark.parametrize("backend", ["auto", "numpy", "nvmath"])
def test_unusual_numpy_layouts(backend, layout):
    """nvmath read a big-endian array as native bytes ([1.15e-40, ...]) and a 5-byte-stride field
    as contiguous; now it refuses them (it reads raw pointers: a declared refusal, a skip here),
    and numpy and auto serve them."""
    if backend == "nvmath" and linred.available_backends()["nvmath"] is not True:
        pytest.skip("nvmath is not available")
    expected = [10.0, 26.0, 42.0]
    x = _unusual_layout(layout)
    try:
        got = linred.segmented_sum(x, 4, backend=backend)
    except linred.BackendError as e:
        assert backend == "nvmath" and "raw pointers" in e.reason
        expect_refusal(e, "nvmath", "byte-swapped, unaligned or structured-field views")
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("backend", ["auto", "numpy", "nvmath"])
def test_byteswapped_out(backend):
    """nvmath wrote native bytes into a byte-swapped out (4.6e-320)."""
    if backend == "nvmath" and linred.available_backends()["nvmath"] is not True:
        pytest.skip("nvmath is not available")
    expected = [10.0, 26.0, 42.0]
    out = np.zeros(3, dtype=">f4")
    assert linred.segmented_sum(np.arange(1, 13, dtype=np.float32), 4, out=out, backend=backend) is out
    np.testing.assert_array_equal(out, expected)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_compile_runs_linred_eagerly(device):
    """torch.compile(lambda t: linred.segmented_sum(t, 64)) raised AttributeError on CUDA."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch._dynamo.reset()
    x = torch.randn(4096, device=device)
    f = torch.compile(lambda t: linred.segmented_sum(t, 64) * 2 + 1)
    g = torch.compile(lambda t, o: linred.segmented_mean(t, offsets=o).sum())
    for _ in range(2):
        np.testing.assert_allclose(to_numpy(f(x)), to_numpy(linred.segmented_sum(x, 64) * 2 + 1), rtol=1e-6)
    off = torch.tensor([0, 100, 4096], device=device)
    np.testing.assert_allclose(float(g(x, off)), float(linred.segmented_mean(x, offsets=off).sum()), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint64", "bool"])
@pytest.mark.parametrize("L", [4, 16, 200])
@pytest.mark.parametrize("use_out", [False, True])
def test_integer_means_of_batch_rows_converted_in_blocks(dtype, L, use_out):
    """Integer means along axis 1 of (3, n) data large enough to be converted to float64 a block
    of rows at a time came out as uninitialized memory: each block's product with ones wrote into
    a reshape of a slice of the results, which was a copy (and was dropped)."""
    from linred.backends.numpy import BLOCK_ELEMENTS

    m = 2 * (BLOCK_ELEMENTS // L) + 3  # more segments than two blocks of rows
    rng = np.random.default_rng(L)
    x = rng.integers(0, 2 if dtype == "bool" else 100, (3, m * L)).astype(dtype)
    want = x.astype(np.float64).reshape(3, m, L).mean(axis=2)
    out = np.full((3, m), np.nan) if use_out else None
    got = linred.segmented_mean(x, L, axis=1, out=out, backend="numpy")
    np.testing.assert_allclose(got, want, rtol=1e-12)
    if use_out:
        assert got is out
