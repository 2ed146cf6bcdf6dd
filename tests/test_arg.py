"""segmented_argmax / argmin of host data (linred._arg): the composition and, for wide rows,
the loop over segments (host_first), each against positions found by NumPy segment by segment:
ties, NaN (the first NaN where a segment holds one), empty segments, batches, CPU tensors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support import HAS_TORCH, to_kind, to_numpy

import linred
from linred import _arg

KINDS = ["numpy", "torch-cpu"] if HAS_TORCH else ["numpy"]


def _expected(which: str, x: np.ndarray, offsets: np.ndarray, axis: int) -> np.ndarray:
    pick = np.argmax if which == "argmax" else np.argmin
    moved = np.moveaxis(x, axis, -1)
    n = moved.shape[-1]
    out = np.empty((*moved.shape[:-1], len(offsets) - 1), dtype=np.int64)
    for s, (a, b) in enumerate(itertools.pairwise(offsets)):
        out[..., s] = n if a == b else a + pick(moved[..., a:b], axis=-1)
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "uint8", "bool"])
@pytest.mark.parametrize(
    ("shape", "axis", "segments", "loop"),
    [
        ((1024, 16), 0, 16, True),  # 1,024 elements a segment, 16 features: the loop
        ((1023, 16), 0, 16, False),  # 1,023: the composition
        ((4000, 15), 0, 8, False),  # 15 features: the composition at any length
        ((2, 500, 40), 1, 12, True),  # a batch along axis 1
        ((300, 4, 8), 0, 5, True),  # features of two axes (4 x 8)
    ],
)
def test_host_positions(monkeypatch, rng, kind, which, dtype, shape, axis, segments, loop):
    taken = []
    real = _arg.host_first
    monkeypatch.setattr(_arg, "host_first", lambda *a: taken.append(r := real(*a)) or r)
    x = rng.integers(0, 4, shape).astype(dtype)  # many ties
    if dtype.startswith("float"):
        x.reshape(-1)[rng.integers(0, x.size, 30)] = np.nan
    n = shape[axis]
    cuts = np.sort(rng.integers(1, n, segments - 3))
    offsets = np.concatenate([[0, 0], cuts, [n, n]])  # empty first and last segments
    assert len(offsets) - 1 == segments
    got = getattr(linred, f"segmented_{which}")(to_kind(x, kind), offsets=offsets, axis=axis)
    assert (taken[0] is not None) == loop
    assert got.dtype == np.int64 if kind == "numpy" else str(got.dtype) == "torch.int64"
    np.testing.assert_array_equal(to_numpy(got), _expected(which, x, offsets, axis))


@pytest.mark.parametrize("spec", ["lengths", "fixed"])
def test_host_positions_of_lengths_and_fixed_lengths(rng, spec):
    x = rng.integers(0, 3, (2048, 32)).astype(np.float32)
    if spec == "fixed":
        got = linred.segmented_argmin(x, 256)
        offsets = np.arange(0, 2049, 256)
    else:
        lengths = np.array([0, 700, 0, 1000, 348, 0])
        got = linred.segmented_argmin(x, lengths=lengths)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
    np.testing.assert_array_equal(got, _expected("argmin", x, offsets, 0))


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_host_positions_of_a_tensor_that_requires_grad(rng):
    import torch

    x = torch.tensor(rng.standard_normal((2000, 64)), requires_grad=True)
    got = linred.segmented_argmax(x, offsets=[0, 900, 2000])
    np.testing.assert_array_equal(got.numpy(), _expected("argmax", x.detach().numpy(), np.array([0, 900, 2000]), 0))


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("which", ["max", "min"])
def test_host_positions_of_bfloat16_tensors(rng, which):
    """bfloat16 CPU tensors of wide rows (the loop over segments reads them through ml_dtypes'
    type: Tensor.numpy() refuses bfloat16), for the arg-reduction and for max/min's backward."""
    import torch

    values = rng.integers(0, 4, (2048, 16)).astype(np.float32)  # many ties, exact in bfloat16
    values[rng.integers(0, 2048, 5), rng.integers(0, 16, 5)] = np.nan
    x = torch.tensor(values, dtype=torch.bfloat16)
    offsets = np.array([0, 0, 1024, 2048])
    expected = _expected(f"arg{which}", values, offsets, 0)
    got = getattr(linred, f"segmented_arg{which}")(x, offsets=offsets)
    np.testing.assert_array_equal(got.numpy(), expected)
    leaf = x.clone().requires_grad_(True)
    getattr(linred, f"segmented_{which}")(leaf, offsets=offsets).sum().backward()
    grad = np.zeros((2048, 16), np.float32)
    for s in (1, 2):  # each non-empty segment's first extreme gets 1
        grad[expected[s], np.arange(16)] = 1
    np.testing.assert_array_equal(leaf.grad.float().numpy(), grad)


@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
@pytest.mark.parametrize("which", ["argmax", "argmin"])
def test_unsigned_torch_tensors(dtype, which):
    """uint16/32/64 CPU tensors, which PyTorch's 1-D index_select does not take: the arg-reductions
    (every spec) and reductions by unsorted ids, against NumPy on the same values."""
    import torch

    rng = np.random.default_rng(3)
    xn = rng.integers(0, 2**16 - 1, 40).astype(dtype)
    xn[:4] = np.iinfo(dtype).max  # (values that a signed view of the bits would read as negative)
    x = torch.from_numpy(xn)
    offsets = np.array([0, 7, 7, 20, 40])
    expected = _expected(which, xn, offsets, 0)
    fn = getattr(linred, f"segmented_{which}")
    for spec in ({"offsets": offsets}, {"lengths": np.diff(offsets)}):
        np.testing.assert_array_equal(fn(x, **spec).numpy(), expected)
    np.testing.assert_array_equal(fn(x, 8).numpy(), _expected(which, xn, np.arange(0, 41, 8), 0))
    ids = rng.permutation(np.repeat(np.arange(4), 10))
    sums = linred.segmented_sum(x, segment_ids=ids).numpy()
    np.testing.assert_array_equal(sums, [xn[ids == k].astype(np.uint64).sum() for k in range(4)])
    extremes = getattr(linred, f"segmented_{which[3:]}")(x, segment_ids=ids).numpy()
    np.testing.assert_array_equal(extremes, [getattr(np, which[3:])(xn[ids == k]) for k in range(4)])
    first = fn(x, segment_ids=ids).numpy()
    np.testing.assert_array_equal(first, [np.flatnonzero(ids == k)[getattr(np, which)(xn[ids == k])] for k in range(4)])


@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
@pytest.mark.parametrize("which", ["argmax", "argmin"])
def test_tensor_with_a_negative_bit(which):
    """A CPU tensor with the negative bit set (``z.conj().imag``), wide enough rows for the host's
    loop over segments: served (by the composition), with NumPy's first extremes of its values."""
    import torch

    z = torch.randn(2048, 16, dtype=torch.complex64, generator=torch.Generator().manual_seed(4))
    x = z.conj().imag
    assert x.is_neg()
    xn = -z.imag.numpy()
    got = getattr(linred, f"segmented_{which}")(x, 1024).numpy()
    np.testing.assert_array_equal(got, _expected(which, xn, np.array([0, 1024, 2048]), 0))
