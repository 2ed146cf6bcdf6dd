"""Device time per call of the softmax family's kernel (and its accuracy), case by case.

For comparing two versions of ``linred/kernels/softmax.cuh`` on one machine: run this once per
version (``PYTHONPATH`` pointing at each tree), in the order a, b, b, a, with a ``label`` each;
every line names the label, the case, the function and the median [min, max] per call of 9
samples of about 15 ms of back-to-back calls (CUDA events on the current stream), and the % of
a device-to-device copy of the data measured the same way (the data read once and the result
written once).  CUDA torch tensors, ``check=False``.

Cases: 64M x 1 values in segments of 1 .. 511 rows (``64Mx1 m256``), the same with one segment
of about 86,000 rows (``64Mx1 m256 skew``), segments of mean 16 with one of about 640,000 rows
(``64Mx1 m16 huge``), float16, bfloat16 and float64 variants (float16 also
in segments of 1 .. 31 and 1 .. 8191 rows), and smaller calls (2M x 8, 4M x 1, 4M x 3, 500k x
64), which a call's host time bounds.  ``--single-rows`` reads 16-bit data a row at a time
instead of two (the kernel before pairs of rows); ``--group G`` forces the lanes of a worker.
Short segments (``m4`` to ``m64``, 8 features ``8Mx8``) compare the lanes per worker.
``--backward`` times ``torch.autograd.grad`` of a result instead (the backward kernel, and
autograd's own work per call); ``--backward-by parts`` takes every backward of one column from
the segments' parts (``grad_from_parts``, where the workers' kernel would serve it too),
``--backward-by workers`` none where the workers' kernel serves it, ``--backward-by composed``
none at all (the workers' kernel or the composition, as before that kernel).  ``--workers`` gives
logsumexp of one column workers per segment (``linred._softmax_kernel.LSE_RUNS = False``) where
``warp_reduce`` reads it by default (longer means than ``MAX_MEAN_ROWS``, ``64Mx1 m1M``, then go
to the composition).

``--accuracy`` prints instead the relative error of the float32 results against float64 (the
same data) for logsumexp, softmax, log_softmax, var and std on 4,000,000 values (and var and
std of values far from 0 beside their spread: 1000 + N(0, 1)).

    python tools/softmax_kernel_times.py new
    python tools/softmax_kernel_times.py new --cases "64Mx1 m256" "64Mx1 m256 skew" --functions logsumexp var
    python tools/softmax_kernel_times.py new --accuracy
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
from fused_bench import CudaTimer, measure  # (tools/: the same timer as the composition bench)

import linred

#: label -> (rows, features, mean length, dtype, one long segment)
CASES = {
    "64Mx1 m256": (1 << 26, 1, 256, "float32", False),
    "64Mx1 m256 skew": (1 << 26, 1, 256, "float32", True),
    "64Mx1 m256 f16": (1 << 26, 1, 256, "float16", False),
    "64Mx1 m256 bf16": (1 << 26, 1, 256, "bfloat16", False),
    "64Mx1 m16 f16": (1 << 26, 1, 16, "float16", False),
    "64Mx1 m4096 f16": (1 << 26, 1, 4096, "float16", False),
    "64Mx1 m1024 f16": (1 << 26, 1, 1024, "float16", False),
    "64Mx1 m2048 f16": (1 << 26, 1, 2048, "float16", False),
    "64Mx1 m4": (1 << 26, 1, 4, "float32", False),
    "64Mx1 m16": (1 << 26, 1, 16, "float32", False),
    "64Mx1 m64": (1 << 26, 1, 64, "float32", False),
    "64Mx1 m128": (1 << 26, 1, 128, "float32", False),
    "8Mx8 m16": (1 << 23, 8, 16, "float32", False),
    "8Mx8 m64": (1 << 23, 8, 64, "float32", False),
    "4Mx1 m20": (4_000_000, 1, 20, "float32", False),
    "64Mx1 m16 huge": (1 << 26, 1, 16, "float32", 40_000),
    "4Mx1 m16": (1 << 22, 1, 16, "float32", False),
    "4Mx1 m16 huge": (1 << 22, 1, 16, "float32", 20_000),
    "16Mx1 m16": (1 << 24, 1, 16, "float32", False),
    "16Mx1 m16 huge": (1 << 24, 1, 16, "float32", 40_000),
    "64Mx1 m1024": (1 << 26, 1, 1024, "float32", False),
    "64Mx1 m2048": (1 << 26, 1, 2048, "float32", False),
    "64Mx1 m4096": (1 << 26, 1, 4096, "float32", False),
    "64Mx1 m8192": (1 << 26, 1, 8192, "float32", False),
    "64Mx1 m16384": (1 << 26, 1, 16384, "float32", False),
    "64Mx1 m1M": (1 << 26, 1, 1 << 20, "float32", False),
    "64Mx1 m4 f16": (1 << 26, 1, 4, "float16", False),
    "64Mx1 m8192 f16": (1 << 26, 1, 8192, "float16", False),
    "64Mx1 m16384 f16": (1 << 26, 1, 16384, "float16", False),
    "64Mx1 m1M f16": (1 << 26, 1, 1 << 20, "float16", False),
    "32Mx1 m256 f64": (1 << 25, 1, 256, "float64", False),
    "2Mx8 m32": (2_000_000, 8, 32, "float32", False),
    "4Mx1 m64": (4_000_000, 1, 64, "float32", False),
    "4Mx1 m4096": (4_000_000, 1, 4096, "float32", False),
    "4Mx3 m32": (4_000_000, 3, 32, "float32", False),
    "500kx64 m32": (500_000, 64, 32, "float32", False),
}
FUNCTIONS = ("logsumexp", "softmax", "log_softmax", "var")
CHOICES = (*FUNCTIONS, "std")


def _time(fn: Callable[[], Any]) -> tuple[float, float, float]:
    """Median, min and max µs per call: 9 samples of about 15 ms of back-to-back calls between
    CUDA events (``tools/fused_bench.py``'s timer, after its warm-up calls)."""
    seconds = measure(fn, CudaTimer("torch"), 9, 15.0)
    return 1e6 * statistics.median(seconds), 1e6 * min(seconds), 1e6 * max(seconds)


def offsets(n: int, mean: int, seed: int, skew: bool | int = False) -> np.ndarray:
    """Offsets of segments of 1 .. 2 * mean - 1 rows over ``n`` rows; with ``skew``, the last
    segment takes the rows of the last 330 (about 86,000 rows for 64M rows of mean 256), or of
    the last ``skew`` where that is a count."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * mean, n // mean + 2 * int(np.sqrt(n)) + 64)
    off = np.concatenate([[0], np.cumsum(lengths)])
    off = off[off <= n]
    if skew:  # (True: the last 330 segments as one; a count: that many)
        off = off[: len(off) - (330 if skew is True else int(skew))]
    if off[-1] != n:
        off = np.append(off, n)
    return off


def times(label: str, cases: list[str], functions: list[str], backward: bool = False) -> None:
    import torch

    for case in cases:
        n, d, mean, dtype, skew = CASES[case]
        off = torch.as_tensor(offsets(n, mean, 0, skew), device="cuda")
        x = torch.randn(n, d, device="cuda", dtype=getattr(torch, dtype))
        if d == 1:
            x = x.squeeze(1)
        m = off.numel() - 1
        longest = int((off[1:] - off[:-1]).max())
        buf = torch.empty_like(x)
        copy = _time(functools.partial(buf.copy_, x))[0]
        nbytes = x.numel() * x.element_size()
        for name in functions:
            f = getattr(linred, f"segmented_{name}")
            moved = nbytes + (nbytes if name in ("softmax", "log_softmax") else m * d * x.element_size())
            call = functools.partial(f, x, offsets=off, check=False)
            if backward:  # (the backward alone: it reads x or y and the gradient, and writes dx)
                leaf = x.detach().requires_grad_()
                y = f(leaf, offsets=off)  # (checked, as by default: it notes very long segments)
                g = torch.randn_like(y)
                moved = 2 * nbytes + g.numel() * g.element_size()
                call = functools.partial(torch.autograd.grad, y, leaf, g, retain_graph=True)
            med, lo, hi = _time(call)
            pct = 100 * (moved / med) / (2 * nbytes / copy)
            print(f"{label} | {case} (m={m}, longest {longest}) | {name} | {med:.1f} [{lo:.1f}, {hi:.1f}] us | "
                  f"{pct:.1f}% of copy ({copy:.1f} us)", flush=True)  # fmt: skip
        del x, buf  # (before the next case's arrays)


def accuracy(label: str) -> None:
    import torch

    rng = np.random.default_rng(1)
    n = 4_000_000
    for scale, mean, shift in ((1.0, 256, 0.0), (30.0, 256, 0.0), (1.0, 8192, 0.0), (1.0, 256, 1000.0)):
        off = np.concatenate([[0], np.cumsum(rng.integers(1, 2 * mean, n // mean + 5000))])
        off = off[off <= n]
        off = torch.as_tensor(off if off[-1] == n else np.append(off, n), device="cuda")
        x = torch.as_tensor(shift + rng.normal(size=n) * scale, device="cuda").float()
        xd = x.double()
        lengths = off[1:] - off[:-1]
        mean_ = torch.segment_reduce(xd, "sum", offsets=off) / lengths
        var = torch.segment_reduce((xd - torch.repeat_interleave(mean_, lengths)) ** 2, "sum", offsets=off) / lengths
        reference = {"var": var, "std": var.sqrt()}
        if not shift:
            mx = torch.segment_reduce(xd, "max", offsets=off)
            shifted = xd - torch.repeat_interleave(mx, lengths)
            total = torch.segment_reduce(torch.exp(shifted), "sum", offsets=off)
            reference |= {
                "logsumexp": mx + torch.log(total),
                "softmax": torch.exp(shifted) / torch.repeat_interleave(total, lengths),
                "log_softmax": shifted - torch.repeat_interleave(torch.log(total), lengths),
            }
        for name, ref in reference.items():
            got = getattr(linred, f"segmented_{name}")(x, offsets=off).double()
            if name in ("var", "std"):  # (segments of one row: 0 in both)
                got, ref = got[lengths > 1], ref[lengths > 1]
            rel = (got - ref).abs() / ref.abs().clamp_min(1e-30)
            if name == "softmax":
                rel = rel[ref.abs() > 1e-6]
            q = torch.quantile(rel[:1_000_000], 0.999).item()
            print(f"{label} | scale {scale} shift {shift} mean {mean} | {name} | max rel {rel.max().item():.2e} | "
                  f"99.9% {q:.2e} | median {rel.median().item():.2e}", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("label", help="names this tree's lines")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--functions", nargs="+", default=list(FUNCTIONS), choices=CHOICES)
    parser.add_argument("--group", type=int, help="lanes per worker (linred._softmax_kernel.GROUP)")
    parser.add_argument("--backward", action="store_true", help="time the backward (autograd.grad) instead")
    parser.add_argument("--backward-by", choices=("default", "parts", "workers", "composed"), default="default",
                        help="the backward of one column: from the parts, by the workers, or composed")  # fmt: skip
    parser.add_argument("--single-rows", action="store_true",
                        help="16-bit data read a row at a time (linred._softmax_kernel.PAIRS = False)")  # fmt: skip
    parser.add_argument("--accuracy", action="store_true", help="relative errors against float64 instead of times")
    parser.add_argument("--workers", action="store_true",
                        help="logsumexp of a column by workers (linred._softmax_kernel.LSE_RUNS = False)")  # fmt: skip
    args = parser.parse_args(argv)
    from linred import _softmax_kernel

    if args.single_rows:
        _softmax_kernel.PAIRS = False
    if args.group:
        _softmax_kernel.GROUP = args.group
    if args.workers:
        _softmax_kernel.LSE_RUNS = False
    if args.backward_by == "composed":
        from linred import _fused_grad

        _fused_grad._from_parts = lambda *a: None
    elif args.backward_by == "workers":
        _softmax_kernel.GRAD_PARTS_MIN_MEAN = {}
    elif args.backward_by == "parts":
        workers = _softmax_kernel._enough_workers
        _softmax_kernel._enough_workers = lambda *a, **k: False if len(a) > 5 and a[5] else workers(*a, **k)
    if args.accuracy:
        accuracy(args.label)
    else:
        times(args.label, args.cases, args.functions, args.backward)


if __name__ == "__main__":
    main()
