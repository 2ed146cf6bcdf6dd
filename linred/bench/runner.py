"""Run the cases: for each, allocate the buffer, compute the reference, time the copy ceiling and every method.

Nothing here may end the run: a case that cannot be allocated is skipped with a
note, a method that raises is recorded as ``error`` (``refused`` for
:class:`linred.BackendError`, ``skipped`` for a missing package or memory), and
a method whose result is wrong is recorded as ``WRONG`` and never timed.
"""

from __future__ import annotations

import gc
import importlib
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from linred.bench import peers as peers_module
from linred.bench.cases import Case
from linred.bench.data import TOLERANCE, DeviceData, HostData, Inputs, bytes_moved, is_out_of_memory
from linred.bench.peers import Method, Skip
from linred.bench.timing import HostClock, device_clock, gbps, lead_calls, plan_samples, take_sample, warm_up

__all__ = ["CaseResult", "MethodResult", "Settings", "run_cases"]

AUTO = "linred auto"


def wanted(patterns: str | None, name: str) -> bool:
    """Whether method ``name`` matches ``--methods`` (comma-separated substrings, any case; None: all)."""
    if not patterns:
        return True
    return any(t.strip().lower() in name.lower() for t in patterns.split(",") if t.strip())


@dataclass
class Settings:
    """How to time: the device, warm-up calls, samples, time budgets, a method filter, interleaving."""

    device: str = "cpu"
    warmup: int = 3
    repeats: int = 10
    budget_s: float = 2.0
    deadline: float | None = None  # time.monotonic() after which remaining work is skipped
    methods: str | None = None
    #: take the samples of a case's methods in turns (on a shared CPU, load then touches all alike);
    #: otherwise each method is timed, checked and freed before the next is built (GPU memory)
    interleave: bool = False

    def wants(self, name: str) -> bool:
        return wanted(self.methods, name)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


@dataclass
class MethodResult:
    """The outcome of one method on one case.

    ``status`` is ``ok``, ``WRONG`` (result off by more than the tolerance, a
    wrong shape or non-finite values: never timed), ``refused`` (linred raised
    :class:`linred.BackendError`; ``note`` is its reason), ``skipped`` (not
    installed, out of memory, out of time) or ``error`` (any other exception).
    """

    name: str
    kind: str
    status: str = "ok"
    note: str = ""
    seconds: float | None = None
    samples: list[float] = field(default_factory=list)
    calls: int = 0
    gbps: float | None = None
    pct_copy: float | None = None
    rel_err: float | None = None
    #: median host time to issue one call during the samples (near ``seconds``: host-bound)
    host_seconds: float | None = None
    #: plan-cache misses of linred during this method's samples (a timed call that plans again)
    replans: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.seconds is not None

    @property
    def interval(self) -> tuple[float, float] | None:
        """``(min, max)`` of the samples (seconds), or None without samples."""
        return (min(self.samples), max(self.samples)) if self.samples else None

    @property
    def spread(self) -> float | None:
        """``(max - min) / median`` of the samples, or None with fewer than two."""
        if len(self.samples) < 2 or not self.seconds:
            return None
        return (max(self.samples) - min(self.samples)) / self.seconds


@dataclass
class CaseResult:
    """All methods of one case, with the copy ceiling measured on the same buffer."""

    case: Case
    status: str = "ok"
    note: str = ""
    m: int = 0
    nbytes: int = 0
    max_length: int = 0
    copy_seconds: float | None = None
    copy_gbps: float | None = None
    methods: list[MethodResult] = field(default_factory=list)
    wall_s: float = 0.0

    def best_peer(self) -> MethodResult | None:
        """The fastest peer among those with a correct result."""
        ok = [r for r in self.methods if r.kind == "peer" and r.ok]
        return min(ok, key=lambda r: r.seconds) if ok else None

    def method(self, name: str) -> MethodResult | None:
        return next((r for r in self.methods if r.name == name), None)

    def auto_vs_best_peer(self) -> float | None:
        """Time of the best peer / time of ``linred auto`` (medians): > 1 when auto's median is lower."""
        auto, best = self.method(AUTO), self.best_peer()
        if auto is None or best is None or not auto.ok:
            return None
        return best.seconds / auto.seconds

    def auto_verdict(self) -> str | None:
        """``"faster"`` or ``"slower"`` than the best peer when the ``[min, max]`` intervals of their
        samples do not overlap, else ``"tie"``; None when there is nothing to compare."""
        auto, best = self.method(AUTO), self.best_peer()
        if auto is None or best is None or not auto.ok:
            return None
        a, b = auto.interval, best.interval
        if a is None or b is None:
            ratio = best.seconds / auto.seconds
            return "faster" if ratio > 1 else "slower" if ratio < 1 else "tie"
        if a[1] < b[0]:
            return "faster"
        if b[1] < a[0]:
            return "slower"
        return "tie"


def short_error(e: BaseException, limit: int = 300) -> str:
    """``e`` as one line: its type and the first line of its message, cut to ``limit`` characters."""
    lines = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


_import_errors: dict[str, str | None] = {}


def missing_module(names: tuple[str, ...]) -> str | None:
    """Why one of ``names`` cannot be imported (cached), or None."""
    for name in names:
        if name not in _import_errors:
            try:
                importlib.import_module(name)
                _import_errors[name] = None
            except Exception as e:  # cuda.compute raises non-ImportErrors without a GPU driver
                _import_errors[name] = f"needs {name} ({short_error(e, 120)})"
        if _import_errors[name]:
            return _import_errors[name]
    return None


@dataclass
class _Timed:
    """A method that passed its correctness check and is being timed."""

    res: MethodResult
    fn: Callable[[], Any]
    clock: Any
    calls: int
    target: int
    lib: str
    last: Any = None
    verify: bool = True  # False for the copy, which has no result to check
    lead: int = 0  # untimed calls before each sample (on the device; see linred.bench.timing)
    host: list[float] = field(default_factory=list)  # host time per call of each sample


class _Runner:
    def __init__(self, settings: Settings, data: HostData) -> None:
        self.settings = settings
        self.data = data

    def clock(self, lib: str) -> Any:
        return device_clock(lib) if self.settings.device == "gpu" else HostClock()

    def check(self, out: Any, ref: Any, dtype: str) -> tuple[float | None, str | None]:
        """``(relative error, None)`` if ``out`` matches ``ref`` within the dtype's tolerance, else ``(error, why)``."""
        err, problem = self.data.rel_error(out, ref)
        if problem:
            return err, problem
        if err > TOLERANCE[dtype]:
            return err, f"relative error {err:.1e} > tolerance {TOLERANCE[dtype]:.0e}"
        return err, None

    def _warm(self, res: MethodResult, fn: Callable[[], Any], lib: str, verify: bool = True) -> _Timed:
        s = self.settings
        clock = self.clock(lib)
        # the correctness call before this one was the first warm-up call
        single, last = warm_up(fn, clock, max(1, s.warmup - 1))
        calls, target = plan_samples(single, s.repeats, s.budget_s)
        lead = lead_calls(single) if s.device == "gpu" else 0
        return _Timed(res, fn, clock, calls, target, lib, last, verify, lead=lead)

    def begin(self, method: Method, inp: Inputs, ref: Any) -> tuple[MethodResult, _Timed | None]:
        """Build the method, check its result, warm it up; None when it is not to be timed."""
        res = MethodResult(method.name, method.kind)
        applies = method.applies(inp)
        if isinstance(applies, str):
            res.status, res.note = "skipped", applies
            return res, None
        missing = missing_module(method.requires)
        if missing:
            res.status, res.note = "skipped", missing
            return res, None
        if self.settings.out_of_time():
            res.status, res.note = "skipped", "time limit (--max-time) reached"
            return res, None
        lib = inp.lib if method.lib == "input" else method.lib
        fn = out = None
        try:
            self.data.sync(lib)
            try:
                for retry in (False, True):
                    try:
                        fn = method.make(inp)
                        res.note = getattr(fn, "note", "")
                        out = fn()
                        self.data.sync(lib)
                        break
                    except Exception as e:
                        if retry or not is_out_of_memory(e):
                            raise
                        # The pools of the methods before hold memory this one's library
                        # cannot use: return it to the driver and try once more.
                        fn = out = None
                        self.data.release()
            except Skip as e:
                res.status, res.note = "skipped", str(e)
                return res, None
            except Exception as e:
                from linred.errors import BackendError

                if isinstance(e, BackendError):
                    res.status, res.note = "refused", e.reason
                elif is_out_of_memory(e):
                    res.status, res.note = "skipped", f"out of memory ({short_error(e, 120)})"
                else:
                    res.status, res.note = "error", short_error(e)
                return res, None
            res.rel_err, wrong = self.check(out, ref, inp.case.dtype)
            out = None
            if wrong:  # never timed, never ranked
                res.status, res.note = "WRONG", join_notes(wrong, res.note)
                return res, None
            return res, self._warm(res, fn, lib)
        except Exception as e:
            self._fail(res, e)
            return res, None

    def begin_copy(self, inp: Inputs) -> tuple[MethodResult, _Timed | None]:
        """The copy of the case's buffer, timed like a method: the bandwidth ceiling."""
        res = MethodResult("copy", "copy")
        try:
            copy = self.data.copy_fn(inp)
            self.data.sync(inp.lib)
            copy()
            return res, self._warm(res, copy, inp.lib, verify=False)
        except Exception as e:
            self._fail(res, e)
            return res, None

    @staticmethod
    def _fail(res: MethodResult, e: BaseException) -> None:
        res.status = "skipped" if is_out_of_memory(e) else "error"
        res.note = join_notes(short_error(e), res.note)
        res.seconds = res.gbps = res.pct_copy = None

    def sample(self, timed: list[_Timed]) -> None:
        """Take every method's samples, one sample of each in turn, round after round.

        Each round takes the methods in a new order (a fixed-seed shuffle), so that
        no method always runs after the same one: on the H100 the method that always
        followed one particular peer measured up to 19% slower than the same call
        in other positions.
        """
        active = list(timed)
        shuffle = random.Random(0).shuffle
        enabled = gc.isenabled()
        gc.disable()  # as timeit does: a collection inside a sample is noise
        try:
            while active:
                order = list(active)
                shuffle(order)
                for t in order:
                    if len(t.res.samples) >= t.target:
                        active.remove(t)
                        continue
                    try:
                        t.last = None
                        self.data.settle()  # untimed: no dirty cache lines of the previous method
                        misses = _plan_misses()
                        seconds, t.last, host = take_sample(t.fn, t.clock, t.calls, t.lead)
                        t.res.replans += _plan_misses() - misses
                        t.res.samples.append(seconds)
                        t.host.append(host)
                    except Exception as e:
                        self._fail(t.res, e)
                        active.remove(t)
        finally:
            if enabled:
                gc.enable()

    def finish(self, t: _Timed, inp: Inputs, ref: Any) -> None:
        """Check the method once more and record its time; the copy only records its time."""
        res = t.res
        try:
            if res.status != "ok":
                return
            if t.verify:
                # Poison the last result and call once more: a method that stops
                # writing its output after the first call must not look fast.
                self.data.poison(t.last, inp)
                t.last = None
                out = t.fn()
                self.data.sync(t.lib)
                _, wrong = self.check(out, ref, inp.case.dtype)
                out = None
                if wrong:
                    res.status, res.note = "WRONG", join_notes(f"after repeated calls: {wrong}", res.note)
                    res.samples = []
                    return
            res.seconds = statistics.median(res.samples)
            res.host_seconds = statistics.median(t.host) if t.host else None
            if self.settings.device == "gpu" and res.host_seconds and res.host_seconds >= 0.8 * res.seconds:
                res.note = join_notes(res.note, f"host-bound: issuing a call took {res.host_seconds * 1e3:.3f} ms")
            if res.replans:
                res.note = join_notes(res.note, f"planned {res.replans} time(s) while timed")
            res.calls = t.calls
            res.gbps = gbps(inp.nbytes, res.seconds)
        except Exception as e:
            self._fail(res, e)
        finally:
            t.fn = t.last = None

    def _record_copy(self, result: CaseResult, res: MethodResult, copy: _Timed | None, inp: Inputs) -> None:
        if copy is not None:
            self.finish(copy, inp, None)
        if res.seconds:
            case = result.case
            result.copy_seconds = res.seconds
            result.copy_gbps = gbps(2 * case.n * case.features * case.itemsize, res.seconds)
        else:
            result.note = f"copy ceiling not measured: {res.note}"

    def methods_for(self, inp: Inputs) -> list[Method]:
        registry = peers_module.GPU_PEERS if self.settings.device == "gpu" else peers_module.CPU_PEERS
        methods = [*peers_module.linred_methods(self.settings.device), *registry]
        return [m for m in methods if self.settings.wants(m.name) and m.applies(inp) is not False]

    def run_case(self, case: Case, progress: Callable[[str], None]) -> CaseResult:
        result = CaseResult(case)
        t0 = time.monotonic()
        if self.settings.out_of_time():
            result.status, result.note = "skipped", "time limit (--max-time) reached"
            return result
        inp = ref = None
        pending: list[_Timed] = []
        try:
            try:
                inp = self.data.inputs(case)
                result.m, result.max_length = inp.m, inp.max_length
                result.nbytes = bytes_moved(case, inp.m)
                ref = self.data.reference(inp)
            except Exception as e:
                result.status = "skipped"
                result.note = ("out of memory: " if is_out_of_memory(e) else "could not set up: ") + short_error(e)
                return result
            interleave = self.settings.interleave
            progress("copy")
            copy_res, copy = self.begin_copy(inp)
            if copy is None or not interleave:
                if copy is not None:
                    self.sample([copy])
                self._record_copy(result, copy_res, copy, inp)
                # The copy's destination goes back to the memory pool, for the methods'
                # buffers.  Not to the driver: on the H100, the samples taken just after a
                # GiB was returned ran up to 15% slower (the first 4-8 samples of the method
                # timed next, while the driver works on the freed memory).
                copy = None
            for method in self.methods_for(inp):
                progress(method.name)
                res, timed = self.begin(method, inp, ref)
                result.methods.append(res)
                if interleave:
                    pending += [timed] if timed is not None else []
                    continue
                if timed is not None:
                    self.sample([timed])
                    self.finish(timed, inp, ref)
                    timed = None
                # Each method's buffers go back to the memory pools, not to the driver (see the copy).
            if interleave:
                progress("timing, interleaved")
                # The copy ceiling is timed on its own: it walks a second GiB of memory
                # (its destination), and the method sampled after it found x's pages cold.
                if copy is not None:
                    self.sample([copy])
                self.sample(pending)
                for timed in pending:
                    self.finish(timed, inp, ref)
            if copy is not None:
                self._record_copy(result, copy_res, copy, inp)
            for m in result.methods:
                if m.gbps is not None and result.copy_gbps:
                    m.pct_copy = 100.0 * m.gbps / result.copy_gbps
        finally:
            inp = ref = copy = None
            pending.clear()
            self.data.release()
            result.wall_s = time.monotonic() - t0
        return result


def _plan_misses() -> int:
    """linred's plan-cache misses so far (a timed linred call should never plan)."""
    import linred

    return linred.plan_cache_info()["misses"]


def join_notes(first: str, second: str) -> str:
    """Two notes joined by ``"; "`` (either may be empty)."""
    return f"{first}; {second}" if first and second else first or second


def run_cases(
    cases: list[Case],
    settings: Settings,
    *,
    on_method: Callable[[Case, str], None] | None = None,
    on_case: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run every case in order; ``on_method`` and ``on_case`` report progress."""
    runner = _Runner(settings, DeviceData() if settings.device == "gpu" else HostData())
    results = []
    for case in cases:
        result = runner.run_case(case, lambda name, case=case: on_method and on_method(case, name))
        results.append(result)
        if on_case:
            on_case(result)
    return results
