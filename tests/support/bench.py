"""Running ``linred bench`` from the tests: its arguments parsed as the CLI parses them, and a
run whose JSON is read back."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from linred import bench

#: every status a method of a bench case may have
STATUSES = {"ok", "WRONG", "refused", "skipped", "error"}


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` as ``linred bench`` parses it."""
    parser = argparse.ArgumentParser(prog="linred bench")
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def run_json(path: Path, argv: list[str]) -> tuple[int, dict]:
    """``linred bench *argv --json path``: its exit status and the JSON it wrote."""
    rc = bench.run(parse([*argv, "--json", str(path)]))
    return rc, json.loads(path.read_text())
