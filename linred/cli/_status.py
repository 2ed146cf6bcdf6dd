"""What the ``info`` and ``demo`` commands both report: each backend's availability, never raising.

A module of its own so that :mod:`linred.cli` and :mod:`linred.cli.demo` share it without
importing each other.
"""

from __future__ import annotations

__all__ = ["backend_status", "short_error"]


def short_error(e: BaseException) -> str:
    """``"TypeName: first line of the message"`` (or only the type name when the message is empty)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def backend_status() -> dict[str, tuple[bool, str]]:
    """Backend name -> (available, reason or summary), never raising.

    Unlike :func:`linred.available_backends`, a backend module that is missing or
    fails to import is reported as unavailable with the error, not raised.
    """
    import linred.backends as registry

    status = {}
    for name in registry.BACKENDS:
        try:
            reason = registry.unavailable(name)
            summary = registry.get_backend(name).summary
        except Exception as e:  # a missing or broken backend module must not break the report
            status[name] = (False, f"module linred.backends.{name} failed to import ({short_error(e)})")
            continue
        status[name] = (True, summary) if reason is None else (False, reason)
    return status
