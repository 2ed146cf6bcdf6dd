"""Feature rows whose segments' lengths vary, with and without long segments cut into tiles.

For each (layout, N rows, d features, segments) of :data:`SHAPES`, float32 CUDA tensors and int64
``ptr`` offsets, in this process, on the same tensors: the device time per call of
``torch.segment_reduce`` (``unsafe=True`` and its default), then linred's
``segmented_sum(x, offsets=ptr, check=False, out=)`` with the nvrtc options ``off`` (no segment
cut into tiles: ``feature_long_min_bytes`` past any call) and ``on`` (every call of
``features_reduce`` or ``features_split`` cuts segments longer than ``feature_long_factor``
times the average) and the options as shipped (cut from ``feature_long_min_bytes`` of data
on), and all three again with the default ``check=True``. Each figure is the median of 9 samples of 30
back-to-back calls timed with CUDA events (``feature_rows.timeit``), and each row ends with its
largest sample's excess over its median; every result is checked against float64 first.
Layouts as in ``tools/feature_rows.py``.

    python tools/feature_long.py [--factor 2]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from feature_rows import offsets, timeit

import linred
import linred.backends as backends

SHAPES = [("even", 10**6, 10**4, 32), ("even", 10**6, 10**4, 64), ("even", 10**6, 10**4, 128),
          ("even", 10**6, 4096, 128), ("even", 2 * 10**5, 2000, 128), ("even", 10**6, 10**4, 256),
          ("uniform", 10**6, 10**4, 128), ("geometric", 10**6, 10**4, 64), ("geometric", 10**6, 10**4, 128),
          ("geometric", 10**6, 4096, 128), ("geometric", 10**6, 10**4, 256), ("geometric", 2 * 10**5, 2000, 128),
          ("one-huge", 10**6, 10**4, 64), ("one-huge", 10**6, 10**4, 128),
          ("even", 50_000, 256, 128), ("geometric", 50_000, 256, 128),
          ("even", 10**7, 10**5, 16), ("geometric", 10**7, 10**5, 16)]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--factor", type=int, default=2, help="feature_long_factor of the 'on' rows")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    data = []
    for kind, n, m, d in SHAPES:
        ptr = offsets(kind, n, m, rng)
        x = torch.randn(n, d, device="cuda")
        ref = torch.segment_reduce(x.double(), "sum", offsets=ptr, axis=0)
        data.append((kind, n, m, d, ptr, x, torch.empty(m, d, device="cuda"), ref))
    before = backends.configure("nvrtc")

    def row(label: str, check: bool = False) -> None:
        cells = []
        for kind, n, _, d, ptr, x, out, ref in data:
            out.fill_(float("nan"))
            linred.segmented_sum(x, offsets=ptr, out=out)
            err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            if not err < 1e-6:
                raise AssertionError(f"{label}: {kind} {n} x {d}: relative error {err:.1e}")
            call = lambda x=x, ptr=ptr, out=out: linred.segmented_sum(x, offsets=ptr, check=check, out=out)
            cells.append(timeit(call))
        spread = max(hi / med - 1 for med, _, hi in cells)
        print(f"{label:26s} " + " ".join(f"{c[0]:8.1f}" for c in cells) + f"  (max +{spread:.0%})", flush=True)

    def configure(**changes: int) -> None:
        backends.configure("nvrtc", **changes)
        linred.clear_plan_cache()

    print(f"{torch.cuda.get_device_name()}; device µs per call")
    print(f"{'':26s} " + " ".join(f"{k[:4]}{n // 1000}k{d}/{m}".rjust(8) for k, n, m, d in SHAPES))
    for label, kwargs in (("torch unsafe", {"unsafe": True}), ("torch default", {})):
        times = [timeit(lambda x=x, ptr=ptr, kw=kwargs: torch.segment_reduce(x, "sum", offsets=ptr, axis=0, **kw))[0]
                 for *_, ptr, x, _, _ in data]  # fmt: skip
        print(f"{label:26s} " + " ".join(f"{t:8.1f}" for t in times), flush=True)
    try:
        for check in (False, True):
            suffix = ", default check" if check else ""
            configure(feature_long_min_bytes=1 << 62)
            row("off" + suffix, check)
            configure(feature_long_min_bytes=1, feature_long_factor=args.factor)
            row(f"on factor {args.factor}" + suffix, check)
            configure(feature_long_min_bytes=before.feature_long_min_bytes,
                      feature_long_factor=before.feature_long_factor)  # fmt: skip
            row("default options" + suffix, check)
    finally:
        configure(feature_long_min_bytes=before.feature_long_min_bytes, feature_long_factor=before.feature_long_factor)


if __name__ == "__main__":
    main()
