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


def test_jax_64_bit_results_without_x64():
    """With JAX's 64-bit types off (its default), a result JAX would truncate is refused (the
    int64 sum of int32 data: 2**32 would come back as 0), positions come back as int32 (as
    jnp.argmax gives them), and a 32-bit dtype= is served; with them on, the int64 result."""
    if jax.config.read("jax_enable_x64"):
        pytest.skip("JAX's 64-bit types are on in this process")
    big = jnp.asarray([2**30] * 4, dtype=jnp.int32)
    with pytest.raises(TypeError, match=r"int64, which JAX with 64-bit types disabled"):
        linred.segmented_sum(big, 4)
    with pytest.raises(TypeError, match=r"float64, which JAX with 64-bit types disabled"):
        linred.segmented_mean(jnp.arange(4), 2)
    np.testing.assert_array_equal(np.asarray(linred.segmented_sum(big, 4, dtype="float32")), [2.0**32])
    np.testing.assert_array_equal(np.asarray(linred.segmented_mean(jnp.arange(4), 2, dtype="float32")), [0.5, 2.5])
    # (complex64 is two 4-byte parts: JAX keeps it without 64-bit types)
    got = linred.segmented_sum(jnp.asarray(np.arange(6, dtype=np.complex64)), 3)
    assert got.dtype == jnp.complex64
    np.testing.assert_array_equal(np.asarray(got), [3, 12])
    for name, expected in (("argmax", [2, 3]), ("argmin", [0, 5])):  # (positions along the axis)
        got = getattr(linred, f"segmented_{name}")(jnp.asarray([1.0, 2.0, 3.0, 6.0, 5.0, 4.0]), 3)
        assert got.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(got), expected)
    try:
        jax.config.update("jax_enable_x64", True)
        got = linred.segmented_sum(jnp.asarray([2**30] * 4, dtype=jnp.int32), 4)
        assert got.dtype == jnp.int64 and int(got[0]) == 2**32
    finally:
        jax.config.update("jax_enable_x64", False)


def test_jax_results_stay_on_the_inputs_cpu_device():
    """A JAX array on a second CPU device (XLA's forced host devices) gets its result there, for
    the reductions, the fused functions, the positions and segment ids (DLPack names every host
    array's device as the CPU, which JAX reads as its first)."""
    import subprocess
    import sys

    code = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np, linred
second = jax.devices("cpu")[1]
x = jax.device_put(jnp.arange(6.0), second)
for got in (linred.segmented_sum(x, 3), linred.segmented_softmax(x, 3), linred.segmented_argmax(x, 3),
            linred.segmented_var(x, offsets=[0, 2, 6]), linred.segmented_max(x, segment_ids=[0, 1, 0, 1, 1, 0],
                                                                             num_segments=2)):
    assert got.devices() == {second}, got.devices()
np.testing.assert_array_equal(np.asarray(linred.segmented_sum(x, 3)), [3.0, 12.0])
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


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
