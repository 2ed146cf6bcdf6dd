"""``linred demo``: the seed example, then a large array through every backend that can serve it.

Each figure is checked against a float64 reference before it is printed: a
result that is wrong is reported as wrong, never with a speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import linred
from linred.bench.timing import time_device, time_host
from linred.cli._status import backend_status

#: most seconds spent timing one method (the demo should take seconds, not minutes)
_BUDGET_S = 1.0

__all__ = ["run"]

DEFAULT_SEGMENT_LENGTHS = (32, 1024)


@dataclass
class _Case:
    """One segment layout of the large array, with its float64 reference."""

    label: str
    kwargs: dict[str, Any]  # segment_length= or offsets=
    m: int
    max_length: int
    extra_bytes: int  # offsets read by the call
    reference: np.ndarray


@dataclass
class _Target:
    """The large array in one array library, with how to time and read results back."""

    label: str
    x: Any
    empty: Callable[[int], Any]
    to_host: Callable[[Any], np.ndarray]
    time: Callable[[Callable[[], Any], int], float]
    device_kwargs: Callable[[dict[str, Any]], dict[str, Any]]
    peers: Callable[[_Case], list[tuple[str, Callable[[Any], Any]]]]


def _seed_example() -> None:
    x = np.arange(1, 13, dtype=np.float32)
    print("The seed example: x = np.arange(1, 13, dtype=np.float32), 3 segments of 4")
    calls = [
        ("linred.segmented_sum(x, 4)", lambda: linred.segmented_sum(x, 4)),
        ("linred.segmented_sum(x, offsets=[0, 4, 8, 12])", lambda: linred.segmented_sum(x, offsets=[0, 4, 8, 12])),
        ("linred.segmented_sum(x, lengths=[4, 4, 4])", lambda: linred.segmented_sum(x, lengths=[4, 4, 4])),
        ("linred.segmented_mean(x, 4)", lambda: linred.segmented_mean(x, 4)),
        ("linred.segmented_max(x, offsets=[0, 4, 4, 12])", lambda: linred.segmented_max(x, offsets=[0, 4, 4, 12])),
    ]
    for text, call in calls:
        print(f"  {text:<50} -> {call()}")
    print("  (an empty segment sums to 0, its mean is NaN, its max is -inf)\n")


def _time_host(f: Callable[[], Any], repeat: int) -> Any:
    return time_host(f, warmup=0, repeats=repeat, budget_s=_BUDGET_S)


def _time_cupy(f: Callable[[], Any], repeat: int) -> Any:
    # CUDA events; calls run back to back, so launch latency overlaps as in real use
    return time_device(f, lib="cupy", warmup=0, repeats=repeat, budget_s=_BUDGET_S)


#: a row whose samples spread over more than this fraction of their median is flagged
SPREAD_WARNING = 0.25


def _host_peers(x: np.ndarray, case: _Case) -> list[tuple[str, Callable[[Any], Any]]]:
    if "segment_length" in case.kwargs:
        view = x.reshape(case.m, case.kwargs["segment_length"])
        return [("NumPy reshape(m, L).sum(1)", lambda out: view.sum(axis=1, out=out))]
    starts = case.kwargs["offsets"][:-1]
    return [("NumPy np.add.reduceat", lambda out: np.add.reduceat(x, starts, out=out))]


def _host_target(x: np.ndarray) -> _Target:
    return _Target(
        label="numpy.ndarray on the host",
        x=x,
        empty=lambda m: np.empty(m, dtype=x.dtype),
        to_host=np.asarray,
        time=_time_host,
        device_kwargs=lambda kw: kw,
        peers=lambda case: _host_peers(x, case),
    )


def _cupy_target(x: np.ndarray) -> _Target | None:
    """The array on the GPU as a CuPy array, or None when CuPy sees no GPU."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        xd = cupy.asarray(x)
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    except Exception:  # no CuPy, no driver, no device: the host part of the demo still runs
        return None
    name = name.decode() if isinstance(name, bytes) else str(name)

    def device_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
        return {k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}

    def peers(case: _Case) -> list[tuple[str, Callable[[Any], Any]]]:
        if "segment_length" not in case.kwargs:
            return []
        view = xd.reshape(case.m, case.kwargs["segment_length"])
        return [("CuPy reshape(m, L).sum(1)", lambda out: view.sum(axis=1, out=out))]

    return _Target(
        label=f"cupy.ndarray on CUDA device 0 ({name})",
        x=xd,
        empty=lambda m: cupy.empty(m, dtype=xd.dtype),
        to_host=cupy.asnumpy,
        time=_time_cupy,
        device_kwargs=device_kwargs,
        peers=peers,
    )


def _cases(x: np.ndarray, segment_lengths: Sequence[int], mean_length: int, rng: np.random.Generator) -> list[_Case]:
    n = x.shape[0]
    cases = []
    for L in segment_lengths:
        if n % L:
            print(f"(skipping L={L}: it does not divide n={n})")
            continue
        m = n // L
        reference = x.reshape(m, L).sum(axis=1, dtype=np.float64)
        cases.append(_Case(f"L={L}, m={m:,}", {"segment_length": L}, m, L, 0, reference))
    if mean_length:
        # Geometric lengths (>= 1, so no empty segment: np.add.reduceat, the peer, mishandles those).
        lengths = rng.geometric(1 / mean_length, size=2 * n // mean_length + 2)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        offsets = offsets[offsets < n]
        offsets = np.append(offsets, n).astype(np.int64)
        m = offsets.shape[0] - 1
        reference = np.add.reduceat(x, offsets[:-1], dtype=np.float64)
        max_length = int(np.diff(offsets).max())
        label = f"variable, mean {mean_length}, m={m:,}"
        # Timed without re-validating the offsets on every call (each plan below checks them
        # once): the check reads them back to the host, a synchronization per call.
        cases.append(_Case(label, {"offsets": offsets, "check": False}, m, max_length, offsets.nbytes, reference))
    return cases


def _methods(target: _Target, case: _Case, backends: list[str]) -> list[tuple[str, Callable[[Any], Any] | str]]:
    """(label, function of ``out``) for linred's backends and the peers; a string where a backend refuses."""
    kwargs = target.device_kwargs(case.kwargs)
    checked = {k: v for k, v in kwargs.items() if k != "check"}  # the plans validate the offsets
    methods: list[tuple[str, Callable[[Any], Any] | str]] = []
    for name in ["auto", *backends]:
        label = f"linred {name}"
        try:
            with linred.SegmentedReduction(target.x, **checked, backend=name) as plan:
                chosen = plan.backend
        except linred.BackendError as e:
            methods.append((label, f"refused: {e.reason}"))
            continue
        except Exception as e:  # a broken backend: show the error instead of stopping the demo
            methods.append((label, f"ERROR {type(e).__name__}: {e}"))
            continue
        if name == "auto":
            label = f"linred auto -> {chosen}"

        def call(out: Any, name: str = name) -> Any:
            return linred.segmented_sum(target.x, **kwargs, backend=name, out=out)

        methods.append((label, call))
    return methods + target.peers(case)


def _measure(target: _Target, case: _Case, f: Callable[[Any], Any], repeat: int, tolerance: float) -> tuple[str, bool]:
    """One table row's figures, and whether the result was right."""
    out = target.empty(case.m)
    out.fill(np.nan)  # a method that writes nothing cannot pass the check

    def error() -> float:
        result = target.to_host(out).astype(np.float64)
        return float(np.max(np.abs(result - case.reference) / np.abs(case.reference)))

    f(out)  # warm-up; also builds and caches the plan
    err = error()
    if err <= tolerance:  # only time what is right
        timing = target.time(lambda: f(out), repeat)
        err = max(err, error())  # the timed runs' result must be right too
    if not err <= tolerance:
        return f"{'WRONG':>10} {'':>21} {'':>9} {err:>11.1e}  (tolerance {tolerance:.1e})", False
    nbytes = target.x.nbytes + out.nbytes + case.extra_bytes
    seconds, low, high = timing.seconds, min(timing.samples), max(timing.samples)
    spread = f"  spread {(high - low) / seconds:.0%}" if (high - low) > SPREAD_WARNING * seconds else ""
    interval = f"[{_format_time(low)}, {_format_time(high)}]"
    return f"{_format_time(seconds):>10} {interval:>21} {nbytes / seconds / 1e9:>9.1f} {err:>11.1e}{spread}", True


def _format_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def run(
    n: int = 1 << 24,
    segment_lengths: Sequence[int] | None = None,
    mean_length: int = 64,
    repeat: int = 7,
    seed: int = 0,
) -> int:
    """Print the demo; return 0 when every result matched the reference, else 1."""
    print(f"linred {linred.__version__} demo\n")
    _seed_example()

    status = backend_status()
    available = [name for name, (ok, _) in status.items() if ok]
    print("Backends available here: " + ", ".join(available))
    for name, (ok, reason) in status.items():
        if not ok:
            print(f"  not {name}: {reason}")

    rng = np.random.default_rng(seed)
    x = rng.random(n, dtype=np.float32)
    x += 1  # values in [1, 2): every segment sum is far from 0, so relative errors mean something
    print(
        f"\nA large array: n = {n:,} float32 values ({x.nbytes / 2**20:.0f} MiB); "
        f"median and [min, max] of up to {repeat} samples after a warm-up; a spread over\n"
        f"{SPREAD_WARNING:.0%} of the median is flagged (a busy machine: compare the intervals, not the medians).\n"
        "GB/s = (bytes read + bytes written) / time; error = max relative error against a float64 reference.\n"
        "Offsets calls are timed with check=False after one checked plan (check=True validates the\n"
        "offsets on every call: on a GPU, one more kernel and a synchronization)."
    )
    cases = _cases(x, segment_lengths or DEFAULT_SEGMENT_LENGTHS, mean_length, rng)
    targets = [t for t in (_host_target(x), _cupy_target(x)) if t is not None]
    if len(targets) == 1:
        print("(no CUDA device visible to CuPy: host arrays only)")

    all_right, ran = True, False
    for target in targets:
        print(f"\n{target.label}")
        print(f"  {'segments':<34} {'method':<32} {'time':>10} {'[min, max]':>21} {'GB/s':>9} {'max rel err':>11}")
        for case in cases:
            # 2 L eps is 4x the worst-case bound of recursive float32 summation, and below
            # the 1/L-sized error of a missing or repeated element for L < 2000.
            tolerance = 2 * case.max_length * float(np.finfo(x.dtype).eps)
            label = case.label
            for method, f in _methods(target, case, available):
                if isinstance(f, str):
                    row, right = f, not f.startswith("ERROR")
                else:
                    row, right = _measure(target, case, f, repeat, tolerance)
                all_right &= right
                ran = True
                print(f"  {label:<34} {method:<32} {row}")
                label = ""
    if all_right and not ran:
        print("\nNo case ran (no segment lengths or shapes selected).")
        return 0
    if all_right:
        print("\nEvery result matched the float64 reference.")
        return 0
    print("\nSOME RESULTS ARE WRONG OR FAILED (above).")
    return 1
