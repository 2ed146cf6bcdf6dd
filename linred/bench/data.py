"""Buffers, references and error checks for one case, on the host or on the GPU.

Every method of a case reads the same input buffer: a NumPy array on the host,
a CuPy array on the GPU (PyTorch methods get a zero-copy DLPack view of it), or,
for bfloat16, which CuPy lacks, a CUDA torch tensor.  The float64 reference is
computed once per case from that same buffer.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from linred.bench.cases import Case

__all__ = ["TOLERANCE", "DeviceData", "HostData", "Inputs", "is_out_of_memory"]

#: largest relative error ||out - ref|| / ||ref|| a method may have and still count as correct
TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2, "float64": 1e-12}


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation failure of NumPy, CuPy or PyTorch."""
    return isinstance(e, MemoryError) or "OutOfMemory" in type(e).__name__ or "out of memory" in str(e).lower()


def _rel_error(xp: Any, out: Any, ref: Any, to_float64: Any) -> tuple[float | None, str | None]:
    """``(||out - ref|| / ||ref||, None)`` computed with ``xp`` (NumPy or CuPy), or ``(None, why)``
    for a result of the wrong kind or shape or with non-finite values."""
    if out is None or not hasattr(out, "shape"):
        return None, f"returned {type(out).__name__}, not an array"
    if tuple(out.shape) != tuple(ref.shape):
        return None, f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    o = to_float64(out)
    num = float(xp.linalg.norm((o - ref).ravel()))
    den = float(xp.linalg.norm(ref.ravel()))
    if not np.isfinite(num):
        return None, "non-finite values in the result"
    return (num / den if den > 0 else num), None


@dataclass
class Inputs:
    """One case's data, shared by all of its methods.

    Attributes
    ----------
    case : Case
    lib : {"numpy", "cupy", "torch"}
        The array library of ``x``.
    x : array
        The data, shape ``(n,)`` or ``(n, features)``, random normal.
    m : int
        Number of segments.
    offsets, lengths : array or None
        int64 offsets (``m + 1``) and lengths (``m``) of a variable-length case, in ``x``'s library.
    host_offsets : numpy.ndarray or None
        The offsets on the host.
    max_length : int
        The longest segment.
    """

    case: Case
    lib: str
    x: Any
    m: int
    offsets: Any = None
    lengths: Any = None
    host_offsets: np.ndarray | None = None
    max_length: int = 0
    _torch_x: Any = None

    @property
    def fixed(self) -> bool:
        return self.case.fixed

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.m,) if self.case.features == 1 else (self.m, self.case.features)

    @property
    def nbytes(self) -> int:
        """Bytes a segmented sum must move: the input read, the result written, the offsets read."""
        return bytes_moved(self.case, self.m)

    def segment_kwargs(self) -> dict[str, Any]:
        """The segment argument of a ``linred`` call."""
        return {"segment_length": self.case.length} if self.fixed else {"offsets": self.offsets}

    def torch_x(self) -> Any:
        """``x`` as a torch tensor sharing its memory (DLPack for CuPy, ``from_numpy`` on the host)."""
        if self._torch_x is None:
            self._torch_x = self.as_torch(self.x)
        return self._torch_x

    def as_torch(self, a: Any) -> Any:
        import torch

        if self.lib == "torch":
            return a
        if self.lib == "numpy":
            return torch.from_numpy(a)
        return torch.from_dlpack(a)

    def arrays(self) -> list[Any]:
        return [a for a in (self.x, self.offsets, self.lengths, self._torch_x) if a is not None]


def bytes_moved(case: Case, m: int) -> int:
    """Input bytes + result bytes (the input's dtype) + int64 offsets for variable lengths."""
    elements = case.n * case.features
    result = m * case.features
    offsets = 0 if case.fixed else (m + 1) * 8
    return (elements + result) * case.itemsize + offsets


def _segments(case: Case) -> tuple[int, np.ndarray | None, int]:
    if case.fixed:
        return case.n // case.length, None, case.length
    offsets = case.offsets()
    lengths = np.diff(offsets)
    return offsets.shape[0] - 1, offsets, int(lengths.max(initial=0))


class HostData:
    """NumPy buffers and a NumPy float64 reference."""

    lib = "numpy"

    def inputs(self, case: Case) -> Inputs:
        rng = np.random.default_rng(case.seed)
        if case.dtype in ("float32", "float64"):
            x = rng.standard_normal(case.shape, dtype=np.dtype(case.dtype))
        else:
            from linred._dtypes import numpy_dtype

            x = rng.standard_normal(case.shape, dtype=np.float32).astype(numpy_dtype(case.dtype))
        m, offsets, max_length = _segments(case)
        lengths = None if offsets is None else np.diff(offsets)
        return Inputs(case, "numpy", x, m, offsets, lengths, offsets, max_length)

    def reference(self, inp: Inputs) -> np.ndarray:
        x64 = inp.x.astype(np.float64)
        if inp.fixed:
            return x64.reshape(inp.m, inp.case.length, *x64.shape[1:]).sum(axis=1)
        ref = np.zeros(inp.out_shape, dtype=np.float64)
        lengths = np.diff(inp.host_offsets)
        nonempty = lengths > 0
        if nonempty.any():
            ref[nonempty] = np.add.reduceat(x64, inp.host_offsets[:-1][nonempty], axis=0)
        return ref

    def copy_fn(self, inp: Inputs):
        y = np.empty_like(inp.x)
        x = inp.x
        return lambda: np.copyto(y, x)

    def sync(self, lib: str) -> None:
        pass

    def settle(self) -> None:
        """Before a timed sample: leave nothing of the previous method's work to pay for."""

    def to_float64(self, a: Any) -> np.ndarray:
        if type(a).__module__.split(".")[0] == "torch":
            import torch

            a = a.detach().cpu().to(torch.float64).numpy()
        return np.asarray(a, dtype=np.float64)

    def rel_error(self, out: Any, ref: Any) -> tuple[float | None, str | None]:
        """``(||out - ref|| / ||ref||, None)``, or ``(None, why)`` for a wrong shape or non-finite values."""
        return _rel_error(np, out, ref, self.to_float64)

    def _overlaps(self, a: Any, inp: Inputs) -> bool:
        return any(np.may_share_memory(a, b) for b in inp.arrays() if isinstance(b, np.ndarray))

    def poison(self, out: Any, inp: Inputs) -> bool:
        """Fill a previous result with NaN, so a method that stops writing it is caught; False if unsafe."""
        if not isinstance(out, np.ndarray) or out.dtype.kind != "f" or not out.flags.writeable:
            return False
        if self._overlaps(out, inp):
            return False
        out.fill(np.nan)
        return True

    def release(self, collect: bool = True) -> None:
        """Drop what the last method or case left behind (``collect``: also run the garbage collector)."""
        if collect:
            gc.collect()


class DeviceData(HostData):
    """CuPy (or, for bfloat16, PyTorch) buffers on the current GPU, with a CuPy float64 reference."""

    lib = "cupy"
    _evict: Any = None  # a buffer twice the L2 size, read by settle()

    def inputs(self, case: Case) -> Inputs:
        import cupy

        m, host_offsets, max_length = _segments(case)
        if case.dtype == "bfloat16":
            import torch

            gen = torch.Generator(device="cuda").manual_seed(case.seed)
            x = torch.randn(case.shape, dtype=torch.bfloat16, device="cuda", generator=gen)
            lib = "torch"
            to_device = lambda a: torch.from_numpy(a).to("cuda")
        else:
            rng = cupy.random.default_rng(case.seed)
            if case.dtype == "float16":
                x = rng.standard_normal(case.shape, dtype=cupy.float32).astype(cupy.float16)
            else:
                x = rng.standard_normal(case.shape, dtype=cupy.dtype(case.dtype))
            lib = "cupy"
            to_device = cupy.asarray
        offsets = lengths = None
        if host_offsets is not None:
            offsets = to_device(host_offsets)
            lengths = to_device(np.diff(host_offsets))
        return Inputs(case, lib, x, m, offsets, lengths, host_offsets, max_length)

    def reference(self, inp: Inputs) -> Any:
        import cupy

        x64 = self.to_float64(inp.x)
        if inp.fixed:
            ref = x64.reshape(inp.m, inp.case.length, *x64.shape[1:]).sum(axis=1)
        else:
            # Differences of a float64 prefix sum: error about 1e-16 * |prefix|, far below float32's.
            prefix = cupy.zeros((x64.shape[0] + 1, *x64.shape[1:]), dtype=cupy.float64)
            cupy.cumsum(x64, axis=0, out=prefix[1:])
            off = cupy.asarray(inp.host_offsets)
            ref = prefix[off[1:]] - prefix[off[:-1]]
            del prefix, off
        del x64
        return ref

    def copy_fn(self, inp: Inputs):
        if inp.lib == "torch":
            import torch

            x = inp.x
            y = torch.empty_like(x)
            return lambda: y.copy_(x)
        import cupy

        x = inp.x
        y = cupy.empty_like(x)
        return lambda: cupy.copyto(y, x)

    def sync(self, lib: str) -> None:
        import cupy

        cupy.cuda.Device().synchronize()

    def settle(self) -> None:
        """Evict the L2 cache by reading a buffer twice its size, then synchronize (untimed).

        A method writes its result through L2; what is still dirty there when the next
        method's sample starts is written back during that sample.  After the copy
        ceiling (1 GiB written) that was up to 50 MB charged to whichever method came
        next.  Reading clean data over the whole cache first makes every sample start
        from the same state.
        """
        import cupy

        if self._evict is None:
            l2 = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["l2CacheSize"]
            self._evict = cupy.ones(max(2 * l2, 1 << 20) // 4, dtype=cupy.float32)
        self._evict.sum()
        cupy.cuda.Device().synchronize()

    def to_float64(self, a: Any) -> Any:
        import cupy

        if type(a).__module__.split(".")[0] == "torch":
            import torch

            a = cupy.from_dlpack(a.detach().to(torch.float64).contiguous())
            return a
        if isinstance(a, np.ndarray):
            return cupy.asarray(a, dtype=cupy.float64)
        return a.astype(cupy.float64)

    def rel_error(self, out: Any, ref: Any) -> tuple[float | None, str | None]:
        import cupy

        return _rel_error(cupy, out, ref, self.to_float64)

    @staticmethod
    def _span(a: Any) -> tuple[int, int] | None:
        if type(a).__module__.split(".")[0] == "torch":
            return a.data_ptr(), a.data_ptr() + a.numel() * a.element_size()
        if hasattr(a, "data") and hasattr(a.data, "ptr"):
            return a.data.ptr, a.data.ptr + a.nbytes
        return None

    def poison(self, out: Any, inp: Inputs) -> bool:
        span = self._span(out)
        if span is None:
            return False
        for b in inp.arrays():
            other = self._span(b)
            if other is None or (span[0] < other[1] and other[0] < span[1]):
                return False
        if type(out).__module__.split(".")[0] == "torch":
            if not out.dtype.is_floating_point:
                return False
            out.fill_(float("nan"))
        else:
            if out.dtype.kind != "f":
                return False
            out.fill(np.nan)
        return True

    def release(self, collect: bool = True) -> None:
        """Return cached device memory to the driver, so the next buffer finds room."""
        super().release(collect)
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
