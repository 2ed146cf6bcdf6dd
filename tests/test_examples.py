"""Every script in examples/ runs, checks what it computed, and says so.

Each example runs in a subprocess, as a user runs it (on the GPU when one is
usable, else on the CPU).  An example exits non-zero when a result differs from
its reference, prints ``OK: <name>`` when all of them match, or ``SKIPPED:
<name>: <why>`` (and exits 0) when it needs something this machine lacks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

#: what each example must print besides its OK line (when it is not skipped)
EXPECTED_OUTPUT = {
    "quickstart": ["[10.0, 26.0, 42.0]", "lengths=[4, 4, 4]", "offsets=[0, 4, 8, 12]", "segmented_sum(x, 4) "],
    "graph_pooling": ["1000 graphs", "checked 1000 graphs against a float64 loop", "empty graphs:"],
    "time_series": ["hourly sums (segment_length=60)", "daily means", "session totals (lengths=)"],
    "torch_interop": ["on cpu:", "segmented_sum(x (1000, 16), offsets=tensor)", "bfloat16"],
    "bench_my_shape": ["linred auto", "rel err", "your call"],
    "plans": ["served by backend", "plan cache"],
    "graph_attention": ["against a float64 loop", "unsorted segment ids: the same", "training: loss"],
    "embedding_bags": ["the same bags and table gradient as F.embedding_bag", "weighted sum: the same"],
}


def run_example(path: Path, *args: str) -> subprocess.CompletedProcess:
    # The source tree first, so the examples run against it whether or not linred is installed.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run(
        [sys.executable, str(path), *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )


def test_the_documented_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert names >= {"quickstart", "graph_pooling", "time_series", "torch_interop", "bench_my_shape"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_and_checks_its_results(path):
    proc = run_example(path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{path.name} exited {proc.returncode}:\n{output}"
    if f"SKIPPED: {path.stem}:" in proc.stdout:
        return
    assert f"OK: {path.stem}" in proc.stdout, output
    for text in EXPECTED_OUTPUT.get(path.stem, []):
        assert text in proc.stdout, f"{path.name} did not print {text!r}:\n{output}"


def test_torch_interop_runs_when_torch_is_installed():
    pytest.importorskip("torch")
    proc = run_example(ROOT / "examples" / "torch_interop.py")
    assert proc.returncode == 0 and "OK: torch_interop" in proc.stdout, proc.stdout + proc.stderr


def test_bench_my_shape_takes_a_shape_of_yours():
    """Variable lengths with features on the CPU, through the command-line arguments."""
    proc = run_example(
        ROOT / "examples" / "bench_my_shape.py", "--device", "cpu", "--n", "2^16", "--mean", "8", "--features", "4"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "geometric lengths" in proc.stdout and "OK: bench_my_shape" in proc.stdout


def test_an_example_fails_on_a_wrong_result(tmp_path):
    """The checks are real: a quick start whose reference is off by one exits non-zero."""
    source = (ROOT / "examples" / "quickstart.py").read_text()
    broken = source.replace("expected = [sum(values[i : i + 4])", "expected = [1 + sum(values[i : i + 4])")
    assert broken != source
    script = tmp_path / "quickstart.py"
    script.write_text(broken)
    proc = run_example(script)
    assert proc.returncode != 0 and "MISMATCH" in proc.stdout, proc.stdout + proc.stderr
