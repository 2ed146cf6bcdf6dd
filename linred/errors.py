"""Exceptions raised by linred.

Bad arguments raise the built-in :class:`ValueError` or :class:`TypeError` (and
:class:`numpy.exceptions.AxisError` for ``axis``).  The one exception of linred's
own is :class:`BackendError`: the backend that was asked for (or every backend
that ``"auto"`` considered) cannot serve the call.  linred never falls back to
another backend silently.
"""

from __future__ import annotations

__all__ = ["BackendError"]


class BackendError(RuntimeError):
    """A backend cannot serve a call.

    Raised when a backend is not installed, needs a GPU that is absent, or cannot
    handle the call's array type, device, dtype, reduction or segment layout.
    A subclass of :class:`RuntimeError`; it pickles, so it crosses process
    boundaries intact.

    Parameters
    ----------
    backend : str
        The backend's name (``"auto"`` when no backend could serve the call).
    reason : str
        Why the backend cannot serve it; for ``"auto"``, every candidate's
        reason.

    Attributes
    ----------
    backend : str
        As given.
    reason : str
        As given.

    Examples
    --------
    >>> import numpy as np
    >>> import linred
    >>> try:
    ...     linred.segmented_sum(np.ones(4), 2, backend="cublas")
    ... except linred.BackendError as e:
    ...     print(e.backend)
    cublas
    >>> linred.BackendError("cub", "no CUDA device")
    BackendError("backend 'cub' cannot serve this call: no CUDA device")
    """

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"backend {backend!r} cannot serve this call: {reason}")

    def __reduce__(self):  # keep the two-argument constructor picklable
        return (type(self), (self.backend, self.reason))
