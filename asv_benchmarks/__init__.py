"""asv benchmarks of linred beside the peers a user would otherwise pick.

Run from the repository root with the installed linred: ``asv run --python=same --quick``.
"""
