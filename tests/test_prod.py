"""``segmented_prod``: what the differential suite does not pin down (its data is drawn near 1):
the empty segment, integer wrap-around, zeros and their gradients, the backends that refuse it."""

from __future__ import annotations

import numpy as np
import pytest
from support import HAS_GPU, to_kind, to_numpy

import linred


def test_empty_segments_and_specs(array_kind):
    x = to_kind(np.array([2.0, 3.0, 4.0, 0.5, -1.0, 7.0]), array_kind)
    np.testing.assert_array_equal(to_numpy(linred.segmented_prod(x, lengths=[2, 0, 3, 1])), [6.0, 1.0, -2.0, 7.0])
    np.testing.assert_array_equal(to_numpy(linred.segmented_prod(x, offsets=[0, 3, 3, 6])), [24.0, 1.0, -3.5])
    np.testing.assert_array_equal(to_numpy(linred.segmented_prod(x, 3)), [24.0, -3.5])
    np.testing.assert_array_equal(to_numpy(linred.segmented_prod(x, segment_ids=[1, 0, 1, 0, 1, 2])), [1.5, -8.0, 7.0])


def test_integers_wrap_around_as_numpy(array_kind):
    x = np.array([2**40, 2**40, 3, -(2**62), 5, 7], dtype=np.int64)
    got = to_numpy(linred.segmented_prod(to_kind(x, array_kind), lengths=[2, 2, 2]))
    with np.errstate(over="ignore"):
        expected = np.multiply.reduceat(x, [0, 2, 4])
    np.testing.assert_array_equal(got, expected)
    small = np.array([100, 100, 3], dtype=np.int8)  # accumulated in int64, as sums are
    assert to_numpy(linred.segmented_prod(to_kind(small, array_kind), 3)).tolist() == [30000]


def test_nan_inf_and_zero(array_kind):
    x = to_kind(np.array([np.inf, 0.0, np.nan, 2.0, -np.inf, 3.0]), array_kind)
    got = to_numpy(linred.segmented_prod(x, 2))
    assert np.isnan(got[0]) and np.isnan(got[1]) and got[2] == -np.inf


@pytest.mark.parametrize("spec", ["fixed", "lengths", "ids"])
def test_torch_gradient_with_zeros(spec):
    torch = pytest.importorskip("torch")
    values = [[1.5, 2.0, 0.0], [3.0, 4.0, 0.5], [0.0, 0.0, 2.0], [0.7, -1.2, 5.0]]
    x = torch.tensor(values, dtype=torch.float64).reshape(12).requires_grad_()
    kwargs = {"fixed": {"segment_length": 3}, "lengths": {"lengths": [3, 3, 3, 3]},
              "ids": {"segment_ids": torch.arange(12) // 3}}[spec]  # fmt: skip
    linred.segmented_prod(x, **kwargs).sum().backward()
    # d/dx_j of each segment's product: the product of the other elements
    expected = []
    for row in values:
        for j in range(3):
            expected.append(np.prod([v for k, v in enumerate(row) if k != j]))
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-14)
    y = torch.rand(12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: linred.segmented_prod(t, **kwargs), (y,))


@pytest.mark.parametrize("backend", ["nvmath", "cublas", "cub"])
def test_linear_algebra_backends_refuse_it(backend):
    if linred.available_backends()[backend] is not True:
        pytest.skip(f"{backend} is not available here (it would refuse for that reason first)")
    cupy = pytest.importorskip("cupy") if backend != "nvmath" else None
    x = np.arange(1.0, 7.0) if cupy is None else cupy.arange(1.0, 7.0)
    with pytest.raises(linred.BackendError, match=f"backend '{backend}'.*does not compute segmented_prod"):
        linred.segmented_prod(x, 3, backend=backend)


@pytest.mark.parametrize("backend", ["nvmath", "cublas", "cub"])
def test_the_refusal_names_the_backends_that_compute_it(monkeypatch, backend):
    """(Taken as available here, so that the reduction is what refuses.) The message names the
    backends that compute products, not the refusing backend's reductions, which listed max and
    min for the products with ones that refuse them."""
    from linred.backends import select

    monkeypatch.setattr(select, "unavailable", lambda name: None)
    with pytest.raises(linred.BackendError, match=r"does not compute segmented_prod \(numpy and nvrtc do\)$"):
        linred.segmented_prod(np.arange(1.0, 7.0), 3, backend=backend)


def test_complex_products_on_the_host():
    x = np.array([1 + 1j, 2 - 1j, 0.5j, 3.0])
    np.testing.assert_allclose(linred.segmented_prod(x, 2), [(1 + 1j) * (2 - 1j), 1.5j])


@pytest.mark.gpu
def test_complex_products_on_the_gpu_are_refused_naming_each_backend():
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    cupy = pytest.importorskip("cupy")
    x = cupy.asarray(np.array([1 + 1j, 2 - 1j], dtype=np.complex64))
    with pytest.raises(linred.BackendError, match=r"nvrtc: its kernels handle real and integer data.*cub: it does not"):
        linred.segmented_prod(x, 2)


def test_torch_complex_gradient_is_conjugated_as_torch_prod():
    torch = pytest.importorskip("torch")
    z = torch.tensor([1 + 2j, 3 - 1j, 0.5 + 0.5j, 2j], dtype=torch.complex128, requires_grad=True)
    (linred.segmented_prod(z, 2).abs() ** 2).sum().backward()
    w = z.detach().clone().requires_grad_()
    (w.view(2, 2).prod(1).abs() ** 2).sum().backward()
    torch.testing.assert_close(z.grad, w.grad)
    assert torch.autograd.gradcheck(lambda t: linred.segmented_prod(t, 2), (z.detach().clone().requires_grad_(),))


def test_torch_double_backward_with_one_zero_per_segment():
    torch = pytest.importorskip("torch")
    x = torch.tensor([2.0, 0.0, 3.0, 1.5, -2.0, 0.7], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: linred.segmented_prod(t, 3), (x,))
    (g,) = torch.autograd.grad(linred.segmented_prod(x, 3).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g[0], x)
    torch.testing.assert_close(h, torch.tensor([0.0, 3.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64))
