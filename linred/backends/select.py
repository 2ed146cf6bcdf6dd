"""``backend="auto"``: choose, per problem, the first backend that can serve it.

On the host the order is NumPy's BLAS, then nvmath-python on MKL, unless ``linred
tune --device cpu`` measured this machine and cached a host table whose rules say
otherwise (there is no shipped host table: host speeds vary too much between
machines).  On a GPU it comes from a dispatch table: rules keyed by the segment layout, the kind
of reduction and the dtype, each giving an order of backends up to a segment
length (for offsets, up to the mean segment length).  linred ships a table
measured on an H100 (``linred/dispatch_default.json``); ``linred tune``
re-measures on the current GPU and caches its own table, which then takes
precedence.  The table is consulted only when a plan is made, never per call.

The first backend in the order that is available and does not refuse the
problem wins, but for a backend that serves it slowly (:meth:`Backend.slower`),
which wins only where no other backend serves it; when none can serve it, the
error lists every backend's reason.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from linred._cache import user_cache_dir
from linred.backends import BACKENDS, get_backend, unavailable
from linred.backends.base import Backend
from linred.errors import BackendError
from linred.problem import Problem

logger = logging.getLogger("linred")

HOST_ORDER = ("numpy", "nvmath")
#: used when no rule of the table matches
GPU_ORDER = ("nvrtc", "cublas", "nvmath", "cub")

TABLE_VERSION = 1
#: what a rule's optional ``"lengths"`` restricts it to: fixed lengths that are powers of two
#: (linred's one-launch kernels serve those), the other fixed lengths, or any (the default)
LENGTHS = ("any", "pow2", "other")

_tables: dict[str, list[dict[str, Any]]] = {}
_lock = threading.Lock()


def tune_cache_path() -> Path:
    """Where ``linred tune`` writes its GPU table: ``$LINRED_TUNE_CACHE``, else the user's cache dir."""
    path = os.environ.get("LINRED_TUNE_CACHE")
    if path:
        return Path(path)
    return user_cache_dir() / "dispatch.json"


def host_cache_path() -> Path:
    """Where ``linred tune --device cpu`` writes its host table: beside the GPU table, its name
    ending in ``_cpu`` (``dispatch_cpu.json``)."""
    gpu = tune_cache_path()
    return gpu.with_name(f"{gpu.stem}_cpu{gpu.suffix or '.json'}")


def rule_key(problem: Problem) -> tuple[str, str, str, int]:
    """``(layout, op, dtype, size)`` of a problem, as the table's rules are keyed.

    layout is ``"fixed"``, ``"variable"`` or ``"features"`` (more than one
    feature column); op is ``"sum"`` (sum and mean) or ``"minmax"``; size is
    ``log2`` of the segment length (for offsets, of the mean length), floored.
    A rule may also be limited to fixed lengths that are, or are not, powers of
    two (``"lengths": "pow2"`` or ``"other"``).
    """
    layout = "features" if problem.features > 1 else "fixed" if problem.fixed else "variable"
    op = "sum" if problem.reduction in ("sum", "mean") else "minmax"  # (prod orders as max/min: not linear)
    length = problem.segment_length if problem.fixed else problem.n / max(problem.num_segments, 1)
    size = math.floor(math.log2(length)) if length >= 1 else 0
    return layout, op, problem.dtype, size


def _load(path: Path | Any) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    if data.get("version") != TABLE_VERSION:
        raise ValueError(f"dispatch table {path} has version {data.get('version')}, expected {TABLE_VERSION}")
    rules = data["rules"]
    for rule in rules:
        unknown = [b for b in rule["order"] if b not in BACKENDS]
        if unknown:
            raise ValueError(f"dispatch table {path} names unknown backends {unknown}")
        if rule.get("lengths", "any") not in LENGTHS:
            raise ValueError(f"dispatch table {path}: 'lengths' must be one of {LENGTHS}; got {rule['lengths']!r}")
    return rules


def table(device: str = "gpu") -> list[dict[str, Any]]:
    """The dispatch rules in force: on the GPU the tuned table if there is one, then the shipped
    one; on the host (``device="cpu"``) the tuned host table, or none."""
    rules = _tables.get(device)
    if rules is None:
        with _lock:
            rules = _tables.get(device)
            if rules is None:
                rules = _read_tables() if device == "gpu" else _read_host_table()
                _tables[device] = rules
    return rules


def _read_host_table() -> list[dict[str, Any]]:
    tuned = host_cache_path()
    if not tuned.exists():
        return []
    try:
        rules = _load(tuned)
    except (OSError, ValueError, KeyError) as e:  # a broken cache must not break calls
        logger.warning("ignoring the host dispatch table %s: %s", tuned, e)
        return []
    logger.debug("host dispatch table from %s", tuned)
    return rules


def _read_tables() -> list[dict[str, Any]]:
    tuned = tune_cache_path()
    shipped = resources.files("linred").joinpath("dispatch_default.json")
    rules: list[dict[str, Any]] = []
    if tuned.exists():
        try:
            rules = _load(tuned)
            logger.debug("dispatch table from %s", tuned)
        except (OSError, ValueError, KeyError) as e:  # a broken cache must not break calls
            logger.warning("ignoring the dispatch table %s: %s", tuned, e)
    # The shipped rules come after the tuned ones: they fill what tuning did not measure.
    return rules + _load(shipped)


def reload() -> None:
    """Forget the loaded tables (after ``linred tune`` wrote a new one)."""
    with _lock:
        _tables.clear()


def preference(problem: Problem) -> tuple[str, ...]:
    """Backends to try for ``problem``, best first."""
    default, rules = (GPU_ORDER, table()) if problem.on_gpu else (HOST_ORDER, table("cpu"))
    if not rules:
        return default
    layout, op, dtype, size = rule_key(problem)
    L = problem.segment_length
    lengths = ("pow2" if L & (L - 1) == 0 else "other") if problem.fixed and L else ""
    for rule in rules:
        if rule["layout"] != layout or rule["op"] != op or dtype not in rule["dtypes"]:
            continue
        if rule.get("lengths", "any") not in ("any", lengths):
            continue
        if size <= rule.get("upto_log2", 64):
            order = tuple(rule["order"])
            return order + tuple(b for b in default if b not in order)
    return default


def _reductions(name: str) -> tuple[str, ...]:
    """The reductions backend ``name`` computes (none where its module does not import here)."""
    try:
        return get_backend(name).reductions
    except Exception:  # (a backend's module that cannot be imported on this machine)
        return ()


def _serve(name: str, problem: Problem) -> tuple[Backend | None, str | None]:
    """``(backend, None)`` if backend ``name`` can serve ``problem``, else ``(None, why not)``."""
    reason = unavailable(name)
    if reason is not None:
        return None, reason
    backend = get_backend(name)
    if problem.reduction not in backend.reductions:
        # (the backends that do compute it: a backend's list would name reductions it refuses
        # for every call, max and min for the products with ones)
        others = [other for other in BACKENDS if problem.reduction in _reductions(other)]
        return None, f"it does not compute segmented_{problem.reduction} ({' and '.join(others) or 'no backend'} do)"
    if not problem.plain and backend.reads_pointers:
        return None, (
            "it reads the data through raw pointers, and this array is byte-swapped, unaligned or has strides "
            "that are not a multiple of its itemsize; backend='numpy' serves it, or pass a native contiguous copy"
        )
    reason = backend.unsupported(problem)
    return (backend, None) if reason is None else (None, reason)


def select(problem: Problem, name: str) -> Backend:
    """The backend that serves ``problem``: ``name`` itself, or the choice of ``"auto"``.

    Raises
    ------
    BackendError
        If the named backend (or, for ``"auto"``, every candidate) cannot serve it.
    """
    if name != "auto":
        backend, reason = _serve(name, problem)
        if backend is None:
            raise BackendError(name, reason)
        return backend
    reasons = []
    later: list[Backend] = []  # (those that serve it slowly: if no other backend serves it)
    for candidate in preference(problem):
        backend, reason = _serve(candidate, problem)
        if backend is None:
            reasons.append(f"{candidate}: {reason}")
        elif backend.slower(problem) is None:
            return backend
        else:
            later.append(backend)
    if later:
        logger.debug("auto: %s serves %s (no faster backend does: %s)", later[0].name, problem.describe(), reasons)
        return later[0]
    raise BackendError("auto", "no backend can serve " + problem.describe() + " (" + "; ".join(reasons) + ")")
