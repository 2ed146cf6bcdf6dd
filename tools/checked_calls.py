#!/usr/bin/env python3
"""Checked calls (the default ``check=True``) with variable lengths, on a GPU: the verdict taken
ahead of the reduction against the verdict taken after it.

One column of 2^28 float32 values (1 GiB) in the variable-length layouts of ``linred bench``,
CuPy or PyTorch input.  Each method is the public function called back to back on the same
buffers (``out=`` preallocated), timed with CUDA events around 30 calls; 7 samples, median and
[min, max] per call.  A checked call raises before it returns, so a call whose verdict comes
after its reduction keeps the GPU idle while the host does the next call's work; the figure
per call is what a loop of such calls gets.  Methods:

- ``check=False``: the caller's promise, no check;
- ``ahead``: the default route where :func:`linred.arrays._device_checks.ahead_pays` (the check
  enqueued ahead of the reduction, the call waits for it alone);
- ``after``: every checked call waits for its checking reduction (the route before ahead);
- ``lengths ahead`` / ``lengths after``: the same with ``lengths=``;
- ``torch.segment_reduce`` (offsets, ``unsafe=True``: no check) with torch input.

The two checked routes run in the order ahead, after, after, ahead, each with fresh plans;
% copy is (data + result + int64 offsets) over the time, against a device-to-device copy of
the data timed in the same run.

Usage: ``python tools/checked_calls.py [--torch] [--layouts geometric:16,geometric:256,...]``
"""

from __future__ import annotations

import argparse

import numpy as np

LAYOUTS = "geometric:16,half-empty:16,geometric:256,geometric:8192,zipf:0,one-huge:16"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", action="store_true", help="PyTorch input (default: CuPy)")
    parser.add_argument("--layouts", default=LAYOUTS)
    parser.add_argument("--log2n", type=int, default=28)
    parser.add_argument(
        "--max-offsets-bytes",
        type=float,
        default=None,
        help="AHEAD_MAX_OFFSETS_BYTES of the ahead route (inf: every layout ahead)",
    )
    parser.add_argument(
        "--min-bytes", type=int, default=None, help="AHEAD_MIN_BYTES of the ahead route (0: calls of every size)"
    )
    args = parser.parse_args()

    import cupy as cp

    import linred
    from linred.arrays import _device_checks
    from linred.bench.cases import make_offsets

    n = 1 << args.log2n
    if args.torch:
        import torch

        x = torch.rand(n, device="cuda", dtype=torch.float32)
        dst = torch.empty_like(x)

        def event() -> tuple:
            return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def elapsed(a, b) -> float:
            return a.elapsed_time(b)

        def copy() -> None:
            dst.copy_(x)

        def asarray(a: np.ndarray):
            return torch.as_tensor(a, device="cuda")

        def sync() -> None:
            torch.cuda.synchronize()
    else:
        x = cp.random.rand(n, dtype=cp.float32)
        dst = cp.empty_like(x)

        def event() -> tuple:
            return cp.cuda.Event(), cp.cuda.Event()

        def elapsed(a, b) -> float:
            return cp.cuda.get_elapsed_time(a, b)

        def copy() -> None:
            cp.copyto(dst, x)

        def asarray(a: np.ndarray):
            return cp.asarray(a)

        def sync() -> None:
            cp.cuda.get_current_stream().synchronize()

    def per_call(fn, calls: int = 30, samples: int = 7) -> tuple[float, float, float]:
        for _ in range(3):
            fn()
        sync()
        times = []
        for _ in range(samples):
            start, stop = event()
            for _ in range(5):  # (untimed calls first: the sample starts on a busy GPU)
                fn()
            start.record()
            for _ in range(calls):
                fn()
            stop.record()
            stop.synchronize()
            times.append(elapsed(start, stop) * 1e3 / calls)
        return float(np.median(times)), min(times), max(times)

    copy_us = per_call(copy)[0]
    print(f"{'torch' if args.torch else 'cupy'} input, n = 2^{args.log2n} float32; copy {copy_us:.1f} us "
          f"({8 * n / copy_us / 1e3:.0f} GB/s); 7 samples of 30 back-to-back calls, "
          "median (min-max) us per call")  # fmt: skip
    saved = _device_checks.AHEAD_MIN_BYTES if args.min_bytes is None else args.min_bytes
    if args.max_offsets_bytes is not None:
        _device_checks.AHEAD_MAX_OFFSETS_BYTES = args.max_offsets_bytes

    def route(ahead: bool) -> None:
        _device_checks.AHEAD_MIN_BYTES = saved if ahead else 1 << 62
        linred.clear_plan_cache()

    def measure(layout: str, mean: float) -> None:
        host = make_offsets(layout, n, mean, 0)
        off = asarray(host)
        lengths = asarray(np.diff(host))
        m = host.shape[0] - 1
        out = torch.empty(m, device="cuda") if args.torch else cp.empty(m, cp.float32)
        nbytes = 4 * n + 8 * (m + 1) + 4 * m
        pays = _device_checks.ahead_pays(4 * n, 8 * (m + 1))  # (the ahead route's; "after" never pays)

        def fmt(name: str, r: tuple[float, float, float]) -> str:
            return f"{name} {r[0]:.1f} ({r[1]:.1f}-{r[2]:.1f}) {nbytes / r[0] / (8 * n / copy_us):.1%}"

        def checked(**kw):
            return lambda: linred.segmented_sum(x, **kw, out=out)

        rows = {"check=False": per_call(lambda: linred.segmented_sum(x, offsets=off, out=out, check=False))}
        runs: dict[str, list] = {}
        for ahead in (True, False, False, True):
            route(ahead)
            tag = "ahead" if ahead else "after"
            runs.setdefault(tag, []).append(per_call(checked(offsets=off)))
            runs.setdefault(f"lengths {tag}", []).append(per_call(checked(lengths=lengths)))
        route(True)
        for name, rs in runs.items():
            rows[name] = min(rs, key=lambda r: r[0])  # (the better of the two runs; both printed below)
        if args.torch:
            rows["torch.segment_reduce"] = per_call(lambda: torch.segment_reduce(x, "sum", offsets=off, unsafe=True))
        print(f"{layout} {mean:g}: m={m}, mean length {n / max(m, 1):.1f}, ahead pays: {pays}")
        print("   " + " | ".join(fmt(k, v) for k, v in rows.items()))
        print("   runs: " + "; ".join(f"{k} " + " / ".join(f"{r[0]:.1f}" for r in rs) for k, rs in runs.items()))

    for item in args.layouts.split(","):
        layout, mean = item.split(":")
        measure(layout, float(mean))


if __name__ == "__main__":
    main()
