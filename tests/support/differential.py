"""The machinery of the differential suite (``tests/test_differential.py``): cases, inputs, the
float64 reference and the error model.

Error model
-----------
Every result is compared with a float64 (complex128; int64/uint64 for integers) NumPy
reduction of the same values, written here without any of linred's code:

- integer sums, every max and min: **exact** (max/min: the reference rounded to the result
  dtype, which holds it exactly);
- floating sums and means, elementwise::

      |result - reference| <= tau(acc) * S + 2 * eps(result) * |reference| + tiny(result)

  where ``S`` is the sum of ``|x|`` over the segment (divided by its length for a mean),
  ``acc`` the accumulation precision (float32 for float16, bfloat16, float32 and complex64
  data, float64 for float64 and complex128), ``tau(float32) = 1e-6``,
  ``tau(float64) = 1e-10``, ``eps`` and ``tiny`` those of the result dtype (one rounding of
  the result, twice for slack);
- NaN exactly where the reference is NaN; infinities equal;
- floating products, elementwise (``L`` the segment length, ``u`` the accumulation's unit
  roundoff): ``|result - reference| <= 2 (L + 2) u |reference| + 2 eps(result) |reference| +
  tiny(result)`` (any order of ``L - 1`` multiplications errs by at most ``gamma(L - 1)``
  relatively), and an infinity of the right sign where the reference is within that bound of
  the result dtype's largest value or beyond.  Their data is drawn near +-1 (``|x|`` in
  ``exp(+-s)`` with ``s`` shrinking as ``1/sqrt(L)``) so that products neither vanish nor
  overflow; integer products are exact modulo 2^64 (they wrap around in any order alike).

``tau`` does not grow with the segment length: a float32 segment of 2^26 values must come
out within 1e-6 of its float64 sum relative to ``S``, which sequential float32 accumulation
does not achieve (3e-3 at 2^24 on positive data).  The docs (docs/api.md, "Accuracy") state
the same contract.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import linred
from support.arrays import HAS_TORCH, cupy, empty_like_kind, to_kind, to_numpy, torch
from support.dtypes import COMPLEX, HALF, INTEGER, UNSIGNED, expected_dtype, np_dtype
from support.reference import identity
from support.refusals import refusal

#: calls the differential suite checked (tests/test_differential.py), refused and found wrong;
#: conftest.py's ``differential_counts`` fixture puts each test's on its report
DIFFERENTIAL: collections.Counter = collections.Counter()

TAU = {"float32": 1e-6, "float64": 1e-10}
#: every dtype the suite draws (the contract's; int16/uint16 behave as int8/uint8 do in the kernels)
DTYPES = (
    "float32", "float16", "bfloat16", "float64", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
)  # fmt: skip
REDUCTIONS = ("sum", "mean", "max", "min", "prod")
SPECS = ("fixed", "offsets", "lengths")
#: layouts every kind can make; NumPy adds byte-swapped, unaligned and structured-field views
LAYOUTS = ("contiguous", "strided", "reversed", "misaligned", "axis-1")
NUMPY_LAYOUTS = ("byteswapped", "unaligned", "field")
#: feature columns that are not contiguous (cases with features only): the transpose of a
#: contiguous (d, n) array; a batch of three along axis 0 with the segments along axis 1,
#: stored feature-major (d, 3, n); every other column of an (n, 2d) array
COLUMN_LAYOUTS = ("columns", "columns-batch", "columns-sliced")
#: value distributions: centred (errors cancel) and positive with an offset (they add up)
VALUES = ("centred", "offset")


def around(*values: int, lo: int = 1) -> list[int]:
    """``k*T - 1, k*T, k*T + 1`` for every ``k*T`` given (those >= ``lo``), in order, unique."""
    return sorted({v + d for v in values for d in (-1, 0, 1) if v + d >= lo})


@dataclasses.dataclass(frozen=True)
class Case:
    """One call: what to reduce, how the data is laid out and which backend runs it.

    ``lengths`` are the segment lengths (for ``spec == "fixed"`` all equal to ``L``); ``d``
    the feature columns (0: 1-D data).
    """

    family: str
    backend: str
    kind: str
    dtype: str
    reduction: str
    spec: str
    lengths: tuple[int, ...]
    d: int = 0
    layout: str = "contiguous"
    out: bool = False
    check: bool = True
    values: str = "centred"

    @property
    def n(self) -> int:
        return sum(self.lengths)

    @property
    def fixed_length(self) -> int | None:
        return self.lengths[0] if self.spec == "fixed" else None

    def describe(self) -> str:
        m, n = len(self.lengths), self.n
        seg = f"L={self.lengths[0]}" if self.spec == "fixed" else f"{self.spec} (m={m}, longest {max(self.lengths)})"
        shape = f"(n={n}, d={self.d})" if self.d else f"(n={n},)"
        return (
            f"[{self.family}] segmented_{self.reduction} backend={self.backend!r} {self.kind} {self.dtype} {shape} "
            f"{seg} layout={self.layout} out={self.out} check={self.check} values={self.values}"
        )


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def values(dtype: str, shape: tuple[int, ...], rng: np.random.Generator, kind: str = "centred") -> np.ndarray:
    """Random values of ``dtype`` whose sums cannot overflow (never all zeros)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in INTEGER:
        lo, hi = (0, 100) if dtype in UNSIGNED else (-50, 50)
        if kind == "offset" and dtype not in ("int8", "uint8", "int16", "uint16"):
            lo, hi = 10**6, 10**6 + 100
        return rng.integers(lo, hi, shape).astype(dtype)
    base = 1000.0 if kind == "offset" and dtype not in HALF else 8.0 if kind == "offset" else 0.0
    if dtype in COMPLEX:
        z = base + rng.uniform(-2, 2, shape) + 1j * (base + rng.uniform(-2, 2, shape))
        return z.astype(dtype)
    return (base + rng.uniform(-2, 2, shape)).astype(np_dtype(dtype))


def prod_values(case: Case, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values whose segment products stay within range: near +-1 for floats (log-magnitudes
    uniform in +-s with s about 1/sqrt(L), so a product's log has a spread of about 1), small
    integers (their products wrap around, exactly alike in any order)."""
    dtype = case.dtype
    if dtype == "bool":
        return rng.random(shape) < 0.9
    if dtype in INTEGER:
        lo, hi = (0, 4) if dtype in UNSIGNED else (-3, 4)
        return rng.integers(lo, hi, shape).astype(dtype)
    s = min(0.7, 2.0 / np.sqrt(max(1, max(case.lengths, default=1))))
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0) if case.values == "centred" else 1.0
    v = sign * np.exp(rng.uniform(-s, s, shape))
    if dtype in COMPLEX:
        v = v * np.exp(1j * rng.uniform(-np.pi, np.pi, shape))
        return v.astype(dtype)
    return v.astype(np_dtype(dtype))


def _flip(a: Any) -> Any:
    if HAS_TORCH and isinstance(a, torch.Tensor):
        return a.flip(0)
    return a[::-1]


def _permute(a: Any, axes: tuple[int, ...]) -> Any:
    """``a`` with its axes in the order ``axes`` (a view), for any array kind."""
    if HAS_TORCH and isinstance(a, torch.Tensor):
        return a.permute(*axes)
    return a.transpose(axes)


def make_input(case: Case, rng: np.random.Generator) -> tuple[Any, np.ndarray, int]:
    """``(x as passed, its values as a native NumPy array, axis)`` for ``case``."""
    n, d = case.n, case.d
    shape = (n, d) if d else (n,)
    if case.layout in ("axis-1", "columns-batch"):
        shape = (3, n) if not d else (3, n, d)
    v = values(case.dtype, shape, rng, case.values) if case.reduction != "prod" else prod_values(case, shape, rng)
    axis = 1 if case.layout in ("axis-1", "columns-batch") else 0
    layout = case.layout
    if layout in ("contiguous", "axis-1") or (layout in COLUMN_LAYOUTS and not d):
        return to_kind(v, case.kind), v, axis
    if layout in ("columns", "columns-batch"):  # stored with the features first
        order = tuple(range(v.ndim))
        stored = np.ascontiguousarray(np.transpose(v, order[-1:] + order[:-1]))
        return _permute(to_kind(stored, case.kind), order[1:] + order[:1]), v, axis
    if layout == "columns-sliced":  # every other column, every other element of a row
        buf = np.zeros((n, 2 * d), dtype=v.dtype)
        buf[:, ::2] = v
        return to_kind(buf, case.kind)[:, ::2], v, axis
    if layout == "strided":  # every other row of a twice longer buffer
        buf = np.zeros((2 * n, *shape[1:]), dtype=v.dtype)
        buf[::2] = v
        return to_kind(buf, case.kind)[::2], v, axis
    if layout == "reversed":  # a negative stride
        if case.kind.startswith("torch"):
            raise ValueError("torch tensors have no negative strides")
        buf = np.ascontiguousarray(v[::-1])
        return _flip(to_kind(buf, case.kind)), v, axis
    if layout in ("misaligned", "misaligned-3"):  # 1 or 3 elements into a flat buffer: not 16-byte aligned
        # (elements, not a row: a row of feature rows of whole 16-byte groups would keep every
        # row aligned, and the kernels' 16-byte path would never meet a misaligned row).  What
        # lies before is poison (NaN, or the largest integer): warp_reduce reads it as part of
        # the 16-byte vector the data begins in, and must let it reach no result.
        skip = 1 if layout == "misaligned" else 3
        flat = np.zeros(v.size + skip, dtype=v.dtype)
        flat[:skip] = _poison(v.dtype)
        flat[skip:] = v.reshape(-1)
        return to_kind(flat, case.kind)[skip:].reshape(v.shape), v, axis
    if case.kind != "numpy":
        raise ValueError(f"layout {layout} exists for NumPy arrays only")
    if layout == "byteswapped":
        return v.astype(v.dtype.newbyteorder()), v, axis
    if layout == "unaligned":  # the elements at an odd address
        raw = np.zeros(v.nbytes + 1, dtype=np.uint8)
        x = raw[1:].view(v.dtype).reshape(v.shape)
        x[...] = v
        return x, v, axis
    if layout == "field":  # a field of a structured array: strides not a multiple of the itemsize
        rec = np.zeros(v.shape, dtype=[("pad", "u1"), ("v", v.dtype)])
        rec["v"] = v
        return rec["v"], v, axis
    raise ValueError(layout)


def _poison(dtype: np.dtype) -> Any:
    """A value that no result of a reduction that did not read it can show: NaN for floating
    data, the largest value for integers, True for bools."""
    if dtype.kind in "fc" or dtype.name == "bfloat16":
        return np.nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def segment_kwargs(case: Case, x: Any) -> dict[str, Any]:
    lengths = np.asarray(case.lengths, dtype=np.int64)
    if case.spec == "fixed":
        return {"segment_length": case.lengths[0]}
    device = _device_kind(x)
    if case.spec == "offsets":
        off = np.concatenate([[0], np.cumsum(lengths)])
        return {"offsets": _index_like(off, device)}
    return {"lengths": _index_like(lengths, device)}


def _device_kind(x: Any) -> str:
    if cupy is not None and isinstance(x, cupy.ndarray):
        return "cupy"
    if HAS_TORCH and isinstance(x, torch.Tensor):
        return "torch-cuda" if x.device.type == "cuda" else "torch-cpu"
    return "numpy"


def _index_like(a: np.ndarray, kind: str) -> Any:
    """Offsets or lengths as the data's kind, int32 when they fit (both index dtypes get used)."""
    if a.size and a.max() < 2**31 and a.size % 2:
        a = a.astype(np.int32)
    return to_kind(a, kind)


# ---------------------------------------------------------------------------
# The reference and the comparison
# ---------------------------------------------------------------------------


def _segments_reduce(ufunc: Any, work: np.ndarray, starts: np.ndarray, ends: np.ndarray, fill: Any) -> np.ndarray:
    """``ufunc`` over ``work[starts[i]:ends[i]]`` along axis 0 (``fill`` for an empty one)."""
    out = np.full((starts.shape[0], *work.shape[1:]), fill, dtype=work.dtype)
    full = ends > starts
    if full.any():  # contiguous segments: each non-empty one ends where the next non-empty starts
        out[full] = ufunc.reduceat(work, starts[full], axis=0)
    return out


def reference(case: Case, v: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``(reference, S)``: the float64 (or exact integer) result in linred's result layout, and
    for floating sums and means the sum of ``|x|`` per result element (else None)."""
    out_name = expected_dtype(case.reduction, case.dtype)
    lengths = np.asarray(case.lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    xm = np.moveaxis(v, axis, 0)
    if (case.dtype in INTEGER and case.dtype != "bool") or (case.dtype == "bool" and case.reduction in ("sum", "mean")):
        work = xm.astype(np.uint64 if case.dtype in UNSIGNED else np.int64)  # exact: the values are small
    elif case.dtype == "bool":
        work = xm
    elif case.dtype in COMPLEX:
        work = xm.astype(np.complex128)
    else:
        work = xm.astype(np.float64)
    size = None
    with np.errstate(invalid="ignore", over="ignore"):
        if case.reduction in ("sum", "mean"):
            total = _segments_reduce(np.add, work, starts, ends, 0)
            if out_name not in INTEGER:
                absx = np.abs(xm.astype(np.complex128 if case.dtype in COMPLEX else np.float64))
                size = _segments_reduce(np.add, absx, starts, ends, 0).astype(np.float64)
            if case.reduction == "mean":
                count = lengths.reshape((-1,) + (1,) * (work.ndim - 1)).astype(np.float64)
                with np.errstate(divide="ignore"):
                    total = total / count
                    size = size / count
            ref = total
        elif case.reduction == "prod":
            ref = _segments_reduce(np.multiply, work, starts, ends, 1)
            if out_name not in INTEGER:  # the segment lengths, for the error bound
                size = np.broadcast_to(lengths.reshape((-1,) + (1,) * (work.ndim - 1)), ref.shape).astype(np.float64)
        else:
            ufunc = np.maximum if case.reduction == "max" else np.minimum
            ref = _segments_reduce(ufunc, work, starts, ends, identity(case.reduction, out_name))
    ref = np.moveaxis(ref, 0, axis)
    size = None if size is None else np.moveaxis(size, 0, axis)
    return ref, size


def compare(case: Case, got: Any, ref: np.ndarray, size: np.ndarray | None) -> str | None:
    """None when ``got`` meets the error model, else what is wrong (first wrong elements)."""
    out_name = expected_dtype(case.reduction, case.dtype)
    res = to_numpy(got)
    got_name = str(res.dtype) if res.dtype.name != "bfloat16" else "bfloat16"
    if got_name != out_name:
        return f"result dtype {got_name}, expected {out_name}"
    if res.shape != ref.shape:
        return f"result shape {res.shape}, expected {ref.shape}"
    if out_name in INTEGER or case.reduction in ("max", "min"):
        expected = ref.astype(np_dtype(out_name)) if out_name not in INTEGER else ref
        if out_name in INTEGER:
            bad = res.astype(ref.dtype) != ref
        else:
            a, b = res.astype(np.float64), expected.astype(np.float64)
            bad = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        return _report(bad, res, ref, None)
    wide = np.complex128 if out_name in COMPLEX else np.float64
    r = res.astype(wide)
    acc = "float64" if out_name in ("float64", "complex128") else "float32"
    real = {"complex64": "float32", "complex128": "float64"}.get(out_name, out_name)
    fi = np.finfo(np_dtype(real)) if real != "bfloat16" else _bf16_finfo()
    if case.reduction == "prod":
        return _report(*_prod_bad(r, ref, size, float(np.finfo(acc).eps) / 2, fi), res, ref, None)
    with np.errstate(invalid="ignore"):
        bound = TAU[acc] * size + 2 * float(fi.eps) * np.abs(ref) + float(fi.smallest_normal)
        err = np.abs(r - ref)
        nan_ok = np.isnan(r) == np.isnan(ref)
        finite = np.isfinite(ref)
        inf_ok = np.where(np.isinf(ref), r == ref, True)
        # a sum past the result dtype's largest value (float16 sums of 32768 values of 8) is
        # an infinity of its sign once rounded to that dtype
        rounds_to_inf = (np.abs(ref) + bound >= float(fi.max)) & np.isinf(r) & (np.sign(r.real) == np.sign(ref.real))
        bad = ~nan_ok | ~inf_ok | (finite & ~(err <= bound) & ~rounds_to_inf)
    return _report(bad, res, ref, bound)


def _prod_bad(r: np.ndarray, ref: np.ndarray, lengths: np.ndarray, u: float, fi: Any) -> tuple[np.ndarray]:
    """Where a floating product is off the error model (see the module's notes)."""
    with np.errstate(invalid="ignore", over="ignore"):
        rel = 2 * (lengths + 2) * u + 2 * float(fi.eps)
        mag = np.abs(ref)
        close = np.abs(r - ref) <= rel * mag + float(fi.smallest_normal)
        big = mag >= float(fi.max) * (1 - rel)  # may round to infinity in the result dtype
        overflow = big & np.isinf(r) & (np.sign(r.real) == np.sign(ref.real))
        nan_ok = np.isnan(r) == np.isnan(ref)
        bad = ~nan_ok | (~np.isnan(ref) & ~(close | overflow))
    return (bad,)


def _bf16_finfo() -> Any:
    import ml_dtypes

    return ml_dtypes.finfo(ml_dtypes.bfloat16)


def _report(bad: np.ndarray, res: np.ndarray, ref: np.ndarray, bound: np.ndarray | None) -> str | None:
    if not bad.any():
        return None
    where = np.argwhere(bad)[:5]
    parts = []
    for i in where:
        i = tuple(int(v) for v in i)
        extra = "" if bound is None else f" (bound {bound[i]:.3g})"
        parts.append(f"{i}: got {res[i]!r}, reference {ref[i]!r}{extra}")
    return f"{int(bad.sum())} of {bad.size} results wrong; first: " + "; ".join(parts)


# ---------------------------------------------------------------------------
# Running a case
# ---------------------------------------------------------------------------

FUNCTIONS = {
    "sum": linred.segmented_sum,
    "mean": linred.segmented_mean,
    "max": linred.segmented_max,
    "min": linred.segmented_min,
    "prod": linred.segmented_prod,
}


def kernel_of(case: Case, x: Any, kwargs: dict[str, Any], axis: int) -> str:
    """The executor (and, for nvrtc, the kernel) a plan of this call uses, for messages."""
    try:
        with linred.SegmentedReduction(x, **kwargs, axis=axis, reduction=case.reduction, backend=case.backend) as p:
            ex = p._executor
            name = f"{p.backend}:{type(ex).__name__}"
            if type(ex).__name__ == "_FixedExecutor":
                from linred.backends.nvrtc import DEFAULT_OPTIONS as TUNING
                from linred.backends.nvrtc.kernels import fixed_layout as _fixed_layout

                name += f"/{_fixed_layout(p._call.problem, TUNING)[0]}"
            return name
    except Exception as e:  # the message is for a failure report only
        return f"unknown ({type(e).__name__})"


def run_case(case: Case, rng: np.random.Generator) -> str:
    """Run one case: ``"ok"``, ``"refused: ..."`` (a proper BackendError of a named backend, for
    something it is documented to refuse), or raise AssertionError with the case, the kernel and
    the first wrong segments."""
    x, v, axis = make_input(case, rng)
    kwargs = segment_kwargs(case, x)
    fn = FUNCTIONS[case.reduction]
    out = None
    ref, size = reference(case, v, axis)
    if case.out:
        out = empty_like_kind(case.kind, ref.shape, expected_dtype(case.reduction, case.dtype))
        if hasattr(out, "fill_"):
            out.fill_(7)
        else:
            out.fill(7)  # poisoned: an element the call does not write shows
    try:
        got = fn(x, **kwargs, axis=axis, backend=case.backend, check=case.check, out=out)
    except linred.BackendError as e:
        if case.backend == "auto" or (case.backend == "numpy" and case.kind in ("numpy", "torch-cpu")):
            raise AssertionError(f"{case.describe()}: {case.backend} refused a valid call: {e}") from e
        assert e.backend == case.backend and e.reason, f"malformed refusal {e!r}"
        try:
            r = refusal(e, case.backend)  # documented, or the backend cannot run here
        except AssertionError as bad:
            raise AssertionError(f"{case.describe()}: {bad}") from e
        return f"refused: {r.what}: {e.reason}"
    except Exception as e:  # anything but a refusal is a defect: report it with the case
        raise AssertionError(f"{case.describe()}: raised {type(e).__name__}: {e}") from e
    if out is not None and got is not out:
        raise AssertionError(f"{case.describe()}: out= was not returned")
    problem = compare(case, got, ref, size)
    if problem is not None:
        raise AssertionError(f"{case.describe()} [{kernel_of(case, x, kwargs, axis)}]: {problem}")
    return "ok"


# ---------------------------------------------------------------------------
# Choosing cases
# ---------------------------------------------------------------------------


def random_lengths(rng: np.random.Generator, m: int, style: str, mean: float) -> tuple[int, ...]:
    """``m`` segment lengths: geometric, with empty runs, power-law, or one huge among tiny."""
    if style == "geometric":
        lengths = rng.geometric(1 / max(mean, 1.0), m) - (0 if mean >= 1 else 1)
    elif style == "empty-runs":
        lengths = rng.integers(0, int(2 * mean) + 1, m)
        lengths[rng.random(m) < 0.4] = 0
    elif style == "power-law":
        lengths = np.minimum((rng.pareto(1.2, m) * mean / 4).astype(np.int64), int(50 * mean) + 1)
    elif style == "one-huge":
        lengths = rng.integers(0, 3, m)
        lengths[rng.integers(0, m)] = int(mean * m)
    else:
        raise ValueError(style)
    return tuple(int(v) for v in lengths)


STYLES = ("geometric", "empty-runs", "power-law", "one-huge")


class Cycle:
    """Hands out the values of a sequence in turn (so that a sweep meets every one of them)."""

    def __init__(self, items: Sequence[Any], start: int = 0) -> None:
        self._items = list(items)
        self._i = start

    def __call__(self) -> Any:
        item = self._items[self._i % len(self._items)]
        self._i += 1
        return item


def expand(
    family: str,
    backend: str,
    kinds: Sequence[str],
    shapes: Sequence[tuple[str, tuple[int, ...], int]],
    *,
    dtypes: Sequence[str] = DTYPES,
    layouts: Sequence[str] = ("contiguous",),
    reductions: Sequence[str] = REDUCTIONS,
    seed: int = 0,
) -> Iterator[Case]:
    """Cases for every shape ``(spec, lengths, d)``: every dtype with every reduction across the
    shapes (rotated so that each shape sees several), the kinds, layouts, ``out=``, ``check`` and
    value distributions handed out in turn."""
    kind, layout = Cycle(kinds, seed), Cycle(layouts, seed)
    flags = Cycle(list(itertools.product((False, True), (True, False), VALUES)), seed)
    combos = list(itertools.product(dtypes, reductions))
    pick = Cycle(combos, seed)
    per_shape = max(1, -(-len(combos) // max(1, len(shapes))) * 2)
    for spec, lengths, d in shapes:
        for _ in range(per_shape):
            dtype, reduction = pick()
            if reduction in ("max", "min") and dtype in COMPLEX:
                reduction = "sum"
            k, lay = kind(), layout()
            if reduction == "prod" and dtype in COMPLEX and k in ("cupy", "torch-cuda"):
                reduction = "sum"  # (complex products are served on the host only: tests/test_prod.py)
            if k == "cupy" and dtype == "bfloat16":
                k = "torch-cuda" if "torch-cuda" in kinds else k
                if k == "cupy":
                    dtype = "float16"
            if lay in NUMPY_LAYOUTS and k != "numpy":
                k, lay = ("numpy", lay) if "numpy" in kinds else (k, "strided")
            if lay == "reversed" and k.startswith("torch"):
                lay = "strided"
            if lay in ("field", "byteswapped") and dtype == "bfloat16":
                lay = "strided"
            out, check, vals = flags()
            yield Case(family, backend, k, dtype, reduction, spec, lengths, d, lay, out, check, vals)
