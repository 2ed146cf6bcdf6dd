"""A test's Python source run in a fresh interpreter: for calls that may end the process (a
library's segmentation fault), so that a crash fails the test instead of the whole run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(source: str, timeout: float = 300) -> None:
    """Run ``source`` (dedented) with this checkout first on ``sys.path``; assert that it exited
    with 0 after printing ``ok`` (its exit status, output and errors are the failure's message)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", (
        done.returncode,
        done.stdout[-2000:],
        done.stderr[-3000:],
    )
