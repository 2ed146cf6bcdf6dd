"""Backends: the registry of names, lazy imports and availability.

Each backend lives in its own module (or package), ``linred.backends.<name>``,
imported the first time the backend is asked for; nothing heavy is imported by
``import linred``.  No backend imports another.
"""

from __future__ import annotations

import importlib
import threading
from typing import Literal

from linred.backends.base import Backend

__all__ = ["BACKENDS", "BackendName", "available_backends", "check_backend_name", "get_backend"]

#: every backend, in the order ``linred info`` lists them
BACKENDS: tuple[str, ...] = ("numpy", "nvmath", "cublas", "cub", "nvrtc")

BackendName = Literal["auto", "numpy", "nvmath", "cublas", "cub", "nvrtc"]

_loaded: dict[str, Backend] = {}
_unavailable: dict[str, str | None] = {}
_lock = threading.Lock()


def check_backend_name(backend: object) -> str:
    """Return ``backend`` if it names a backend or ``"auto"``, else raise."""
    if isinstance(backend, str) and (backend == "auto" or backend in BACKENDS):
        return backend
    valid = ", ".join(repr(b) for b in ("auto", *BACKENDS))
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, one of {valid}; got {type(backend).__name__}")
    raise ValueError(f"backend must be one of {valid}; got {backend!r}")


def get_backend(name: str) -> Backend:
    """The backend object called ``name`` (importing its module on first use)."""
    backend = _loaded.get(name)
    if backend is None:
        with _lock:
            backend = _loaded.get(name)
            if backend is None:
                backend = importlib.import_module(f"linred.backends.{name}").BACKEND
                _loaded[name] = backend
    return backend


def unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run on this machine (cached), or None."""
    try:
        return _unavailable[name]
    except KeyError:
        pass
    try:
        reason = get_backend(name).unavailable()
    except Exception as e:  # a backend module that cannot even be imported is unavailable, not fatal
        reason = f"its module cannot be imported ({type(e).__name__}: {e})"
    _unavailable[name] = reason
    return reason


def available_backends() -> dict[str, bool | str]:
    """Which backends can run here.

    Returns
    -------
    dict
        Backend name -> ``True`` if it is available, else the reason it is not
        (a missing package, no GPU).  A backend that is available may still
        refuse a particular call (an array type, dtype or reduction it cannot
        serve) with :class:`linred.BackendError`.

    Examples
    --------
    >>> import linred
    >>> linred.available_backends()["numpy"]
    True
    """
    return {name: (unavailable(name) or True) for name in BACKENDS}
