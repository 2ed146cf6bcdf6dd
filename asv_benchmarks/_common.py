"""Shared by the benchmarks: shapes, data, references, correctness checks, clocks and the linred call.

No benchmark lives here.  asv collects ``time_*``/``track_*``/``timeraw_*`` names from
the public classes and functions of every module, so everything here is either
private (leading underscore) or not a benchmark name; the benchmark modules import
the base classes under their private names.

asv runs the *current* benchmarks against the linred of older commits, so this
module touches linred through its public API only (``segmented_sum``,
``BackendError``, ``available_backends``), each looked up defensively, and keeps
its own copy of the shapes of ``linred bench`` rather than importing them.
"""

from __future__ import annotations

import ctypes
import inspect
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: float32 elements per case on the GPU (1 GiB, far larger than any L2 cache), as ``linred bench``
N_GPU = 1 << 28
#: float32 elements per case on the CPU: ``linred bench`` uses 2^24; a quarter keeps an asv run short
N_CPU = 1 << 22

#: largest norm-wise relative error against float64 that still counts as correct (as ``linred bench``)
TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2, "float64": 1e-12}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class _Shape:
    """A case of ``linred bench``: a fixed length, or a layout of variable lengths."""

    length: int | None = None
    features: int = 1
    layout: str = ""
    mean: float = 0.0
    #: elements the data begins past a 16-byte boundary (a slice ``buf[skip:]``)
    skip: int = 0


#: the shapes of ``linred bench``, by the names its table uses
SHAPES = {
    **{name: _Shape(length) for name, length in [("L=2", 2), ("L=8", 8), ("L=32", 32), ("L=128", 128)]},
    **{name: _Shape(length) for name, length in [("L=1024", 1024), ("L=4096", 4096), ("L=16384", 16384)]},
    "L=2^20": _Shape(1 << 20),
    "L=2^24": _Shape(1 << 24),
    "d=64 L=8": _Shape(8, features=64),
    "d=64 L=128": _Shape(128, features=64),
    "geom 16": _Shape(layout="geometric", mean=16),
    "geom 256": _Shape(layout="geometric", mean=256),
    "geom 8192": _Shape(layout="geometric", mean=8192),
    "half empty": _Shape(layout="half-empty", mean=16),
    "zipf 1.5": _Shape(layout="zipf"),
    "one huge": _Shape(layout="one-huge", mean=4),
    # mid-size calls (GpuVariableMid): one segment, and data one element past a 16-byte boundary
    "one segment": _Shape(layout="one"),
    "geom 16 +1": _Shape(layout="geometric", mean=16, skip=1),
    "one segment +1": _Shape(layout="one", skip=1),
}


def _draw_until(draw: Callable[[int], np.ndarray], n: int, mean: float) -> np.ndarray:
    """Lengths from ``draw(size)`` until they cover ``n`` elements."""
    chunks, total = [], 0
    while total < n:
        chunk = draw(int((n - total) / mean * 1.1) + 64).astype(np.int64)
        chunks.append(chunk)
        total += int(chunk.sum())
    return np.concatenate(chunks)


def _offsets_covering(lengths: np.ndarray, n: int) -> np.ndarray:
    """int64 offsets of ``lengths`` cut at ``n``: the last segment ends at ``n``, later ones are dropped."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.append(offsets[offsets < n], n).astype(np.int64)


def make_offsets(shape: _Shape, n: int, seed: int) -> np.ndarray:
    """The offsets of a variable-length shape over ``n`` elements (seeded: the same for every commit)."""
    rng = np.random.default_rng(seed)
    geometric = lambda k: rng.geometric(1 / shape.mean, size=k)
    if shape.layout == "one":
        return np.array([0, n], dtype=np.int64)
    if shape.layout == "geometric":
        lengths = _draw_until(geometric, n, shape.mean)
    elif shape.layout == "half-empty":  # half the segments empty, mean length still shape.mean

        def draw(k: int) -> np.ndarray:
            lengths = rng.geometric(0.5 / shape.mean, size=k)
            lengths[rng.random(k) < 0.5] = 0
            return lengths

        lengths = _draw_until(draw, n, shape.mean)
    elif shape.layout == "zipf":  # power law: most segments 1-3 long, a few up to 2^20
        lengths = _draw_until(lambda k: np.minimum(rng.zipf(1.5, size=k), 1 << 20), n, 500.0)
    elif shape.layout == "one-huge":  # half of n in one segment in the middle, the rest short
        rest = n - n // 2
        small = np.diff(_offsets_covering(_draw_until(geometric, rest, shape.mean), rest))
        lengths = np.concatenate([small[: small.size // 2], [n // 2], small[small.size // 2 :]])
    else:
        raise ValueError(f"unknown layout {shape.layout!r}")
    return _offsets_covering(lengths, n)


@dataclass
class _Case:
    """One problem: ``rows`` elements (of ``features`` values each) along the segment axis."""

    name: str
    dtype: str
    rows: int
    shape: _Shape
    offsets: np.ndarray | None  # host int64 offsets of a variable-length case

    @property
    def fixed(self) -> bool:
        return self.shape.length is not None

    @property
    def m(self) -> int:
        return self.rows // self.shape.length if self.fixed else self.offsets.shape[0] - 1

    @property
    def array_shape(self) -> tuple[int, ...]:
        return (self.rows,) if self.shape.features == 1 else (self.rows, self.shape.features)

    @property
    def seed(self) -> int:
        return zlib.crc32(f"{self.name} {self.dtype}".encode())

    @property
    def nbytes(self) -> int:
        """Bytes a segmented sum moves: input read, result written (input's dtype), int64 offsets read."""
        offsets = 0 if self.fixed else (self.m + 1) * 8
        return (self.rows + self.m) * self.shape.features * ITEMSIZE[self.dtype] + offsets


def make_case(name: str, dtype: str, n_float32: int) -> _Case:
    """The case ``name`` at ``n_float32`` float32 elements' worth of bytes (other dtypes: the same bytes)."""
    shape = SHAPES[name]
    rows = n_float32 * 4 // ITEMSIZE[dtype] // shape.features
    if shape.length is not None and (shape.length > rows or rows % shape.length):
        raise NotImplementedError(f"{name} does not divide {rows} {dtype} elements")
    # (a skipped shape draws the offsets of the shape it skips from: the same segments)
    seed = zlib.crc32(name.removesuffix(f" +{shape.skip}").encode())
    offsets = None if shape.length is not None else make_offsets(shape, rows, seed)
    return _Case(name, dtype, rows, shape, offsets)


def check(error: float | None, why: str | None, dtype: str, method: str) -> None:
    """Refuse to time a method whose result is wrong: a wrong result is never fast.

    A wrong linred result fails the benchmark; a wrong peer is skipped with the reason
    (asv shows it as n/a), since a peer's limits are not linred's regressions.
    """
    if why is None and error is not None and error <= TOLERANCE[dtype]:
        return
    message = f"{method} gives a wrong result: " + (why or f"relative error {error:.2e} > {TOLERANCE[dtype]:.0e}")
    if method.startswith("linred-"):
        raise ValueError(message)
    raise NotImplementedError(message)


def relative_error(xp: Any, result: Any, reference: Any) -> tuple[float | None, str | None]:
    """``(||result - reference|| / ||reference||, None)`` computed with ``xp``, or ``(None, why)``."""
    if tuple(result.shape) != tuple(reference.shape):
        return None, f"shape {tuple(result.shape)}, expected {tuple(reference.shape)}"
    num = float(xp.linalg.norm((result - reference).ravel()))
    den = float(xp.linalg.norm(reference.ravel()))
    if not np.isfinite(num):
        return None, "non-finite values in the result"
    return (num / den if den > 0 else num), None


# ---------------------------------------------------------------- linred


def linred_sum(method: str, x: Any, segments: dict[str, Any]) -> tuple[Callable[[], Any], Any]:
    """``(fn, first result)``: ``fn()`` is ``linred.segmented_sum`` with the backend of ``method``.

    Raises NotImplementedError (asv's skip) where the backend cannot serve the call
    here: absent from the linred measured, unavailable (not installed, no GPU), or
    refusing this problem (``BackendError``).  Variable lengths are summed with
    ``check=False``, the caller's promise that the offsets are valid, which every
    peer assumes too; ``linred-auto-checked`` keeps the default ``check=True`` (what a
    call with default arguments costs).
    """
    import linred

    checked = method.endswith("-checked")
    backend = method.removeprefix("linred-").removesuffix("-checked")
    if backend != "auto":
        available = getattr(linred, "available_backends", dict)()
        if backend not in available:
            raise NotImplementedError(f"this linred has no backend {backend!r}")
        if available[backend] is not True:
            raise NotImplementedError(f"{method} is unavailable: {_one_line(available[backend])}")
    kwargs = dict(segments)
    if "offsets" in kwargs and not checked and "check" in inspect.signature(linred.segmented_sum).parameters:
        kwargs["check"] = False
    segmented_sum = linred.segmented_sum
    fn = lambda: segmented_sum(x, **kwargs, backend=backend)
    try:
        result = fn()  # the first call plans (and may compile); it is not timed
    except getattr(linred, "BackendError", ()) as e:
        raise NotImplementedError(f"{method} refuses: {_one_line(e)}") from None
    return fn, result


def _one_line(reason: object) -> str:
    return " ".join(str(reason).split())


# ---------------------------------------------------------------- clocks


def host_seconds(fn: Callable[[], Any], repeat: int = 7) -> float:
    """Median wall-clock seconds of one call."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cuda_seconds(cupy: Any, fn: Callable[[], Any], repeat: int = 10) -> float:
    """Median seconds of one call between two CUDA events.

    The events are recorded on CuPy's current stream, the legacy default stream unless
    changed, which orders them with the work of every blocking stream, PyTorch's
    default stream included.
    """
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return statistics.median(times)


def _driver_device_count() -> tuple[int, str]:
    """``(CUDA devices, why none)`` from the driver through ctypes: far cheaper than importing CuPy to
    learn that there are none.  CuPy loads the driver library by the same name through the same
    loader, so where ctypes cannot load it, CuPy cannot either."""
    for name in ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so"]:
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0, "the CUDA driver reports no usable device"
        return count.value, ""
    return 0, "no CUDA driver (libcuda does not load)"


def gpu_or_skip() -> Any:
    """The ``cupy`` module when a CUDA device is visible; else NotImplementedError (asv skips)."""
    count, why = _driver_device_count()
    if count < 1:
        raise NotImplementedError(why)
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as e:
        raise NotImplementedError(f"no usable CUDA device ({type(e).__name__}: {_one_line(e)})") from None
    return cupy


def torch_peer(method: str, case: _Case, xt: Any, offsets: Any) -> Callable[[], Any]:
    """PyTorch's ways to the case's segmented sum on tensor ``xt`` (``offsets``: a tensor on
    ``xt``'s device for variable lengths, None for fixed ones)."""
    torch = import_torch()
    if method == "torch-sum":
        view_t = xt.view(case.m, case.shape.length, *xt.shape[1:])
        return lambda: view_t.sum(1)
    if method == "torch-segment_reduce":
        # unsafe=True skips torch's validation of the offsets, as linred's check=False does
        return lambda: torch.segment_reduce(xt, "sum", offsets=offsets, axis=0, unsafe=True)
    raise ValueError(f"unknown method {method!r}")


def import_torch() -> Any:
    """``torch``, or NotImplementedError (asv skips) where it is not installed."""
    try:
        import torch
    except ImportError:
        raise NotImplementedError("PyTorch is not installed") from None
    return torch


# ---------------------------------------------------------------- the benchmark base


class _SegmentedSum:
    """A segmented sum along axis 0, by one method, on one shape and dtype.

    ``setup`` builds ``self.fn`` (one call, returning the result), checks its first
    result against float64 and records ``self.nbytes``; subclasses define ``prepare``,
    ``sync`` (waits for the device, a no-op on the host) and ``seconds`` (the clock).
    """

    param_names = ("method", "shape", "dtype")
    timeout = 120

    def setup(self, method: str, shape: str, dtype: str) -> None:
        self.fn, self.nbytes = self.prepare(method, shape, dtype)

    def prepare(self, method: str, shape: str, dtype: str) -> tuple[Callable[[], Any], int]:
        raise NotImplementedError

    def sync(self) -> None:
        pass

    def seconds(self) -> float:
        return host_seconds(self.fn)

    def time_sum(self, method: str, shape: str, dtype: str) -> None:
        self.fn()
        self.sync()

    def track_gbps(self, method: str, shape: str, dtype: str) -> float:
        """(bytes read + bytes written) / median time per call, in GB/s (3 significant digits: a
        slow call, on a loaded machine, must not round to 0)."""
        return float(f"{self.nbytes / self.seconds() / 1e9:.3g}")

    track_gbps.unit = "GB/s"
