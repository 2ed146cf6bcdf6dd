"""segmented_logsumexp, segmented_softmax, segmented_log_softmax, segmented_var and segmented_std.

Every result is compared with :func:`reference`, a float64 (complex128) loop over each segment's
values in plain Python (``math.fsum``: exactly rounded sums), written without linred's code:
every function, every segment specification (fixed length, its remainder dropped or kept,
offsets, lengths, with empty and length-1 segments), the axis of 1-D, 2-D (either axis) and
non-contiguous 3-D data, and float32, float64, float16, int64 (and complex128 for var and std)
data holding an all -inf segment, a NaN and a +inf.  PyTorch: tensors in, tensors out,
``gradcheck`` and ``gradgradcheck`` in float64; JAX on the CPU; CUDA tensors and CuPy arrays in
the tests marked ``gpu``.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from typing import Any

import numpy as np
import pytest
from support import HAS_CUPY_GPU, HAS_TORCH, HAS_TORCH_CUDA, to_numpy
from support.arrays import FakeDeviceAdapter
from support.dtypes import ml_dtypes

import linred
from linred import _pieces, _softmax_kernel
from linred.arrays import _device_checks

if HAS_TORCH:
    import torch

if HAS_CUPY_GPU:
    import cupy

SOFTMAX_FAMILY = ("logsumexp", "softmax", "log_softmax")
VARIANCE = ("var", "std")
FUNCTIONS = (*SOFTMAX_FAMILY, *VARIANCE)
PER_ELEMENT = ("softmax", "log_softmax")

N = 12


def _ranges(*bounds: tuple[int, int]) -> list[list[int]]:
    return [list(range(start, stop)) for start, stop in bounds]


def _by_ids(ids: list[int], m: int) -> list[list[int]]:
    return [[j for j, i in enumerate(ids) if i == k] for k in range(m)]


SORTED_IDS = [0, 0, 0, 2, 2, 2, 2, 3, 4, 4, 4, 4]  # segment 1 empty, and 5 (num_segments=6)
UNSORTED_IDS = [2, 0, 1, 2, 0, 3, 3, 1, 0, 2, 3, 1]

#: name -> (keyword arguments, the elements of each segment (indices along the axis), elements covered)
SPECS: dict[str, tuple[dict[str, Any], list[list[int]], int]] = {
    "fixed": ({"segment_length": 3}, _ranges((0, 3), (3, 6), (6, 9), (9, 12)), 12),
    "drop": ({"segment_length": 5, "remainder": "drop"}, _ranges((0, 5), (5, 10)), 10),
    "keep": ({"segment_length": 5, "remainder": "keep"}, _ranges((0, 5), (5, 10), (10, 12)), 12),
    "offsets": ({"offsets": [0, 3, 3, 7, 8, 12]}, _ranges((0, 3), (3, 3), (3, 7), (7, 8), (8, 12)), 12),
    "offsets32": ({"offsets": np.array([0, 4, 12], dtype=np.int32)}, _ranges((0, 4), (4, 12)), 12),
    "lengths": ({"lengths": [2, 0, 4, 1, 5]}, _ranges((0, 2), (2, 2), (2, 6), (6, 7), (7, 12)), 12),
    "ids": ({"segment_ids": SORTED_IDS, "num_segments": 6}, _by_ids(SORTED_IDS, 6), 12),
    "ids_unsorted": ({"segment_ids": UNSORTED_IDS}, _by_ids(UNSORTED_IDS, 4), 12),
}

#: name -> (shape with N along the axis, axis); "middle" is a non-contiguous (transposed) view
LAYOUTS = {"1d": ((N,), 0), "2d": ((N, 3), 0), "last": ((2, N), -1), "middle": ((2, N, 3), 1)}

TOLERANCE = {"float64": 1e-12, "int64": 1e-12, "complex128": 1e-12, "float32": 1e-5, "float16": 1e-2}
RESULT_DTYPE = {"float64": "float64", "int64": "float64", "complex128": "float64", "float32": "float32",
                "float16": "float16"}  # fmt: skip


# --- the reference: one segment at a time, in Python floats ---


def _lse(v: list) -> float:
    if any(math.isnan(t) for t in v):
        return math.nan
    mx = max(v, default=-math.inf)
    if math.isinf(mx):
        return mx
    return mx + math.log(math.fsum(math.exp(t - mx) for t in v))


def _softmax(v: list, log: bool) -> list:
    mx = max(v, default=-math.inf)
    if any(math.isnan(t) for t in v) or mx in (math.inf, -math.inf):  # as torch.softmax
        return [math.nan] * len(v)
    s = math.fsum(math.exp(t - mx) for t in v)
    return [t - mx - math.log(s) for t in v] if log else [math.exp(t - mx) / s for t in v]


def _var(v: list, ddof: float) -> float:
    k = len(v)
    if k <= ddof or any(not math.isfinite(abs(t)) for t in v):  # (an infinity: inf - inf)
        return math.nan
    mean = complex(math.fsum(t.real for t in v), math.fsum(t.imag for t in v)) / k
    return math.fsum(abs(t - mean) ** 2 for t in v) / (k - ddof)


def reference(name: str, x: np.ndarray, groups: list[list[int]], axis: int, ddof: float = 0) -> np.ndarray:
    """``segmented_<name>`` of NumPy ``x``, in float64, segment by segment and column by column
    (``groups``: the indices along ``axis`` of each segment's elements)."""
    complex_ = x.dtype.kind == "c"
    xm = np.moveaxis(x.astype(np.complex128 if complex_ else np.float64), axis, 0)
    rest = xm.shape[1:]
    cols = xm.reshape(xm.shape[0], -1)
    convert = complex if complex_ else float
    per_element = name in PER_ELEMENT
    out = np.full((cols.shape[0] if per_element else len(groups), cols.shape[1]), np.nan)
    for j in range(cols.shape[1]):
        for i, members in enumerate(groups):
            v = [convert(cols[k, j]) for k in members]
            if name == "logsumexp":
                out[i, j] = _lse(v)
            elif per_element:
                out[members, j] = _softmax(v, name == "log_softmax")
            else:
                var = _var(v, ddof)
                out[i, j] = math.sqrt(var) if name == "std" else var
    return np.moveaxis(out.reshape(out.shape[0], *rest), 0, axis)


def fn(name: str):
    return getattr(linred, f"segmented_{name}")


def make(layout: str, dtype: str, groups: list[list[int]], special: bool, seed: int = 0) -> np.ndarray:
    """Data of ``layout`` and ``dtype``; with ``special``, in column 0: segment 0 all -inf, a NaN
    in the last segment that has elements, a +inf in the third (where it has elements)."""
    shape, axis = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    if dtype == "int64":
        x = rng.integers(-40, 40, size=shape)
    elif dtype == "complex128":
        x = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    else:
        x = (rng.normal(size=shape) * 3).astype(dtype)
    if layout == "middle":  # non-contiguous: the transposed view of another array
        x = np.ascontiguousarray(np.swapaxes(x, 1, 2)).swapaxes(1, 2)
        assert not x.flags.c_contiguous
    if special:
        xm = np.moveaxis(x, axis, 0)  # a view: writes reach x
        column = (0,) * (xm.ndim - 1)
        xm[(groups[0], *column)] = -np.inf
        xm[([g for g in groups if g][-1][0], *column)] = np.nan
        if len(groups) > 2 and groups[2]:
            xm[(groups[2][0], *column)] = np.inf
    return x


def check(got: Any, expected: np.ndarray, dtype: str, tol: float) -> None:
    got = to_numpy(got)
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    got = got.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0)))
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * scale, equal_nan=True)


def _cases() -> list:
    cases = []
    for name in FUNCTIONS:
        dtypes = ["float32", "float64", "float16", "int64"] + (["complex128"] if name in VARIANCE else [])
        for dtype in dtypes:
            for spec in SPECS:
                for layout in LAYOUTS:
                    cases.append(pytest.param(name, spec, layout, dtype, id=f"{name}-{spec}-{layout}-{dtype}"))
    return cases


@pytest.mark.parametrize("name, spec, layout, dtype", _cases())
def test_against_reference(name, spec, layout, dtype):
    kwargs, groups, covered = SPECS[spec]
    _, axis = LAYOUTS[layout]
    x = make(layout, dtype, groups, special=dtype in ("float32", "float64", "float16"))
    before = x.copy()
    got = fn(name)(x, axis=axis, **kwargs)
    kept = np.moveaxis(np.moveaxis(x, axis, 0)[:covered], 0, axis)
    check(got, reference(name, kept, groups, axis), RESULT_DTYPE[dtype], TOLERANCE[dtype])
    np.testing.assert_array_equal(x, before)  # never modified


@pytest.mark.parametrize("name", VARIANCE)
@pytest.mark.parametrize("ddof", [1, 2, 0.5])
@pytest.mark.parametrize("spec", ["fixed", "offsets", "lengths", "keep", "ids_unsorted"])
def test_ddof(name, ddof, spec):
    """Segments of length <= ddof (empty, length 1 and 2 here) give NaN."""
    kwargs, groups, _ = SPECS[spec]
    x = make("2d", "float64", groups, special=False)
    check(fn(name)(x, ddof=ddof, **kwargs), reference(name, x, groups, 0, ddof), "float64", 1e-12)
    if spec == "fixed" and ddof >= 1:  # L = 3 <= ddof: every segment
        assert np.isnan(fn(name)(x, ddof=3, **kwargs)).all()


def test_special_segments_match_torch():
    """All -inf, +inf and NaN segments, and -inf beside finite values, give what torch gives."""
    torch = pytest.importorskip("torch")
    inf, nan = math.inf, math.nan
    rows = [[-inf, -inf], [inf, 1.0], [inf, inf], [nan, 1.0], [1.0, -inf], [-inf, 2.0, 3.0]]
    x = np.array([t for row in rows for t in row])
    lengths = [len(row) for row in rows]
    soft = linred.segmented_softmax(x, lengths=lengths)
    log_soft = linred.segmented_log_softmax(x, lengths=lengths)
    lse = linred.segmented_logsumexp(x, lengths=lengths)
    start = 0
    for i, row in enumerate(rows):
        t = torch.tensor(row, dtype=torch.float64)
        stop = start + len(row)
        # (assert_allclose: NaN where torch has NaN, infinities equal, finite values within rounding)
        np.testing.assert_allclose(soft[start:stop], torch.softmax(t, 0).numpy(), rtol=1e-15)
        np.testing.assert_allclose(log_soft[start:stop], torch.log_softmax(t, 0).numpy(), rtol=1e-15)
        np.testing.assert_allclose(lse[i], torch.logsumexp(t, 0).numpy(), rtol=1e-15)
        start = stop


def test_empty_segments_and_empty_data():
    x = np.array([1.0, 2.0])
    np.testing.assert_array_equal(linred.segmented_logsumexp(x, lengths=[0, 2, 0])[[0, 2]], [-np.inf, -np.inf])
    assert np.isnan(linred.segmented_var(x, lengths=[0, 2])[0])
    empty = np.zeros((0, 2))
    assert linred.segmented_softmax(empty, offsets=[0]).shape == (0, 2)
    assert linred.segmented_logsumexp(empty, 4).shape == (0, 2)
    assert linred.segmented_var(empty, lengths=[0, 0]).shape == (2, 2)
    assert np.isnan(linred.segmented_var(empty, lengths=[0, 0])).all()
    assert linred.segmented_log_softmax(empty, lengths=[0]).shape == (0, 2)


def test_stability():
    """No overflow in exp; no cancellation in the variance."""
    big = np.array([1000.0, 1000.0, -1000.0, -1000.0], dtype=np.float32)
    np.testing.assert_allclose(linred.segmented_logsumexp(big, 2), [1000 + math.log(2), -1000 + math.log(2)])
    np.testing.assert_allclose(linred.segmented_softmax(big, 2), [0.5] * 4)
    tiny = np.array([0.0, -800.0])  # exp(-800) underflows to 0; its log-softmax does not
    np.testing.assert_allclose(linred.segmented_log_softmax(tiny, 2), [0.0, -800.0], rtol=1e-15)
    offset = 1e9 + np.array([1.0, 2.0, 3.0, 4.0])  # E[x^2] - E[x]^2 would give garbage here
    np.testing.assert_allclose(linred.segmented_var(offset, 4), [1.25], rtol=1e-12)
    near = np.float32(1e4) + np.array([1, 2, 3, 4], dtype=np.float32)  # exact in float32; x^2 is not
    np.testing.assert_allclose(linred.segmented_std(near, 4), [math.sqrt(1.25)], rtol=1e-6)


def test_dtypes():
    x = np.arange(8, dtype=np.float64)
    assert linred.segmented_softmax(x, 4, dtype=np.float32).dtype == np.float32
    assert linred.segmented_var(x, 4, dtype="float16").dtype == np.float16
    assert linred.segmented_std(x.astype(np.int8), 4).dtype == np.float64
    assert linred.segmented_logsumexp(x.astype(bool), 4).dtype == np.float64
    assert linred.segmented_var(x.astype(np.complex64), 4).dtype == np.float32
    np.testing.assert_allclose(linred.segmented_var(x.astype(np.complex64), 4, dtype=np.float64), [1.25, 1.25])
    if ml_dtypes is not None:
        b = x.astype(ml_dtypes.bfloat16)
        got = linred.segmented_softmax(b, 4)
        assert got.dtype == b.dtype
        expected = reference("softmax", x, _ranges((0, 4), (4, 8)), 0)
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-2)


def test_errors():
    z = np.ones(4, dtype=np.complex128)
    for name in SOFTMAX_FAMILY:
        with pytest.raises(TypeError, match=f"segmented_{name} does not support complex"):
            fn(name)(z, 2)
        with pytest.raises(TypeError, match=f"segmented_{name} returns a real floating dtype"):
            fn(name)(np.ones(4), 2, dtype=np.int32)
    for name in VARIANCE:
        with pytest.raises(ValueError, match="ddof must be >= 0"):
            fn(name)(np.ones(4), 2, ddof=-1)
        with pytest.raises(TypeError, match="ddof must be a real number"):
            fn(name)(np.ones(4), 2, ddof="1")
        with pytest.raises(TypeError, match="real floating dtype"):
            fn(name)(z, 2, dtype=np.complex128)
    with pytest.raises(TypeError, match="exactly one of"):
        linred.segmented_softmax(np.ones(4))
    with pytest.raises(ValueError, match=r"offsets\[-1\] must equal"):
        linred.segmented_var(np.ones(4), offsets=[0, 2, 3])
    with pytest.raises(ValueError, match="does not divide"):
        linred.segmented_logsumexp(np.ones(5), 2)
    with pytest.raises(ValueError, match="at least one dimension"):
        linred.segmented_std(np.float64(1.0), 1)
    with pytest.raises(TypeError, match="unsupported dtype"):
        linred.segmented_var(np.array(["a", "b"]), 1)


def test_check_false_gives_the_same():
    x = make("2d", "float64", SPECS["offsets"][1], special=True)
    for name in FUNCTIONS:
        a = fn(name)(x, offsets=[0, 3, 3, 7, 8, 12])
        b = fn(name)(x, offsets=[0, 3, 3, 7, 8, 12], check=False)
        np.testing.assert_array_equal(a, b)


def test_segment_ids():
    """Ids, sorted or not, name the segments; the ids are each element's segment (no sort needed to
    broadcast back); check=False with ids promised sorted gives the same."""
    x = make("2d", "float64", SPECS["ids_unsorted"][1], special=False)
    for name in FUNCTIONS:
        got = fn(name)(x, segment_ids=np.array(UNSORTED_IDS, dtype=np.int32), num_segments=5)
        check(got, reference(name, x, [*SPECS["ids_unsorted"][1], []], 0), "float64", 1e-12)
        sorted_ = fn(name)(x, segment_ids=SORTED_IDS, num_segments=6, ids_sorted=True, check=False)
        check(sorted_, reference(name, x, SPECS["ids"][1], 0), "float64", 1e-12)
    with pytest.raises(ValueError, match="segment_ids must lie in"):
        linred.segmented_softmax(x, segment_ids=UNSORTED_IDS, num_segments=3)
    with pytest.raises(TypeError, match="remainder= applies to segment_length only"):
        linred.segmented_var(x, segment_ids=UNSORTED_IDS, remainder="drop")


@pytest.mark.parametrize(
    "kind", ["numpy", pytest.param("torch", marks=pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch"))]
)
def test_a_wrong_ids_sorted_promise_is_read_through_when_checked(kind):
    """ids_sorted=True on ids that are not sorted, with check=True: the ids are read (as the plain
    reductions read them), so the composition's later, unchecked reductions do not take the wrong
    promise on trust (torch tensors gave a softmax value above 1)."""
    x = make("2d", "float64", SPECS["ids_unsorted"][1], special=False)
    xs = x if kind == "numpy" else torch.from_numpy(x)
    for name in FUNCTIONS:
        got = fn(name)(xs, segment_ids=UNSORTED_IDS, ids_sorted=True)
        check(np.asarray(got), reference(name, x, SPECS["ids_unsorted"][1], 0), "float64", 1e-12)


# --- PyTorch ---

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")


def _torch_kwargs(kwargs: dict, device: str) -> dict:
    arrays = ("offsets", "lengths", "segment_ids")
    return {k: torch.as_tensor(v, device=device) if k in arrays else v for k, v in kwargs.items()}


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", ["fixed", "keep", "offsets", "lengths", "ids", "ids_unsorted"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_cpu(name, spec, dtype):
    kwargs, groups, _ = SPECS[spec]
    x = make("last", dtype, groups, special=True)
    got = fn(name)(torch.from_numpy(x), axis=-1, **_torch_kwargs(kwargs, "cpu"))
    assert isinstance(got, torch.Tensor) and got.device.type == "cpu"
    check(got, reference(name, x, groups, -1), dtype, TOLERANCE[dtype])


@needs_torch
def test_torch_bfloat16_and_half():
    x = torch.linspace(-3, 3, 12).reshape(3, 4)
    for dt in (torch.bfloat16, torch.float16):
        got = linred.segmented_softmax(x.to(dt), 2, axis=1)
        assert got.dtype == dt
        np.testing.assert_allclose(got.float().numpy(), torch.softmax(x.reshape(3, 2, 2), 2).reshape(3, 4), rtol=2e-2)
        assert linred.segmented_std(x.to(dt), lengths=[1, 2], axis=0).dtype == dt


#: (segment keywords, axis, shape) of the gradient checks: offsets with an empty segment and fixed lengths
GRAD_SPECS = [
    pytest.param({"offsets": [0, 2, 2, 5, 7]}, 0, (7, 2), id="offsets"),
    pytest.param({"segment_length": 3}, 1, (2, 6), id="fixed"),
    pytest.param({"lengths": [2, 3, 2]}, 1, (1, 7, 2), id="lengths"),
    pytest.param({"segment_ids": [1, 0, 2, 1, 0, 2, 1]}, 0, (7, 2), id="ids"),
]


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("kwargs, axis, shape", GRAD_SPECS)
def test_gradcheck(name, kwargs, axis, shape):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
    kw = _torch_kwargs(kwargs, "cpu")
    if (
        name in ("logsumexp", "var", "std") and "offsets" in kw
    ):  # an empty segment's -inf or NaN has no finite difference
        kw["offsets"] = torch.tensor([0, 2, 5, 7])
    assert torch.autograd.gradcheck(lambda a: fn(name)(a, axis=axis, **kw), (x,))
    if name in ("softmax", "var") and "offsets" in kw:  # double backward: linred's sum and mean, elementwise ops
        assert torch.autograd.gradgradcheck(lambda a: fn(name)(a, axis=axis, **kw), (x,))


@needs_torch
def test_gradients_match_torch():
    """Against torch's own softmax and log_softmax of the rows of an (m, L) view."""
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 6, dtype=torch.float64)
    for ours, theirs in ((linred.segmented_softmax, torch.softmax), (linred.segmented_log_softmax, torch.log_softmax)):
        (g1,) = torch.autograd.grad((ours(x.reshape(-1), 6) * w.reshape(-1)).sum(), x)
        (g2,) = torch.autograd.grad((theirs(x, 1) * w).sum(), x)
        torch.testing.assert_close(g1, g2)
    (g1,) = torch.autograd.grad(linred.segmented_logsumexp(x, offsets=[0, 1, 4], axis=0).sum(), x)
    (g2,) = torch.autograd.grad(torch.logsumexp(x[:1], 0).sum() + torch.logsumexp(x[1:], 0).sum(), x)
    torch.testing.assert_close(g1, g2)
    (g1,) = torch.autograd.grad(linred.segmented_std(x, 3, axis=1, ddof=1).sum(), x)
    (g2,) = torch.autograd.grad(x.reshape(4, 2, 3).std(2, correction=1).sum(), x)
    torch.testing.assert_close(g1, g2)


# --- JAX (CPU) ---


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", ["fixed", "keep", "jax offsets", "jax ids"])
def test_jax_in_jax_out(name, spec):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    key = {"jax offsets": "offsets", "jax ids": "ids_unsorted"}.get(spec, spec)
    kwargs, groups, _ = SPECS[key]
    if spec.startswith("jax"):  # the segment arrays are JAX arrays too
        kwargs = {k: jnp.asarray(v) for k, v in kwargs.items()}
    x = make("2d", "float32", groups, special=False)
    got = fn(name)(jnp.asarray(x), **kwargs)
    assert isinstance(got, jax.Array)
    check(np.asarray(got), reference(name, x, groups, 0), "float32", 1e-5)
    if name == "var":
        np.testing.assert_allclose(np.asarray(fn(name)(jnp.asarray(x), ddof=1, **kwargs)),
                                   reference(name, x, groups, 0, ddof=1), rtol=1e-5, atol=1e-5)  # fmt: skip


# --- CUDA tensors and CuPy arrays ---

GPU_KINDS = [
    pytest.param("torch-cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")]),
    pytest.param("cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy")]),
]


def _on_gpu(a: np.ndarray, kind: str) -> Any:
    return torch.as_tensor(a, device="cuda") if kind == "torch-cuda" else cupy.asarray(a)


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", ["fixed", "keep", "offsets", "lengths", "ids_unsorted"])
@pytest.mark.parametrize("layout", ["2d", "middle"])
def test_gpu(kind, name, spec, layout):
    kwargs, groups, _ = SPECS[spec]
    _, axis = LAYOUTS[layout]
    x = make(layout, "float32", groups, special=True)
    arrays = ("offsets", "lengths", "segment_ids")
    segs = {k: _on_gpu(np.asarray(v), kind) if k in arrays else v for k, v in kwargs.items()}
    got = fn(name)(_on_gpu(x, kind), axis=axis, **segs)
    assert type(got).__module__.split(".")[0] == ("torch" if kind == "torch-cuda" else "cupy")
    check(got, reference(name, x, groups, axis), "float32", 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
def test_gpu_torch_autograd_and_stream(name):
    kw = {"offsets": torch.tensor([0, 2, 5, 7], device="cuda")}
    x = torch.randn(7, 3, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: fn(name)(a, **kw), (x,))
    stream = torch.cuda.Stream()
    with torch.no_grad():
        expected = fn(name)(x, **kw)
        stream.wait_stream(torch.cuda.current_stream())
        got = fn(name)(x, stream=stream, **kw)
    stream.synchronize()
    torch.testing.assert_close(got, expected, equal_nan=True)


def test_std_gradient_of_a_zero_variance_segment_is_zero():
    """As torch.std's: sqrt's infinite slope at 0 must not turn the gradient into NaN."""
    torch = pytest.importorskip("torch")
    c = torch.tensor([1.0, 1.0, 1.0, 2.0, 5.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(linred.segmented_std(c, lengths=[2, 2, 1]).sum(), c)
    torch.testing.assert_close(g, torch.tensor([0.0, 0.0, -0.5, 0.5, 0.0], dtype=torch.float64))


def _reference_backward(name: str, x: Any, g: Any, bounds: np.ndarray, ddof: float, batch: bool,
                        shape: tuple[int, ...]) -> np.ndarray:  # fmt: skip
    """:func:`_reference_gradient` of tensors ``x`` (the values as rounded to their dtype) and
    ``g``: one row, or with ``batch`` each row of the first axis; a column where a row is 1-D;
    shaped ``shape``."""
    xs, gs = x.detach().double().cpu().numpy(), g.double().cpu().numpy()
    rows = list(zip(xs, gs, strict=True)) if batch else [(xs, gs)]

    def column(a: np.ndarray) -> np.ndarray:
        return a if a.ndim == 2 else a.reshape(-1, 1)

    parts = [_reference_gradient(name, column(a), bounds.tolist(), column(b), ddof) for a, b in rows]
    return np.stack(parts).reshape(shape)


def _reference_gradient(name: str, x: np.ndarray, bounds: list[int], g: np.ndarray, ddof: float) -> np.ndarray:
    """The derivative of ``name`` of the (n, d) rows ``x`` in the segments ``bounds`` (offsets)
    along axis 0, applied to ``g`` (shaped like the result), in float64 NumPy, segment by segment."""
    x, g = x.astype(np.float64), g.astype(np.float64)
    gx = np.zeros_like(x)
    for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        xs = x[lo:hi]
        if hi == lo:
            continue
        if name in ("softmax", "log_softmax"):
            e = np.exp(xs - xs.max(0))
            y = e / e.sum(0)
            gs = g[lo:hi]
            gx[lo:hi] = y * (gs - (gs * y).sum(0)) if name == "softmax" else gs - y * gs.sum(0)
        elif name == "logsumexp":
            r = xs.max(0) + np.log(np.exp(xs - xs.max(0)).sum(0))
            gx[lo:hi] = np.exp(xs - r) * g[k]
        else:
            free = (hi - lo) - ddof
            if free <= 0:
                continue
            d = xs - xs.mean(0)
            s = np.sqrt((d * d).sum(0) / free)
            if name == "var":
                gx[lo:hi] = 2 * d / free * g[k]
            else:
                gx[lo:hi] = np.where(s > 0, d / (free * np.where(s > 0, s, 1)), 0) * g[k]
    return gx


#: (segment keywords, their offsets) of the one-Function gradient tests: empty segments, lengths, a fixed length
FUSED_GRAD_SPECS = {
    "offsets": ({"offsets": [0, 3, 3, 7, 8, 12]}, [0, 3, 3, 7, 8, 12]),
    "lengths": ({"lengths": [2, 0, 4, 1, 5]}, [0, 2, 2, 6, 7, 12]),
    "fixed": ({"segment_length": 4}, [0, 4, 8, 12]),
}


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", FUSED_GRAD_SPECS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_autograd_records_one_function(name, spec, dtype, monkeypatch):
    """A tensor that requires grad takes linred._fused_grad.FusedGrad (one node in the graph, the
    forward without autograd), whose backward is the derivative, against float64 NumPy."""
    from linred import _fused_grad

    applied = []
    apply = _fused_grad.FusedGrad.apply
    monkeypatch.setattr(_fused_grad.FusedGrad, "apply", lambda *a: applied.append(a[5]) or apply(*a))
    kwargs, bounds = FUSED_GRAD_SPECS[spec]
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((12, 3)) * 3
    ddof = 1 if name in VARIANCE else 0
    x = torch.tensor(xv, dtype=getattr(torch, dtype), requires_grad=True)
    kw = {"ddof": ddof} if name in VARIANCE else {}
    y = fn(name)(x, **_torch_kwargs(kwargs, "cpu"), **kw)
    assert applied == [f"segmented_{name}"] and y.grad_fn is not None
    g = rng.standard_normal(tuple(y.shape))
    (gx,) = torch.autograd.grad(y, x, torch.tensor(g, dtype=x.dtype))
    expected = _reference_gradient(name, xv.astype(dtype), bounds, g.astype(dtype), ddof)
    np.testing.assert_allclose(gx.numpy(), expected, rtol=TOLERANCE[dtype] * 10, atol=TOLERANCE[dtype] * 10)


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", FUSED_GRAD_SPECS)
def test_jacobian_vectorized(name, spec):
    """autograd's own batched backward (jacobian(vectorize=True)) through the recorded Function
    equals the Jacobian row by row, and float64 NumPy's derivative applied to each unit vector."""
    kwargs, bounds = FUSED_GRAD_SPECS[spec]
    xv = np.random.default_rng(9).standard_normal((12, 2))
    x = torch.tensor(xv)
    f = lambda t: fn(name)(t, **_torch_kwargs(kwargs, "cpu"))
    fast = torch.autograd.functional.jacobian(f, x, vectorize=True)
    torch.testing.assert_close(fast, torch.autograd.functional.jacobian(f, x), equal_nan=True)
    out_shape = tuple(f(x).shape)
    for k in range(int(np.prod(out_shape))):
        g = np.zeros(out_shape)
        g.flat[k] = 1
        row = fast.reshape(-1, *x.shape)[k].numpy()
        np.testing.assert_allclose(row, _reference_gradient(name, xv, bounds, g, 0), rtol=1e-9, atol=1e-9)


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
def test_cpu_tensors_without_autograd_run_as_numpy_views(name, monkeypatch):
    """A CPU tensor's call that autograd does not record is computed on the NumPy views of its
    memory (no gather through PyTorch), with NumPy input's result, as a tensor."""
    x = torch.tensor(np.random.default_rng(2).standard_normal((12, 3)))
    offsets = [0, 3, 3, 7, 12]
    expected = fn(name)(x.numpy(), offsets=offsets)

    def no_gather(*args, **kwargs):
        raise AssertionError("a PyTorch gather on the host")

    monkeypatch.setattr(torch, "index_select", no_gather)
    monkeypatch.setattr(torch, "repeat_interleave", no_gather)
    for got in (fn(name)(x, offsets=torch.tensor(offsets)), fn(name)(x.float(), offsets=offsets)):
        assert isinstance(got, torch.Tensor)
        np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-6, atol=1e-6, equal_nan=True)


@needs_torch
@pytest.mark.parametrize("special", [math.inf, math.nan])
def test_variance_gradient_with_an_infinity_or_nan_is_torchs(special):
    """var's and std's gradients are torch.var's and torch.std's where a segment holds an infinity
    (-inf at its finite elements and NaN at the infinity for var, NaN throughout for std) or a
    NaN (NaN throughout)."""
    for ours, theirs in ((linred.segmented_var, torch.var), (linred.segmented_std, torch.std)):
        x = torch.tensor([1.0, special, 2.0, 4.0, 6.0], dtype=torch.float64, requires_grad=True)
        (g1,) = torch.autograd.grad(ours(x, lengths=[3, 2]).sum(), x)
        x2 = x.detach().clone().requires_grad_()
        (g2,) = torch.autograd.grad(theirs(x2[:3], correction=0) + theirs(x2[3:], correction=0), x2)
        torch.testing.assert_close(g1, g2, equal_nan=True)


def _grad_case(rng: np.random.Generator, features: int, lengths: list[int], special: bool) -> np.ndarray:
    x = rng.standard_normal((sum(lengths), features)) * 2
    if special and x.size:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, 4)] = [math.nan, math.inf, -math.inf, 0.0]
    return x


def _backward_spec(spec: str, lengths: list[int], device: str = "cuda") -> tuple[np.ndarray, str, Any]:
    """The offsets of ``lengths`` and the keyword and value that name them as ``spec`` does (tensors
    on ``device``): int64 offsets ("offsets"; "batch" and "trailing" too, for their layouts), int32
    offsets, lengths, or the fixed length of the first ("fixed")."""
    bounds = np.r_[0, np.cumsum(lengths)]
    if spec == "fixed":
        return bounds, "segment_length", lengths[0]
    if spec == "lengths":
        return bounds, "lengths", torch.tensor(lengths, device=device)
    dtype = torch.int32 if spec == "offsets32" else torch.int64
    return bounds, "offsets", torch.tensor(bounds, dtype=dtype, device=device)


def _composed_gradient(monkeypatch: Any, call: Any, x: Any, g: Any) -> np.ndarray:
    """The gradient of ``call()`` by ``x`` for ``g`` from PyTorch operations (the composition's
    derivative, which the backward's kernels follow), as float64 NumPy."""
    from linred import _fused_grad

    with monkeypatch.context() as patch:
        patch.setattr(_fused_grad, "_in_one_kernel", lambda *a: None)
        (gx,) = torch.autograd.grad(call(), x, g)
    return gx.double().cpu().numpy()


def _check_like_composed(got: np.ndarray, other: np.ndarray, tol: float) -> None:
    """NaN where the composition's gradient has NaN, its infinities, and its finite values."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(other))
    finite = np.isfinite(got) & np.isfinite(other)
    np.testing.assert_array_equal(got[~finite], other[~finite])
    scale = 1 + np.abs(other[finite]).max(initial=0)
    np.testing.assert_allclose(got[finite], other[finite], rtol=tol, atol=tol * scale)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("features", [1, 2, 8, 32, 3, 64])
@pytest.mark.parametrize("spec", ["offsets", "offsets32", "lengths", "fixed", "batch"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("group", [None, 2, 8])
def test_gpu_backward_kernel(name, features, spec, dtype, group, monkeypatch):
    """The backward's one kernel (softmax_grad.cuh), which every call here takes: against float64
    NumPy's derivative on finite data, and against the backward of PyTorch operations (the same
    formulas) with NaN and infinities, for workers of a warp or of groups of 2 or 8 lanes (1, 2,
    8, 32 features; chosen by the mean length where the group is None) and of a thread (3, 64),
    segments of 0, 1 and around multiples of a worker's rows a step, a batch with the segments
    along axis 1."""

    monkeypatch.setattr(_softmax_kernel, "MIN_WORKERS_PER_SM", 0)
    monkeypatch.setattr(_softmax_kernel, "GROUP", group)
    runs = []
    run = _softmax_kernel.run_backward
    monkeypatch.setattr(_softmax_kernel, "run_backward", lambda *a: runs.append(a[0]) or run(*a))
    lanes = 32 if group is None else max(group, features)
    step = lanes // features if features in (1, 2, 8, 32) else 1
    lengths = [0, 1, step - 1 or 2, step, step + 1, 4 * step - 1, 4 * step + 1, 100, 0, 37]
    if spec == "fixed":
        lengths = [4 * step + 1] * 5
    rng = np.random.default_rng(features)
    ddof = 1 if name in VARIANCE else 0
    kw = {"ddof": ddof} if name in VARIANCE else {}
    bounds, key, value = _backward_spec(spec, lengths)
    tdt = getattr(torch, dtype)
    for special in (False, True):
        xv = _grad_case(rng, features, lengths, special)
        if spec == "batch":  # (2, n, features), the segments along axis 1
            xv = np.stack([xv, _grad_case(rng, features, lengths, special)])
        x = torch.tensor(xv, dtype=tdt, device="cuda", requires_grad=True)
        axis = 1 if spec == "batch" else 0
        y = fn(name)(x, axis=axis, **{key: value}, **kw)
        g = torch.tensor(rng.standard_normal(tuple(y.shape)), dtype=y.dtype, device="cuda")
        before = len(runs)
        (gx,) = torch.autograd.grad(y, x, g)
        assert len(runs) == before + 1
        tol = {"float64": 1e-9, "float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}[dtype]
        got = gx.double().cpu().numpy()
        call = functools.partial(fn(name), x, axis=axis, **{key: value}, **kw)
        other = _composed_gradient(monkeypatch, call, x, g)
        _check_like_composed(got, other, tol)
        if special:
            continue
        expected = _reference_backward(name, x, g, bounds, ddof, spec == "batch", got.shape)
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * (1 + np.abs(expected).max()))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", ["offsets", "offsets32", "lengths", "fixed", "batch", "trailing"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_gpu_backward_from_parts(name, spec, dtype, monkeypatch):
    """The backward of one feature column from two values per segment (grad_from_parts,
    softmax_grad.cuh), which every call here takes (the workers' kernel told it does not serve
    them): chunks of 1,024 and 2,048 values (softmax and log_softmax read two arrays), segments
    of 0, 1 and k * C - 1, k * C, k * C + 1 values for both chunk sizes, several in one chunk, a
    batch of two rows along axis 1 (each row not a whole number of chunks), a trailing feature
    axis of 1; against float64 NumPy's derivative on finite data, and against the composition's
    backward with NaN and infinities."""

    real = _softmax_kernel._enough_workers
    monkeypatch.setattr(_softmax_kernel, "_enough_workers",
                        lambda *a, **k: False if len(a) > 5 and a[5] else real(*a, **k))  # fmt: skip
    runs = []
    run = _softmax_kernel.run_grad_from_parts
    monkeypatch.setattr(_softmax_kernel, "run_grad_from_parts", lambda *a: runs.append(a[0]) or run(*a))
    lengths = [0, 1, 1023, 1024, 1025, 3, 0, 2047, 2048, 2049, 5, 4095, 4097, 1, 6000, 0]
    if spec == "fixed":
        lengths = [2049] * 7
    rng = np.random.default_rng(len(name) + len(spec))
    ddof = 1 if name in VARIANCE else 0
    kw = {"ddof": ddof} if name in VARIANCE else {}
    bounds, key, value = _backward_spec(spec, lengths)
    tdt = getattr(torch, dtype)
    for special in (False, True):
        xv = _grad_case(rng, 1, lengths, special)
        if spec == "batch":  # (2, n), the segments along axis 1
            xv = np.stack([xv[:, 0], _grad_case(rng, 1, lengths, special)[:, 0]])
        elif spec != "trailing":
            xv = xv[:, 0]
        x = torch.tensor(xv, dtype=tdt, device="cuda", requires_grad=True)
        axis = 1 if spec == "batch" else 0
        y = fn(name)(x, axis=axis, **{key: value}, **kw)
        g = torch.tensor(rng.standard_normal(tuple(y.shape)), dtype=y.dtype, device="cuda")
        before = len(runs)
        (gx,) = torch.autograd.grad(y, x, g)
        assert runs[before:] == [f"segmented_{name}"]
        tol = {"float64": 1e-9, "float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}[dtype]
        got = gx.double().cpu().numpy()
        assert got.shape == tuple(x.shape) and gx.dtype == x.dtype
        call = functools.partial(fn(name), x, axis=axis, **{key: value}, **kw)
        other = _composed_gradient(monkeypatch, call, x, g)
        _check_like_composed(got, other, tol)
        if special:
            continue
        expected = _reference_backward(name, x, g, bounds, ddof, spec == "batch", got.shape)
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * (1 + np.abs(expected).max()))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
def test_gpu_backward_from_parts_by_default(name):
    """With the defaults, the backward of long segments of one column (a mean past the workers'
    MAX_MEAN_ROWS) comes from the segments' parts, with chunks enough that each block takes
    several (20M values): against float64 NumPy's derivative."""
    from linred import _softmax_kernel as sk

    rng = np.random.default_rng(5)
    n = 20_000_003
    bounds = np.r_[0, np.sort(rng.choice(np.arange(1, n), 40, replace=False)), n]
    x = torch.tensor(rng.standard_normal(n).astype(np.float32), device="cuda", requires_grad=True)
    off = torch.tensor(bounds, device="cuda")
    kw = {"ddof": 1} if name in VARIANCE else {}
    runs = []
    real = sk.run_grad_from_parts
    sk.run_grad_from_parts = lambda *a: runs.append(a[0]) or real(*a)
    try:
        y = fn(name)(x, offsets=off, **kw)
        g = torch.tensor(rng.standard_normal(tuple(y.shape)).astype(np.float32), device="cuda")
        (gx,) = torch.autograd.grad(y, x, g)
    finally:
        sk.run_grad_from_parts = real
    assert runs == [f"segmented_{name}"]
    got = gx.double().cpu().numpy()
    expected = _reference_gradient(name, x.detach().double().cpu().numpy()[:, None], bounds.tolist(),
                                   g.double().cpu().numpy()[:, None], kw.get("ddof", 0))[:, 0]  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("mean", [1024, 2048, 4096])
def test_gpu_backward_route_by_mean(name, mean):
    """Segments the workers' kernel serves: softmax and log_softmax from GRAD_PARTS_MIN_MEAN rows
    on average take the parts, shorter ones (and every other function) the workers; each right."""
    from linred import _softmax_kernel as sk

    rng = np.random.default_rng(mean)
    m = 64
    bounds = np.r_[0, np.cumsum(rng.integers(1, 2 * mean, m))]
    x = torch.tensor(rng.standard_normal(int(bounds[-1])).astype(np.float32), device="cuda", requires_grad=True)
    kw = {"ddof": 1} if name in VARIANCE else {}
    runs = []
    parts, workers = sk.run_grad_from_parts, sk.run_backward
    sk.run_grad_from_parts = lambda *a: runs.append("parts") or parts(*a)
    sk.run_backward = lambda *a: runs.append("workers") or workers(*a)
    try:
        y = fn(name)(x, offsets=torch.tensor(bounds, device="cuda"), **kw)
        g = torch.tensor(rng.standard_normal(tuple(y.shape)).astype(np.float32), device="cuda")
        (gx,) = torch.autograd.grad(y, x, g)
    finally:
        sk.run_grad_from_parts, sk.run_backward = parts, workers
    least = sk.GRAD_PARTS_MIN_MEAN.get(f"segmented_{name}")
    assert runs == ["parts" if least is not None and bounds[-1] >= least * m else "workers"]
    expected = _reference_gradient(name, x.detach().double().cpu().numpy()[:, None], bounds.tolist(),
                                   g.double().cpu().numpy()[:, None], kw.get("ddof", 0))[:, 0]  # fmt: skip
    np.testing.assert_allclose(gx.double().cpu().numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@needs_torch
def test_what_the_recorded_function_saves():
    """As torch.var's backward, var's reads the data only: its result may be changed in place
    before the backward (var += eps); softmax's reads its result, as torch.softmax's, and PyTorch
    refuses a backward through a result changed in place."""
    x = torch.tensor([1.0, 2.0, 4.0, 3.0, 5.0, 9.0, 2.0], dtype=torch.float64, requires_grad=True)
    v = linred.segmented_var(x, offsets=[0, 3, 7])
    v.add_(1e-5)
    (g,) = torch.autograd.grad(v.sqrt().sum(), x)
    x2 = x.detach().clone().requires_grad_()
    stds = [(x2[a:b].var(correction=0) + 1e-5).sqrt() for a, b in ((0, 3), (3, 7))]
    expected = torch.autograd.grad(stds[0] + stds[1], x2)
    torch.testing.assert_close(g, expected[0])
    y = linred.segmented_softmax(x, offsets=[0, 3, 7])
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("kind", ["float32 to float16", "float16", "float32 to bfloat16"])
def test_half_results_differentiate_the_float32_values(name, kind):
    """A float16 or bfloat16 result is the cast of the float32 computation, whose derivative the
    backward takes (not the derivative at the rounded result): the composition's accuracy."""
    rng = np.random.default_rng(4)
    xv = 1000 + rng.standard_normal(64)
    x_dtype, dtype = {"float32 to float16": ("float32", "float16"), "float16": ("float16", None),
                      "float32 to bfloat16": ("float32", "bfloat16")}[kind]  # fmt: skip
    x = torch.tensor(xv, dtype=getattr(torch, x_dtype), requires_grad=True)
    y = fn(name)(x, offsets=[0, 64], dtype=dtype)
    g = torch.linspace(0.5, 1.5, y.numel(), dtype=y.dtype).reshape(y.shape)  # (exact in float16)
    (gx,) = torch.autograd.grad(y, x, g)
    x64 = x.detach().double().numpy()
    expected = _reference_gradient(name, x64[:, None], [0, 64], g.double().numpy()[:, None], 0)[:, 0]
    scale = np.abs(expected).max()
    tol = 1e-2 if x_dtype == "float16" else 2e-3  # (float16 data of 1000 is itself rounded; its gradient is not)
    np.testing.assert_allclose(gx.double().numpy(), expected, rtol=tol, atol=tol * scale)


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", ["fixed", "offsets"])
def test_compile_fullgraph_of_cpu_tensors_without_grad(name, spec):
    """torch.compile(fullgraph=True) traces the fused functions of CPU tensors that autograd does
    not record (eagerly they run on NumPy views of the tensors' memory, which Dynamo cannot
    trace): one graph, the eager results."""
    x = torch.randn(10, 4, dtype=torch.float64)
    kw = {"segment_length": 5} if spec == "fixed" else {"offsets": torch.tensor([0, 3, 3, 10])}
    f = fn(name)
    torch._dynamo.reset()
    compiled = torch.compile(lambda h: f(h, **kw), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), f(x, **kw), equal_nan=True)


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
def test_forward_mode_ad_is_refused(name):
    """A dual tensor of forward-mode AD raises the documented TypeError (its result would come
    back without a tangent), whether or not it requires grad."""
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        for primal in (torch.randn(7), torch.randn(7, requires_grad=True)):
            dual = fwAD.make_dual(primal, torch.randn(7))
            with pytest.raises(TypeError, match="forward-mode AD"):
                fn(name)(dual, offsets=[0, 3, 7])


@needs_torch
def test_backward_warnings_name_the_callers_line():
    """NumPy's warnings in a backward that runs on the host name the line that called backward."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    y = linred.segmented_log_softmax(x, offsets=[0, 4])
    with pytest.warns(RuntimeWarning, match="overflow") as record:
        y.backward(torch.tensor([3e38, 3e38, 1.0, 1.0]))
    assert record[0].filename == __file__


@needs_torch
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", ["offsets", "offsets32", "lengths", "fixed", "batch"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_host_backward_on_numpy_views(name, spec, dtype, monkeypatch):
    """The backward of CPU tensors on NumPy views (_on_the_host) gives the backward of PyTorch
    operations' values, NaN and infinities included, for every spec, a batch along axis 1, 1 and 3
    features."""
    from linred import _fused_grad

    lengths = [0, 1, 3, 4, 0, 9, 2]
    if spec == "fixed":
        lengths = [3] * 6
    _, key, value = _backward_spec(spec, lengths, "cpu")
    kw = {"ddof": 1} if name in VARIANCE else {}
    rng = np.random.default_rng(8)
    taken = []
    host = _fused_grad._on_the_host
    monkeypatch.setattr(_fused_grad, "_on_the_host", lambda *a: taken.append(1) or host(*a))
    for features, special in ((1, False), (3, True)):
        xv = _grad_case(rng, features, lengths, special)
        if spec == "batch":
            xv = np.stack([xv, _grad_case(rng, features, lengths, special)])
        x = torch.tensor(xv, dtype=getattr(torch, dtype), requires_grad=True)
        axis = 1 if spec == "batch" else 0
        y = fn(name)(x, axis=axis, **{key: value}, **kw)
        g = torch.tensor(rng.standard_normal(tuple(y.shape)), dtype=y.dtype)
        (gx,) = torch.autograd.grad(y, x, g)
        with monkeypatch.context() as patch:
            patch.setattr(_fused_grad, "_on_the_host", lambda *a: None)
            (gx2,) = torch.autograd.grad(fn(name)(x, axis=axis, **{key: value}, **kw), x, g)
        got, other = gx.double().numpy(), gx2.double().numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(other))
        finite = np.isfinite(got) & np.isfinite(other)
        np.testing.assert_array_equal(got[~finite], other[~finite])
        tol = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2}[dtype]
        scale = 1 + np.abs(other[finite]).max(initial=0)
        np.testing.assert_allclose(got[finite], other[finite], rtol=tol, atol=tol * scale)
    assert len(taken) == 2


@needs_torch
def test_fused_gradient_warnings_name_the_callers_line():
    """NumPy's warnings inside the forward of a tensor that requires grad name the caller's line,
    not PyTorch's autograd (which calls linred's forward)."""
    x = torch.tensor([3e38, 3e38, 1.0, 2.0], requires_grad=True)
    with pytest.warns(RuntimeWarning, match="overflow") as record:
        linred.segmented_sum(x, 2)
    assert record[0].filename == __file__


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_autograd_forward_is_the_kernel(name, dtype, monkeypatch):
    """On the GPU the recorded Function's forward is the one kernel, and its backward the derivative."""
    from linred import _fused_grad

    runs = []
    run = _softmax_kernel.run
    monkeypatch.setattr(_softmax_kernel, "run", lambda *a, **k: runs.append(a[0]) or run(*a, **k))
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 9, 5000)
    bounds = np.r_[0, np.cumsum(lengths)].tolist()
    xv = rng.standard_normal((bounds[-1], 1)).astype(dtype)
    x = torch.tensor(xv, device="cuda", requires_grad=True)
    ddof = 1 if name in VARIANCE else 0
    kw = {"ddof": ddof} if name in VARIANCE else {}
    y = fn(name)(x, offsets=torch.tensor(bounds, device="cuda"), **kw)
    assert runs == [f"segmented_{name}"]
    node = y.grad_fn
    if dtype == "float16":  # (the cast of the Function's float32 result)
        node = node.next_functions[0][0]
    assert isinstance(node, _fused_grad.FusedGrad._backward_cls)
    g = rng.standard_normal(tuple(y.shape)).astype(dtype)
    (gx,) = torch.autograd.grad(y, x, torch.tensor(g, device="cuda"))
    expected = _reference_gradient(name, xv, bounds, g, ddof)
    tol = 2e-2 if dtype == "float16" else 1e-4
    np.testing.assert_allclose(gx.double().cpu().numpy(), expected, rtol=tol, atol=tol * (1 + np.abs(expected).max()))


# --- the softmax family's kernel on the GPU (linred._softmax_kernel) ---


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the calls the kernel computed (the others were composed).  The kernel serves these
    tests' small calls, whatever their number of workers (tested apart)."""
    monkeypatch.setattr(_softmax_kernel, "MIN_WORKERS_PER_SM", 0)
    calls = []
    real = _softmax_kernel.run
    monkeypatch.setattr(_softmax_kernel, "run", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    return calls


def _gpu_array(a: np.ndarray, kind: str, dtype: str | None = None) -> Any:
    if kind == "torch-cuda":
        t = torch.as_tensor(np.ascontiguousarray(a), device="cuda")
        return t.to(getattr(torch, dtype)) if dtype else t
    return cupy.asarray(np.ascontiguousarray(a))


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("spec", ["fixed", "keep", "offsets", "offsets32", "lengths"])
@pytest.mark.parametrize("layout", ["1d", "2d", "last"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_gpu_kernel_against_reference(kernel_calls, kind, name, spec, layout, dtype):
    """Every segment specification, layout (one column: a warp per segment; feature rows: a thread
    per feature) and dtype, with an all -inf segment, a NaN and a +inf, through the kernel."""
    kwargs, groups, _ = SPECS[spec]
    _, axis = LAYOUTS[layout]
    x = make(layout, dtype, groups, special=True)
    arrays = ("offsets", "lengths")
    segs = {k: _gpu_array(np.asarray(v), kind) if k in arrays else v for k, v in kwargs.items()}
    got = fn(name)(_gpu_array(x, kind), axis=axis, **segs)
    check(got, reference(name, x, groups, axis), RESULT_DTYPE[dtype], TOLERANCE[dtype])
    assert kernel_calls == [f"segmented_{name}"]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize(
    "shape, axis",
    [((70_001,), 0), ((5_003, 7), 0), ((3, 4_001, 2), 1), ((3_001, 4), 0), ((2_001, 8), 0), ((999, 16), 0),
     ((1_001, 32), 0), ((777, 40), 0)],
)  # fmt: skip
def test_gpu_kernel_long_and_many_segments(kernel_calls, kind, name, shape, axis):
    """Segments of 0 to thousands of rows (longer than a warp's step, many to a grid), one column
    (a warp per segment), 2 to 32 features (a warp over rows and features) and 7 or 40 (a thread
    per feature), float32 and float64 against float64 NumPy."""
    rng = np.random.default_rng(len(shape))
    n = shape[axis]
    cuts = np.sort(rng.integers(0, n + 1, 40))
    cuts[5] = cuts[6]  # an empty segment
    offsets = np.concatenate([[0], cuts, [n]])
    for dtype, tol in (("float32", 2e-5), ("float64", 1e-12)):
        x = (rng.normal(size=shape) * 4).astype(dtype)
        got = fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind), axis=axis)
        expected = _fast_reference(name, x, offsets, axis)
        check(got, expected, dtype, tol)
    assert kernel_calls == [f"segmented_{name}"] * 2


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", VARIANCE)
@pytest.mark.parametrize("dtype, offset", [("float32", 1000), ("float32", 1e7), ("float16", 1000), ("float64", 1000),
                                           ("float64", 1e7)])  # fmt: skip
def test_gpu_kernel_variance_far_from_zero(kernel_calls, kind, name, dtype, offset):
    """Data whose mean is far from 0 beside its spread (offset + N(0, 1), and an outlier as a
    segment's first value) keeps the float64 result of the same values to 1e-6 (1e-12 for
    float64; float16: its own rounding): the deviations from the mean (or, in one pass, from a
    segment's first value), never E[x^2] - E[x]^2 (at 1e7 float32's E[x^2] - E[x]^2 in float64
    is 2e-3 off)."""
    rng = np.random.default_rng(7)
    n = 40_000
    x = (offset + rng.normal(size=n)).astype(dtype)
    offsets = np.concatenate([[0], np.sort(rng.integers(0, n + 1, 300)), [n]])
    first = next(int(a) for a, b in itertools.pairwise(offsets) if b - a > 10)
    x[first] = 1200 if dtype == "float16" else 1e6 + offset  # (an outlier as the shift)
    got = to_numpy(fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind)))
    expected = _fast_reference(name, x, offsets, 0)
    assert got.dtype == np.dtype(dtype)
    tol = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tol, atol=0, equal_nan=True)
    assert kernel_calls == [f"segmented_{name}"]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", VARIANCE)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("ddof", [1, 2])
def test_gpu_kernel_variance_ddof_and_infinities_in_a_batch(kernel_calls, kind, name, dtype, ddof):
    """``ddof`` through the kernel (segments of at most ``ddof`` rows give NaN), over a batch of
    three rows (``axis=1``), with infinities after a segment's first value (+inf; -inf; both) and
    a NaN deep in a segment: NaN there, the float64 result elsewhere."""
    rng = np.random.default_rng(ddof)
    lengths = [0, 1, 2, 3, 40, 300, 5, 6, 7, 129]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    x = rng.normal(size=(3, int(offsets[-1]))) * 3 + 5
    x[0, offsets[6] + 2] = np.inf
    x[1, offsets[7] + 3] = -np.inf
    x[2, offsets[8] + 1], x[2, offsets[8] + 4] = np.inf, -np.inf
    x[0, offsets[9] + 100] = np.nan
    x = x.astype(dtype)
    got = to_numpy(fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind), axis=1, ddof=ddof))
    expected = np.full((3, len(lengths)), np.nan)
    for r in range(3):
        for s, (a, b) in enumerate(itertools.pairwise(offsets)):
            seg = x[r, a:b].astype(np.float64)
            if b - a > ddof and np.isfinite(seg).all():
                var = ((seg - seg.mean()) ** 2).sum() / (b - a - ddof)
                expected[r, s] = np.sqrt(var) if name == "std" else var
    assert np.isnan(expected[:, : ddof + 1]).all() and np.isnan(expected[[0, 1, 2, 0], [6, 7, 8, 9]]).all()
    tol = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(dtype), rtol=tol, atol=0, equal_nan=True)
    assert kernel_calls == [f"segmented_{name}"]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", VARIANCE)
def test_gpu_kernel_variance_of_a_long_segment_whose_first_value_is_an_outlier(kernel_calls, kind, name):
    """One pass shifted by a segment's first value magnifies its rounding by up to the segment's
    length where that value is an outlier (about n^1.5 2^-53: 8 float32 ulps at 3e7 rows); a
    segment over 2^20 rows is read again, shifted by its mean: 2^25 rows of N(0, 1) after a first
    value of 6e4, beside 2,200 single rows, keep the float64 result to 3e-7."""
    n = 1 << 25
    rng = np.random.default_rng(11)
    x = rng.normal(size=n + 2200).astype(np.float32)
    x[0] = 6e4
    offsets = np.concatenate([[0], np.arange(n, n + 2201)])
    got = to_numpy(fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind)))
    seg = x[:n].astype(np.float64)
    var = ((seg - seg.mean()) ** 2).mean()
    want = np.sqrt(var) if name == "std" else var
    np.testing.assert_allclose(got[0], want, rtol=3e-7)
    assert (got[1:] == 0).all()
    assert kernel_calls == [f"segmented_{name}"]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", VARIANCE)
@pytest.mark.parametrize("features", [1, 3])
def test_gpu_kernel_variance_of_an_overflowing_float64_sum(kernel_calls, kind, name, features):
    """float64 data whose segment's sum overflows: its mean is inf and its var and std are inf, as
    the composition's (not NaN), for segments that end in a partial step of the kernel (2 and 130
    rows) and one that does not (128 rows: 4 steps of 32 lanes), beside an ordinary segment."""
    lengths = [2, 128, 130, 5]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    x = np.full((int(offsets[-1]), features), 1e308)
    x[offsets[-2] :] = np.arange(5 * features).reshape(5, features)
    got = to_numpy(fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind)))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = _fast_reference(name, x, offsets, 0)
    assert np.isinf(expected[:3]).all() and np.isfinite(expected[3]).all()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
    assert kernel_calls == [f"segmented_{name}"]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", VARIANCE)
@pytest.mark.parametrize("features", [1, 8, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_kernel_variance_of_narrow_data_at_its_extremes(kernel_calls, kind, name, features, dtype):
    """Data narrower than 8 bytes takes one pass, its sums shifted by each segment's first value
    (softmax.cuh: variance_one_pass), and keeps the float64 result of the same values:
    deviations of 3e19 (their squares beyond float's range; std is 3e19) and of 1e-18, constant
    segments and single rows (var 0), an infinity and a NaN (NaN), beside ordinary segments of 1
    to 300 rows."""
    rng = np.random.default_rng(features)
    lengths = [1, 7, 300, 33, 64, 300, 2, 65, 129, 5, 0, 257]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    x = rng.normal(size=(int(offsets[-1]), features))
    seg = [slice(a, b) for a, b in itertools.pairwise(offsets)]
    big, tiny = (3e19, 1e-18) if dtype == "float32" else (300.0, 0.05)  # (float16: 65504 at most)
    x[seg[1]] *= tiny
    x[seg[2]] = big * x[seg[2]] + (big if dtype == "float32" else 0.0)
    x[seg[3]] = 5.0
    x[seg[4]] *= tiny
    x[seg[5]] *= big
    x[seg[6]] = [[np.inf], [1.0]]
    x[seg[7]][3] = np.nan
    x = x.astype(dtype)
    got = to_numpy(fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind)))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = _fast_reference(name, x, offsets, 0)
    assert np.isnan(expected[[6, 7, 10]]).all() and (expected[[0, 3]] == 0).all()
    tol = {"float32": 1e-6, "float16": 2e-3}[dtype]  # (float16: an ulp of its own rounding)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(dtype), rtol=tol, atol=0, equal_nan=True)
    assert kernel_calls == [f"segmented_{name}"]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", VARIANCE)
def test_gpu_kernel_variance_of_float32_data_as_float64(kernel_calls, kind, name):
    """float32 data with ``dtype="float64"``: the float64 pass, so the result keeps the float64
    result of the same values to 1e-12 (not the float pass's ~1e-7), data far from 0 included."""
    rng = np.random.default_rng(3)
    n = 20_000
    x = (1000 + rng.normal(size=(n, 2))).astype(np.float32)
    offsets = np.concatenate([[0], np.sort(rng.integers(0, n + 1, 100)), [n]])
    got = to_numpy(fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind), dtype="float64"))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _fast_reference(name, x, offsets, 0), rtol=1e-12, atol=0, equal_nan=True)
    assert kernel_calls == [f"segmented_{name}"]


def kernel_unroll(warp: bool, dtype: str) -> int:
    """The kernel's steps loaded at once (softmax.cuh: softmax_unroll): 8 for a warp over 2- and
    4-byte data, else 4."""
    return 8 if warp and np.dtype(dtype).itemsize <= 4 else 4


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("features", [1, 8, 32, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_gpu_kernel_step_boundaries(kernel_calls, kind, name, features, dtype):
    """Segments whose lengths cross each of the kernel's steps: RS rows per step of a worker's
    lanes (32 / D for a warp over D features, 1 for a thread per feature) and the UNROLL steps of
    its unrolled loop, at k * T - 1, k * T and k * T + 1 rows."""
    group, width, _ = _softmax_kernel._workers(1, 1, features)  # (the kernel's worker layout)
    warp = group == 32
    rs = group // width
    unroll = kernel_unroll(warp, dtype) * rs
    lengths = [0, 1]
    for t in (rs, 2 * rs, unroll, 2 * unroll, 5 * unroll + rs):
        lengths += [t - 1, t, t + 1]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = int(offsets[-1])
    rng = np.random.default_rng(features)
    x = (rng.normal(size=(n, features)) * 3).astype(dtype)
    got = fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind))
    expected = _fast_reference(name, x, offsets, 0)
    tol = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3}[dtype]
    check(got, expected, dtype, tol)
    assert kernel_calls == [f"segmented_{name}"]


#: the layouts of 16-bit data whose lanes read pairs of rows (the rows of every batch row start
#: at a 4-byte boundary) or single rows: (shape, axis, start) with ``start`` the element of a
#: larger buffer where the data begins (1: 2 bytes past an aligned address)
PAIR_LAYOUTS = {
    "1d, n even": ((4_098,), 0, 0, True),
    "1d, n odd": ((4_097,), 0, 0, True),
    "batch, n even": ((3, 4_098), 1, 0, True),
    "batch, n odd": ((3, 4_097), 1, 0, False),
    "1d, 2 bytes off": ((4_097,), 0, 1, False),
}


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", list(PAIR_LAYOUTS))
@pytest.mark.parametrize("result", [None, "float32", "float64"])
def test_gpu_kernel_pairs_of_rows(kernel_calls, monkeypatch, kind, name, dtype, layout, result):
    """16-bit data of one column read two rows a load (softmax.cuh: load_pairs): segments that
    start at odd and even rows, lengths crossing a pair (2), a step of the lanes (64 rows) and a
    loop step (256) at k * T - 1, k * T and k * T + 1, the last segment ending at the data's end
    (n odd: its last pair is one row), empty segments; batches whose rows start at odd elements
    and data 2 bytes past an aligned address read a row at a time.  Against float64 NumPy of the
    rounded data.  (Pairs serve a warp per segment, in segments of PAIRS_MIN_ROWS rows on average:
    here a warp, and segments of any length.)"""
    if kind == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16")
    shape, axis, start, pairs = PAIR_LAYOUTS[layout]
    default_min_rows = _softmax_kernel.PAIRS_MIN_ROWS
    monkeypatch.setattr(_softmax_kernel, "PAIRS_MIN_ROWS", 0)
    monkeypatch.setattr(_softmax_kernel, "GROUP", 32)
    chosen = []
    real = _softmax_kernel._pairs
    monkeypatch.setattr(_softmax_kernel, "_pairs", lambda *a: chosen.append(real(*a)) or chosen[-1])
    n = shape[axis]
    lengths = [0, 1, 2, 3, 1, 63, 64, 65, 0, 127, 128, 129, 255, 256, 257, 1, 511, 512, 513]
    lengths.append(n - sum(lengths))  # (to the data's end)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rng = np.random.default_rng(len(layout))
    x = (rng.normal(size=shape) * 3).astype(np.float32)
    if dtype == "float16":
        x = x.astype(np.float16)
        rounded = x.astype(np.float64)
    else:
        rounded = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    flat = np.concatenate([np.zeros(start, x.dtype), x.ravel()])
    if kind == "torch-cuda":
        buffer = torch.as_tensor(flat, device="cuda")
        # (float32 to bfloat16 rounds to nearest even on the device, as ml_dtypes does)
        buffer = buffer.to(torch.bfloat16) if dtype == "bfloat16" else buffer
        data = buffer[start:].view(shape)
        off = torch.as_tensor(offsets, device="cuda")
    else:
        data = cupy.asarray(flat)[start:].reshape(shape)
        off = cupy.asarray(offsets)

    def call() -> Any:
        got = fn(name)(data, offsets=off, axis=axis, dtype=result)
        return got.float() if kind == "torch-cuda" and got.dtype == torch.bfloat16 else got  # (NumPy has no bfloat16)

    expected = _fast_reference(name, rounded, offsets, axis)
    out_dtype = result or ("float32" if dtype == "bfloat16" else dtype)
    tol = 2e-2 if result is None else 2e-5
    check(call(), expected, out_dtype, tol)
    assert kernel_calls == [f"segmented_{name}"]
    assert chosen == [pairs]
    monkeypatch.setattr(_softmax_kernel, "PAIRS_MIN_ROWS", default_min_rows)  # (these segments: too short)
    check(call(), expected, out_dtype, tol)
    assert chosen == [pairs, False]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize(
    "features, batch, group",
    [(1, 1, 32), (1, 1, 2), (1, 1, 1), (8, 1, 32), (8, 1, 8), (1, 3, 32), (1, 3, 4), (3, 1, 1)],
)
def test_gpu_kernel_workers_past_the_grid(kernel_calls, monkeypatch, kind, name, features, batch, group):
    """More workers than one stride of the grid: each worker takes two or three segments in turn
    (reading the next one's bounds ahead for a group of lanes), the last workers' loops ending at a
    partial stride (groups of a warp past the last worker among them); a batch (axis=1) wraps the
    segment index.  Segments of 1 to 9 rows, float32, a warp (32), groups of lanes and a thread
    per segment or feature (1)."""
    monkeypatch.setattr(_softmax_kernel, "GROUP", group)
    device = 0 if kind == "cupy" else torch.cuda.current_device()
    stride = (
        _softmax_kernel.BLOCKS_PER_SM * _softmax_kernel.multiprocessors(device) * (_softmax_kernel.THREADS // group)
    )
    m = -(-(2 * stride + 123) // (batch * (features if group == 1 else 1)))
    rng = np.random.default_rng(features + batch)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(1, 10, m))])
    n = int(offsets[-1])
    shape, axis = ((batch, n), 1) if batch > 1 else ((n, features), 0)
    x = (rng.normal(size=shape) * 3).astype(np.float32)
    got = fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind), axis=axis)
    check(got, _reduceat_reference(name, x, offsets, axis), "float32", 2e-5)
    assert kernel_calls == [f"segmented_{name}"]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("features, dtype", [(1, "float32"), (1, "float64"), (1, "float16"), (2, "float32"),
                                             (4, "float16")])  # fmt: skip
def test_gpu_kernel_lane_group_steps(kernel_calls, monkeypatch, kind, name, group, features, dtype):
    """Workers of fewer lanes than a warp (short segments share one): segment lengths crossing a
    step of the group's lanes (G / D rows) and its loop step (its unrolled steps) at k * T - 1,
    k * T and k * T + 1, empty ones, and a count of segments that leaves the last warp's groups
    partly idle.  (G below D is D.)"""
    monkeypatch.setattr(_softmax_kernel, "GROUP", group)
    itemsize = np.dtype(dtype).itemsize
    g, width, _ = _softmax_kernel._workers(1, 1, features, 1)
    assert g == max(group, features)
    rs = g // width
    step = _softmax_kernel.unroll(g, itemsize) * rs
    lengths = [0, 1, *sorted({t + k for t in (rs, 2 * rs, step, 2 * step, 5 * step + rs) for k in (-1, 0, 1)}), 0, 3]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = int(offsets[-1])
    rng = np.random.default_rng(group * 10 + features)
    x = (rng.normal(size=(n, features)) * 3).astype(dtype)
    got = fn(name)(_gpu_array(x if features > 1 else x[:, 0], kind), offsets=_gpu_array(offsets, kind))
    expected = _fast_reference(name, x, offsets, 0)
    tol = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3}[dtype]
    check(got, expected if features > 1 else expected[..., 0], dtype, tol)
    assert kernel_calls == [f"segmented_{name}"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("features, dtype", [(1, "float32"), (1, "float64"), (1, "float16"), (8, "float32")])
def test_gpu_kernel_long_segments_among_short_ones(kernel_calls, monkeypatch, name, group, features, dtype):
    """A worker of a few lanes (or a thread, for one feature) hands a segment longer than a warp's
    loop step to its whole warp (softmax.cuh, softmax_grad.cuh): lengths at that step - 1, the step
    and + 1 (rows: 8 or, for 8-byte data, 4 steps of 32 / D in the forward, 8 in the backward),
    much longer ones, two long ones side by side (one warp hands both over), among segments of 0
    to 9 rows; the forward and the backward against float64 NumPy."""
    monkeypatch.setattr(_softmax_kernel, "GROUP", group)
    monkeypatch.setattr(_softmax_kernel, "MIN_WORKERS_PER_SM", 0)
    warp_rows = (4 if dtype == "float64" else 8) * 32 // features
    rng = np.random.default_rng(group + features)
    lengths = rng.integers(0, 10, 300).tolist()
    for at, length in ((7, warp_rows - 1), (20, warp_rows), (21, warp_rows + 1), (40, 256 // features + 1),
                       (41, 5_000), (42, 3_001), (200, 257), (299, 2 * warp_rows + 3)):  # fmt: skip
        lengths[at] = length
    bounds = np.r_[0, np.cumsum(lengths)]
    xv = (rng.normal(size=(int(bounds[-1]), features)) * 3).astype(dtype)
    x = torch.tensor(xv if features > 1 else xv[:, 0], device="cuda", requires_grad=True)
    y = fn(name)(x, offsets=torch.tensor(bounds, device="cuda"))
    xs = xv.astype(np.float64)
    expected = _fast_reference(name, xs, bounds, 0)
    tol = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3}[dtype]
    check(y.detach(), expected if features > 1 else expected[..., 0], dtype, tol)
    assert kernel_calls == [f"segmented_{name}"]
    g = rng.standard_normal(tuple(y.shape))
    (gx,) = torch.autograd.grad(y, x, torch.tensor(g, dtype=y.dtype, device="cuda"))
    gs = g.astype(y.detach().cpu().numpy().dtype).astype(np.float64)  # (the gradient as rounded to y's dtype)
    ref = _reference_gradient(name, xs, bounds.tolist(), gs if features > 1 else gs[..., None], 0)
    ref = ref if features > 1 else ref[:, 0]
    gtol = {"float64": 1e-9, "float32": 1e-4, "float16": 2e-2}[dtype]
    got = gx.double().cpu().numpy()
    np.testing.assert_allclose(got, ref, rtol=gtol, atol=gtol * (1 + np.abs(ref).max()))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("group", [1, 2, 8, 32])
@pytest.mark.parametrize("features, dtype", [(1, "float32"), (1, "float64"), (1, "float16"), (8, "float32"),
                                             (3, "float32")])  # fmt: skip
@pytest.mark.parametrize("room", [None, 4])
@pytest.mark.parametrize("check_", [True, False])
def test_gpu_kernel_very_long_segments_to_blocks(kernel_calls, monkeypatch, name, group, features, dtype, room,
                                                 check_):  # fmt: skip
    """A segment longer than SOFTMAX_LONG_ROWS (softmax.cuh: 2**15 rows) is listed by its warp and
    read by a whole block of linred_softmax_long (in calls of any size here: checked, the second
    kernel where the first noted one; unchecked, LONG_MIN_VALUES at 0, both kernels always, but
    for logsumexp's warps per segment): lengths at 2**15 (read by the warp) and 2**15 + 1,
    20 very long ones side by side, one among 300 short ones far from them, the groups' own
    segments between; a list with room for 4 (the warps read the rest); 3 features: a thread per
    feature, which lists none.  Against float64 NumPy."""
    monkeypatch.setattr(_softmax_kernel, "GROUP", None if features == 3 else group)
    monkeypatch.setattr(_softmax_kernel, "LONG_MIN_VALUES", 0)  # (a small call: listed too)
    # (var and std of 3 features would be cut into pieces, linred._pieces: this is the kernel's test)
    monkeypatch.setattr(_pieces, "ENABLED", False)
    if room is not None:
        monkeypatch.setattr(_softmax_kernel, "LONG_LIST", room)
    listed = []
    real = _softmax_kernel._compile_long
    monkeypatch.setattr(_softmax_kernel, "_compile_long", lambda key: listed.append(key) or real(key))
    rng = np.random.default_rng(group + features)
    lengths = rng.integers(0, 10, 300).tolist()
    for at in range(20):
        lengths[at] = int(rng.integers(32_769, 40_000))
    lengths[3], lengths[4], lengths[250] = 32_768, 32_769, 50_001
    bounds = np.r_[0, np.cumsum(lengths)]
    xv = (rng.normal(size=(int(bounds[-1]), features)) * 3).astype(dtype)
    x = torch.tensor(xv if features > 1 else xv[:, 0], device="cuda")
    y = fn(name)(x, offsets=torch.tensor(bounds, device="cuda"), check=check_)
    expected = _fast_reference(name, xv.astype(np.float64), bounds, 0)
    tol = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3}[dtype]
    check(y, expected if features > 1 else expected[..., 0], dtype, tol)
    assert kernel_calls == [f"segmented_{name}"]
    lists = features != 3 and not (name == "logsumexp" and group == 32 and not check_)
    assert len(listed) <= int(lists)  # (compiled once per thread)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("check_", [True, False])  # (checked: the noted second kernel; else both always)
@pytest.mark.parametrize("name", ["logsumexp", "softmax", "var"])
def test_gpu_kernel_very_long_segments_on_streams_threads_and_graphs(kernel_calls, monkeypatch, name, check_):
    """The list of very long segments is this thread's for its stream: calls on a side stream and
    the current one in turn (a checked call, whose second kernel follows the note, and an
    unchecked one, whose second kernel always runs), four threads at once, and a call captured
    into a CUDA graph (which lists none: its warps read them) and replayed on new data, each
    right."""
    import concurrent.futures

    monkeypatch.setattr(_softmax_kernel, "LONG_MIN_VALUES", 0)
    rng = np.random.default_rng(9)
    lengths = rng.integers(0, 20, 4000).tolist()
    lengths[10], lengths[2000] = 60_000, 40_000
    bounds = np.r_[0, np.cumsum(lengths)]
    off = torch.tensor(bounds, device="cuda")
    f = fn(name)

    def case(seed):
        xv = np.random.default_rng(seed).normal(size=int(bounds[-1])).astype(np.float32)
        return torch.tensor(xv, device="cuda"), _fast_reference(name, xv[:, None].astype(np.float64), bounds, 0)[..., 0]

    side = torch.cuda.Stream()
    for seed in range(3):
        x, expected = case(seed)
        with torch.cuda.stream(side):
            a = f(x, offsets=off, check=check_)
        b = f(x, offsets=off, check=not check_)  # (both kinds of pair, one after the other)
        torch.cuda.synchronize()
        check(a, expected, "float32", 2e-5)
        check(b, expected, "float32", 2e-5)

    def in_a_thread(seed):
        x, expected = case(seed)
        got = f(x, offsets=off, check=check_)
        torch.cuda.current_stream().synchronize()
        return got.cpu().numpy(), expected

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for got, expected in pool.map(in_a_thread, range(10, 18)):
            check(got, expected, "float32", 2e-5)

    x, _ = case(30)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        f(x, offsets=off, check=False)  # (warm: kernels compiled before the capture)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        y = f(x, offsets=off, check=False)
    fresh, expected = case(31)
    x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    check(y, expected, "float32", 2e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax"])
@pytest.mark.parametrize("group", [None, 2, 8, 32])
def test_gpu_kernel_long_segment_read_by_a_warp_keeps_float32_accuracy(kernel_calls, monkeypatch, name, group):
    """A segment of 300,000 rows among short ones in a call too small to list it (a warp's lanes
    read 9,375 rows each): its sum of exps keeps float32's accuracy, about 1e-7 (the lanes add
    their steps' sums in double; in float, a lane that adds the same value step after step
    drifts by about n * eps / 8, 1e-5 here).
    Softmax's values to 1e-6 of each, logsumexp and log_softmax to 2e-6 (values near 12.6),
    against float64 NumPy."""
    monkeypatch.setattr(_softmax_kernel, "GROUP", group)
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 30, 3000)
    lengths[1234] = 300_000
    bounds = np.r_[0, np.cumsum(lengths)]
    assert bounds[-1] < _softmax_kernel.LONG_MIN_VALUES  # (unchecked: the warps read it)
    # Every row -0.1 but a segment's first, 0 (its maximum): a lane adds the same sum of exps step
    # after step, whose roundings in float add up instead of cancelling.
    xv = np.full(int(bounds[-1]), -0.1, np.float32)
    xv[bounds[:-1][lengths > 0]] = 0
    # (unchecked: a checked call would list the segment for a block of linred_softmax_long)
    got = to_numpy(fn(name)(torch.tensor(xv, device="cuda"), offsets=torch.tensor(bounds, device="cuda"),
                            check=False))  # fmt: skip
    expected = _fast_reference(name, xv[:, None].astype(np.float64), bounds, 0)[..., 0]
    assert kernel_calls == [f"segmented_{name}"]
    if name == "softmax":
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-6, atol=0)
    else:
        # (values near 12.6: float32's own rounding of them is up to 5e-7)
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=0, atol=2e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("check_", [True, False])
def test_gpu_kernel_list_left_empty_when_the_second_launch_fails(kernel_calls, monkeypatch, check_):
    """A call whose second kernel cannot be made (here: its compile raises) leaves the list empty
    (the first kernel is not launched before the second is ready), so the next call, of other
    arrays and segments, reads only its own very long segments; both against float64."""
    monkeypatch.setattr(_softmax_kernel, "LONG_MIN_VALUES", 0)
    real = _softmax_kernel._compile_long
    failed = []

    def fail_once(key):
        if not failed:
            failed.append(key)
            raise RuntimeError("no second kernel")
        return real(key)

    monkeypatch.setattr(_softmax_kernel, "_compile_long", fail_once)
    monkeypatch.setattr(_softmax_kernel, "_local", type(_softmax_kernel._local)())  # (nothing compiled yet)
    rng = np.random.default_rng(2)
    # (short segments around the long ones: a mean the workers' kernel serves, warps that list)
    for lengths, fails in (([5] * 30 + [40_000] + [3] * 30 + [50_000], True),
                           ([7] * 40 + [60_000] + [2] * 40 + [33_000] + [1], False)):  # fmt: skip
        bounds = np.r_[0, np.cumsum(lengths)]
        xv = rng.normal(size=int(bounds[-1])).astype(np.float32)
        call = functools.partial(linred.segmented_softmax, torch.tensor(xv, device="cuda"),
                                 offsets=torch.tensor(bounds, device="cuda"), check=check_)  # fmt: skip
        if fails:
            with pytest.raises(RuntimeError, match="no second kernel"):
                call()
            continue
        expected = _fast_reference("softmax", xv[:, None].astype(np.float64), bounds, 0)[..., 0]
        check(call(), expected, "float32", 2e-5)
    assert failed and kernel_calls == ["segmented_softmax"] * 2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "var", "logsumexp"])
@pytest.mark.parametrize("group", [4, 32])
def test_gpu_kernel_checked_calls_list_very_long_segments_at_any_size(kernel_calls, monkeypatch, name, group):
    """Checked calls far below LONG_MIN_VALUES list a segment longer than LONG_ROWS (groups of
    lanes and warps, logsumexp's warps per segment too: the call is far below RUNS_MIN_VALUES)
    and launch the second kernel only where the first noted it:
    the note read after the wait is set for a call with such a segment and not for one without;
    unchecked calls of that size list nothing (the note is not read), nor with LONG_MIN_VALUES
    at 0 (the second kernel always).  Every result against float64 NumPy."""
    notes = []
    real_noted = _device_checks.noted
    monkeypatch.setattr(_device_checks, "noted", lambda: notes.append(real_noted()) or notes[-1])
    monkeypatch.setattr(_softmax_kernel, "GROUP", group)
    rng = np.random.default_rng(11)
    hub = rng.integers(0, 20, 2000)
    hub[700] = 45_000
    flat = rng.integers(0, 20, 2000)
    flat[700] = 30_000  # (long, but not past LONG_ROWS: read by the warp)
    for lengths, check_, lists, noted in ((hub, True, True, [True]), (flat, True, True, [False]),
                                          (hub, False, False, []), (hub, False, True, [])):  # fmt: skip
        monkeypatch.setattr(_softmax_kernel, "LONG_MIN_VALUES", 0 if lists and not check_ else 1 << 26)
        bounds = np.r_[0, np.cumsum(lengths)]
        xv = rng.normal(size=int(bounds[-1])).astype(np.float32)
        notes.clear()
        got = fn(name)(torch.tensor(xv, device="cuda"), offsets=torch.tensor(bounds, device="cuda"), check=check_)
        expected = _fast_reference(name, xv[:, None].astype(np.float64), bounds, 0)[..., 0]
        check(got, expected, "float32", 2e-5)
        assert notes == noted, (check_, lists)
    assert kernel_calls == [f"segmented_{name}"] * 4


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp", "var", "std"])
def test_gpu_backward_of_a_listed_very_long_segment_from_per_segment_values(kernel_calls, monkeypatch, name):
    """Where the checked forward's kernel listed a very long segment (its note), the backward of
    the same segments takes the route that spreads a segment over the GPU (per-segment values
    from linred's reductions, then grad_from_parts), whatever the mean length; without one, the
    backward kernel's workers.  Both gradients against float64 NumPy."""
    from linred import _fused_grad

    monkeypatch.setattr(_softmax_kernel, "GROUP", 4)
    parts = []
    real = _fused_grad._from_parts
    monkeypatch.setattr(_fused_grad, "_from_parts", lambda *a: parts.append(a[0].name) or real(*a))
    rng = np.random.default_rng(13)
    for very_long in (True, False):
        lengths = rng.integers(1, 20, 3000)
        lengths[1500] = 50_000 if very_long else 30_000
        bounds = np.r_[0, np.cumsum(lengths)]
        xv = rng.normal(size=int(bounds[-1])).astype(np.float32)
        x = torch.tensor(xv, device="cuda", requires_grad=True)
        y = fn(name)(x, offsets=torch.tensor(bounds, device="cuda"))
        gv = rng.normal(size=tuple(y.shape)).astype(np.float32)
        (gx,) = torch.autograd.grad(y, x, torch.tensor(gv, device="cuda"))
        ref = _reference_gradient(name, xv[:, None], bounds.tolist(), gv[:, None], 0)[:, 0]
        np.testing.assert_allclose(gx.double().cpu().numpy(), ref, rtol=1e-4, atol=1e-4 * (1 + np.abs(ref).max()))
        assert parts == ([f"segmented_{name}"] if very_long else []), very_long
        parts.clear()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("bad", ["decreasing", "past n"])
def test_gpu_kernel_checked_call_that_listed_and_raises_leaves_the_list_empty(kernel_calls, bad):
    """A checked call whose offsets break a rule after a very long segment that its warps listed
    raises the ValueError that names them, without the second kernel, and empties the list: the
    next call (other data, its own very long segments) is right against float64."""
    rng = np.random.default_rng(12)
    lengths = rng.integers(0, 20, 3000)
    lengths[100], lengths[200] = 40_000, 50_000
    bounds = np.r_[0, np.cumsum(lengths)]
    broken = bounds.copy()
    if bad == "decreasing":
        broken[2500] = broken[2499] - 1
    else:
        broken[-1] = broken[-1] + 5
    xv = rng.normal(size=int(bounds[-1])).astype(np.float32)
    x = torch.tensor(xv, device="cuda")
    with pytest.raises(ValueError, match="offsets"):
        linred.segmented_softmax(x, offsets=torch.tensor(broken, device="cuda"))
    lengths2 = rng.integers(0, 10, 4000)
    lengths2[3000] = 70_000
    bounds2 = np.r_[0, np.cumsum(lengths2)]
    xv2 = rng.normal(size=int(bounds2[-1])).astype(np.float32)
    got = linred.segmented_softmax(torch.tensor(xv2, device="cuda"), offsets=torch.tensor(bounds2, device="cuda"))
    check(got, _fast_reference("softmax", xv2[:, None].astype(np.float64), bounds2, 0)[..., 0], "float32", 2e-5)
    assert kernel_calls == ["segmented_softmax"] * 2


def test_kernel_lists_very_long_segments_in_checked_and_large_calls():
    """(No GPU needed.) The workers' kernel lists very long segments for linred_softmax_long in
    checked calls whose rows can hold one (more than LONG_ROWS; the second kernel launched only
    where the first noted one) and unchecked calls of LONG_MIN_VALUES values or more (the second
    kernel always), for groups of lanes and a thread of one feature, not for a thread per feature
    of several nor logsumexp's warps per segment (but in checked calls below RUNS_MIN_VALUES)."""
    lists, big, rows = _softmax_kernel._lists, _softmax_kernel.LONG_MIN_VALUES, _softmax_kernel.LONG_ROWS
    always, noted = _softmax_kernel.ALWAYS, _softmax_kernel.NOTED
    assert lists("segmented_softmax", big, big, 32, 1, False) == always
    assert lists("segmented_var", big, big, 2, 1, False) == always
    assert lists("segmented_logsumexp", big, big, 8, 8, False) == always
    assert lists("segmented_log_softmax", big, big, 1, 1, False) == always
    assert lists("segmented_softmax", big - 1, big - 1, 32, 1, False) is None
    assert lists("segmented_softmax", rows + 1, rows + 1, 32, 1, True) == noted
    assert lists("segmented_var", rows + 1, 8 * (rows + 1), 8, 8, True) == noted
    assert lists("segmented_softmax", rows, 1000 * rows, 32, 1, True) is None  # (no segment can be that long)
    assert lists("segmented_softmax", big, big, 1, 3, False) is None
    assert lists("segmented_softmax", big, big, 1, 3, True) is None
    assert lists("segmented_logsumexp", big, big, 32, 1, False) is None
    assert lists("segmented_logsumexp", big, big, 32, 1, True) is None
    runs = _softmax_kernel.RUNS_MIN_VALUES  # (a checked call's warps per segment list below it)
    assert lists("segmented_logsumexp", runs - 1, runs - 1, 32, 1, True) == noted
    assert lists("segmented_logsumexp", runs, runs, 32, 1, True) is None


def test_kernel_lane_groups_follow_the_mean_length(monkeypatch):
    """The worker layout (no GPU needed): lanes that leave each about 16 values of a segment of the
    mean length (8 for softmax and log_softmax), a power of two from 2 (4 for softmax and
    log_softmax; a thread for segments of one feature of 8 values or fewer) or D to 32 (a warp); a
    warp where the mean passes 3/4 of a warp's loop step, and without a row count; a thread per
    feature where D is not a power of two up to 32; GROUP forces the group."""
    w = _softmax_kernel._workers
    assert w(1, 1000, 1, 512_000) == (32, 1, 1000)
    assert w(1, 1000, 1, 192_000) == (16, 1, 1000)  # (3/4 of a warp's loop step of 256 rows)
    assert w(1, 1000, 1, 193_000) == (32, 1, 1000)
    assert w(1, 1000, 1, 96_000, itemsize=8) == (8, 1, 1000)  # (8-byte data: loop steps of 128 rows)
    assert w(1, 1000, 1, 97_000, itemsize=8) == (32, 1, 1000)
    assert w(1, 1000, 1, 128_000, "segmented_softmax") == (16, 1, 1000)
    assert w(1, 1000, 1, 100_000) == (8, 1, 1000)  # (6.25 lanes: 8)
    assert w(1, 1000, 1, 16_000) == (2, 1, 1000)
    assert w(1, 1000, 1, 16_000, "segmented_log_softmax") == (4, 1, 1000)
    assert w(1, 1000, 1, 64_000, "segmented_softmax") == (8, 1, 1000)
    assert w(1, 1000, 1, 8_000) == (1, 1, 1000)
    assert w(1, 1000, 1, 8_000, itemsize=2) == (2, 1, 1000)  # (16-bit data: no thread per segment)
    assert w(1, 1, 0, 0, "segmented_softmax") == (32, 0, 1)  # (no data)
    assert w(1, 1, 4, 0) == (32, 4, 1)
    assert w(1, 1000, 1, 256_000, "segmented_logsumexp", backward=True) == (32, 1, 1000)  # (8 values a lane)
    assert w(1, 1000, 1, 16_000, "segmented_var", backward=True) == (2, 1, 1000)
    assert w(1, 1000, 1, 16_000, "segmented_softmax", backward=True) == (4, 1, 1000)
    assert w(2, 1000, 8, 16_000) == (8, 8, 2000)
    assert w(2, 1000, 8, 4_000, "segmented_softmax") == (8, 8, 2000)
    assert w(2, 1000, 8, 64_000) == (32, 8, 2000)
    assert w(1, 1000, 3, 4_000) == (1, 1, 3000)
    assert w(1, 1000, 1) == (32, 1, 1000)  # (no row count: a warp)
    assert w(1, 0, 1, 0) == (32, 1, 0)
    assert w(1, 1000, 1, 0) == (32, 1, 1000)  # (empty segments: nothing to launch)
    monkeypatch.setattr(_softmax_kernel, "GROUP", 4)
    assert w(1, 1000, 1, 256_000) == (4, 1, 1000)
    assert w(1, 1000, 8, 256_000) == (8, 8, 1000)


def _reduceat_reference(name: str, x: np.ndarray, offsets: np.ndarray, axis: int) -> np.ndarray:
    """:func:`_fast_reference` for segments that all hold rows, through ``ufunc.reduceat``
    (float64; for calls with too many segments for a loop)."""
    xm = np.moveaxis(x.astype(np.float64), axis, 0)
    starts, lengths = offsets[:-1], np.diff(offsets)
    shape = (-1,) + (1,) * (xm.ndim - 1)
    if name in VARIANCE:
        mean = np.add.reduceat(xm, starts, axis=0) / lengths.reshape(shape)
        dev = xm - np.repeat(mean, lengths, axis=0)
        var = np.add.reduceat(dev * dev, starts, axis=0) / lengths.reshape(shape)
        res = np.sqrt(var) if name == "std" else var
    else:
        mx = np.maximum.reduceat(xm, starts, axis=0)
        shifted = xm - np.repeat(mx, lengths, axis=0)
        total = np.add.reduceat(np.exp(shifted), starts, axis=0)
        if name == "logsumexp":
            res = mx + np.log(total)
        elif name == "softmax":
            res = np.exp(shifted) / np.repeat(total, lengths, axis=0)
        else:
            res = shifted - np.repeat(np.log(total), lengths, axis=0)
    return np.moveaxis(res, 0, axis)


def _fast_reference(name: str, x: np.ndarray, offsets: np.ndarray, axis: int) -> np.ndarray:
    """The reference of :func:`reference` for finite data, vectorized per segment (float64)."""
    xm = np.moveaxis(x.astype(np.float64), axis, 0)
    parts = []
    for a, b in itertools.pairwise(offsets):
        seg = xm[a:b]
        if name in VARIANCE:
            with np.errstate(invalid="ignore", divide="ignore"):
                var = ((seg - seg.mean(axis=0)) ** 2).sum(axis=0) / (b - a) if b > a else np.full(xm.shape[1:], np.nan)
            parts.append((np.sqrt(var) if name == "std" else var)[None])
            continue
        if name == "logsumexp":
            if b == a:
                parts.append(np.full((1, *xm.shape[1:]), -np.inf))
                continue
            mx = seg.max(axis=0)
            parts.append((mx + np.log(np.exp(seg - mx).sum(axis=0)))[None])
        else:
            mx = seg.max(axis=0) if b > a else 0
            e = np.exp(seg - mx)
            s = e.sum(axis=0)
            parts.append(seg - mx - np.log(s) if name == "log_softmax" else e / s)
    return np.moveaxis(np.concatenate(parts, axis=0), 0, axis)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs PyTorch with CUDA")
@pytest.mark.parametrize("name", FUNCTIONS)
def test_gpu_kernel_bfloat16_and_what_it_leaves_to_the_composition(kernel_calls, name):
    kwargs, groups, _ = SPECS["offsets"]
    x = make("2d", "float32", groups, special=False)
    off = torch.tensor(kwargs["offsets"], device="cuda")
    got = fn(name)(torch.as_tensor(x, device="cuda").bfloat16(), offsets=off)
    assert got.dtype == torch.bfloat16
    check(got.float(), reference(name, x.astype(ml_dtypes.bfloat16).astype(np.float64), groups, 0), "float32", 2e-2)
    assert kernel_calls == [f"segmented_{name}"]
    # a tensor that requires grad: the kernel is the forward of the Function autograd records
    t = torch.as_tensor(x, device="cuda").requires_grad_()
    assert fn(name)(t, offsets=off).grad_fn is not None
    assert kernel_calls == [f"segmented_{name}"] * 2
    # composed: a strided view, segment ids, integer data
    fn(name)(torch.as_tensor(np.ascontiguousarray(x.T), device="cuda").T, offsets=off)
    fn(name)(torch.as_tensor(x, device="cuda"), segment_ids=torch.tensor(SORTED_IDS, device="cuda"))
    fn(name)(torch.arange(12, device="cuda"), offsets=off)
    assert kernel_calls == [f"segmented_{name}"] * 2


def _raises_the_hosts_error(name: str, x: np.ndarray, bad: list, kind: str) -> None:
    """``name`` of ``x`` on the GPU with the broken offsets ``bad`` raises the ValueError the host
    raises for them, word for word."""
    try:
        fn(name)(x, offsets=np.array(bad))
        raise AssertionError(f"the host accepts {bad}")
    except ValueError as e:
        expected = str(e)
    with pytest.raises(ValueError, match=re.escape(expected)):
        fn(name)(_gpu_array(x, kind), offsets=_gpu_array(np.array(bad), kind))


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_gpu_kernel_checks_the_offsets(kernel_calls, kind, name):
    """check=True: broken offsets raise the host's message (the kernel checked them as it read
    them, reading nothing outside the axis); a valid call after them is right."""
    x = np.random.default_rng(3).normal(size=(50, 4)).astype(np.float32)
    good = np.array([0, 10, 10, 30, 50])
    for bad in ([1, 10, 10, 30, 50], [0, 10, 5, 30, 50], [0, 10, 10, 30, 49], [0, -4, 10, 30, 50],
                [0, 10, 10, 2**40, 50]):  # fmt: skip
        _raises_the_hosts_error(name, x, bad, kind)
    got = fn(name)(_gpu_array(x, kind), offsets=_gpu_array(good, kind))
    check(got, _fast_reference(name, x, good, 0), "float32", 2e-5)
    assert len(kernel_calls) == 6


def test_what_the_gpu_kernel_serves(monkeypatch):
    """(No GPU needed.) The kernel serves one segment argument of the three, a bool check, real
    data, no gradient, C-contiguous device arrays, bfloat16 only from compute capability 8.0;
    every other call is composed (which raises the errors of bad arguments)."""
    from linred.backends import nvrtc

    class X:
        shape = (2,)

    monkeypatch.setattr(linred.backends, "unavailable", lambda name: None)
    monkeypatch.setattr(nvrtc, "_compute_capability", lambda device: (7, 5))
    monkeypatch.setattr(_softmax_kernel, "multiprocessors", lambda device: 132)
    monkeypatch.setattr(_softmax_kernel, "MIN_WORKERS_PER_SM", 0)
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS", False)  # (the workers' rules; warp_reduce's: test_lse_runs_route)

    def serves(segments, in_name="float32", result="float32", check=True, grad=False, backend="auto", x=None):
        return _softmax_kernel.serves("segmented_softmax", x or X(), FakeDeviceAdapter(), in_name, result, segments,
                                      backend, grad, check)  # fmt: skip

    offsets = {"offsets": [0, 2]}
    assert serves(offsets) and serves({"segment_length": 2}) and serves({"lengths": [2]})
    assert not serves({"offsets": [0, 2], "segment_length": 2})  # two: composed, which raises
    assert not serves({})
    assert not serves({"segment_ids": [0, 0]}) and not serves({"offsets": [0, 2], "num_segments": 1})
    assert not serves(offsets, check=None) and not serves(offsets, check=1)
    assert not serves(offsets, grad=True) and not serves(offsets, backend="cub")
    assert not serves(offsets, in_name="int64")
    assert not serves(offsets, in_name="bfloat16", result="bfloat16") and not serves(offsets, result="bfloat16")
    monkeypatch.setattr(nvrtc, "_compute_capability", lambda device: (8, 0))
    assert serves(offsets, in_name="bfloat16", result="bfloat16")
    # None too long on average; enough workers (segments, or segments x features) for the GPU, or
    # few values for each lane of the few workers.
    monkeypatch.setattr(_softmax_kernel, "MIN_WORKERS_PER_SM", 16)
    monkeypatch.setattr(_softmax_kernel, "FEW_WORKERS_LANE_VALUES", 512)
    rows = _softmax_kernel.MAX_MEAN_ROWS
    for m, mean, served in ((16 * 132, 4, True), (16 * 132 - 1, 4, True), (16 * 132, rows, True),
                            (16 * 132, rows + 1, False), (3, rows, True), (3, rows + 1, False)):  # fmt: skip
        x = type("X", (), {"shape": (m * mean,)})()  # (one feature: a warp of 32 lanes a segment)
        assert serves({"segment_length": mean}, x=x) is served, (m, mean)
        assert serves({"offsets": np.arange(m + 1) * mean}, x=x) is served, (m, mean)
        assert serves({"lengths": [mean] * m}, x=x) is served, (m, mean)
    x = type("X", (), {"shape": (rows + 1,)})()  # (a NumPy integer length counts the same)
    assert serves({"segment_length": np.int64(rows)}, x=x) and not serves({"segment_length": np.int64(rows + 1)}, x=x)
    # 7 features: a worker (one lane) each, 512 values a lane when few; 8 features: a warp's 32
    # lanes read 4 rows of a segment at a time
    for m, length, served in ((-(-16 * 132 // 7), 513, True), (16 * 132 // 7, 513, False), (3, 512, True)):
        x = type("X", (), {"shape": (m * length, 7)})()
        assert serves({"segment_length": length}, x=x) is served, (m, length)
    for m, length, served in ((16 * 132, 2049, True), (16 * 132 - 1, 2049, False), (3, 2048, True)):
        x = type("X", (), {"shape": (m * length, 8)})()
        assert serves({"segment_length": length}, x=x) is served, (m, length)

    # var and std of float64 data computed in a narrower dtype: composed (the kernel reads float64)
    monkeypatch.setattr(_softmax_kernel, "MIN_WORKERS_PER_SM", 0)

    def serves_var(in_name, result):
        return _softmax_kernel.serves("segmented_var", X(), FakeDeviceAdapter(), in_name, result, offsets, "auto",
                                      False, True)  # fmt: skip

    assert serves_var("float64", "float64") and serves_var("float32", "float32") and serves_var("float16", "float16")
    assert not serves_var("float64", "float32") and not serves_var("float64", "float16")
    monkeypatch.setattr(linred.backends, "unavailable", lambda name: "no GPU")
    assert not serves(offsets)


# --- logsumexp of one column by warp_reduce (linred/kernels/lse.cuh) ---


def _lse_reference(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """logsumexp of the rows of ``x`` (batch, n) in the segments of ``offsets``, float64, by the
    composition's formula: the shift is the segment's maximum, 0 where that is not finite (so
    NaN gives NaN, +inf +inf, all -inf and empty -inf)."""
    lengths = np.diff(offsets)
    full = lengths > 0
    starts = offsets[:-1][full]
    out = np.full((x.shape[0], len(lengths)), -np.inf)
    for b, row in enumerate(x.astype(np.float64)):
        if not starts.size:
            continue
        mx = np.maximum.reduceat(row, starts)
        shift = np.where(np.isfinite(mx), mx, 0.0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            total = np.add.reduceat(np.exp(row - np.repeat(shift, lengths[full])), starts)
            out[b, full] = np.log(total) + shift
    return out


def _softmax_reference(x: np.ndarray, offsets: np.ndarray, log: bool) -> np.ndarray:
    """softmax (or log_softmax) of the rows of ``x`` (batch, n) in the segments of ``offsets``,
    float64, by the composition's formula: the shift is the segment's maximum; every value of a
    segment whose maximum is not finite (NaN, +inf, all -inf) is NaN."""
    lengths = np.diff(offsets)
    full = lengths > 0
    starts = offsets[:-1][full]
    out = np.empty(x.shape)
    for b, row in enumerate(x.astype(np.float64)):
        mx = np.maximum.reduceat(row, starts)
        shift = np.repeat(mx, lengths[full])
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            e = np.exp(row - shift)
            total = np.repeat(np.add.reduceat(e, starts), lengths[full])
            out[b] = (row - shift) - np.log(total) if log else e / total
        out[b, ~np.isfinite(shift)] = np.nan
    return out


def _lse_cuts(n: int, rng: np.random.Generator) -> np.ndarray:
    """Offsets over ``n`` rows that cross every boundary of warp_reduce's tiling at k * T - 1,
    k * T and k * T + 1: its tiles (256 values), runs of 2 to 16 tiles, blocks of 8 runs; with
    empty segments, short ones (0 to 40 values) and one spanning thousands of tiles."""
    cuts = set()
    for t in (256, 512, 1024, 2048, 4096, 8192, 32_768):
        for k in rng.integers(1, max(2, n // t), 3):
            cuts.update(int(k) * t + d for d in (-1, 0, 1))
    cuts.update(range(0, 2_000, 7))
    cuts.update(int(v) for v in np.cumsum(rng.integers(0, 41, n // 20)) + n // 2)
    long_start, long_end = n // 8, n // 8 + 100_003
    cuts = {c for c in cuts if 0 < c < n and not long_start < c < long_end} | {long_start, long_end}
    inner = np.sort(np.array([*sorted(cuts), 2_000, 2_000, 2_000]))  # (repeats: empty segments)
    return np.concatenate([[0], inner, [n]]).astype(np.int64)


def _lse_specials(x: np.ndarray, offsets: np.ndarray) -> None:
    """NaN, infinities and all -inf segments in ``x`` (its last axis), some in segments that span
    tiles and runs: a NaN in the long segment, a +inf in another that spans a run, a segment of
    -inf that spans a tile, +inf with -inf, and lone ones among short segments."""
    lengths = np.diff(offsets)
    order = np.argsort(-lengths)
    long0, long1, long2 = (int(i) for i in order[:3])
    x[..., offsets[long0] + lengths[long0] // 2] = np.nan
    x[..., offsets[long1] + 3] = np.inf
    x[..., offsets[long2] : offsets[long2 + 1]] = -np.inf
    short = [int(i) for i in np.flatnonzero((lengths > 2) & (lengths < 30))[:6]]
    x[..., offsets[short[0]]] = np.inf
    x[..., offsets[short[1]] : offsets[short[1] + 1]] = -np.inf
    x[..., offsets[short[2]]] = np.inf
    x[..., offsets[short[2]] + 1] = -np.inf
    x[..., offsets[short[3]] + 1] = np.nan
    x[..., offsets[short[4]]] = -np.inf


@pytest.fixture
def lse_runs(monkeypatch):
    """Records the calls logsumexp's warp_reduce route served (linred._softmax_kernel._runs), which
    these tests give segments of any mean length (LSE_RUNS_MIN_MEAN: the route's choice, tested
    apart; its kernel must be right for every length)."""
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS_MIN_MEAN", 0)
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS_MIN_MEAN_16BIT", 0)
    monkeypatch.setattr(_softmax_kernel, "SOFTMAX_RUNS_MIN_MEAN", 0)
    monkeypatch.setattr(_softmax_kernel, "RUNS_MIN_VALUES", 0)
    calls = []
    real = _softmax_kernel._runs
    monkeypatch.setattr(_softmax_kernel, "_runs", lambda *a, **k: calls.append(a[6:9]) or real(*a, **k))
    return calls


LSE_TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("spec", ["offsets", "offsets32", "lengths"])
@pytest.mark.parametrize("batch", [1, 3])
def test_gpu_lse_runs_tiling(lse_runs, kind, dtype, spec, batch):
    """Offsets crossing warp_reduce's tiles, runs and blocks (each at k * T - 1, k * T, k * T + 1),
    a segment of 100,003 values spanning runs, empty and short segments, NaN and infinities in
    segments within and across tiles; one row or a batch (axis 1), a fused fix-up (small rows) and
    a fix-up of its own (many runs); against float64 NumPy, NaN and infinities where the
    composition puts them."""
    if kind == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16")
    rng = np.random.default_rng(batch + len(spec))
    for n in (300_000, 4_000_000):
        offsets = _lse_cuts(n, rng)
        x = (rng.normal(size=(batch, n)) * 4).astype(np.float32)
        _lse_specials(x, offsets)
        xd = x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        expected = _lse_reference(xd.astype(np.float64), offsets)
        if dtype == "bfloat16":
            data = torch.as_tensor(x if batch > 1 else x[0], device="cuda").bfloat16()
        else:
            data = _gpu_array(xd if batch > 1 else xd[0], kind)
        seg = offsets.astype(np.int32) if spec == "offsets32" else offsets
        kwargs = {"lengths": _gpu_array(np.diff(offsets), kind)} if spec == "lengths" else {
            "offsets": _gpu_array(seg, kind)}  # fmt: skip
        got = linred.segmented_logsumexp(data, axis=int(batch > 1), **kwargs)
        got64 = to_numpy(got.float() if dtype == "bfloat16" else got).astype(np.float64).reshape(batch, -1)
        np.testing.assert_array_equal(np.isnan(got64), np.isnan(expected))
        np.testing.assert_array_equal(np.isposinf(got64), np.isposinf(expected))
        np.testing.assert_array_equal(np.isneginf(got64), np.isneginf(expected))
        finite = np.isfinite(expected)
        tol = LSE_TOLERANCE[dtype]
        np.testing.assert_allclose(got64[finite], expected[finite], rtol=tol, atol=tol)
    assert [c[:2] for c in lse_runs] == [(batch, 300_000), (batch, 4_000_000)]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("length", [1, 3, 255, 256, 257, 4_097, 100_003])
def test_gpu_lse_runs_fixed_lengths(lse_runs, kind, length):
    """A fixed length (FixedOffsets), from one value to segments that span runs, float32 data, and
    float16 and float64 data with a float32 result (dtype=: computed in float32), against float64
    NumPy."""
    rng = np.random.default_rng(length)
    m = max(2, 400_000 // length)
    n = m * length
    x = (rng.normal(size=n) * 4).astype(np.float32)
    offsets = np.arange(m + 1, dtype=np.int64) * length
    got = linred.segmented_logsumexp(_gpu_array(x, kind), length)
    check(got, _lse_reference(x[None], offsets)[0], "float32", 2e-5)
    h = x.astype(np.float16)
    got = linred.segmented_logsumexp(_gpu_array(h, kind), length, dtype="float32")
    check(got, _lse_reference(h[None].astype(np.float64), offsets)[0], "float32", 2e-5)
    d = x.astype(np.float64) + rng.normal(size=n) * 1e-3  # (values float32 cannot hold: read as float32)
    got = linred.segmented_logsumexp(_gpu_array(d, kind), length, dtype="float32")
    check(got, _lse_reference(d[None].astype(np.float32).astype(np.float64), offsets)[0], "float32", 2e-5)
    assert len(lse_runs) == 3


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_gpu_lse_runs_only_where_rows_are_aligned(lse_runs, kind, monkeypatch):
    """warp_reduce reads rows of whole 16-byte vectors, each as far past a 16-byte boundary (read
    from it): data 4 bytes past an aligned address is served; a batch whose rows are not whole
    16-byte vectors goes to the workers' kernel, as do float64 results, feature rows, and every
    call with LSE_RUNS off or GROUP set; each right."""
    monkeypatch.setattr(_softmax_kernel, "MIN_WORKERS_PER_SM", 0)
    rng = np.random.default_rng(5)
    offsets = np.array([0, 3, 3, 700, 1_001, 2_002])
    base = (rng.normal(size=2_003) * 4).astype(np.float32)
    whole = _gpu_array(base, kind)
    expected = _lse_reference(base[None, 1:], offsets)[0]
    got = linred.segmented_logsumexp(whole[1:], offsets=_gpu_array(offsets, kind))  # (4 bytes off)
    check(got, expected, "float32", 2e-5)
    assert len(lse_runs) == 1
    odd = (rng.normal(size=(2, 1_001)) * 4).astype(np.float32)  # (rows of 4,004 bytes)
    off2 = _gpu_array(offsets[:-1], kind)
    check(linred.segmented_logsumexp(_gpu_array(odd, kind), offsets=off2, axis=1), _lse_reference(odd, offsets[:-1]),
          "float32", 2e-5)  # fmt: skip
    assert len(lse_runs) == 1
    even, off3 = odd[:, :1_000].copy(), np.array([0, 3, 3, 700, 1_000])  # (rows of 4,000 bytes)
    check(linred.segmented_logsumexp(_gpu_array(even, kind), offsets=_gpu_array(off3, kind), axis=1),
          _lse_reference(even, off3), "float32", 2e-5)  # fmt: skip
    assert len(lse_runs) == 2
    x = base[:2_002]
    expected = _lse_reference(x[None], offsets)[0]
    got = linred.segmented_logsumexp(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind), dtype="float64")
    check(got, expected, "float64", 2e-6)  # (computed in float64: the workers' kernel)
    got = linred.segmented_logsumexp(_gpu_array(np.stack([x, x], 1), kind), offsets=_gpu_array(offsets, kind))
    check(got, np.stack([expected, expected], 1), "float32", 2e-5)
    monkeypatch.setattr(_softmax_kernel, "GROUP", 4)
    check(linred.segmented_logsumexp(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind)),
          _lse_reference(x[None], offsets)[0], "float32", 2e-5)  # fmt: skip
    monkeypatch.setattr(_softmax_kernel, "GROUP", None)
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS", False)
    linred.segmented_logsumexp(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind))
    assert len(lse_runs) == 2
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS", True)
    linred.segmented_logsumexp(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind))
    assert len(lse_runs) == 3


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax"])
def test_gpu_lse_runs_shifted_rows(lse_runs, kind, dtype, name):
    """Rows that begin past a 16-byte boundary (a slice x[k:], every k a vector allows; a batch
    of such rows) are read by warp_reduce from the boundary: the values before them, NaN here,
    join no segment. Offsets crossing the tiling (at k * T - 1, k * T, k * T + 1 of the shifted
    rows too), a fixed length, checked and unchecked calls, broken offsets raising; against
    float64 NumPy."""
    if kind == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16")
    rng = np.random.default_rng(len(name) + len(dtype))
    size = 2 if dtype != "float32" else 4
    vec = 16 // size
    tol = LSE_TOLERANCE[dtype]
    for n, batch, shifts in ((300_000, 1, range(1, vec)), (4_096 * 33, 2, (1, vec - 1)), (1_000, 1, (vec - 1,))):
        offsets = _lse_cuts(n, rng) if n > 2_000 else np.array([0, 1, 1, 255, 257, 513, 999, 1_000])
        cuts = offsets + 0
        values = (rng.normal(size=(batch, n)) * 4).astype(np.float32)
        for shift in shifts:
            flat = np.full(batch * n + shift, np.nan, np.float32)
            flat[shift:] = values.reshape(-1)
            if dtype == "bfloat16":
                data = torch.as_tensor(flat, device="cuda").bfloat16()[shift:].reshape(batch, n)
            else:
                data = _gpu_array(flat.astype(dtype), kind)[shift:].reshape(batch, n)
            rounded = to_numpy(data.float() if dtype == "bfloat16" else data).astype(np.float64)
            row = data if batch > 1 else data[0]
            for check_, spec in ((True, "offsets"), (False, "offsets"), (True, "fixed")):
                if spec == "fixed":
                    length = 1_000 if n % 1_000 == 0 else 4_096
                    cuts = np.arange(0, n + 1, length)
                    got = fn(name)(row, length, axis=int(batch > 1), check=check_)
                else:
                    cuts = offsets
                    got = fn(name)(row, offsets=_gpu_array(offsets, kind), axis=int(batch > 1), check=check_)
                if name == "logsumexp":
                    expected = _lse_reference(rounded, cuts)
                else:
                    expected = _softmax_reference(rounded, cuts, name == "log_softmax")
                got64 = to_numpy(got.float() if dtype == "bfloat16" else got).astype(np.float64).reshape(batch, -1)
                finite = np.isfinite(expected)
                np.testing.assert_array_equal(np.isfinite(got64), finite, err_msg=f"{n} {shift} {spec}")
                np.testing.assert_allclose(got64[finite], expected[finite], rtol=tol, atol=tol)
            broken = offsets.copy()
            broken[len(broken) // 2] = broken[len(broken) // 2 + 1] + 1
            with pytest.raises(ValueError, match="offsets must be non-decreasing"):
                fn(name)(row, offsets=_gpu_array(broken, kind), axis=int(batch > 1))
            if kind == "torch-cuda" and dtype == "float32" and name == "logsumexp" and batch == 1:
                # (with autograd: the gradient of a sum of logsumexps is the softmax)
                leaf = torch.as_tensor(flat, device="cuda").requires_grad_()
                y = linred.segmented_logsumexp(leaf[shift:], offsets=_gpu_array(offsets, kind))
                (g,) = torch.autograd.grad(y.sum(), leaf)
                assert torch.isnan(g[:shift]).sum() == 0 and (g[:shift] == 0).all()
                np.testing.assert_allclose(g[shift:].cpu().numpy(), _softmax_reference(rounded, offsets, False)[0],
                                           rtol=1e-4, atol=1e-6)  # fmt: skip
    assert len(lse_runs) > 0 and all(c[0] in (1, 2) for c in lse_runs)


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax"])
def test_gpu_lse_runs_checks_the_offsets(lse_runs, kind, name):
    """check=True: warp_reduce checks the offsets as it reads them (its CHECKED variant and the
    fix-up's test of the runs' walks): broken offsets raise the host's message, small calls (the
    fix-up in the last block) and large ones (a fix-up of its own), softmax_from_parts reading
    them after it without leaving its bounds; valid calls after them are right, with check=True
    and False."""
    rng = np.random.default_rng(9)
    for n in (5_000, 3_000_000):
        x = (rng.normal(size=n) * 4).astype(np.float32)
        good = np.array([0, 10, 10, n // 3, n // 2, n])
        bads = ([1, 10, 10, n // 3, n // 2, n], [0, 10, 5, n // 3, n // 2, n], [0, 10, 10, n // 3, n // 2, n - 1],
                [0, -4, 10, n // 3, n // 2, n], [0, 10, 10, 2**40, n // 2, n], [0, 10, 10, n // 2, n // 3, n],
                [0, 10, 10, n // 3, n // 2, n + 1])  # fmt: skip
        for bad in bads:
            _raises_the_hosts_error(name, x, bad, kind)
        for check_ in (True, False):
            got = fn(name)(_gpu_array(x, kind), offsets=_gpu_array(good, kind), check=check_)
            if name == "logsumexp":
                check(got, _lse_reference(x[None], good)[0], "float32", 2e-5)
            else:
                check(got, _softmax_reference(x[None], good, name == "log_softmax")[0], "float32", 2e-5)
    assert len(lse_runs) == 2 * (len(bads) + 2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs PyTorch with CUDA")
def test_gpu_lse_runs_on_streams_and_with_autograd(lse_runs):
    """Calls on a side stream and the current one in turn (the executor's partials ordered between
    them), and a tensor that requires grad (the forward of the recorded Function), each right."""
    rng = np.random.default_rng(11)
    n = 2_000_000
    offsets = np.unique(np.r_[0, rng.integers(0, n, 50_000), n])
    x = (rng.normal(size=n) * 4).astype(np.float32)
    expected = _lse_reference(x[None], offsets)[0]
    t, off = torch.as_tensor(x, device="cuda"), torch.as_tensor(offsets, device="cuda")
    side = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(side):
            a = linred.segmented_logsumexp(t, offsets=off)
        b = linred.segmented_logsumexp(t, offsets=off, stream=side)
        side.synchronize()
        c = linred.segmented_logsumexp(t, offsets=off)
        for r in (a, b, c):
            check(r, expected, "float32", 2e-5)
    tg = t.clone().requires_grad_()
    y = linred.segmented_logsumexp(tg, offsets=off)
    check(y.detach(), expected, "float32", 2e-5)
    (g,) = torch.autograd.grad(y.sum(), tg)
    softmax = np.exp(x - np.repeat(expected, np.diff(offsets)))
    np.testing.assert_allclose(g.cpu().numpy(), softmax, rtol=1e-4, atol=1e-6)
    assert len(lse_runs) == 10


def test_lse_runs_route(monkeypatch):
    """(No GPU needed.) Which logsumexp calls warp_reduce serves: one feature column, a float32
    computation, rows 16-byte aligned, LSE_RUNS on and GROUP unset; and serves() then takes any
    mean length (a segment's tiles are shared out), where the workers stop at MAX_MEAN_ROWS."""

    class Adapter:
        kind = "cupy"

        def __init__(self, address):
            self.address = address

        def pointer(self, x):
            return self.address

        def device_of(self, x):
            return 0

        def is_c_contiguous(self, x):
            return True

    def x(*shape, itemsize=4):
        return type("X", (), {"shape": shape, "dtype": np.dtype(f"f{itemsize}")})()

    def by_runs(name, x, address, result, axis, m=1):
        return _softmax_kernel._by_runs(name, x, Adapter(address), result, axis, m)

    lse = "segmented_logsumexp"
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS_MIN_MEAN", 500)
    monkeypatch.setattr(_softmax_kernel, "SOFTMAX_RUNS_MIN_MEAN", 1000)
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS_MIN_MEAN_16BIT", 250)
    assert by_runs(lse, x(1_000), 256, "float32", 0)
    assert by_runs(lse, x(1_000), 256, "float32", 0, 2) and not by_runs(lse, x(1_000), 256, "float32", 0, 3)
    assert not by_runs(lse, x(1_000), 256, "float32", 0, 0)  # (no segments: nothing to launch)
    assert by_runs(lse, x(1_000, itemsize=2), 256, "float16", 0, 4) and not by_runs(lse, x(1_000, itemsize=2), 256,
                                                                                     "float16", 0, 5)  # fmt: skip
    assert by_runs(lse, x(1_000, 1), 256, "float32", 0)  # (a feature axis of 1)
    assert by_runs(lse, x(3, 1_000), 256, "float32", 1)  # (rows of 4,000 bytes)
    assert not by_runs(lse, x(3, 1_001), 256, "float32", 1)  # (rows of 4,004 bytes)
    assert not by_runs(lse, x(3, 1_004, itemsize=2), 256, "float16", 1)  # (2,008 bytes)
    assert by_runs(lse, x(3, 1_008, itemsize=2), 256, "float16", 1)
    assert by_runs(lse, x(1_000), 260, "float32", 0)  # (a slice x[1:]: read from the boundary before it)
    assert by_runs(lse, x(3, 1_000), 260, "float32", 1)  # (every row as far past a boundary)
    assert not by_runs(lse, x(1_000), 258, "float32", 0)  # (not aligned to its values)
    assert by_runs(lse, x(1_000, itemsize=2), 258, "float16", 0, 4)
    assert not by_runs(lse, x(1_000, itemsize=8), 260, "float32", 0)
    assert by_runs(lse, x(1_000, itemsize=8), 264, "float32", 0)
    assert not by_runs(lse, x(1_000, 2), 256, "float32", 0)
    assert not by_runs(lse, x(1_000), 256, "float64", 0)
    assert by_runs(lse, x(1_000, itemsize=8), 256, "float32", 0)  # (float64 data, dtype=float32)
    assert by_runs("segmented_softmax", x(1_000), 256, "float32", 0)  # (from the parts: softmax_from_parts)
    assert by_runs("segmented_log_softmax", x(1_000), 256, "float32", 0)
    assert not by_runs("segmented_softmax", x(1_000), 256, "float32", 0, 2)  # (SOFTMAX_RUNS_MIN_MEAN)
    assert by_runs("segmented_softmax", x(1_000, itemsize=2), 256, "float16", 0, 4)  # (16-bit: the same least)
    assert not by_runs("segmented_var", x(1_000), 256, "float32", 0) and not by_runs("segmented_std", x(1_000), 256,
                                                                                      "float32", 0)  # fmt: skip
    monkeypatch.setattr(_softmax_kernel, "GROUP", 2)
    assert not by_runs(lse, x(1_000), 256, "float32", 0)
    monkeypatch.setattr(_softmax_kernel, "GROUP", None)
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS", False)
    assert not by_runs(lse, x(1_000), 256, "float32", 0)
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS", True)
    monkeypatch.setattr(_softmax_kernel, "LSE_RUNS_MIN_MEAN", 2048)

    from linred.backends import nvrtc

    monkeypatch.setattr(linred.backends, "unavailable", lambda name: None)
    monkeypatch.setattr(nvrtc, "_compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(_softmax_kernel, "multiprocessors", lambda device: 132)
    rows = _softmax_kernel.MAX_MEAN_ROWS
    one = {"offsets": np.array([0, 4 * rows])}
    for name, result, served in ((lse, "float32", True), (lse, "float64", False), ("segmented_var", "float32", False)):
        assert _softmax_kernel.serves(name, x(4 * rows), Adapter(256), "float32", result, one, "auto", False,
                                      True) is served, name  # fmt: skip
    # the least size: smaller calls that the workers serve stay with them (64 segments of 4,096
    # values: few workers, each lane reading 128 values); those they do not serve come here
    monkeypatch.setattr(_softmax_kernel, "RUNS_MIN_VALUES", 1 << 25)
    small, large = x(64 * 4096), x(1 << 25)
    assert not _softmax_kernel._takes_runs(lse, small, Adapter(256), "float32", 0, {"segment_length": 4096}, 0)
    assert _softmax_kernel._takes_runs(lse, large, Adapter(256), "float32", 0, {"segment_length": 4096}, 0)
    assert _softmax_kernel._takes_runs(lse, small, Adapter(256), "float32", 0, {"segment_length": 64 * 4096}, 0)
    assert _softmax_kernel.serves(lse, x(4 * rows), Adapter(256), "float32", "float32", one, "auto", False, True)
    # the mean, from a length, the offsets' or the lengths' shape
    for segments, served in (({"segment_length": 2048}, True), ({"segment_length": 2047}, False),
                             ({"offsets": np.arange(0, 8193, 2048)}, True), ({"lengths": [2048] * 4}, True),
                             ({"lengths": [2048] * 5}, False)):  # fmt: skip
        assert _softmax_kernel._by_runs(lse, x(8192), Adapter(256), "float32", 0,
                                        _softmax_kernel.count(x(8192), 0, segments)) is served, segments  # fmt: skip


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_gpu_lse_runs_by_default_from_the_least_mean(kind, monkeypatch):
    """With the defaults (but the least size, RUNS_MIN_VALUES: these calls are small), warp_reduce
    reads logsumexp of segments of LSE_RUNS_MIN_MEAN rows or more on average (one of 300,000 among
    99 of 1..30, too: the mean decides), the workers' kernel shorter ones and the composition
    none; each right."""
    monkeypatch.setattr(_softmax_kernel, "RUNS_MIN_VALUES", 0)
    calls = []
    real = _softmax_kernel._runs
    monkeypatch.setattr(_softmax_kernel, "_runs", lambda *a, **k: calls.append(a[8]) or real(*a, **k))
    rng = np.random.default_rng(13)
    mean = _softmax_kernel.LSE_RUNS_MIN_MEAN
    lengths = np.r_[rng.integers(1, 31, 99), 300_000]
    for offsets, runs in ((np.arange(0, 64 * mean + 1, mean), True), (np.arange(0, 64 * mean, mean - 1), False),
                          (np.r_[0, np.cumsum(lengths)], True)):  # fmt: skip
        n = int(offsets[-1])
        x = (rng.normal(size=n) * 4).astype(np.float32)
        got = linred.segmented_logsumexp(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind))
        check(got, _lse_reference(x[None], offsets)[0], "float32", 2e-5)
        assert bool(calls) is runs and calls[-1:] in ([], [len(offsets) - 1])
        calls.clear()


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("spec", ["offsets", "offsets32", "lengths", "fixed"])
def test_gpu_softmax_from_parts(lse_runs, kind, name, dtype, spec):
    """softmax and log_softmax from warp_reduce's parts (softmax_from_parts): the offsets of
    test_gpu_lse_runs_tiling (every tiling boundary, a segment spanning runs, empty and short
    segments, NaN and infinities within and across tiles) over one row and a batch of 3 (axis 1),
    and a fixed length of 4,104; every value against float64 NumPy, NaN and infinities where the
    composition puts them."""
    if kind == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16")
    rng = np.random.default_rng(len(name) + len(spec))
    for batch in (1, 3):
        n = 300_000 if spec != "fixed" else 73 * 4_104  # (rows of whole 16-byte vectors: warp_reduce's)
        offsets = _lse_cuts(n, rng) if spec != "fixed" else np.arange(74, dtype=np.int64) * 4_104
        x = (rng.normal(size=(batch, n)) * 4).astype(np.float32)
        if spec != "fixed":
            _lse_specials(x, offsets)
        xd = x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        expected = _softmax_reference(xd.astype(np.float64), offsets, name == "log_softmax")
        if dtype == "bfloat16":
            data = torch.as_tensor(x if batch > 1 else x[0], device="cuda").bfloat16()
        else:
            data = _gpu_array(xd if batch > 1 else xd[0], kind)
        kwargs = {
            "offsets": {"offsets": _gpu_array(offsets, kind)},
            "offsets32": {"offsets": _gpu_array(offsets.astype(np.int32), kind)},
            "lengths": {"lengths": _gpu_array(np.diff(offsets), kind)},
            "fixed": {"segment_length": 4_104},
        }[spec]
        got = fn(name)(data, axis=int(batch > 1), **kwargs)
        assert tuple(got.shape) == tuple(data.shape)
        got64 = to_numpy(got.float() if dtype == "bfloat16" else got).astype(np.float64).reshape(batch, n)
        np.testing.assert_array_equal(np.isnan(got64), np.isnan(expected))
        np.testing.assert_array_equal(np.isneginf(got64), np.isneginf(expected))
        finite = np.isfinite(expected)
        tol = LSE_TOLERANCE[dtype]
        atol = tol * (1e-2 if name == "softmax" else 1)  # (softmax's values are at most 1)
        np.testing.assert_allclose(got64[finite], expected[finite], rtol=tol, atol=atol)
    assert [c[:2] for c in lse_runs] == [(1, n), (3, n)]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_gpu_softmax_from_parts_blocks_of_many_chunks(lse_runs, monkeypatch, kind, name):
    """A grid of 2 blocks (one SM, two blocks a SM), so that each block takes many consecutive
    chunks of THREADS * ITEMS values: its first thread finds a chunk's segments from the previous
    chunk's last one, anew at a new row of the batch (3 rows, axis 1); chunks inside one segment and
    across several, offsets that cross chunks at k * C - 1, k * C and k * C + 1."""
    monkeypatch.setattr(_softmax_kernel, "multiprocessors", lambda device: 1)
    monkeypatch.setattr(_softmax_kernel, "BLOCKS_PER_SM", 2)
    chunk = _softmax_kernel.PARTS_THREADS * _softmax_kernel.PARTS_ITEMS
    rng = np.random.default_rng(17)
    n = 41 * chunk + 1_000
    cuts = {k * chunk + d for k in (1, 2, 5, 6, 17, 40) for d in (-1, 0, 1)} | {3 * chunk + 5 * i for i in range(50)}
    offsets = np.array([0, *sorted([*cuts, 30 * chunk, 30 * chunk]), n], dtype=np.int64)  # (an empty segment)
    x = (rng.normal(size=(3, n)) * 4).astype(np.float32)
    got = fn(name)(_gpu_array(x, kind), offsets=_gpu_array(offsets, kind), axis=1)
    check(got, _softmax_reference(x, offsets, name == "log_softmax"), "float32", 2e-5)
    assert [c[:2] for c in lse_runs] == [(3, n)]
