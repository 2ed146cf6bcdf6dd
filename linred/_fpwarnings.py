"""NumPy's floating-point warnings, reported at the caller's line instead of linred's.

NumPy raises its ``RuntimeWarning`` ("overflow encountered in matmul") from C with
``stacklevel=1``, so it names the linred line that called the ufunc, which tells a user
nothing.  :func:`at_caller` runs a host computation under NumPy error modes in which every
mode the caller left at ``"warn"`` becomes ``"call"``, and the call re-issues the warning at
the first frame outside the ``linred`` package.  Modes the caller set to anything else
(``"ignore"``, ``"raise"``, ``"log"``, ``"print"``, their own ``"call"``) are kept as they are.

Switching modes per call through :class:`numpy.errstate` costs about 3 µs (it reads the
current modes first), more than a whole small reduction.  NumPy 2 keeps its modes in one
context variable, so the switch here is a ``set``/``reset`` of that variable with an error
object built once per distinct caller state; on NumPy releases without it the warnings keep
NumPy's own location.
"""

from __future__ import annotations

import contextvars
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep

try:  # NumPy >= 2.0
    from numpy._core import umath as _umath

    _VAR = _umath._extobj_contextvar
    _make_extobj = _umath._make_extobj
except (ImportError, AttributeError):  # pragma: no cover - NumPy 1.26
    _VAR = None

#: caller's error object -> the one linred runs under (the caller's object is kept as the key
#: so its identity is not reused).  Every ``np.errstate`` block makes a new object, so the cache
#: is emptied when it holds _CACHE_SIZE of them (a rebuild costs a few µs).
_redirected: dict[Any, Any] = {}
_CACHE_SIZE = 64


#: in a pool thread of the caller's call: the list its warnings are kept in, for the caller's
#: thread to issue (a pool thread's stack holds no line of the caller's)
_PENDING: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("linred_fp_pending", default=None)


def _inside(filename: str) -> bool:
    """Whether a frame of ``filename`` is linred's, or PyTorch's running a function of linred's
    (an autograd Function's ``apply``, and ``Tensor.backward`` and the autograd engine's calls of
    its ``backward``)."""
    if filename.startswith(_PACKAGE):
        return True
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return filename.startswith(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def _emit(kind: str) -> None:
    """One ``RuntimeWarning`` at the first frame outside linred (this function's caller's), and
    outside PyTorch's autograd machinery that called linred."""
    frame = sys._getframe(1)
    level = 2
    while frame is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    warnings.warn(f"{kind} encountered in a segmented reduction", RuntimeWarning, stacklevel=level)


def _warn(kind: str, flag: int) -> None:
    """NumPy's error callback: the warning, or, in a pool thread, a note of it for the caller."""
    pending = _PENDING.get()
    if pending is not None:
        pending.append(kind)
        return
    _emit(kind)


def pool_context(pending: list[str]) -> contextvars.Context:
    """A copy of the calling thread's context for a pool thread working on its call: NumPy's
    error modes as the caller set them, and warnings kept in ``pending`` (see :func:`reissue`)."""
    context = contextvars.copy_context()
    context.run(_PENDING.set, pending)
    return context


def reissue(pending: list[str]) -> None:
    """The pool threads' warnings, once per kind, at the caller's line (from the caller's thread)."""
    for kind in dict.fromkeys(pending):
        _emit(kind)


class once_per_kind:
    """The enclosed NumPy calls' warnings (under :func:`at_caller`'s modes) kept and issued once
    per kind when the block ends, as one NumPy call would issue them: for a computation made of
    many elementwise calls over the same data.  (A class, not a generator: the warnings name
    the first frame outside linred, which a generator's context manager would be.)"""

    __slots__ = ("_outer", "_pending", "_token")

    def __enter__(self) -> None:
        self._outer = _PENDING.get()
        self._pending: list[str] = []
        self._token = _PENDING.set(self._pending)

    def __exit__(self, *exc: object) -> None:
        _PENDING.reset(self._token)
        if self._outer is not None:  # (in a pool thread: the caller's thread issues them)
            self._outer.extend(dict.fromkeys(self._pending))
        else:
            reissue(self._pending)


def _modes(extobj: Any) -> tuple[dict[str, Any], Any]:
    """The modes and the callback of NumPy's error object ``extobj``."""

    def read() -> tuple[dict[str, Any], Any]:
        _VAR.set(extobj)
        return np.geterr(), np.geterrcall()

    return contextvars.copy_context().run(read)


def _cached(cache: dict[Any, Any], extobj: Any, build: Callable[[Any], Any]) -> Any:
    """``build(extobj)``, kept in ``cache`` (emptied when it holds :data:`_CACHE_SIZE`)."""
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    built = cache[extobj] = build(extobj)
    return built


def _build(caller: Any) -> Any:
    """The error object for ``caller``'s modes with every ``"warn"`` made ``"call"``."""
    current, callback = _modes(caller)
    if callback is not None or "warn" not in current.values():
        return caller  # the caller's own callback, or nothing that warns: leave it alone
    return _make_extobj(call=_warn, **{k: "call" if v == "warn" else v for k, v in current.items()})


#: the error object a modes' object becomes under :func:`noting` (cached as ``_redirected``)
_noting: dict[Any, Any] = {}
#: the list a :func:`noting` run's overflows and invalid values are noted in (a context variable:
#: pool threads run in a copy of the caller's context, and note into the same list)
_NOTES: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("linred_fp_notes", default=None)
#: NumPy's error flags for an overflow and an invalid value
_NOTED_FLAGS = 2 | 8


def _build_noting(current: Any) -> Any:
    """``current``'s error object with overflow and invalid values noted (not warned of), the
    others kept: a callback of the caller's still gets theirs."""
    found, callback = _modes(current)

    def note(err: str, flag: int) -> None:
        if flag & _NOTED_FLAGS:
            notes = _NOTES.get()
            if notes is not None:
                notes.append(flag)
        if flag & ~_NOTED_FLAGS and callback is not None:
            callback(err, flag & ~_NOTED_FLAGS)

    found.update(over="call", invalid="call")
    return _make_extobj(call=note, **found)


def noting(run: Callable[..., None]) -> Callable[..., bool]:
    """``run(x, out, segments, stream)`` under NumPy's modes with overflow and invalid values
    noted instead of warned of (the others as they are); the wrapper returns whether any was
    noted.  For a computation that tests its own results only where a flag says they may need
    it, and computes again, in the modes of its caller, what those flags would have warned of:
    nothing costs the common call but a ``set``/``reset`` of NumPy's modes (``np.errstate``
    costs about 3 µs, a test of a small result for non-finite values 1 µs)."""
    if _VAR is None:  # pragma: no cover - NumPy 1.26

        def ignoring(x: Any, out: Any, segments: Any, stream: Any) -> bool:
            with np.errstate(over="ignore", invalid="ignore"):
                run(x, out, segments, stream)
            return True  # (no flag to read: always tested)

        return ignoring

    get, set_, reset, cache = _VAR.get, _VAR.set, _VAR.reset, _noting
    notes_var = _NOTES

    def noted(x: Any, out: Any, segments: Any, stream: Any) -> bool:
        current = get()
        extobj = cache.get(current)
        if extobj is None:
            extobj = _cached(cache, current, _build_noting)
        notes: list[int] = []
        token, notes_token = set_(extobj), notes_var.set(notes)
        try:
            run(x, out, segments, stream)
        finally:
            notes_var.reset(notes_token)
            reset(token)
        return bool(notes)

    return noted


def at_caller(run: Callable[..., None]) -> Callable[..., None]:
    """``run(x, out, segments, stream)`` with NumPy's floating-point warnings at the caller's line.

    Costs about 0.3 µs per call (a 1,024-value sum takes about 3 µs).
    """
    if _VAR is None:  # pragma: no cover - NumPy 1.26
        return run

    get, set_, reset, cache = _VAR.get, _VAR.set, _VAR.reset, _redirected

    def redirected(x: Any, out: Any, segments: Any, stream: Any) -> None:
        caller = get()
        extobj = cache.get(caller)
        if extobj is None:
            extobj = _remember(caller)
        token = set_(extobj)
        try:
            run(x, out, segments, stream)
        finally:
            reset(token)

    return redirected


def _remember(caller: Any) -> Any:
    """The error object linred runs under for ``caller``'s, built and kept (the cache bounded)."""
    return _cached(_redirected, caller, _build)


def call_at_caller(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` under :func:`at_caller`'s error modes: for a host
    computation of several NumPy calls (the composed functions' steps and their final cast).
    (:func:`at_caller`'s wrapper takes the same steps written out: it is on every small host
    call's path, where a call through this function would add a frame.)"""
    if _VAR is None:  # pragma: no cover - NumPy 1.26
        return function(*args, **kwargs)
    caller = _VAR.get()
    extobj = _redirected.get(caller)
    if extobj is None:
        extobj = _remember(caller)
    token = _VAR.set(extobj)
    try:
        return function(*args, **kwargs)
    finally:
        _VAR.reset(token)
