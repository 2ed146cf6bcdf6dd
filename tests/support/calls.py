"""Counting the calls a test routes through a module's function (a launcher, a check)."""

from __future__ import annotations

from typing import Any


def count_calls(monkeypatch: Any, module: Any, name: str, counts: dict[str, int] | None = None, key: str = "calls",
                launches: str | None = None) -> dict[str, int]:  # fmt: skip
    """Replace ``module.name`` (for the test) by a wrapper that counts its calls in ``counts[key]``
    (``counts`` made when not given) and returns ``counts``.  With ``launches`` (what the function
    launches, for the message), every call must return True: a launcher's False leaves the call
    to another route, right but not the one under test."""
    counts = {} if counts is None else counts
    counts[key] = 0
    function = getattr(module, name)

    def counting(*args: Any) -> Any:
        counts[key] += 1
        result = function(*args)
        if launches is not None:
            assert result, f"{launches} could not run on this device"
        return result

    monkeypatch.setattr(module, name, counting)
    return counts
