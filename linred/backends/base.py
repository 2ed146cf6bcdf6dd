"""The backend interface.

A backend is a module in :mod:`linred.backends` with one instance of a
:class:`Backend` subclass named ``BACKEND``.  The registry imports it on first use,
so a backend's heavy imports (CuPy, nvmath-python, cuda.compute, PyTorch) happen
inside its methods or its own module, never at ``import linred``.

The contract:

- :meth:`Backend.unavailable` says why the backend cannot run at all on this
  machine (not installed, no GPU), or None.
- :meth:`Backend.unsupported` says why it cannot serve one :class:`Problem`, or
  None.  It must be cheap and must not touch data.
- :meth:`Backend.plan` returns an :class:`Executor` for a problem it supports.
  Planning may allocate and compile; the executor then runs many times.
- :attr:`Backend.options` holds the backend's tuning knobs, an instance of its
  frozen :class:`Options` dataclass.  A plan reads them when it is made and keeps
  them; :func:`linred.backends.configure` replaces them and starts a new options
  generation, which is part of every cached plan's key, so a changed knob never
  meets a plan made with the old one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

from linred.problem import Problem
from linred.segments import Segments


class Executor(Protocol):
    """A planned reduction.

    ``x`` is the input viewed as ``(batch, n, features)``, ``out`` the result
    viewed as ``(batch, m, features)`` (C-contiguous, of the problem's result
    dtype, on the input's device), ``segments`` the call's segments and
    ``stream`` the resolved stream (None on the host).  The executor writes every
    element of ``out``, including empty segments, and enqueues its work on
    ``stream`` without synchronizing.

    An executor whose class sets ``views = False`` reads only what its plan fixed
    (device pointers, with strides known from the problem): it is then passed
    ``x`` and ``out`` as the caller gave them, which saves two reshapes per call.

    An executor whose class sets ``checks_offsets = True`` checks offsets while it
    reads them: given :class:`~linred.segments.VariableSegments` with a nonzero
    ``word`` (unchecked offsets of a call with ``check=True``), its kernels read every
    segment's bounds, set that word of pinned host memory when one breaks a rule of
    offsets, and read no element outside ``[0, n)`` whatever the offsets hold.  The
    caller then synchronizes the stream once and reads the word, in place of a pass
    of its own over the offsets before the reduction.
    """

    #: whether ``x`` and ``out`` must be the ``(batch, n, features)`` and
    #: ``(batch, m, features)`` views (True) or may come in the caller's shape
    views: bool
    #: whether ``out`` may overlap ``x`` (host executors that write ``out`` only through one
    #: NumPy call per input, which reads its inputs as if they did not overlap its output):
    #: the plan then skips its overlap test (optional; False when absent)
    overlap_safe: bool
    #: whether the executor checks unchecked offsets as it reads them (see above)
    checks_offsets: bool

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None: ...

    def free(self) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """A backend's tuning knobs (none for the base class).

    Each backend with knobs subclasses this as a frozen dataclass with defaults and
    validates its fields in ``__post_init__``; :func:`linred.backends.configure`
    makes a new instance with some fields changed.
    """


class Backend:
    """Base class of the backends; see the module docstring for the contract."""

    #: the knobs this backend's plans read when they are made (replace them through
    #: :func:`linred.backends.configure`, never by assignment to a module global)
    options: Options = Options()

    name: ClassVar[str] = ""
    #: one line for ``linred info``, the README and error messages
    summary: ClassVar[str] = ""
    #: whether the backend reads the data through raw pointers and element strides (then
    #: it cannot serve data whose memory is not plain: see :attr:`Problem.plain`)
    reads_pointers: ClassVar[bool] = True
    #: the reductions it computes (a product is not linear algebra: only some backends have it)
    reductions: ClassVar[tuple[str, ...]] = ("sum", "mean", "max", "min")

    def unavailable(self) -> str | None:
        """Why this backend cannot run on this machine, or None if it can."""
        return None

    def unsupported(self, problem: Problem) -> str | None:
        """Why this backend cannot serve ``problem``, or None if it can."""
        raise NotImplementedError

    def slower(self, problem: Problem) -> str | None:
        """Why ``backend="auto"`` should try the other backends first for ``problem``, which this
        backend serves (correctly, but slowly for its layout), or None.  ``auto`` comes back to
        it when none of them serves the problem; naming the backend serves it."""
        return None

    def plan(self, problem: Problem) -> Executor:
        """An executor for ``problem`` (only called when :meth:`unsupported` returned None)."""
        raise NotImplementedError


def cupy_gpu_unavailable() -> str | None:
    """Why CuPy cannot reach a CUDA device here, or None: shared by the CuPy-based backends."""
    try:
        import cupy
    except Exception as e:  # a broken CUDA install raises more than ImportError
        return f"CuPy is not importable ({type(e).__name__}: {e}); install linred[cu12] or linred[cu13]"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no CUDA device ({type(e).__name__}: {e})"
    return "no CUDA device" if count == 0 else None


#: the largest count a 32-bit ``int`` argument takes (cuBLAS's dimensions, cuSPARSE's batch,
#: CUB's and cuda.compute's segment counts, nvmath's host BLAS): one constant for every backend
INT32_MAX = (1 << 31) - 1


def segment_chunks(total: int, limit: int = INT32_MAX) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` ranges of at most ``limit`` items covering ``range(total)``.

    Libraries that count segments (or rows) in a 32-bit ``int`` (cuda.compute refuses
    more than ``2**31 - 1`` segments per launch, cuBLAS as many columns) get one call
    per chunk.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1; got {limit}")
    for start in range(0, total, limit):
        yield start, min(start + limit, total)


class FunctionExecutor:
    """An executor made of a plain function, for backends with nothing to free."""

    __slots__ = ("overlap_safe", "run", "views")

    def __init__(self, run: Any, views: bool = True, overlap_safe: bool = False) -> None:
        #: the function, called as ``run(x, out, segments, stream)``
        self.run = run
        self.views = views
        self.overlap_safe = overlap_safe

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        self.run(x, out, segments, stream)

    def free(self) -> None:
        self.run = None


#: the longest float32 sum (in elements) linred leaves to a vendor product (cuBLAS GEMV,
#: cuBLASLt, cuSPARSE): one float32 segment of 2^26 positive values came out 1.3e-6 off
#: (relative to sum|x|) through each of them on an H100, more than linred's 1e-6
VENDOR_FLOAT32_LONGEST = 1 << 24


#: the same for cuSPARSE (offsets): one float32 segment of 2^20 came out 1.6e-6 off through its
#: SpMV, one complex64 segment of 80000 values 1.4e-6 through its SpMM (H100); on an H200, rows of
#: 2^14 complex64 values (lognormal magnitudes) 1.15e-6 through its SpMM, of 2^13 6.4e-7
VENDOR_FLOAT32_LONGEST_SPARSE = 1 << 13
#: ... and for several float32 vectors as the columns of one matrix (CSR_ALG2, nvmath's
#: ``SPMM_ALG_COLUMNS``; H200, 9 to 64 vectors, one to 21 segments a row, lognormal magnitudes):
#: rows of 2^14 values 1.2e-6 off (float16 data summed in float32 1.4e-6), of 2^13 8.3e-7
#: (9.4e-7), of 2^12 6.3e-7 (6.0e-7)
VENDOR_FLOAT32_LONGEST_SPARSE_COLUMNS = 1 << 12


def vendor_float32_reason(problem: Problem, library: str, limit: int = VENDOR_FLOAT32_LONGEST) -> str | None:
    """Why ``library`` cannot sum ``problem`` within linred's float32 accuracy, or None.

    ``limit`` is the longest sum it was measured to keep within 1e-6 of sum|x|.  For
    offsets the longest segment is not known when planning: any may be a whole row.
    """
    if problem.acc_dtype not in ("float32", "complex64") or problem.reduction not in ("sum", "mean"):
        return None
    longest = problem.segment_length if problem.fixed else problem.n
    if longest <= limit:
        return None
    what = f"segments of {longest}" if problem.fixed else f"rows of {longest} elements (a segment may be one)"
    return (
        f"{library} sums float32 {what} less accurately than linred's 1e-6 of sum|x| (measured on H100 and "
        "H200 GPUs); "
        "backend='nvrtc' or 'cub' serves them"
    )
