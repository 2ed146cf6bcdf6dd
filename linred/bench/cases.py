"""The shapes ``linred bench`` measures, and their segment layouts.

A :class:`Case` is one problem: a dtype, a number of elements along the
segment axis, an optional feature dimension and either a fixed segment length
or a rule that draws variable lengths from a seeded NumPy generator.  Cases are
plain data; :mod:`linred.bench.runner` allocates their buffers.

Sizes are given in float32 elements (``n``, default 2^28 on the GPU, 2^24 on the
CPU).  The other dtypes keep the same number of bytes, so every case streams
the same buffer size: float16 and bfloat16 cases hold ``2n`` elements, float64
cases ``n/2``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "GROUPS",
    "Case",
    "cpu_cases",
    "fmt_count",
    "gpu_cases",
    "select_cases",
]

#: group names accepted by ``--cases``
GROUPS = ("fixed", "variable", "skewed", "dtypes", "features")

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
SHORT_DTYPE = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


def fmt_count(k: int) -> str:
    """``2^20`` for powers of two from 2^16 on, else the plain number."""
    if k >= 1 << 16 and k & (k - 1) == 0:
        return f"2^{k.bit_length() - 1}"
    return str(k)


@dataclass(frozen=True)
class Case:
    """One benchmark problem: a segmented sum along axis 0 of an ``(n,)`` or ``(n, features)`` array.

    Attributes
    ----------
    name : str
        Short label used in the table, the plot and ``--cases``.
    group : str
        One of :data:`GROUPS`.
    dtype : str
        ``"float32"``, ``"float16"``, ``"bfloat16"`` or ``"float64"``.
    n : int
        Length of the segment axis.
    features : int
        Product of the trailing dimensions (1 for a 1-D array).
    length : int or None
        Fixed segment length ``L``, or None for variable lengths.
    layout : str
        For variable lengths: ``"geometric"``, ``"half-empty"``, ``"zipf"`` or ``"one-huge"``.
    mean : float
        Mean segment length of the geometric, half-empty and one-huge layouts.
    params : dict
        Extra parameters of a layout (``a`` and ``cap`` of zipf, ``huge`` of one-huge).
    """

    name: str
    group: str
    dtype: str
    n: int
    features: int = 1
    length: int | None = None
    layout: str = ""
    mean: float = 0.0
    params: dict = field(default_factory=dict, compare=False)

    @property
    def fixed(self) -> bool:
        return self.length is not None

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n,) if self.features == 1 else (self.n, self.features)

    @property
    def seed(self) -> int:
        """A seed that depends on the case's name only, so a filtered run draws the same data."""
        return zlib.crc32(self.name.encode())

    def describe(self) -> str:
        shape = "x".join(fmt_count(s) for s in self.shape)
        seg = f"L={fmt_count(self.length)}" if self.fixed else f"{self.layout} lengths"
        return f"{self.dtype} ({shape}), {seg}"

    def offsets(self) -> np.ndarray | None:
        """The int64 CSR offsets of a variable-length case (None for fixed length)."""
        if self.fixed:
            return None
        return make_offsets(self.layout, self.n, self.mean, self.seed, **self.params)


def _offsets_from_lengths(lengths: np.ndarray, n: int) -> np.ndarray:
    """Offsets of ``lengths`` clipped to ``n``: segments past ``n`` are dropped, the last one takes the rest."""
    offsets = np.empty(lengths.shape[0] + 1, dtype=np.int64)
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    keep = np.searchsorted(offsets, n, side="left")  # offsets[:keep] < n
    offsets = offsets[: max(keep, 1) + 1].copy()
    offsets[-1] = n
    return offsets


def _draw_until(draw, n: int, mean: float) -> np.ndarray:
    """Lengths from ``draw(size)`` until they cover ``n`` elements."""
    chunks = []
    total = drawn = 0
    size = int(n / max(mean, 1.0) * 1.02) + 64
    while total < n:
        chunk = draw(size).astype(np.int64)
        chunks.append(chunk)
        total += int(chunk.sum())
        drawn += size
        observed = max(total / drawn, 0.5)
        size = int((n - total) / observed * 1.1) + 64
    return np.concatenate(chunks)


def make_offsets(layout: str, n: int, mean: float, seed: int, **params) -> np.ndarray:
    """Int64 offsets of ``n`` elements for a variable-length layout.

    Layouts
    -------
    geometric
        Lengths ~ Geometric(1/mean) (>= 1, no empty segments).
    half-empty
        Each segment is empty with probability 1/2, else Geometric(1/(2 mean)):
        the overall mean is ``mean`` and half the segments are empty.
    zipf
        Power-law lengths ~ Zipf(a), capped at ``cap``: most segments have 1-3
        elements, a few are very long.
    one-huge
        One segment of ``huge`` (default half of ``n``) elements in the middle,
        the rest Geometric(1/mean).
    """
    rng = np.random.default_rng(seed)
    if layout == "geometric":
        lengths = _draw_until(lambda k: rng.geometric(1.0 / mean, size=k), n, mean)
    elif layout == "half-empty":

        def draw(k: int) -> np.ndarray:
            lengths = rng.geometric(0.5 / mean, size=k)
            lengths[rng.random(k) < 0.5] = 0
            return lengths

        lengths = _draw_until(draw, n, mean)
    elif layout == "zipf":
        a = params.get("a", 1.5)
        cap = params.get("cap", 1 << 20)
        lengths = _draw_until(lambda k: np.minimum(rng.zipf(a, size=k), cap), n, 500.0)
    elif layout == "one-huge":
        huge = min(params.get("huge", n // 2), n)
        rest = n - huge
        small = _draw_until(lambda k: rng.geometric(1.0 / mean, size=k), rest, mean) if rest else np.zeros(0, np.int64)
        small_offsets = _offsets_from_lengths(small, rest) if rest else np.zeros(1, np.int64)
        small = np.diff(small_offsets)
        half = small.shape[0] // 2
        lengths = np.concatenate([small[:half], [huge], small[half:]]).astype(np.int64)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    return _offsets_from_lengths(lengths, n)


def _fixed(n: int, lengths: list[int]) -> list[Case]:
    return [Case(f"L={fmt_count(L)}", "fixed", "float32", n, length=L) for L in lengths]


def _geometric(n: int, means: list[int]) -> list[Case]:
    return [Case(f"geom {m}", "variable", "float32", n, layout="geometric", mean=m) for m in means]


def _skewed(n: int, quick: bool) -> list[Case]:
    cases = [
        Case("half empty", "skewed", "float32", n, layout="half-empty", mean=16),
        Case("zipf 1.5", "skewed", "float32", n, layout="zipf", params={"a": 1.5, "cap": 1 << 20}),
        Case("one huge", "skewed", "float32", n, layout="one-huge", mean=4),
    ]
    return cases[:1] if quick else cases


def _dtypes(n: int, lengths: list[int], dtypes: tuple[str, ...]) -> list[Case]:
    return [
        Case(f"{SHORT_DTYPE[dt]} L={fmt_count(L)}", "dtypes", dt, n * 4 // ITEMSIZE[dt], length=L)
        for dt in dtypes
        for L in lengths
    ]


def _features(n: int, lengths: list[int], d: int = 64) -> list[Case]:
    return [Case(f"d={d} L={L}", "features", "float32", n // d, features=d, length=L) for L in lengths]


def gpu_cases(n: int, quick: bool = False) -> list[Case]:
    """The GPU shape set (``n`` float32 elements per case; other dtypes the same bytes)."""
    if quick:
        cases = _fixed(n, [2, 32, 1024, 1 << 24])
        cases += _geometric(n, [16, 8192])
        cases += _skewed(n, quick=True)
        cases += _dtypes(n, [32], ("float16", "bfloat16", "float64"))
        cases += _features(n, [8])
    else:
        cases = _fixed(n, [2, 8, 32, 128, 1024, 16384, 1 << 20, 1 << 24])
        cases += _geometric(n, [16, 256, 8192])
        cases += _skewed(n, quick=False)
        cases += _dtypes(n, [8, 32, 128, 4096], ("float16", "bfloat16", "float64"))
        cases += _features(n, [8, 128])
    return _feasible(cases)


def cpu_cases(n: int, quick: bool = False) -> list[Case]:
    """The CPU shape set: NumPy float32 at ``n`` elements."""
    if quick:
        cases = _fixed(n, [2, 32, 1024]) + _geometric(n, [16])
    else:
        cases = _fixed(n, [2, 8, 32, 128, 1024, 1 << 20]) + _geometric(n, [16, 256])
    return _feasible(cases)


def _feasible(cases: list[Case]) -> list[Case]:
    """Drop fixed-length cases whose ``L`` does not divide the (possibly overridden) ``n``."""
    return [c for c in cases if c.n >= 1 and (not c.fixed or (c.length <= c.n and c.n % c.length == 0))]


def select_cases(cases: list[Case], patterns: str | None) -> list[Case]:
    """Cases matching any comma-separated pattern (case-insensitive).

    A pattern is a group name, a case's exact name (``L=8`` selects that case
    only), or else a substring of case names (``geom``, ``f16``).
    """
    if not patterns:
        return list(cases)
    names = {c.name.lower() for c in cases}

    def matches(t: str, c: Case) -> bool:
        name = c.name.lower()
        return t == c.group or (name == t if t in names else t in name)

    tokens = [t.strip().lower() for t in patterns.split(",") if t.strip()]
    return [c for c in cases if any(matches(t, c) for t in tokens)]
