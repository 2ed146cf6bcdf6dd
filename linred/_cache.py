"""The user's cache directory for linred (kernels, the tuned dispatch table)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """``linred`` in ``$XDG_CACHE_HOME``, else in ``~/.cache``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "linred"
