"""check=True on the GPU: offsets and lengths tested on the device in one pass, with the host's messages.

Every verdict is compared with the NumPy (host) check of the same values: a valid call
gives the float64 reference's result, an invalid one raises the host's exact message.
The kernel is a grid-stride loop of 256-thread blocks, at most 8192 of them: the sizes
cross the block (256) and grid (2^21 offsets) boundaries, and the broken offset sits at
the first, last and boundary positions.
"""

from __future__ import annotations

import itertools
import re
import threading

import numpy as np
import pytest
from support import GPU_KINDS, to_kind, to_numpy

import linred

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_KINDS, reason="needs a GPU (CuPy)")]

BLOCK = 256
GRID = 8192 * BLOCK


def _host_message(x: np.ndarray, **kwargs) -> str | None:
    """The host check's message for these segments, or None when they are valid."""
    try:
        linred.segmented_sum(x, **kwargs)
    except ValueError as e:
        return str(e)
    return None


def _index(values: np.ndarray, kind: str, dtype: str):
    return to_kind(np.asarray(values, dtype=dtype), kind)


def _call(kind: str, x: np.ndarray, **kwargs):
    return linred.segmented_sum(to_kind(x, kind), **kwargs)


def _reference(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return np.array([x[a:b].astype(np.float64).sum() for a, b in itertools.pairwise(offsets)])


def _offsets(m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    cuts = np.sort(rng.integers(0, n + 1, m - 1))
    return np.concatenate([[0], cuts, [n]]).astype(np.int64)


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("count", [1, BLOCK - 1, BLOCK, BLOCK + 1, GRID - 1, GRID, GRID + 1])
def test_valid_offsets_pass_and_broken_ones_raise_the_host_message(kind, dtype, count):
    """``count`` offsets (m = count - 1 segments); each rule broken at the edges of blocks and grid."""
    rng = np.random.default_rng(count)
    m = max(count - 1, 0)
    n = 3 * count + 5
    x = rng.standard_normal(n).astype(np.float32)
    good = _offsets(m, n, rng) if m else np.array([n if n == 0 else 0], np.int64)
    if m == 0:  # a single offset: valid only for an empty axis
        x, n, good = x[:0], 0, np.array([0], np.int64)
    got = _call(kind, x, offsets=_index(good, kind, dtype))
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), _reference(x, good), rtol=1e-5, atol=1e-4)

    breaks = {0, 1, BLOCK - 1, BLOCK, BLOCK + 1, GRID - 1, GRID, m - 1, m}
    for at in sorted(i for i in breaks if 0 <= i <= m):
        bad = good.copy()
        bad[at] = good[at] - 1 if at else 1  # below its left neighbour (or 0 -> 1 at the start)
        if at and at < m and bad[at] >= bad[at - 1]:
            bad[at] = bad[at - 1] - 1
        expected = _host_message(x, offsets=bad.astype(dtype))
        assert expected is not None, (at, bad[max(at - 1, 0) : at + 2])
        with pytest.raises(ValueError, match=re.escape(expected)):
            _call(kind, x, offsets=_index(bad, kind, dtype))
    past = good.copy()
    past[-1] = n + 1
    with pytest.raises(ValueError, match=re.escape(_host_message(x, offsets=past.astype(dtype)))):
        _call(kind, x, offsets=_index(past, kind, dtype))


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_lengths_checked_on_the_device_raise_the_host_message(kind, dtype):
    rng = np.random.default_rng(7)
    for m in (1, BLOCK - 1, BLOCK, BLOCK + 1, 5000):
        lengths = rng.integers(0, 9, m)
        n = int(lengths.sum())
        x = rng.standard_normal(n).astype(np.float32)
        got = _call(kind, x, lengths=_index(lengths, kind, dtype))
        off = np.concatenate([[0], np.cumsum(lengths)])
        np.testing.assert_allclose(to_numpy(got).astype(np.float64), _reference(x, off), rtol=1e-5, atol=1e-4)
        for at in sorted({0, m // 2, m - 1}):
            for value in (-1, lengths[at] + 1):
                bad = lengths.copy()
                bad[at] = value
                expected = _host_message(x, lengths=bad.astype(dtype))
                with pytest.raises(ValueError, match=re.escape(expected)):
                    _call(kind, x, lengths=_index(bad, kind, dtype))


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("backend", ["auto", "nvrtc", "cub"])
def test_strided_offsets_are_read_as_their_values(kind, backend):
    """A strided view of offsets (every other element) is read by value, not as raw memory."""
    if backend != "auto" and backend not in linred.available_backends():
        pytest.skip(f"{backend} is not available")
    rng = np.random.default_rng(3)
    n, m = 10_000, 300
    x = rng.standard_normal((n, 4)).astype(np.float32)
    off = _offsets(m, n, rng)
    spread = _index(np.repeat(off, 2), kind, "int64")[::2]
    for check in (True, False):
        for _ in range(2):  # a planned call, then the cached plan
            got = linred.segmented_sum(to_kind(x, kind), offsets=spread, backend=backend, check=check)
            want = np.stack([_reference(x[:, j], off) for j in range(4)], axis=1)
            np.testing.assert_allclose(to_numpy(got).astype(np.float64), want, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif("cupy" not in GPU_KINDS, reason="needs CuPy")
def test_check_runs_on_the_calls_stream():
    """Offsets written on a stream just before the call are the ones checked (stream order)."""
    import cupy

    n = 1 << 20
    x = cupy.ones(n, cupy.float32)
    cupy.cuda.get_current_stream().synchronize()  # (x is used on a stream that does not wait for this one)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(20):
            off = cupy.linspace(0, n, 257).astype(cupy.int64)  # made on `stream`, not yet run
            if i % 2:
                off[100] = off[101] + 1  # broken on the stream
            call = lambda o=off: linred.segmented_sum(x, offsets=o, stream=stream)
            if i % 2:
                with pytest.raises(ValueError, match=r"offsets must be non-decreasing: offsets\[101\]"):
                    call()
            else:
                assert float(call().sum()) == n


@pytest.mark.skipif("cupy" not in GPU_KINDS, reason="needs CuPy")
@pytest.mark.parametrize(
    "shape, backend",
    [((1 << 16,), "auto"), ((1 << 14, 8), "nvrtc")],
    ids=["one column: the check kernel", "feature rows: checked by the reduction kernel (test_kernel_checks)"],
)
def test_threads_check_their_own_offsets(shape, backend):
    """Each thread has its own verdict word: concurrent valid and broken calls get their own answers."""
    import cupy

    n = shape[0]
    errors: list[str] = []

    def work(seed: int) -> None:
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            x = cupy.ones(shape, cupy.float32)
            good = cupy.linspace(0, n, 65).astype(cupy.int64)
            bad = good.copy()
            bad[10] = n + 1
            for i in range(100):
                broken = (i + seed) % 3 == 0
                try:
                    r = linred.segmented_sum(x, offsets=bad if broken else good, backend=backend)
                    if broken:
                        errors.append(f"thread {seed}: broken offsets passed")
                    elif float(r.sum()) != x.size:
                        errors.append(f"thread {seed}: wrong sum")
                except ValueError:
                    if not broken:
                        errors.append(f"thread {seed}: valid offsets refused")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
