"""``backend="auto"``: choose, per problem, the first backend that can serve it.

The order of preference is a per-problem list; the first backend that is
available and does not refuse the problem wins.  When none can serve it, the
error lists every backend's reason.
"""

from __future__ import annotations

from linred.backends.base import Backend
from linred.backends.registry import get_backend, unavailable
from linred.errors import BackendError
from linred.problem import Problem

HOST_ORDER = ("numpy", "nvmath")
GPU_ORDER = ("cublas", "nvmath", "cub")


def preference(problem: Problem) -> tuple[str, ...]:
    """Backends to try for ``problem``, best first."""
    return GPU_ORDER if problem.on_gpu else HOST_ORDER


def select(problem: Problem, name: str) -> Backend:
    """The backend that serves ``problem``: ``name`` itself, or the choice of ``"auto"``.

    Raises
    ------
    BackendError
        If the named backend (or, for ``"auto"``, every candidate) cannot serve it.
    """
    if name != "auto":
        reason = unavailable(name)
        if reason is None:
            backend = get_backend(name)
            reason = backend.unsupported(problem)
            if reason is None:
                return backend
        raise BackendError(name, reason)
    reasons = []
    for candidate in preference(problem):
        reason = unavailable(candidate)
        if reason is None:
            backend = get_backend(candidate)
            reason = backend.unsupported(problem)
            if reason is None:
                return backend
        reasons.append(f"{candidate}: {reason}")
    raise BackendError("auto", "no backend can serve " + problem.describe() + " (" + "; ".join(reasons) + ")")
