"""Reporting: the text table, the per-case summary, the JSON file and the plot."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict
from typing import Any

from linred.bench.cases import fmt_count
from linred.bench.runner import AUTO, CaseResult, MethodResult

__all__ = [
    "format_header",
    "format_summary",
    "format_table",
    "median_copy_gbps",
    "to_json",
    "write_json",
    "write_plot",
]

WIDTH = 120
_STATUS_ORDER = {"ok": 0, "WRONG": 1, "error": 2, "refused": 3, "skipped": 4}


def median_copy_gbps(results: list[CaseResult]) -> float | None:
    values = [r.copy_gbps for r in results if r.copy_gbps]
    return statistics.median(values) if values else None


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    if ms < 10:
        return f"{ms:.3f}"
    if ms < 100:
        return f"{ms:.2f}"
    return f"{ms:.1f}"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 10 else f"{value:.2f}"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def format_header(meta: dict[str, Any], results: list[CaseResult]) -> str:
    """Date, device, driver, versions, timing method and copy ceiling."""
    lines = [f"linred bench, {meta['date']}, on {meta['host']}"]
    gpu = meta.get("gpu")
    cpu = meta.get("cpu", {})
    if gpu and "name" in gpu:
        lines.append(
            f"device: {gpu['name']} (compute capability {gpu['compute_capability']}, {gpu['multiprocessors']} SMs, "
            f"{gpu['memory_gib']} GiB, L2 {gpu['l2_cache_mib']} MiB)"
        )
        lines.append(
            f"driver {gpu.get('driver') or '?'} (CUDA {gpu['driver_cuda_version']}), "
            f"CUDA runtime {gpu['runtime_cuda_version']}"
            + (f", torch built for CUDA {gpu['torch_cuda_version']}" if gpu.get("torch_cuda_version") else "")
        )
    elif gpu:
        lines.append(f"device: GPU ({gpu.get('error')})")
    else:
        blas = f", NumPy BLAS {cpu['numpy_blas']}" if cpu.get("numpy_blas") else ""
        lines.append(f"device: CPU {cpu.get('processor', '?')} ({cpu.get('cores')} cores){blas}")
    versions = [f"{k} {v}" for k, v in meta["versions"].items() if v and k != "matplotlib"]
    lines.append(_wrap("versions: " + ", ".join(versions)))
    s = meta["settings"]
    clock = "CUDA events on the current stream" if meta["device"] == "gpu" else "perf_counter"
    lines.append(
        _wrap(
            f"timing: {clock}; {s['warmup']} warm-up call(s), then the median of up to {s['repeats']} samples "
            f"(a sample batches calls up to >= 1 ms"
            + (", after about 3 ms of untimed calls of the same method" if meta["device"] == "gpu" else "")
            + f"; at most {s['budget_s']:g} s per method"
            + ("; the methods of a case take their samples in turns)" if s.get("interleaved") else ")")
        )
    )
    lines.append("GB/s = (input bytes + result bytes + int64 offsets) / time; % copy: of a copy of the same buffer")
    lines.append(
        "rel err = ||out - ref|| / ||ref|| against float64; "
        "WRONG (error above tolerance, wrong shape, NaN) is never timed"
    )
    load = meta.get("load_average_at_start") or meta.get("load_average")
    cores = cpu.get("cores") or 1
    if meta["device"] == "cpu" and load and load[0] > 0.5 * cores:
        lines.append(
            f"WARNING: load average {load[0]:.1f} on {cores} cores when the run began: "
            "other processes compete for the CPU; these figures are noisy"
        )
    copy = median_copy_gbps(results)
    if copy:
        what = (
            "device-to-device copy"
            if meta["device"] == "gpu"
            else "np.copyto, one thread: a multi-threaded BLAS read can exceed it"
        )
        lines.append(f"copy ceiling ({what}): median {copy:.0f} GB/s over the cases")
    return "\n".join(lines)


def _wrap(text: str, width: int = WIDTH, indent: str = "  ") -> str:
    out, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = indent + word
        else:
            line = f"{line} {word}" if line else word
    out.append(line)
    return "\n".join(out)


def _case_title(r: CaseResult) -> str:
    c = r.case
    parts = [c.describe(), f"m={fmt_count(r.m)}" if r.m else ""]
    if not c.fixed and r.m:
        parts.append(f"mean length {c.n / r.m:.1f}, max {fmt_count(r.max_length)}")
    if r.nbytes:
        parts.append(f"{r.nbytes / 1e9:.2f} GB moved")
    if r.copy_gbps:
        parts.append(f"copy {_rate(r.copy_gbps)} GB/s")
    return f"{c.name}: " + ", ".join(p for p in parts if p)


def _sorted(methods: list[MethodResult]) -> list[MethodResult]:
    return sorted(
        methods, key=lambda r: (_STATUS_ORDER.get(r.status, 9), r.seconds if r.seconds is not None else math.inf)
    )


def _status_lines(row: str, status: str, more: int = 1) -> list[str]:
    """The row with as much of ``status`` as fits, the rest on up to ``more`` indented lines (the JSON has it all)."""
    room = WIDTH - len(row)
    if len(status) <= room:
        return [row + status]
    cut = status.rfind(" ", 0, room + 1)
    cut = cut if cut > 0 else room
    lines = [row + status[:cut].rstrip()]
    rest = status[cut:].strip()
    wrapped = _wrap(rest, WIDTH - 6, indent="").split("\n")
    for i, line in enumerate(wrapped[:more]):
        last = i == more - 1 and len(wrapped) > more
        lines.append(_clip("      " + line + (" ..." if last else ""), WIDTH))
    return lines


_ROW = "{mark:<3}{name:<31} {time:>9} {gbps:>8} {pct:>7} {err:>9}  {status}"
#: a method whose samples spread over more than this fraction of their median is flagged
SPREAD_WARNING = 0.25


def format_table(results: list[CaseResult]) -> str:
    """One block per case: a row per method, fastest first, linred auto (*) and the best peer (+) marked."""
    lines = []
    head = _ROW.format(
        mark="", name="method", time="time ms", gbps="GB/s", pct="% copy", err="rel err", status="status"
    )
    for r in results:
        lines.append("")
        lines.append(_clip(_case_title(r), WIDTH))
        if r.status != "ok":
            lines.append(_clip(f"   {r.status}: {r.note}", WIDTH))
            continue
        if r.note:
            lines.append(_clip(f"   note: {r.note}", WIDTH))
        lines.append(head)
        best = r.best_peer()
        for m in _sorted(r.methods):
            mark = "*" if m.name == AUTO else "+" if m is best else ""
            status = m.status
            if m is best:
                status += " (best peer)"
            if m.note:
                status += f": {m.note}" if m.status != "ok" else f", {m.note}"
            if m.ok and m.spread is not None and m.spread > SPREAD_WARNING:
                status += f"; spread {m.spread:.0%} of the median (noisy: compare intervals, not medians)"
            row = _ROW.format(
                mark=mark,
                name=_clip(m.name, 31),
                time=_ms(m.seconds),
                gbps=_rate(m.gbps),
                pct="-" if m.pct_copy is None else f"{m.pct_copy:.0f}%",
                err=_err(m.rel_err),
                status="",
            )
            lines.extend(_status_lines(row, status))
        ratio, verdict = r.auto_vs_best_peer(), r.auto_verdict()
        if ratio is not None:
            why = ": their [min, max] intervals overlap" if verdict == "tie" else ""
            lines.append(f"   linred auto vs best peer ({best.name}): {ratio:.2f}x ({verdict}{why})")
    return "\n".join(lines)


_SUMMARY = "{case:<16} {m:>9} {copy:>8} {auto:>8} {pct:>7}  {peer:<31} {peer_gbps:>8} {ratio:>9} {verdict}"


def format_summary(results: list[CaseResult]) -> str:
    """One line per case: linred auto beside the best correct peer (the ratio is best peer time / auto time)."""
    lines = [
        "Summary: linred auto vs the fastest correct peer (auto/best: medians; verdict: [min, max] intervals)",
        _SUMMARY.format(
            case="case",
            m="m",
            copy="copy",
            auto="auto",
            pct="% copy",
            peer="best peer",
            peer_gbps="peer",
            ratio="auto/best",
            verdict="verdict",
        ),
        _SUMMARY.format(
            case="", m="", copy="GB/s", auto="GB/s", pct="", peer="", peer_gbps="GB/s", ratio="", verdict=""
        ),
    ]
    for r in results:
        if r.status != "ok":
            lines.append(_clip(f"{r.case.name:<16} {r.status}: {r.note}", WIDTH))
            continue
        auto, best, ratio = r.method(AUTO), r.best_peer(), r.auto_vs_best_peer()
        auto_ok = auto is not None and auto.ok
        lines.append(
            _SUMMARY.format(
                case=_clip(r.case.name, 16),
                m=fmt_count(r.m),
                copy=_rate(r.copy_gbps),
                auto=_rate(auto.gbps) if auto_ok else (auto.status if auto else "-"),
                pct=f"{auto.pct_copy:.0f}%" if auto_ok and auto.pct_copy is not None else "-",
                peer=_clip(best.name, 31) if best else "-",
                peer_gbps=_rate(best.gbps) if best else "-",
                ratio=f"{ratio:.2f}x" if ratio is not None else "-",
                verdict=r.auto_verdict() or "-",
            )
        )
    ran = [r for r in results if r.status == "ok"]
    verdicts = [r.auto_verdict() for r in ran]
    autos = [r.method(AUTO) for r in ran]
    at_copy = [a for a in autos if a is not None and a.pct_copy is not None and a.pct_copy >= 90]
    lines.append(
        f"linred auto against the best peer ([min, max] intervals of the samples): faster in "
        f"{verdicts.count('faster')}, tie in {verdicts.count('tie')}, slower in {verdicts.count('slower')} "
        f"of {len(ran)} cases"
    )
    lines.append(f"linred auto at >= 90% of copy bandwidth in {len(at_copy)} of {len(ran)} cases")
    return "\n".join(lines)


def to_json(meta: dict[str, Any], results: list[CaseResult]) -> dict[str, Any]:
    """Every raw number of the run, with its metadata."""
    cases = []
    for r in results:
        c = r.case
        best = r.best_peer()
        cases.append(
            {
                "name": c.name,
                "group": c.group,
                "dtype": c.dtype,
                "shape": list(c.shape),
                "n": c.n,
                "features": c.features,
                "segment_length": c.length,
                "layout": c.layout or None,
                "layout_params": {"mean": c.mean, **c.params} if not c.fixed else None,
                "seed": c.seed,
                "status": r.status,
                "note": r.note,
                "num_segments": r.m,
                "max_segment_length": r.max_length,
                "bytes": r.nbytes,
                "copy_seconds": r.copy_seconds,
                "copy_gbps": r.copy_gbps,
                "wall_seconds": r.wall_s,
                "best_peer": best.name if best else None,
                "auto_vs_best_peer": r.auto_vs_best_peer(),
                "auto_verdict": r.auto_verdict(),
                "methods": [asdict(m) for m in r.methods],  # (with every sample)
            }
        )
    return {"meta": meta, "copy_gbps_median": median_copy_gbps(results), "cases": cases}


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def dump_json(path: str, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` as strict JSON (NaN and infinities as null)."""
    with open(path, "w") as f:
        json.dump(_clean(document), f, indent=1, default=str, allow_nan=False)
        f.write("\n")


def write_json(path: str, meta: dict[str, Any], results: list[CaseResult]) -> None:
    """Write :func:`to_json` to ``path`` (strict JSON: no NaN)."""
    dump_json(path, to_json(meta, results))


def write_plot(path: str, meta: dict[str, Any], results: list[CaseResult]) -> None:
    """GB/s per case, one series per method, the copy ceiling as a horizontal line (Agg, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = [r for r in results if r.status == "ok"]
    names: list[str] = []
    for r in shown:
        for m in r.methods:
            if m.ok and m.name not in names:
                names.append(m.name)
    names.sort(key=lambda n: (not n.startswith("linred"), n != AUTO))
    fig = Figure(figsize=(max(9.0, 0.55 * len(shown) + 5), 6.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = list(range(len(shown)))
    markers = "osD^v<>pPXh*d"
    for i, name in enumerate(names):
        ys = []
        for r in shown:
            m = r.method(name)
            ys.append(m.gbps if m is not None and m.ok else math.nan)
        if name == AUTO:
            style = {"color": "black", "linewidth": 2.5, "marker": "o", "markersize": 7, "zorder": 5}
        elif name.startswith("linred"):
            style = {"linestyle": "--", "marker": markers[i % len(markers)], "linewidth": 1.2}
        else:
            style = {"linestyle": ":", "marker": markers[i % len(markers)], "linewidth": 1.0, "alpha": 0.85}
        ax.plot(xs, ys, label=name, **style)
    copy = median_copy_gbps(shown)
    if copy:
        ax.axhline(copy, color="red", linewidth=1.5, label=f"copy ceiling ({copy:.0f} GB/s)")
    ax.plot(xs, [r.copy_gbps or math.nan for r in shown], color="red", linewidth=0.8, alpha=0.4, label="copy, per case")
    groups = [r.case.group for r in shown]
    for i, group in enumerate(groups):
        if i and group != groups[i - 1]:
            ax.axvline(i - 0.5, color="grey", linewidth=0.6, linestyle="--")
        if i == 0 or group != groups[i - 1]:
            ax.text(i - 0.4, 0.99, group, transform=ax.get_xaxis_transform(), va="top", fontsize="small", color="grey")
    ax.set_xticks(xs, [r.case.name for r in shown], rotation=45, ha="right")
    ax.set_ylabel("GB/s (bytes read + written) / time")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    where = meta.get("gpu", {}).get("name") if meta["device"] == "gpu" else meta.get("cpu", {}).get("processor")
    ax.set_title(f"linred bench: segmented sum, {where or meta['device']}, {meta['date'][:10]}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.savefig(path, dpi=120, bbox_inches="tight")  # keeps the legend outside the axes
