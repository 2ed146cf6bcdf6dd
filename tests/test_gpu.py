"""GPU-only contract: streams, devices, device offsets, no TF32, no hidden synchronization, int64 indexing.

Everything here is marked ``gpu`` (skipped without a CUDA GPU); the > 2^31-element
tests are also ``slow``.  The numerical contract on CuPy arrays and CUDA tensors
runs in the other modules, parametrized by conftest.py.
"""

from __future__ import annotations

import contextlib
import itertools
import time

import numpy as np
import pytest
from support import (
    FUNCTIONS,
    GPU_BACKENDS,
    GPU_COUNT,
    GPU_KINDS,
    HAS_CUPY_GPU,
    HAS_TORCH_CUDA,
    REDUCTIONS,
    assert_reduction,
    check_refusal,
    run_or_refused,
    segment_bounds,
    to_kind,
    to_numpy,
)

import linred

pytestmark = pytest.mark.gpu

if HAS_CUPY_GPU:
    import cupy
if HAS_TORCH_CUDA:
    import torch

GPU_BACKEND_PARAMS = [*GPU_BACKENDS, "auto"]
needs_cupy = pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy with a GPU")
needs_torch_cuda = pytest.mark.skipif(not (HAS_TORCH_CUDA and HAS_CUPY_GPU), reason="needs torch with CUDA")


def test_gpu_backends_are_available():
    status = linred.available_backends()
    for name in ("nvmath", "cublas", "cub"):
        assert status[name] is True, f"{name}: {status[name]}"


# What each GPU backend must serve (the division of labour); refusing these is a failure.
MUST_SERVE = [
    ("nvmath", "sum", "float32", "fixed"),
    ("nvmath", "mean", "float32", "fixed"),
    ("nvmath", "sum", "float64", "fixed"),
    ("nvmath", "sum", "float16", "fixed"),
    ("nvmath", "sum", "complex64", "fixed"),
    ("cublas", "sum", "float32", "fixed"),
    ("cublas", "mean", "float32", "fixed"),
    ("cublas", "sum", "float64", "fixed"),
    ("cub", "sum", "int32", "fixed"),
    ("cub", "sum", "int32", "offsets"),
    ("cub", "sum", "float32", "offsets"),
    ("cub", "max", "float32", "offsets"),
    ("cub", "min", "int32", "fixed"),
]


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize(("name", "reduction", "dtype", "how"), MUST_SERVE)
def test_backend_serves_its_core_cases(kind, name, reduction, dtype, how, rng):
    x_np = (rng.integers(-50, 50, (4096, 2)) if dtype == "int32" else rng.uniform(-1, 1, (4096, 2))).astype(dtype)
    x = to_kind(x_np, kind)
    kwargs = {"segment_length": 64} if how == "fixed" else {"offsets": [0, 0, 100, 1000, 1000, 4096]}
    got = FUNCTIONS[reduction](x, backend=name, **kwargs)
    assert_reduction(got, reduction, x_np, segments=segment_bounds(4096, **kwargs), like=x)


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_host_backend_refuses_device_data(kind):
    x = to_kind(np.arange(12, dtype=np.float32), kind)
    with pytest.raises(linred.BackendError) as info:
        linred.segmented_sum(x, 4, backend="numpy")
    check_refusal(info.value, "numpy")


@pytest.fixture
def tf32_allowed(request):
    """Allow TF32 wherever a user can: CuPy's cuBLAS handle and torch's matmul flags."""
    cublas = cupy.cuda.cublas
    handle = cupy.cuda.device.get_cublas_handle()
    mode = cublas.getMathMode(handle)
    cublas.setMathMode(handle, getattr(cublas, "CUBLAS_TF32_TENSOR_OP_MATH", 3))
    if HAS_TORCH_CUDA:
        flags = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.set_float32_matmul_precision("medium")
    yield
    cublas.setMathMode(handle, mode)
    if HAS_TORCH_CUDA:
        torch.backends.cuda.matmul.allow_tf32 = flags[0]
        torch.set_float32_matmul_precision(flags[1])


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
def test_no_tf32(kind, backend, tf32_allowed):
    """float32 is accumulated in float32, never TF32, even where the user allowed TF32."""
    # 1 + 2^-11 needs 12 significant bits: TF32 (10) rounds it to 1; float32 sums 256 of them exactly
    x = to_kind(np.full((1024 * 256, 3), 1 + 2.0**-11, dtype=np.float32), kind)
    for reduction, value in (("sum", 256 + 2.0**-3), ("mean", 1 + 2.0**-11)):
        for layout in (x, x[:, 0]):  # with features and without
            got = run_or_refused(FUNCTIONS[reduction], layout, 256, backend=backend)
            expected = np.full(tuple(got.shape), value, dtype=np.float32)
            np.testing.assert_array_equal(to_numpy(got), expected, err_msg=f"{reduction} {tuple(layout.shape)}")


# ---------------------------------------------------------------------------
# Streams: the work must be ordered after what the user enqueued on the stream
# ---------------------------------------------------------------------------

_SPIN = r"""
extern "C" __global__ void linred_test_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


#: spin-loop cycles per second; approximate (H100 and H200 boost clocks are about 2 GHz)
CYCLES_PER_SECOND = 2e9


def _cupy_spin(stream, seconds: float) -> None:
    kernel = cupy.RawKernel(_SPIN, "linred_test_spin")
    with stream:
        kernel((1,), (1,), (np.int64(seconds * CYCLES_PER_SECOND),))


@contextlib.contextmanager
def _drained(stream):
    """``stream`` waited for when the block ends, however it ends: an array made by
    ``_late_ones_*`` is written by ``stream`` after 0.2 s, and one dropped before that (a
    refusal's skip leaves the test early) goes back to the memory pool of the current stream,
    whose next array (another test's data) the late ones would overwrite."""
    try:
        yield
    finally:
        stream.synchronize()


def _late_ones_cupy(shape, dtype, stream, seconds=0.2):
    """An array that becomes ones on ``stream`` only after ``seconds`` of GPU time (zeros before);
    use it inside ``_drained(stream)``."""
    x = cupy.zeros(shape, dtype=dtype)
    cupy.cuda.Device().synchronize()
    _cupy_spin(stream, seconds)
    with stream:
        x.fill(1)
    return x


def _late_ones_torch(shape, dtype, stream, seconds=0.2):
    """As ``_late_ones_cupy``, for PyTorch."""
    x = torch.zeros(shape, dtype=dtype, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(seconds * CYCLES_PER_SECOND))
        x.fill_(1)
    return x


SPECS = {"fixed": {"segment_length": 256}, "offsets": {"offsets": [0, 0, 256 * 100, 256 * 1024]}}


@needs_cupy
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("how", list(SPECS))
@pytest.mark.parametrize("way", ["current stream", "stream=Stream", "stream=int"])
def test_cupy_stream(backend, reduction, how, way):
    stream = cupy.cuda.Stream(non_blocking=True)
    with _drained(stream):
        x = _late_ones_cupy((256 * 1024,), cupy.float32, stream)
        fn = FUNCTIONS[reduction]
        if way == "current stream":
            with stream:
                got = run_or_refused(fn, x, backend=backend, **SPECS[how])
        else:
            handle = stream if way == "stream=Stream" else stream.ptr
            got = run_or_refused(fn, x, backend=backend, stream=handle, **SPECS[how])
    bounds = segment_bounds(256 * 1024, **SPECS[how])
    assert_reduction(got, reduction, np.ones(256 * 1024, np.float32), segments=bounds, like=x)


@needs_torch_cuda
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("how", list(SPECS))
@pytest.mark.parametrize("way", ["current stream", "stream=Stream", "stream=int"])
def test_torch_stream(backend, reduction, how, way):
    stream = torch.cuda.Stream()
    with _drained(stream):
        x = _late_ones_torch((256 * 1024,), torch.float32, stream)
        fn = FUNCTIONS[reduction]
        if way == "current stream":
            with torch.cuda.stream(stream):
                got = run_or_refused(fn, x, backend=backend, **SPECS[how])
        else:
            handle = stream if way == "stream=Stream" else stream.cuda_stream
            got = run_or_refused(fn, x, backend=backend, stream=handle, **SPECS[how])
    bounds = segment_bounds(256 * 1024, **SPECS[how])
    assert_reduction(got, reduction, np.ones(256 * 1024, np.float32), segments=bounds, like=x)


@needs_cupy
@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
def test_repeated_call_uses_the_current_stream(kind, backend):
    """A repeated fixed-length call (the fast path, which skips validation) runs on the stream
    current at that call, not the one of the call that planned it."""
    if kind == "torch" and not HAS_TORCH_CUDA:
        pytest.skip("needs torch with CUDA")
    n = 256 * 1024
    if kind == "cupy":
        stream = cupy.cuda.Stream(non_blocking=True)
        first = cupy.zeros(n, dtype=cupy.float32)
        x = _late_ones_cupy((n,), cupy.float32, stream)
        context = stream
    else:
        stream = torch.cuda.Stream()
        first = torch.zeros(n, dtype=torch.float32, device="cuda")
        x = _late_ones_torch((n,), torch.float32, stream)
        context = torch.cuda.stream(stream)
    with _drained(stream):
        run_or_refused(linred.segmented_sum, first, 256, backend=backend)  # plans on the default stream
        with context:
            got = run_or_refused(linred.segmented_sum, x, 256, backend=backend)
    assert_reduction(got, "sum", np.ones(n, np.float32), segments=segment_bounds(n, segment_length=256), like=x)


@needs_cupy
def test_cupy_stream_wrappers_follow_the_raw_handle():
    """The CuPy adapter's fill and ``on_stream``, and the GPU backends' stream cache, wrap a
    raw handle: their work is ordered after what was enqueued on that stream, the wrappers
    do not destroy the stream when dropped, and CuPy warns about none of it."""
    import gc
    import warnings

    from linred.arrays._cupy import CUPY, external_stream
    from linred.backends._device import cupy_stream, on_stream

    n = 1 << 20
    stream = cupy.cuda.Stream(non_blocking=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        x = _late_ones_cupy((n,), cupy.float32, stream)  # ones only after 0.2 s on the stream
        CUPY.fill(x, 3.0, stream.ptr)  # on another stream it would run before the ones
        stream.synchronize()
        assert float(x.sum()) == 3.0 * n
        x = _late_ones_cupy((n,), cupy.float32, stream)
        with CUPY.on_stream(stream.ptr, 0):
            assert cupy.cuda.get_current_stream().ptr == stream.ptr
            y = x * 2
        stream.synchronize()
        assert float(y.sum()) == 2.0 * n
        with on_stream(stream.ptr, 0):
            assert cupy.cuda.get_current_stream().ptr == stream.ptr
        assert external_stream(0, 0) == cupy.cuda.Stream.null  # handle 0: the legacy default stream
        for wrap in (cupy_stream, external_stream):
            wrapper = wrap(stream.ptr, 0)
            assert wrapper.ptr == stream.ptr
            del wrapper
            gc.collect()
            with stream:  # still a live stream
                x.fill(5)
            stream.synchronize()
            assert float(x.sum()) == 5.0 * n


@needs_cupy
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("how", ["fixed", "offsets unchecked"])
def test_no_hidden_synchronization(backend, reduction, how):
    """A planned call returns while the GPU is still busy on its stream (it only enqueues work)."""
    stream = cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(256 * 1024, dtype=cupy.float32)
    offsets = cupy.asarray([0, 0, 256 * 100, 256 * 1024])
    # Made on the current (legacy default) stream, which a non-blocking stream does not wait
    # for: without this the call could read them before they are written (with unchecked
    # offsets, out of bounds).
    cupy.cuda.get_current_stream().synchronize()
    kwargs = {"segment_length": 256} if how == "fixed" else {"offsets": offsets, "check": False}
    fn = FUNCTIONS[reduction]
    run_or_refused(fn, x, backend=backend, stream=stream, **kwargs)  # plan (and compile) outside the timing
    stream.synchronize()
    with _drained(stream):  # (x must outlive the spin and the call behind it)
        _cupy_spin(stream, 1.0)
        start = time.perf_counter()
        got = fn(x, backend=backend, stream=stream, **kwargs)
        elapsed = time.perf_counter() - start
    assert elapsed < 0.5, f"the call blocked for {elapsed:.2f} s: it synchronized with the busy stream"
    bounds = segment_bounds(256 * 1024, **{k: v for k, v in kwargs.items() if k != "check"})
    assert_reduction(got, reduction, np.ones(256 * 1024, np.float32), segments=bounds, like=x)


@needs_cupy
def test_stream_argument_types():
    x = cupy.ones(16, dtype=cupy.float32)
    with pytest.raises(TypeError, match=r"stream must be a CuPy or PyTorch stream, an object with __cuda_stream__"):
        linred.segmented_sum(x, 4, stream="default")
    with pytest.raises(TypeError, match=r"got bool"):
        linred.segmented_sum(x, 4, stream=True)

    class Foreign:  # the CUDA stream protocol
        def __cuda_stream__(self):
            return (0, cupy.cuda.get_current_stream().ptr)

    np.testing.assert_array_equal(cupy.asnumpy(linred.segmented_sum(x, 4, stream=Foreign())), [4, 4, 4, 4])


# ---------------------------------------------------------------------------
# Devices and device offsets
# ---------------------------------------------------------------------------


@pytest.mark.skipif(GPU_COUNT < 2, reason="needs two GPUs")
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
def test_second_device(backend):
    """Data on device 1 while device 0 is current: the result is on device 1 and right, and
    device 0 is still current after the call (planning too: the first call of each)."""
    with cupy.cuda.Device(1):
        x = cupy.arange(1, 13, dtype=cupy.float32)
    with cupy.cuda.Device(0):
        got = run_or_refused(linred.segmented_sum, x, 4, backend=backend)
        assert cupy.cuda.runtime.getDevice() == 0
        assert got.device.id == 1
        np.testing.assert_array_equal(cupy.asnumpy(got), [10, 26, 42])
        got = run_or_refused(linred.segmented_max, x, offsets=[0, 4, 12], backend=backend)
        assert cupy.cuda.runtime.getDevice() == 0
        assert got.device.id == 1
        np.testing.assert_array_equal(cupy.asnumpy(got), [4, 12])
        got = run_or_refused(linred.segmented_argmax, x, offsets=[0, 4, 12], backend=backend)
        assert cupy.cuda.runtime.getDevice() == 0
        assert got.device.id == 1
        np.testing.assert_array_equal(cupy.asnumpy(got), [3, 11])
    if HAS_TORCH_CUDA:
        torch.cuda.set_device(0)
        t = torch.arange(1, 13, dtype=torch.float32, device="cuda:1")
        got = run_or_refused(linred.segmented_sum, t, 4, backend=backend)
        assert torch.cuda.current_device() == 0
        assert got.device == t.device
        np.testing.assert_array_equal(got.cpu().numpy(), [10, 26, 42])
        got = run_or_refused(linred.segmented_mean, t.reshape(6, 2), offsets=[0, 1, 6], backend=backend)
        assert torch.cuda.current_device() == 0
        np.testing.assert_allclose(got.cpu().numpy(), [[1, 2], [7, 8]])


@pytest.mark.skipif(GPU_COUNT < 2, reason="needs two GPUs")
def test_offsets_on_another_device():
    with cupy.cuda.Device(1):
        x = cupy.arange(12, dtype=cupy.float32)
    with cupy.cuda.Device(0):
        offsets = cupy.asarray([0, 4, 12])
    with pytest.raises(ValueError, match=r"offsets is on CUDA device 0 but x is on CUDA device 1"):
        linred.segmented_sum(x, offsets=offsets)


@needs_torch_cuda
def test_offsets_of_another_library():
    """Offsets may be any array library's, on the data's device (or the host)."""
    x_cupy = cupy.arange(1, 13, dtype=cupy.float32)
    x_torch = torch.arange(1, 13, dtype=torch.float32, device="cuda")
    for x in (x_cupy, x_torch):
        for offsets in (
            torch.tensor([0, 4, 12], device="cuda"),
            cupy.asarray([0, 4, 12], dtype=cupy.int32),
            np.array([0, 4, 12], dtype=np.int64),
            torch.tensor([0, 4, 12]),
        ):
            got = linred.segmented_sum(x, offsets=offsets)
            assert type(got) is type(x)
            np.testing.assert_array_equal(to_numpy(got), [10, 68])


@needs_cupy
def test_device_offsets_for_host_data():
    x = np.arange(12, dtype=np.float32)
    with pytest.raises(TypeError, match=r"offsets is a device array but x is a host \(NumPy\) array"):
        linred.segmented_sum(x, offsets=cupy.asarray([0, 4, 12]))
    if HAS_TORCH_CUDA:
        with pytest.raises(TypeError, match=r"offsets is a (device array|CUDA tensor) but x is a host \(NumPy\) array"):
            linred.segmented_sum(x, offsets=torch.tensor([0, 4, 12], device="cuda"))
        with pytest.raises(TypeError, match=r"lengths is a CUDA tensor but x is a CPU tensor"):
            linred.segmented_sum(torch.arange(12.0), lengths=torch.tensor([4, 8], device="cuda"))


@needs_cupy
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
def test_bad_device_offsets_are_caught(backend):
    """check=True validates device offsets too (one reduction and one synchronization)."""
    x = cupy.arange(12, dtype=cupy.float32)
    with pytest.raises(ValueError, match=r"offsets must be non-decreasing: offsets\[2\]=4 < offsets\[1\]=8"):
        linred.segmented_sum(x, offsets=cupy.asarray([0, 8, 4, 12]), backend=backend)
    with pytest.raises(ValueError, match=r"lengths must be non-negative: lengths\[1\]=-2"):
        linred.segmented_sum(x, lengths=cupy.asarray([4, -2, 10]), backend=backend)


# ---------------------------------------------------------------------------
# int64 indexing: more than 2^31 elements, one segment longer than 2^31, more than 2^31 segments
# ---------------------------------------------------------------------------

BIG = 2**31 + 2**20  # elements: past int32 indexing, a multiple of 2^20


def _need_memory(nbytes: int) -> None:
    cupy.get_default_memory_pool().free_all_blocks()
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < nbytes * 1.1:
        pytest.skip(f"needs {nbytes / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")


@pytest.fixture
def free_gpu_memory():
    yield
    if HAS_CUPY_GPU:
        cupy.get_default_memory_pool().free_all_blocks()
    if HAS_TORCH_CUDA:
        torch.cuda.empty_cache()


@pytest.mark.slow
@needs_cupy
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("L", [2**20, BIG], ids=["L=2^20", "L=n"])
def test_more_than_2_31_elements(backend, dtype, L, free_gpu_memory):
    _need_memory(BIG * np.dtype(dtype).itemsize)
    x = cupy.ones(BIG, dtype=dtype)
    got = run_or_refused(linred.segmented_sum, x, L, backend=backend)
    assert got.shape == (BIG // L,)
    assert bool((got == L).all()), f"wrong sums: {cupy.unique(got)[:8]}"
    if dtype == "float32":
        got = run_or_refused(linred.segmented_max, x, L, backend=backend)
        assert bool((got == 1).all())


@pytest.mark.slow
@needs_cupy
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
def test_a_segment_longer_than_2_31(backend, free_gpu_memory):
    _need_memory(BIG)
    x = cupy.ones(BIG, dtype=cupy.int8)
    split = 2**31 + 5
    offsets = cupy.asarray([0, 3, split, split, BIG], dtype=cupy.int64)
    got = run_or_refused(linred.segmented_sum, x, offsets=offsets, backend=backend)
    np.testing.assert_array_equal(cupy.asnumpy(got), np.array([3, split - 3, 0, BIG - split], dtype=np.int64))
    got = run_or_refused(linred.segmented_mean, x, offsets=offsets, backend=backend)
    np.testing.assert_array_equal(cupy.asnumpy(got)[[0, 1, 3]], [1.0, 1.0, 1.0])


@pytest.mark.slow
@needs_cupy
@pytest.mark.parametrize("backend", ["cub", "auto"])
def test_more_than_2_31_segments(backend, free_gpu_memory):
    m = 2**31 + 2
    _need_memory(m * 2 + m * 8)
    x = cupy.ones(2 * m, dtype=cupy.bool_)
    got = run_or_refused(linred.segmented_sum, x, 2, backend=backend)
    assert got.shape == (m,) and got.dtype == cupy.int64
    assert bool((got == 2).all())
    del got
    got = run_or_refused(linred.segmented_max, x, 2, backend=backend)
    assert bool(got.all())


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("spec", ["fixed", "offsets"])
@pytest.mark.parametrize("where", ["data", "out"])
def test_feature_rows_at_a_misaligned_address(kind, spec, where):
    """Feature rows of whole 16-byte groups whose first row (or whose result's) is 4 bytes past a
    16-byte boundary: the feature kernels read and write them one feature at a time (16-byte
    loads or stores there would fault).  A slice such as x[:, 1:9] of float32 rows makes them."""
    rng = np.random.default_rng(3)
    n, d, L = 4000, 8, 40
    buf = rng.standard_normal(n * d + 1).astype(np.float32)
    x_host = buf[1:].reshape(n, d)
    off = np.arange(0, n + 1, L)
    want = x_host.astype(np.float64).reshape(n // L, L, d).sum(axis=1)
    x = to_kind(buf, kind)[1:].reshape(n, d) if where == "data" else to_kind(x_host.copy(), kind)
    out = None
    if where == "out":
        out = to_kind(np.zeros((n // L) * d + 1, np.float32), kind)[1:].reshape(n // L, d)
    kwargs = {"offsets": to_kind(off, kind)} if spec == "offsets" else {"segment_length": L}
    got = linred.segmented_sum(x, backend="nvrtc", out=out, **kwargs)
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), want, rtol=1e-5, atol=1e-4)


def _poison_pool(kind: str, sizes: set[int]) -> None:
    """Leave blocks of ``sizes`` bytes, filled with NaN, free in the array library's pool: the
    next allocations of those sizes on this stream get them back (the caching allocators reuse a
    freed block of the same rounded size first)."""
    blocks = []
    for nbytes in sizes:
        for _ in range(4):
            if kind == "cupy":
                blocks.append(cupy.full(-(-nbytes // 4), np.nan, dtype=cupy.float32))
            else:
                blocks.append(torch.full((-(-nbytes // 4),), float("nan"), device="cuda"))
    del blocks  # (freed in the order they were made, on the current stream)


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("how", ["fixed", "offsets", "offsets unchecked"])
@pytest.mark.parametrize(("dtype", "shape"), [("float32", (1, 997, 1)), ("float32", (3, 997, 1)),
                                              ("float32", (3, 997, 4)), ("float16", (3, 997, 1)),
                                              ("float64", (2, 997, 3))])  # fmt: skip
def test_result_does_not_depend_on_the_memory_it_lands_in(kind, backend, reduction, how, dtype, shape, rng):
    """BLAS's rule, beta = 0: the result (and any buffer a backend sums into) need not hold
    anything before the call.  A library that computes beta * C there turns a NaN left in the
    pool by an earlier array into a NaN result (0 * NaN); so the call runs right after the pool's
    blocks of its sizes were filled with NaN and freed."""
    x_np = rng.standard_normal(shape).astype(dtype)
    lengths = [0, 5, 300, 0, 1, 64, 2, 600, 25]  # sums to 997
    if how == "fixed":
        x_np = x_np[:, :990]
        spec, segments = {"segment_length": 9}, segment_bounds(990, segment_length=9)
    else:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        spec, segments = {"offsets": to_kind(offsets, kind)}, segment_bounds(997, offsets=offsets)
    x = to_kind(x_np, kind)
    fn = FUNCTIONS[reduction]
    check = how != "offsets unchecked"
    run_or_refused(fn, x, **spec, axis=1, check=check, backend=backend)  # (the plan made)
    m = len(segments)
    sizes = {shape[0] * m * shape[2] * s for s in (2, 4, 8)}
    for _ in range(3):
        _poison_pool(kind, sizes)
        got = fn(x, **spec, axis=1, check=check, backend=backend)
        assert_reduction(got, reduction, x_np, segments=segments, axis=1, like=x)


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("backend", GPU_BACKEND_PARAMS)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize(("batch", "features"), [(2, 1), (3, 1), (12, 1), (2, 4), (1, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("how", ["offsets", "fixed"])
def test_nan_and_inf_stay_in_their_segment_and_batch_slice(kind, backend, reduction, batch, features, dtype, how, rng):
    """A NaN or an infinity makes its own segment's result NaN or infinite, in its own slice of a
    batch, and no other (cuSPARSE's default SpMM of several column-major columns gave NaN as
    the last segment's sum of a column whose first element was NaN or infinite, on an H200):
    the pattern a variance's squared deviations made, each slice's first element, then random
    places."""
    lengths = [0, 717, 42, 0, 30, 43, 387, 0, 0, 0, 0, 128, 0, 122, 0, 0, 60, 147, 0, 86, 0, 29, 0, 691, 247, 0, 26]
    if how == "fixed":  # (105 segments of 26 rows: cuBLAS's and cuBLASLt's products)
        lengths = [26] * 105
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = int(offsets[-1])
    segments = segment_bounds(n, offsets=offsets)
    fn = FUNCTIONS[reduction]
    spec = {"segment_length": 26} if how == "fixed" else {"offsets": to_kind(offsets.astype(np.int32), kind)}
    for trial in range(5):
        x_np = rng.standard_normal((batch, n, features))
        if trial == 1:  # (each slice's first element: lanes past the last segment's end read it)
            x_np[:, 0] = np.inf
            x_np[-1, 0, 0] = np.nan
        elif trial == 0:
            # (the squares of x - mean where a segment is all -inf: NaN throughout)
            x_np[-1, offsets[17] : offsets[18]] = np.nan
            x_np[-1, offsets[23] + 125] = np.nan
            x_np[0, offsets[16] + 3] = np.nan
            x_np[0, offsets[23] + 662] = np.inf
        else:
            flat = x_np.reshape(-1)
            flat[rng.integers(0, flat.size, 4)] = rng.choice([np.nan, np.inf, -np.inf], 4)
        x_np = x_np.astype(dtype)
        x = to_kind(x_np, kind)
        got = run_or_refused(fn, x, **spec, axis=1, check=False, backend=backend)
        assert_reduction(got, reduction, x_np, segments=segments, axis=1, like=x)
        if batch > 1:  # slices apart, NaN between them (a leading dimension past n)
            padded = to_kind(np.full((batch, n + 5, features), np.nan, dtype=dtype), kind)
            padded[:, :n] = x
            got = run_or_refused(fn, padded[:, :n], **spec, axis=1, check=False, backend=backend)
            assert_reduction(got, reduction, x_np, segments=segments, axis=1, like=x)


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("backend", ["auto", "nvrtc"])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("layout", ["transposed", "batch", "sliced"])
@pytest.mark.parametrize("how", ["offsets", "fixed"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("columns", ["long", "short"])
def test_feature_columns_that_are_not_contiguous_are_served(kind, backend, reduction, layout, how, dtype, columns, rng):
    """Feature columns that are not contiguous (a transposed tensor, a batch stored feature-major,
    every other column) are reduced in place by tile_reduce, each column a row of its own, for
    every reduction (before, products, and means and maxima of the 3-D layouts, were refused).
    Columns shorter than a quarter of a tile go to another backend where one serves them, and
    to nvrtc where none does (means and integer sums of the 3-D layouts were refused)."""
    lengths = [0, 700, 42, 0, 3, 2049, 1, 0, 300] if columns == "long" else [0, 70, 4, 0, 3, 205, 1, 0, 30]
    if how == "fixed":
        lengths = [37] * (61 if columns == "long" else 8)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n, d = int(offsets[-1]), 6
    spec = {"segment_length": 37} if how == "fixed" else {"offsets": to_kind(offsets, kind)}
    values = rng.standard_normal((3, n, d)) if dtype == "float32" else rng.integers(-9, 10, (3, n, d))
    if reduction == "prod":  # (values near one: products of thousands of them stay finite)
        values = 1 + 0.001 * values if dtype == "float32" else np.where(rng.random((3, n, d)) < 0.002, -1, 1)
    x_np = values.astype(dtype)
    axis = 1
    if layout == "transposed":  # (n, d) with each feature column contiguous
        x_np, axis = x_np[0], 0
        x = to_kind(np.ascontiguousarray(x_np.T), kind).T
    elif layout == "batch":  # (3, n, d) stored as (d, 3, n)
        stored = to_kind(np.ascontiguousarray(x_np.transpose(2, 0, 1)), kind)
        x = stored.permute(1, 2, 0) if kind.startswith("torch") else stored.transpose(1, 2, 0)
    else:  # every other column of (3, n, 2d)
        buf = np.zeros((3, n, 2 * d), dtype=dtype)
        buf[..., ::2] = x_np
        x = to_kind(buf, kind)[..., ::2]
    got = getattr(linred, f"segmented_{reduction}")(x, **spec, axis=axis, backend=backend)
    if reduction != "prod":
        assert_reduction(got, reduction, x_np, segments=segment_bounds(n, offsets=offsets), axis=axis, like=x)
        return
    # (products: the float64 product of each segment; float32 near one within 3 * L * eps)
    moved = np.moveaxis(x_np.astype(np.float64), axis, 0)
    ref = np.stack([moved[a:b].prod(axis=0) for a, b in segment_bounds(n, offsets=offsets)])
    res = np.moveaxis(to_numpy(got), axis, 0).astype(np.float64)
    if dtype == "int32":
        np.testing.assert_array_equal(res, ref)
    else:
        np.testing.assert_allclose(res, ref, rtol=3 * max(lengths) * np.finfo(np.float32).eps)


def _segment_reference(name: str, x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """float64 NumPy: each function of a 1-D ``x`` cut at ``bounds`` (no empty segments)."""
    parts = [x[a:b].astype(np.float64) for a, b in itertools.pairwise(bounds.tolist())]
    if name in ("softmax", "log_softmax"):
        out = []
        for p in parts:
            z = p - p.max()
            lse = np.log(np.exp(z).sum())
            out.append(np.exp(z - lse) if name == "softmax" else z - lse)
        return np.concatenate(out)
    ops = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "var": np.var, "std": np.std,
           "logsumexp": lambda p: p.max() + np.log(np.exp(p - p.max()).sum()), "argmax": np.argmax,
           "argmin": np.argmin}  # fmt: skip
    return np.array([ops[name](p) for p in parts])


@pytest.mark.skipif(GPU_COUNT < 2, reason="needs two GPUs")
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("size", ["small", "long"])
def test_every_function_on_the_second_device(kind, size, rng):
    """Data and offsets on device 1 while device 0 is current: every function's result is on
    device 1 and right (checked, unchecked, by lengths, by sorted ids), the current device is still 0 after
    each call, bad offsets raise the documented ValueError, and torch's gradients land on
    device 1.  ``long``: 2^22 values with one segment of 319,564 rows among short ones (a
    checked call lists it on the data's device)."""
    if size == "small":
        lengths = rng.integers(1, 40, 500)
    else:
        lengths = rng.integers(1, 30, (1 << 22) // 16)
        lengths[777] = 319_564
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(bounds[-1])
    x_np = rng.standard_normal(n).astype(np.float32)

    def current() -> tuple[int, ...]:
        devices = (cupy.cuda.runtime.getDevice(),)
        return devices + ((torch.cuda.current_device(),) if HAS_TORCH_CUDA else ())

    with cupy.cuda.Device(1):
        x = to_kind(x_np, kind)
        offsets = to_kind(bounds, kind)
        lens = to_kind(lengths.astype(np.int64), kind)
        ids = to_kind(np.repeat(np.arange(len(lengths)), lengths), kind)
    if kind == "torch-cuda":
        x, offsets, lens, ids = x.to("cuda:1"), offsets.to("cuda:1"), lens.to("cuda:1"), ids.to("cuda:1")
    specs = ({"offsets": offsets}, {"offsets": offsets, "check": False}, {"lengths": lens},
             {"segment_ids": ids, "num_segments": len(lengths)}, {"segment_ids": ids})  # fmt: skip
    with cupy.cuda.Device(0):
        if HAS_TORCH_CUDA:
            torch.cuda.set_device(0)
        names = ("sum", "mean", "max", "min", "var", "std", "logsumexp", "softmax", "log_softmax", "argmax", "argmin")
        for name in names:
            fn = getattr(linred, f"segmented_{name}")
            expected = _segment_reference(name, x_np, bounds)
            for spec in specs:
                got = fn(x, **spec)
                assert current() == (0,) * len(current()), (name, spec)
                if kind == "cupy":
                    assert got.device.id == 1
                else:
                    assert got.device == torch.device("cuda:1")
                res = to_numpy(got)
                if name.startswith("arg"):
                    np.testing.assert_array_equal(res, expected + bounds[:-1], err_msg=name)
                else:
                    atol = 1e-9 if name == "softmax" else 2e-5  # (softmax values of the long segment: 3e-6)
                    np.testing.assert_allclose(res, expected, rtol=2e-5, atol=atol, err_msg=name)
        bad = bounds.copy()
        bad[3] = bad[2] - 1  # segment 2 ends before it starts
        with cupy.cuda.Device(1):
            bad_dev = to_kind(bad, kind)
        if kind == "torch-cuda":
            bad_dev = bad_dev.to("cuda:1")
        for name in ("sum", "softmax", "argmax"):
            with pytest.raises(ValueError, match=r"offsets"):
                getattr(linred, f"segmented_{name}")(x, offsets=bad_dev)
            assert current() == (0,) * len(current())
        if kind == "torch-cuda":
            for name in ("sum", "softmax"):
                leaf = x.detach().clone().requires_grad_(True)
                getattr(linred, f"segmented_{name}")(leaf, offsets=offsets).square().sum().backward()
                assert leaf.grad.device == torch.device("cuda:1")
                assert torch.isfinite(leaf.grad).all()
            assert current() == (0,) * len(current())


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_result_of_a_named_stream_is_that_streams_memory(kind):
    """A result of a call on a busy ``stream=`` dropped before that stream is done goes back to
    that stream's pool: an array made next on the current stream is not where the call writes
    (the result used to be allocated on the current stream, and such an array got its memory
    and the call's late sums)."""
    n, L = 1 << 20, 4
    if kind == "cupy":
        stream = cupy.cuda.Stream(non_blocking=True)
        x = cupy.ones(n, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        fill = lambda: cupy.full(n // L, 7.0, dtype=cupy.float32)
        handle = stream
    else:
        stream = torch.cuda.Stream()
        x = torch.ones(n, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        fill = lambda: torch.full((n // L,), 7.0, dtype=torch.float32, device="cuda")
        handle = stream
    linred.segmented_sum(x, L, stream=handle)  # (planned and compiled outside the test)
    stream.synchronize()
    for _ in range(3):
        with _drained(stream):
            if kind == "cupy":
                _cupy_spin(stream, 0.2)
            else:
                with torch.cuda.stream(stream):
                    torch.cuda._sleep(int(0.2 * CYCLES_PER_SECOND))
            y = linred.segmented_sum(x, L, stream=handle)
            del y  # before the stream gets to it
            z = fill()  # on the current stream
        np.testing.assert_array_equal(to_numpy(z), np.full(n // L, 7.0, np.float32))


@needs_cupy
@pytest.mark.parametrize("backend", ["nvrtc"])  # (nvmath allocates on its first call's stream, here the other one)
def test_a_dropped_plan_orders_its_scratch_after_its_last_call(backend):
    """A plan dropped from the functions' cache whose last call still runs on another stream
    makes the stream it was planned on (whose memory pool its scratch buffers go back to, and
    where the next array could otherwise take them while that call writes them) wait for that
    call; the host does not wait."""
    import gc

    x = cupy.random.random(1 << 22, dtype=cupy.float64)  # (nvmath sums long float32 rows less accurately)
    offsets = cupy.asarray([0, 5, 1 << 21, (1 << 22) - 3, 1 << 22])
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    linred.clear_plan_cache()
    run_or_refused(linred.segmented_sum, x, offsets=offsets, check=False, stream=stream, backend=backend)
    stream.synchronize()
    with _drained(stream):
        _cupy_spin(stream, 0.5)
        linred.segmented_sum(x, offsets=offsets, check=False, stream=stream, backend=backend)
        start = time.perf_counter()
        linred.clear_plan_cache()
        gc.collect()
        waited = time.perf_counter() - start
        marker = cupy.cuda.Event(disable_timing=True)
        marker.record()  # on the current stream, where the plan was made
        behind = not marker.done
    assert waited < 0.2, f"the host waited {waited:.3f} s for the dropped plan's last call"
    assert behind, "the current stream did not wait for the dropped plan's last call on the other stream"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy and a GPU")
def test_executors_sharing_a_kernel_with_other_shared_memory():
    """Feature-row problems whose features_split launches differ in threads (and so in shared
    memory) share one compiled kernel: planned in either order and called again after the other,
    each launches and is right (a later executor with less shared memory lowered the kernel's
    allowance, and the earlier one's launch failed with CUDA_ERROR_INVALID_VALUE)."""
    rng = np.random.default_rng(0)
    cases = []
    for n, m in ((255, 7), (70_001, 1_000), (5_000, 40), (100_000, 3_000)):
        x = rng.standard_normal((n, 3))
        offsets = np.linspace(0, n, m + 1).astype(np.int64)
        want = np.stack([x[a:b].min(0) for a, b in itertools.pairwise(offsets)])
        cases.append((cupy.asarray(x), cupy.asarray(offsets), want))
    for order in ([0, 1, 0], [1, 0, 1], [2, 3, 2, 0, 1, 0]):
        linred.clear_plan_cache()
        for i in order:
            x, offsets, want = cases[i]
            got = linred.segmented_min(x, offsets=offsets, backend="nvrtc")
            np.testing.assert_array_equal(cupy.asnumpy(got), want)
    linred.clear_plan_cache()
