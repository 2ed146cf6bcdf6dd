"""asv benchmarks of linred beside the peers a user would otherwise pick.

``cpu``: NumPy arrays (linred's host backends, NumPy, PyTorch on the CPU);
``gpu``: CuPy arrays and CUDA tensors (skipped without a CUDA device);
``imports``: the cost of ``import linred``.  Run from the repository root against
the installed linred: ``asv run --python=same --quick``; see docs/benchmarking.md.
"""
