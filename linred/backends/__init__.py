"""Backends: the registry of names, lazy imports and availability.

Each backend lives in its own module (or package), ``linred.backends.<name>``,
imported the first time the backend is asked for; nothing heavy is imported by
``import linred``.  No backend imports another.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from typing import Any, Literal

from linred.backends.base import Backend, Options

__all__ = [
    "BACKENDS",
    "BackendName",
    "available_backends",
    "check_backend_name",
    "configure",
    "get_backend",
    "options_generation",
]

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


#: bumped by every :func:`configure`; part of the key of every cached plan
_generation = 0
_on_configure: list[Any] = []


def options_generation() -> int:
    """Which options are in force: a number that changes whenever :func:`configure` runs."""
    return _generation


def configure(name: str, **changes: Any) -> Options:
    """Change backend ``name``'s tuning options for the plans made from now on.

    Plans already made (a :class:`linred.SegmentedReduction`, or the functions'
    cached plans) keep the options they were made with; the functions' cache is
    keyed by the options in force, so their next call makes a new plan.

    Parameters
    ----------
    name : str
        A backend name: "numpy", "nvmath", "cublas", "cub" or "nvrtc".
    **changes
        Fields of that backend's options dataclass and their new values.  With no
        changes, the options in force are returned.

    Returns
    -------
    Options
        The options now in force (a frozen dataclass); pass its fields back to
        restore them.

    Raises
    ------
    TypeError
        If a field is not one of the backend's options.
    ValueError
        If a value is not allowed (the options' own validation).

    Examples
    --------
    >>> import linred.backends
    >>> linred.backends.configure("numpy")
    Options()
    """
    global _generation
    if name not in BACKENDS:
        raise ValueError(f"name must be one of {', '.join(map(repr, BACKENDS))}; got {name!r}")
    backend = get_backend(name)
    if not changes:
        return backend.options
    new = dataclasses.replace(backend.options, **changes)
    with _lock:
        backend.options = new
        _generation += 1
    for callback in _on_configure:
        callback()
    return new
