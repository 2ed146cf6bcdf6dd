"""How the nvmath backend expresses a fixed-length segmented sum as matrix products.

Pure stride arithmetic on a :class:`~linred.problem.Problem`: no array library is
imported here, so :meth:`unsupported` can decide cheaply and the decisions can be
tested on any machine.

The data is ``x3`` of shape ``(B, n, D)`` with element strides ``(sB, sn, sD)``,
viewed as ``(B, m, L, D)`` with strides ``(sB, L*sn, sn, sD)``; the result is
``out3``, C-contiguous ``(B, m, D)``.  BLAS needs every matrix to have one
unit-stride dimension and a leading dimension at least as large as the other
extent, and every batch to be one regular stride.  Three forms cover the layouts
that satisfy this without copying the input:

``rows`` (``D == 1``, unit stride along the segment)
    ``X (rows, L) @ ones (L, 1)``, the batch and segment axes merged into rows
    when their strides allow it, else a strided batch over ``B``.  On the host,
    segments are summed in levels (chunk sums, then sums of the chunk sums):
    long ones in chunks of about 1024, which keeps MKL's sequential float32
    accumulation as accurate as a blocked one and lets few long rows use every
    core, and lengths between 32 and 1024 in chunks of 32 (or 16, 8), where
    MKL's one-column product is three times faster than at the full length.
``features`` (``D > 1``)
    ``ones (1, L) @ X (L, D)`` for every segment: a strided batch with the ones
    broadcast (stride 0).  Each segment's ``(L, D)`` block may be row- or
    column-major.
``columns`` (``D == 1``, unit stride along ``B``: ``axis=-1`` of a transposed or
column-major array)
    ``ones (1, L) @ X_j (L, B)`` for every segment ``j``; the results, one row per
    segment, go to a small contiguous buffer and are then copied transposed into
    ``out3`` (a strided store of the result is not accepted by MKL's batched GEMM,
    and the copy is ``L`` times smaller than the input).

Anything else (no unit stride among the segment and feature axes, batch axes that
are not one stride) is refused with a reason.

Complex data is summed as real data with twice the features (real and imaginary
parts side by side): a complex product with ones would compute
``(inf + 0j) * (1 + 0j) = inf + nan*j`` and turn an infinity into a NaN, and the
real product needs a quarter of the arithmetic.  No matrix with zeros is ever
multiplied either (a block-diagonal ones matrix would spread ``0 * nan = nan``
to the neighbouring segments or features).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from linred._dtypes import HALF
from linred.backends.base import INT32_MAX  # nvmath's host BLAS calls (cblas_?gemm) take 32-bit ints
from linred.problem import Problem

#: host: segments longer than this are summed in levels of chunks
HOST_SPLIT_ABOVE = 4096
#: host: the chunk length aimed at (measured: best accuracy at unchanged speed)
HOST_CHUNK = 1024
#: host: data of at least this many elements is summed in levels for speed (see _host_chunk)
HOST_LEVELS_FROM = 1 << 18
#: host: the most rows of a segment that a feature-rows or columns product adds up in float32
#: (each feature column's sum is sequential there: 4096 rows of positive data came out 1e-6
#: off, 1024 rows 5e-7; 2^22 rows 4e-3)
HOST_SEQUENTIAL_MAX = 1024

#: a batch of at most this many vectors is one SpMM per vector (the default algorithm); more are
#: the columns of one matrix (``sparse.SPMM_ALG_COLUMNS``), unless the option says "loop"
LOOP_VECTORS = 8


def sparse_loops(batch: int, features: int, strategy: str) -> bool:
    """Whether cuSPARSE takes a batch one slice at a time (one SpMM each): as the option
    ``batch_strategy`` says, and for at most :data:`LOOP_VECTORS` vectors."""
    return batch > 1 and (strategy == "loop" or (features == 1 and batch <= LOOP_VECTORS))


def sparse_columns(batch: int, features: int, strategy: str) -> bool:
    """Whether cuSPARSE sums a batch of vectors as the columns of one matrix (CSR_ALG2)."""
    return features == 1 and batch > 1 and not sparse_loops(batch, features, strategy)


@dataclass(frozen=True, slots=True)
class View:
    """A strided view of one buffer: ``src`` is ``"x"``, ``"out"``, a temporary or a constant."""

    src: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Product:
    """``c = alpha * a @ b`` with ``alpha = 1/L`` for a mean when ``scaled``, else 1."""

    a: View
    b: View
    c: View
    scaled: bool


@dataclass(frozen=True, slots=True)
class Layout:
    """The products that compute one problem, in order.

    ``constants`` maps a name to ``("ones", size)``;
    ``temporaries`` maps a name to its number of elements (contiguous, of the
    result dtype); ``copy_from`` is the view, shaped like ``out3``, of a temporary
    to copy into ``out3`` after the products (``None``: the products wrote
    ``out3`` directly).
    """

    form: str
    products: tuple[Product, ...]
    constants: dict[str, tuple] = field(default_factory=dict)
    temporaries: dict[str, int] = field(default_factory=dict)
    copy_from: View | None = None


def _ones(size: int) -> str:
    return f"ones{size}"


def _merge(axes: list[tuple[int, int]]) -> tuple[int, int] | None:
    """``(size, stride)`` of axes (outer first) merged into one, or None if they do not merge."""
    axes = [(n, s) for n, s in axes if n != 1]
    if not axes:
        return (1, 0)
    size, stride = axes[-1]
    for n, s in reversed(axes[:-1]):
        if s != size * stride:
            return None
        size *= n
    return (size, stride)


def _chunk(length: int) -> int | None:
    """A divisor of ``length`` near HOST_CHUNK (between a quarter and four times it), or None."""
    best = None
    for d in range(HOST_CHUNK // 4, HOST_CHUNK * 4 + 1):
        if length % d == 0 and (best is None or abs(d - HOST_CHUNK) < abs(best - HOST_CHUNK)):
            best = d
    return best


def _host_chunk(length: int, size: int) -> int | None:
    """The chunk length of the next level of a host row sum of ``size`` elements, or None for one product.

    Long rows (> HOST_SPLIT_ABOVE) are chunked near HOST_CHUNK for accuracy.
    Between 32 and 1024, MKL's ``?gemm`` with one column runs at a third of its
    speed at 16 or 32 (measured on 2 cores: L=128 7 GB/s, as 4 x 32 then 4: 23 GB/s);
    that pays for the second product (about 12 us per call) on large data only.
    """
    if length > HOST_SPLIT_ABOVE:
        return _chunk(length)
    if 32 < length < 1024 and size >= HOST_LEVELS_FROM:
        for chunk in (32, 16):
            if length % chunk == 0:
                return chunk
        if length % 8 == 0 and length < 512:
            return 8
    return None


def _rows_products(rows: int, row_stride: int, length: int, host: bool) -> tuple[list[Product], dict, dict]:
    """``out (rows, 1) = X (rows, length) @ ones``, in levels of chunks on the host for long rows."""
    products: list[Product] = []
    constants: dict[str, tuple] = {}
    temporaries: dict[str, int] = {}
    src, stride, level = "x", row_stride, 0
    while host and (rows == 1 or stride == length):
        chunk = _host_chunk(length, rows * length)
        if chunk is None:
            break
        parts = length // chunk
        tmp = f"level{level}"
        temporaries[tmp] = rows * parts
        constants[_ones(chunk)] = ("ones", chunk)
        products.append(
            Product(
                View(src, (rows * parts, chunk), (chunk, 1)),
                View(_ones(chunk), (chunk, 1), (1, 1)),
                View(tmp, (rows * parts, 1), (1, 1)),
                scaled=False,
            )
        )
        src, stride, length, level = tmp, parts, parts, level + 1
    constants[_ones(length)] = ("ones", length)
    products.append(
        Product(
            View(src, (rows, length), (max(stride, length) if rows == 1 else stride, 1)),
            View(_ones(length), (length, 1), (1, 1)),
            View("out", (rows, 1), (1, 1)),
            scaled=True,
        )
    )
    return products, constants, temporaries


REAL_PART = {"complex64": "float32", "complex128": "float64"}


def as_real(problem: Problem) -> Problem | str:
    """A complex problem as the real problem on its real and imaginary parts (features ``2 D``).

    The executors multiply ``x.real`` and ``out.real`` (views) with the returned
    problem's shape and strides, in units of the real dtype.
    """
    if problem.dtype not in REAL_PART:
        return problem
    D = problem.features
    sB, sn, sD = problem.strides
    if D > 1 and sD != 1:
        return (
            f"its complex features have stride {sD}; the real and imaginary parts of the features must be "
            "adjacent (feature stride 1) to be summed as real numbers"
        )
    real = REAL_PART[problem.dtype]
    return replace(
        problem,
        dtype=real,
        acc_dtype=REAL_PART.get(problem.acc_dtype, problem.acc_dtype),
        out_dtype=REAL_PART.get(problem.out_dtype, problem.out_dtype),
        features=2 * D,
        strides=(2 * sB, 2 * sn, 1),
    )


def dense_layout(problem: Problem, *, host: bool) -> Layout | str:
    """The products computing a fixed-length ``problem``, or why its layout cannot be expressed.

    A complex problem is laid out as its real counterpart (:func:`as_real`).
    """
    problem = as_real(problem)
    if isinstance(problem, str):
        return problem
    B, _, D = problem.in_shape
    sB, sn, sD = problem.strides
    L = problem.segment_length
    m = problem.num_segments
    assert L is not None
    sj = L * sn  # stride between segments
    ones_l = {_ones(L): ("ones", L)}

    if D == 1 and (L == 1 or sn == 1):
        merged = _merge([(B, sB), (m, sj)])
        if merged is not None:
            rows, stride = merged
            if rows > 1 and stride < L:
                return f"its segments overlap in memory (stride {stride} between segments of length {L})"
            products, constants, temporaries = _rows_products(rows, stride, L, host)
            return Layout("rows", tuple(products), constants, temporaries)
        if m > 1 and sj < L:
            return f"its segments overlap in memory (stride {sj} between segments of length {L})"
        if sB >= m * sj:
            product = Product(
                View("x", (B, m, L), (sB, sj, 1)),
                View(_ones(L), (L, 1), (1, 1)),
                View("out", (B, m, 1), (m, 1, 1)),
                scaled=True,
            )
            return Layout("rows", (product,), ones_l)
        if not (L == 1 and sB == 1):
            return f"its batch axis (stride {sB}) interleaves with the segments (stride {sj}); BLAS needs whole batches"

    if D > 1:
        # each segment is an (L, D) block; BLAS needs it row- or column-major
        if L == 1:
            if sD == 0:  # (nvmath raised its own ValueError for the leading dimension 0 this makes)
                return (
                    f"each segment's (L, D) = (1, {D}) block has strides ({sn}, 0): BLAS needs one of them "
                    "to be 1 and the other at least the extent it steps over"
                )
            s_l = D if sD == 1 else 1
        elif (sD == 1 and sn >= D) or (sn == 1 and sD >= L):  # row- or column-major
            s_l = sn
        else:
            return (
                f"each segment's (L, D) = ({L}, {D}) block has strides ({sn}, {sD}): BLAS needs one of them "
                "to be 1 and the other at least the extent it steps over"
            )
        merged = _merge([(B, sB), (m, sj)])
        if merged is None:
            return (
                f"its batch (stride {sB}) and segment (stride {sj}) axes do not merge into one strided batch "
                "of matrices, which BLAS needs"
            )
        batch, bstride = merged
        if batch == 1:
            product = Product(
                View(_ones(L), (1, L), (L, 1)),
                View("x", (L, D), (s_l, sD)),
                View("out", (1, D), (D, 1)),
                scaled=True,
            )
        else:
            product = Product(
                View(_ones(L), (batch, 1, L), (0, L, 1)),
                View("x", (batch, L, D), (bstride, s_l, sD)),
                View("out", (batch, 1, D), (D, D, 1)),
                scaled=True,
            )
        return Layout("features", (product,), ones_l)

    # D == 1 without unit stride along the segment: BLAS can use a unit stride along B
    if B > 1 and sB == 1 and sn >= B:
        if m == 1:
            product = Product(
                View(_ones(L), (1, L), (L, 1)),
                View("x", (L, B), (sn, 1)),
                View("out", (1, B), (B, 1)),
                scaled=True,
            )
            return Layout("columns", (product,), ones_l)
        product = Product(
            View(_ones(L), (m, 1, L), (0, L, 1)),
            View("x", (m, L, B), (sj, sn, 1)),
            View("result", (m, 1, B), (B, B, 1)),
            scaled=True,
        )
        return Layout("columns", (product,), ones_l, {"result": m * B}, View("result", (B, m, 1), (1, B, 1)))
    return (
        f"the data's strides {problem.strides} (as batch, segment axis, features) have no unit stride that BLAS "
        "can use without copying the input"
    )


def check_int32(layout: Layout) -> str | None:
    """Why a layout exceeds the 32-bit integers of nvmath's host BLAS calls, or None."""
    for product in layout.products:
        for view in (product.a, product.b, product.c):
            for value in (*view.shape, *view.strides):
                if value > INT32_MAX:
                    return (
                        f"a matrix extent or stride ({value}) exceeds 2^31 - 1, the limit of the 32-bit BLAS calls "
                        "nvmath makes on the host; backend='numpy' serves it"
                    )
    return None


def check_batch_count(layout: Layout) -> str | None:
    """cuBLASLt's batch count is a 32-bit integer."""
    for product in layout.products:
        for view in (product.a, product.b, product.c):
            if len(view.shape) == 3 and view.shape[0] > INT32_MAX:
                return f"it needs a batch of {view.shape[0]} matrices, more than cuBLASLt's 2^31 - 1"
    return None


def check_device_extents(layout: Layout) -> str | None:
    """Why cuBLASLt cannot run a layout's products (batch count, matrix extents), or None.

    cuBLASLt's heuristic finds no kernel (``CUBLAS_STATUS_NOT_SUPPORTED``) for a
    product whose inner dimension reaches 2^31 (measured on an H100: one segment
    of 2^31 + 2^20 float32 elements); the outer dimensions are held to the same
    limit.
    """
    reason = check_batch_count(layout)
    if reason is not None:
        return reason
    for product in layout.products:
        M, K = product.a.shape[-2:]
        N = product.b.shape[-1]
        for name, value in (("segment length (inner dimension K)", K), ("rows (M)", M), ("columns (N)", N)):
            if value > INT32_MAX:
                return (
                    f"its product has {name} = {value}, beyond the 2^31 - 1 cuBLASLt finds kernels for "
                    "(CUBLAS_STATUS_NOT_SUPPORTED); backend='cub' serves it"
                )
    return None


# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------

#: dtypes cuBLASLt multiplies with a float32/float64 compute type
DEVICE_DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")


def dtype_reason(problem: Problem) -> str | None:
    """Why the dtypes of ``problem`` rule the nvmath backend out, or None."""
    dtype, out = problem.dtype, problem.out_dtype
    if problem.reduction in ("max", "min"):
        return (
            f"segmented_{problem.reduction} is not a linear-algebra operation; backend='numpy' (host) "
            "or 'cub' (GPU) serve max/min"
        )
    if dtype not in DEVICE_DTYPES:
        return (
            f"BLAS has no integer matrix product ({dtype} input); backend='numpy' (host) or 'cub' (GPU) "
            "serve integer data"
        )
    if problem.on_gpu:
        if out == dtype:
            return None
        if dtype in HALF and out == "float32":
            return None  # cuBLASLt multiplies 16-bit inputs into a float32 result with a float32 compute type
        return (
            f"cuBLASLt cannot multiply {dtype} inputs into a {out} result (dtype={out}); "
            "only the input dtype, or float32 for float16/bfloat16 input, is served"
        )
    if dtype in HALF:
        return (
            f"nvmath's host Matmul (MKL) multiplies float32, float64, complex64 and complex128 only; {dtype} "
            "would need a converted copy of the input to accumulate in float32; backend='numpy' serves it"
        )
    if out != dtype:
        return (
            f"nvmath's host Matmul needs one dtype for the data and the result ({dtype} input, dtype={out}); "
            "backend='numpy' serves dtype="
        )
    return None


def sparse_dense_strides(problem: Problem) -> tuple[int, int] | str:
    """Strides (segment axis, features) of the data as cuSPARSE's dense operand, or why it cannot be one.

    For complex data: of its real view (:func:`as_real`).

    The result ``out3`` is column-major for ``D == 1`` (a vector) and row-major
    otherwise; the data is accepted in the same order only (unit stride along the
    segment axis for ``D == 1``, along the features otherwise).  nvmath takes a
    leading dimension as ``max(extent, stride)``, so an invalid one would be
    silently replaced: it is checked here.
    """
    problem = as_real(problem)
    if isinstance(problem, str):
        return problem
    B, n, D = problem.in_shape
    sB, sn, sD = problem.strides
    if D == 1:
        if sn != 1 and n > 1:
            return (
                f"its segment axis has stride {sn}; cuSPARSE SpMM is used here with a unit-stride segment axis "
                "(the result's order) only"
            )
        s_n, s_d, span = 1, n, n
    else:
        if sD != 1 or (sn < D and n > 1):
            return (
                f"its (n, D) = ({n}, {D}) matrix has strides ({sn}, {sD}); cuSPARSE SpMM is used here with "
                "row-major data (the result's order) only: unit stride along the features, at least D along "
                "the segments"
            )
        s_n, s_d = (sn if n > 1 else D), 1
        span = n * s_n
    if B > 1 and sB < span:
        return f"its batch axis (stride {sB}) interleaves with the rows; cuSPARSE needs whole batches"
    return s_n, s_d
