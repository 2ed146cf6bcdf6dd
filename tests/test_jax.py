"""JAX arrays in, JAX arrays out (DLPack, no copy of the input), against float64 NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import linred

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("spec", ["fixed", "offsets", "lengths", "jax offsets"])
@pytest.mark.parametrize("axis", [0, 1])
def test_jax_in_jax_out(reduction, spec, axis):
    rng = np.random.default_rng(1)
    host = rng.standard_normal((12, 5) if axis == 0 else (5, 12)).astype(np.float32)
    x = jnp.asarray(host)
    kwargs = {
        "fixed": {"segment_length": 4},
        "offsets": {"offsets": [0, 3, 3, 12]},
        "lengths": {"lengths": [3, 0, 9]},
        "jax offsets": {"offsets": jnp.asarray([0, 3, 3, 12])},
    }[spec]
    if spec != "fixed" and reduction in ("mean", "max", "min", "argmax", "argmin"):
        kwargs = {"offsets": [0, 3, 12]} if spec != "jax offsets" else {"offsets": jnp.asarray([0, 3, 12])}
    got = getattr(linred, f"segmented_{reduction}")(x, axis=axis, **kwargs)
    assert isinstance(got, jax.Array)
    assert got.devices() == x.devices()
    expected = getattr(linred, f"segmented_{reduction}")(host.astype(np.float64), axis=axis, **{
        k: np.asarray(v) for k, v in kwargs.items()
    })  # fmt: skip
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


def test_jax_remainder_and_refusals():
    x = jnp.arange(10.0)
    np.testing.assert_array_equal(np.asarray(linred.segmented_sum(x, 4, remainder="keep")), [6.0, 22.0, 17.0])
    with pytest.raises(TypeError, match=r"out cannot be given for JAX arrays"):
        linred.segmented_sum(x, 5, out=np.empty(2))
    with pytest.raises(TypeError, match=r"x is a JAX tracer"):
        jax.jit(lambda a: linred.segmented_sum(a, 5))(x)


@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "prod"])
def test_jax_results_that_are_views_come_back(reduction):
    """Unsorted ids with ``check=False`` along a later axis give a view of a larger buffer (the
    dropped ids' column), which JAX refused through DLPack: copied to compact strides first."""
    host = np.arange(8.0).reshape(2, 4)
    kwargs = {"segment_ids": [0, 0, 1, 5], "num_segments": 2, "check": False, "axis": 1}
    got = getattr(linred, f"segmented_{reduction}")(jnp.asarray(host), **kwargs)
    assert isinstance(got, jax.Array)
    expected = getattr(linred, f"segmented_{reduction}")(host, **kwargs)
    np.testing.assert_allclose(np.asarray(got), expected)
    columns = {"sum": [0, 1], "mean": [0, 1], "max": [0, 1], "min": [0, 1], "prod": [0, 1]}[reduction]
    want = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[reduction]
    first = want.reduce(host[:, columns], axis=1) / (2 if reduction == "mean" else 1)
    np.testing.assert_allclose(np.asarray(got)[:, 0], first)
    np.testing.assert_allclose(np.asarray(got)[:, 1], host[:, 2])


def _jax_gpu() -> object | None:
    try:
        return next(iter(jax.devices("gpu")), None)
    except RuntimeError:  # a JAX without CUDA
        return None


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "prod", "argmin"])
def test_jax_arrays_on_the_gpu_stay_there(reduction):
    """A JAX array on a CUDA GPU is reduced there (read as CuPy through DLPack) and comes back as
    a JAX array on that device; JAX offsets and segment ids cross the same way."""
    device = _jax_gpu()
    if device is None:
        pytest.skip("this JAX has no CUDA GPU")
    pytest.importorskip("cupy")
    rng = np.random.default_rng(5)
    host = rng.standard_normal((3000, 4)).astype(np.float32) * 0.1 + 1.0
    x = jax.device_put(jnp.asarray(host), device)
    offsets = np.array([0, 10, 10, 1500, 3000])
    ids = np.repeat(np.arange(4), np.diff(offsets))
    fn = getattr(linred, f"segmented_{reduction}")
    for kwargs in ({"offsets": jax.device_put(jnp.asarray(offsets), device)},
                   {"segment_ids": jax.device_put(jnp.asarray(ids), device), "num_segments": 4}):  # fmt: skip
        got = fn(x, **kwargs)
        assert isinstance(got, jax.Array) and got.devices() == {device}
        expected = fn(host.astype(np.float64), offsets=offsets)
        np.testing.assert_allclose(np.asarray(got), expected, rtol=3e-4, atol=1e-5)  # (prod: 1500 factors)
