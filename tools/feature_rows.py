"""Feature-row pooling on a GPU at even and varying segment lengths, against torch.segment_reduce.

For each (layout, N rows, d features, segments), float32 CUDA tensors and int64 ``ptr`` offsets,
in this process, on the same tensors: the device time per call of ``torch.segment_reduce``
(``unsafe=True``), linred's ``segmented_sum(x, offsets=ptr, check=False, out=)`` and its default
call, each the median of 9 samples of 30 back-to-back calls timed with CUDA events (and the min
and max of linred's ``check=False`` samples), with linred's relative error against float64.

Layouts: ``even`` (``torch.linspace``), ``geometric`` (lengths of mean N / segments),
``uniform`` (between half and 1.5 times the mean), ``one-huge`` (one segment of 5% of the rows
among even ones); the rounding of varying lengths to whole rows is spread over all of them.

To compare two trees, run it once with each on ``PYTHONPATH`` (it prints which linred it uses)::

    python tools/feature_rows.py
"""

from __future__ import annotations

import numpy as np
import torch

import linred

EVEN = [((10**7, 10**5), (4, 8, 16)), ((10**6, 10**4), (16, 32, 64, 128)), ((10**6, 4096), (16, 64, 128)),
        ((50_000, 256), (128,)), ((2000, 32), (64,))]  # fmt: skip
VARYING = [((10**7, 10**5), (8, 16)), ((10**6, 10**4), (16, 64, 128)), ((10**6, 4096), (128,))]
ONE_HUGE = [((10**6, 10**4), (16, 128))]


def timeit(fn, reps: int = 30) -> tuple[float, float, float]:
    """Median, min and max µs per call of 9 samples of ``reps`` back-to-back calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    out = []
    for _ in range(9):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / reps)
    out.sort()
    return out[4], out[0], out[-1]


def offsets(kind: str, n: int, segments: int, rng: np.random.Generator) -> torch.Tensor:
    if kind == "even":
        return torch.linspace(0, n, segments + 1, device="cuda").round().long()
    mean = n / segments
    if kind == "geometric":
        sizes = rng.geometric(1 / mean, segments).astype(np.float64)
    elif kind == "uniform":
        sizes = rng.integers(int(mean // 2), int(mean * 3 // 2) + 1, segments).astype(np.float64)
    else:  # one-huge
        sizes = np.full(segments, 0.95 * n / (segments - 1))
        sizes[segments // 2] = 0.05 * n
    ends = np.cumsum(sizes)
    ends = np.round(ends * (n / ends[-1])).astype(np.int64)
    return torch.as_tensor(np.concatenate([[0], ends]), device="cuda")


def case(kind: str, n: int, segments: int, d: int, rng: np.random.Generator) -> str:
    """One printed row: the three methods' times on one layout's tensors."""
    ptr = offsets(kind, n, segments, rng)
    x = torch.randn(n, d, device="cuda")
    out = torch.empty(segments, d, device="cuda")
    ref = torch.segment_reduce(x.double(), "sum", offsets=ptr, axis=0)
    linred.segmented_sum(x, offsets=ptr, out=out)
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    peer = timeit(lambda: torch.segment_reduce(x, "sum", offsets=ptr, axis=0, unsafe=True))
    fast = timeit(lambda: linred.segmented_sum(x, offsets=ptr, check=False, out=out))
    default = timeit(lambda: linred.segmented_sum(x, offsets=ptr, out=out))
    return (
        f"{kind:9s} {n:>8d} x {d:<3d} {segments:>6d} | torch {peer[0]:8.1f} | linred check=False {fast[0]:8.1f}"
        f" [{fast[1]:.1f}, {fast[2]:.1f}] {fast[0] / peer[0]:5.2f}x | default {default[0]:8.1f}"
        f" {default[0] / peer[0]:5.2f}x | err {err:.1e}"
    )


def main() -> None:
    print(f"linred from {linred.__file__}; {torch.cuda.get_device_name()}; device µs per call")
    rng = np.random.default_rng(0)
    cases = [("even", *s, d) for s, ds in EVEN for d in ds]
    cases += [(k, *s, d) for s, ds in VARYING for d in ds for k in ("geometric", "uniform")]
    cases += [("one-huge", *s, d) for s, ds in ONE_HUGE for d in ds]
    for kind, n, segments, d in cases:
        print(case(kind, n, segments, d, rng), flush=True)


if __name__ == "__main__":
    main()
