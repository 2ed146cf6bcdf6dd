"""``linred bench``: linred's backends beside the peers, on the same buffers.

On a GPU (CuPy with a CUDA device) every case allocates one buffer of random
normal data (1 GiB by default, far larger than the L2 cache), computes a float64
reference from it, times a device-to-device copy of it as the bandwidth
ceiling, and then times each linred backend and each peer that serves the case
(CuPy, PyTorch through a zero-copy DLPack view, ``cuda.compute``, cuSPARSE
through cupyx) with CUDA events.  On the CPU the same is done with NumPy arrays
and wall-clock time against NumPy's own reductions.

Every result is checked against the reference before it is timed: a method
whose relative error exceeds the tolerance of its dtype (float32 1e-5,
float16/bfloat16 1e-2, float64 1e-12), whose result has the wrong shape or
holds NaN is reported as WRONG and never timed or ranked.

Use ``linred bench --help`` for the options; ``python -m linred.bench`` runs it
without the ``linred`` command.  The module imports no GPU library until a run
needs it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import shutil
import sys
import time
import warnings
from typing import Any

__all__ = ["add_arguments", "run"]

#: defaults per (device, quick): n (float32 elements per case), warm-up calls, repeats, seconds per method, max time
DEFAULTS = {
    ("gpu", False): {"n": 1 << 28, "warmup": 3, "repeats": 10, "budget": 2.0, "max_time": 450.0},
    ("gpu", True): {"n": 1 << 27, "warmup": 2, "repeats": 5, "budget": 0.5, "max_time": 120.0},
    ("cpu", False): {"n": 1 << 24, "warmup": 2, "repeats": 7, "budget": 3.0, "max_time": 450.0},
    ("cpu", True): {"n": 1 << 22, "warmup": 1, "repeats": 5, "budget": 1.0, "max_time": 100.0},
}


def _count(text: str) -> int:
    """An element count: ``1000000``, ``2^24`` or ``2**24``."""
    text = text.strip()
    for sep in ("^", "**"):
        base, found, exp = text.partition(sep)
        if found and base.strip() == "2" and exp.strip().isdigit():
            return 1 << int(exp)
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer such as 1048576 or 2^20; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {text}")
    return value


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0; got {text}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``linred bench`` to ``parser``."""
    parser.description = (
        "Time linred's backends beside the peers (CuPy, PyTorch, cuda.compute, cuSPARSE on the GPU; "
        "NumPy on the CPU) on the same buffers, with the relative error of each against float64."
    )
    parser.add_argument(
        "--suite",
        choices=("bandwidth", "workloads"),
        default="bandwidth",
        help="bandwidth: segmented sums of large buffers beside the peers (default); workloads: GNN pooling, "
        "graph attention, embedding bags and windowed time series on torch tensors beside the PyTorch idioms "
        "(linred.bench.workloads; --n does not apply)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="where to run: the GPU (CuPy arrays), the CPU (NumPy arrays), or the GPU when there is one (default)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer shapes, smaller buffers and fewer repeats (55 s measured on an H100, seconds on a CPU)",
    )
    parser.add_argument(
        "--cases",
        metavar="PATTERNS",
        help="comma-separated group names (fixed, variable, skewed, dtypes, features) or substrings of case "
        "names, e.g. 'fixed,geom 16'",
    )
    parser.add_argument(
        "--methods",
        metavar="PATTERNS",
        help="comma-separated substrings of method names to run, e.g. 'linred,torch' (the copy is always timed)",
    )
    parser.add_argument(
        "--n",
        type=_count,
        metavar="N",
        help="float32 elements per case (other dtypes use the same bytes); default 2^28 on the GPU "
        "(2^27 with --quick), 2^24 on the CPU (2^22)",
    )
    parser.add_argument("--repeats", type=_positive(int), metavar="R", help="timed samples per method (GPU 10, CPU 7)")
    parser.add_argument(
        "--warmup",
        type=_positive(int),
        metavar="W",
        help="untimed calls before timing (default 3 on the GPU, 2 on the CPU)",
    )
    parser.add_argument(
        "--budget",
        type=_positive(float),
        metavar="S",
        help="most seconds spent timing one method (default 2 on the GPU, 3 on the CPU)",
    )
    parser.add_argument(
        "--max-time",
        type=float,
        metavar="S",
        help="skip what remains after S seconds, still reporting (default 450; 120 with --quick on a GPU; 0: none)",
    )
    parser.add_argument("--json", metavar="FILE", help="write every number and the run's metadata as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="plot GB/s per case and method, with the copy ceiling")
    parser.add_argument("--list", action="store_true", help="list the cases that would run, and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines on stderr")


class _Progress:
    """A bar on a terminal (tqdm if installed), one line per case otherwise, nothing with --no-progress."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.done = 0
        self.bar = None
        if self.tty:
            try:
                from tqdm import tqdm

                width = min(120, shutil.get_terminal_size((100, 20)).columns)  # a 0-column pty would hide the bar
                self.bar = tqdm(total=total, file=sys.stderr, unit="case", ncols=width, leave=False)
            except Exception:
                self.bar = None

    def method(self, case: Any, name: str) -> None:
        if not self.tty:
            return
        text = f"{case.name}: {name}"
        if self.bar is not None:
            self.bar.set_description_str(text[:50])
        else:
            sys.stderr.write(f"\r[{self.done + 1}/{self.total}] {text[:80]:<80}")
            sys.stderr.flush()

    def case(self, result: Any) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            return
        if self.tty:
            return
        from linred.bench.runner import AUTO

        auto, best = result.method(AUTO), result.best_peer()
        parts = [f"[{self.done}/{self.total}] {result.case.name}: {result.status}"]
        if result.status == "ok":
            if auto is not None:
                parts.append(f"auto {auto.gbps:.0f} GB/s" if auto.ok else f"auto {auto.status}")
            if best is not None:
                parts.append(f"best peer {best.name} {best.gbps:.0f} GB/s")
        else:
            parts.append(result.note)
        parts.append(f"({result.wall_s:.1f} s)")
        print(", ".join(parts), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def _device(requested: str) -> tuple[str | None, str]:
    from linred.bench.meta import gpu_available

    if requested == "cpu":
        return "cpu", ""
    ok, why = gpu_available()
    if ok:
        return "gpu", ""
    if requested == "gpu":
        return None, why
    return "cpu", why


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; returns 0, 1 if a linred backend gave a wrong result, 2 for a usage error."""
    if getattr(args, "suite", "bandwidth") == "workloads":
        from linred.bench import workloads

        return workloads.run(args)
    from linred.bench import cases as cases_module
    from linred.bench import report
    from linred.bench.runner import Settings, run_cases

    started = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc)
    device, why = _device(args.device)
    if device is None:
        print(f"linred bench: --device gpu, but {why}", file=sys.stderr)
        return 2
    d = DEFAULTS[(device, bool(args.quick))]
    n = args.n or d["n"]
    all_cases = (cases_module.gpu_cases if device == "gpu" else cases_module.cpu_cases)(n, quick=args.quick)
    cases = cases_module.select_cases(all_cases, args.cases)
    if args.list:
        for c in cases:
            print(f"{c.group:<9} {c.name:<16} {c.describe()}")
        return 0
    if not cases:
        names = ", ".join(c.name for c in all_cases)
        print(f"linred bench: no case matches --cases {args.cases!r}; cases: {names}", file=sys.stderr)
        return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("linred bench: --plot needs matplotlib: pip install 'linred[bench]'", file=sys.stderr)
        return 2
    if args.methods:
        from linred.bench import peers as peers_module
        from linred.bench.runner import wanted

        known = [m.name for m in peers_module.linred_methods(device)]
        known += [m.name for m in (peers_module.GPU_PEERS if device == "gpu" else peers_module.CPU_PEERS)]
        patterns = [p.strip().lower() for p in args.methods.split(",") if p.strip()]
        unmatched = [p for p in patterns if not any(wanted(p, name) for name in known)]
        if unmatched:
            print(
                f"linred bench: --methods {', '.join(unmatched)} matches no method; methods: {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
    max_time = d["max_time"] if args.max_time is None else args.max_time
    settings = Settings(
        device=device,
        warmup=args.warmup or d["warmup"],
        repeats=args.repeats or d["repeats"],
        budget_s=args.budget or d["budget"],
        deadline=started + max_time if max_time and max_time > 0 else None,
        methods=args.methods,
        interleave=device == "cpu",
    )
    settings_meta = {
        "n": n,
        "quick": bool(args.quick),
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "budget_s": settings.budget_s,
        "max_time_s": max_time,
        "cases": args.cases,
        "methods": args.methods,
        "interleaved": settings.interleave,
    }
    if why and args.device == "auto":
        print(f"linred bench: running on the CPU ({why})", file=sys.stderr)

    progress = _Progress(len(cases), enabled=not args.no_progress)
    results: list = []
    early_meta = _meta(device, settings_meta, date)

    def finish_case(result: Any) -> None:
        results.append(result)
        progress.case(result)
        if args.json:  # keep the file current, so a run cut short still leaves its numbers
            report.write_json(args.json, early_meta, results)

    with warnings.catch_warnings():
        # cuda.compute warns that its v2 backend ignores the max_segment_size hint; the hint is harmless
        warnings.filterwarnings("ignore", message="max_segment_size is not used")
        try:
            run_cases(cases, settings, on_method=progress.method, on_case=finish_case)
        finally:
            progress.close()

    meta = _meta(device, settings_meta, date)
    meta["load_average_at_start"] = early_meta.get("load_average")
    meta["wall_seconds"] = round(time.monotonic() - started, 1)
    print(report.format_header(meta, results))
    print(report.format_table(results))
    print()
    print(report.format_summary(results))
    if args.json:
        report.write_json(args.json, meta, results)
        print(f"\nwrote {args.json}")
    if args.plot:
        try:
            report.write_plot(args.plot, meta, results)
            print(f"wrote {args.plot}")
        except Exception as e:
            print(f"linred bench: no plot ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    wrong = [
        f"{r.case.name}: {m.name}" for r in results for m in r.methods if m.kind == "linred" and m.status == "WRONG"
    ]
    if wrong:
        print(f"\nlinred gave WRONG results: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


def _meta(device: str, settings: dict[str, Any], date: datetime.datetime) -> dict[str, Any]:
    from linred.bench.meta import collect

    meta = collect(device, settings)
    meta["date"] = date.isoformat(timespec="seconds")
    return meta
