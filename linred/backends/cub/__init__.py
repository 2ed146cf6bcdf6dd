"""The CUB backend: ``DeviceSegmentedReduce`` through cuda.compute, and CuPy's CUB.

It serves every GPU reduction: max and min, integer sums, complex sums,
variable-length segments, and any layout.  One of four paths runs each problem,
chosen once per plan by :func:`choose_path`:

``"cccl"``
    ``cuda.compute.make_segmented_reduce`` (CUB ``DeviceSegmentedReduce``) on
    the data in place, for one feature with contiguous segments (any batch
    stride).  Segment boundaries are never materialised for fixed lengths: the
    start offsets are a ``TransformIterator`` over a ``CountingIterator``
    multiplying by ``L`` (a C++ operator compiled to LTO-IR with cuda.core, ``L``
    passed as state so one compilation serves every length) and the end
    offsets the same iterator advanced by one.  Batches whose rows are not
    adjacent, and offsets shared by every batch, go through operators that map
    the flat segment index to ``batch * batch_stride + offset``.  float16 and
    bfloat16 are read as 16-bit words through a converting iterator and
    accumulated in float32; results narrower than the accumulator (float16,
    bfloat16), and means of fixed lengths (times ``1/L``), are converted on the
    way out by a ``TransformOutputIterator``.  Integer sums accumulate in the
    result type (``h_init`` is int64/uint64, CUB's accumulator type).  max and
    min of floating data use operators that propagate NaN (CUB's ``MAXIMUM`` is
    ``a < b ? b : a``, which drops a NaN depending on the order it meets it).
    Empty segments get ``h_init``: 0, or the identity of max/min (of the
    accumulator's dtype; when ``dtype=`` asks for another result dtype, its
    identity is written over the empty segments after the conversion).  More than
    ``2**31 - 1`` segments are reduced in several launches.  The reduction object
    and its temporary storage belong to the plan and are reused across calls
    (cuda.compute also caches the compiled reduction across plans).
``"cupy-cub"``
    CuPy's fixed-size CUB segmented reduction (``cupy.cuda.cub``), for fixed
    lengths up to :data:`CUPY_CUB_MAX_LENGTH` where its fixed-size kernels are
    faster, when input, accumulator and result share a dtype (float32/float64
    and 64-bit integer sums; max/min of every dtype but bool, NaN-propagating).
``"cupy-reduce"``
    CuPy's reduction over the segment axis of the ``(batch, m, L, features)``
    view, for fixed lengths whose layout CUB's segmented reduction cannot read
    (feature dimensions, strided segments), and for complex data (CuPy adds
    complex values part by part; means divide each part by ``L``).
``"strided-kernel"``
    A small kernel with one thread per (batch, segment, feature), for variable
    lengths with feature dimensions or strided segments, bfloat16 in those
    layouts, and complex sums of variable lengths (real and imaginary parts
    added, and divided by the length, separately).  Neighbouring threads read
    neighbouring features.

All work runs on the resolved stream; nothing waits on the host.

The package: this module chooses the path (pure, no CUDA library imported);
:mod:`.operators` holds the device operators cuda.compute links into CUB's kernels;
:mod:`.executors` runs the four paths (CuPy and cuda.compute imported there); the
strided kernel and the divisions by lengths are CuPy elementwise kernels of
:mod:`linred.kernels.elementwise`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linred._dtypes import COMPLEX, HALF
from linred.backends.base import INT32_MAX, Backend, Options, cupy_gpu_unavailable
from linred.problem import Problem

#: CuPy's fixed-size CUB reduction serves fixed lengths up to this (its small- and
#: medium-segment kernels beat the general segmented reduction there)
CUPY_CUB_MAX_LENGTH = 256
#: segments per cuda.compute launch (it refuses more than 2**31 - 1)
MAX_SEGMENTS_PER_LAUNCH = INT32_MAX

PATHS = ("cccl", "cupy-cub", "cupy-reduce", "strided-kernel")


@dataclass(frozen=True, slots=True)
class CubOptions(Options):
    """The CUB backend's knobs; change them with ``linred.backends.configure("cub", ...)``."""

    #: force a path (one of :data:`PATHS`) for new plans instead of :func:`choose_path`'s;
    #: for tests and benchmarks only
    path: str | None = None

    def __post_init__(self) -> None:
        if self.path is not None and self.path not in PATHS:
            raise ValueError(f"cub option path must be None or one of {', '.join(map(repr, PATHS))}; got {self.path!r}")


_CCCL_DTYPES = frozenset(
    ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", *HALF, "float32", "float64")
)
_CUPY_CUB_SUM = frozenset(("int64", "uint64", "float32", "float64"))
_CUPY_CUB_MINMAX = frozenset(
    ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
)


# --- choosing a path (pure; runs without a GPU) -------------------------------------


def normalized_strides(problem: Problem) -> tuple[int, int, int]:
    """The strides with those of length-1 dimensions normalised (they are never used)."""
    B, n, D = problem.in_shape
    sB, sN, sD = problem.strides
    return (0 if B == 1 else sB, 1 if n == 1 else sN, 1 if D == 1 else sD)


def cccl_layout(problem: Problem) -> bool:
    """One feature, unit stride along the segments, non-negative batch stride."""
    sB, sN, _ = normalized_strides(problem)
    return problem.features == 1 and sN == 1 and sB >= 0


def batches_adjacent(problem: Problem) -> bool:
    """Whether batch ``b + 1`` starts where batch ``b`` ends, so all segments are one flat sequence."""
    sB, _, _ = normalized_strides(problem)
    return problem.batch == 1 or sB == problem.n


def cupy_cub_eligible(problem: Problem) -> bool:
    """Whether CuPy's fixed-size CUB reduction can serve ``problem`` exactly."""
    if not (problem.fixed and cccl_layout(problem) and batches_adjacent(problem)):
        return False
    if problem.batch * problem.n > INT32_MAX:  # CuPy's CUB wrappers count in int
        return False
    if problem.reduction == "sum":
        return problem.dtype == problem.acc_dtype == problem.out_dtype and problem.dtype in _CUPY_CUB_SUM
    if problem.reduction in ("max", "min"):
        return problem.dtype == problem.out_dtype and problem.dtype in _CUPY_CUB_MINMAX
    return False


def is_complex(problem: Problem) -> bool:
    """Whether the data or the accumulator is complex (cuda.compute has no complex addition)."""
    return problem.dtype in COMPLEX or problem.acc_dtype in COMPLEX


def _cupy_reducible(problem: Problem) -> bool:
    """Fixed lengths of dtypes CuPy has (not bfloat16)."""
    return problem.fixed and "bfloat16" not in (problem.dtype, problem.out_dtype)


def choose_path(problem: Problem) -> str:
    """The path that serves ``problem`` (see the module docstring)."""
    if cccl_layout(problem) and problem.dtype in _CCCL_DTYPES and not is_complex(problem):
        if cupy_cub_eligible(problem) and problem.segment_length <= CUPY_CUB_MAX_LENGTH:
            return "cupy-cub"
        return "cccl"
    if _cupy_reducible(problem):
        return "cupy-reduce"
    return "strided-kernel"


def path_unsupported(problem: Problem, path: str) -> str | None:
    """Why ``path`` cannot serve ``problem`` (used when a path is forced), or None."""
    if path == "cccl":
        if not cccl_layout(problem):
            return "CUB's segmented reduction needs one feature and contiguous segments"
        if problem.dtype not in _CCCL_DTYPES or is_complex(problem):
            return f"cuda.compute cannot add {problem.dtype} into {problem.acc_dtype}"
    elif path == "cupy-cub":
        if not cupy_cub_eligible(problem):
            return "CuPy's CUB reduction needs fixed contiguous segments of one dtype"
    elif path == "cupy-reduce":
        if not _cupy_reducible(problem):
            return "CuPy's reduction serves fixed lengths of CuPy dtypes"
    elif path != "strided-kernel":
        return f"unknown path {path!r}"
    return None


class CubBackend(Backend):
    options = CubOptions()
    name = "cub"
    summary = "CUB DeviceSegmentedReduce (cuda.compute) and CuPy's CUB: every reduction, dtype and layout on the GPU"

    def unavailable(self) -> str | None:
        reason = cupy_gpu_unavailable()
        if reason is not None:
            return reason
        try:
            import cuda.compute

            if not getattr(cuda.compute, "_BINDINGS_AVAILABLE", True):
                return "cuda.compute is installed but its CUDA bindings are not available"
            from cuda.compute import make_segmented_reduce  # noqa: F401
        except Exception as e:
            return f"cuda.compute (cuda-cccl) is not usable ({type(e).__name__}: {e}); pip install cuda-cccl"
        try:
            import cuda.core
        except Exception as e:
            return f"cuda.core is not importable ({type(e).__name__}: {e}); pip install cuda-core"
        if not hasattr(cuda.core, "Program"):
            try:
                from cuda.core.experimental import Program  # noqa: F401
            except Exception as e:
                return f"cuda.core is not importable ({type(e).__name__}: {e}); pip install cuda-core"
        return None

    def unsupported(self, problem: Problem) -> str | None:
        if problem.device is None:
            return (
                f"it runs on CUDA devices and the data is a {problem.kind} array on the host; "
                "backend='numpy' serves host data"
            )
        if self.options.path is not None:
            return path_unsupported(problem, self.options.path)
        return None

    def path(self, problem: Problem) -> str:
        """The path a plan made now takes for ``problem``: the forced one, else :func:`choose_path`'s."""
        return self.options.path or choose_path(problem)

    def plan(self, problem: Problem) -> Any:
        from linred.backends.cub.executors import EXECUTORS

        return EXECUTORS[self.path(problem)](problem)


BACKEND = CubBackend()
