"""What a user waits for before the first result: ``import linred`` in a fresh interpreter."""


def timeraw_import_linred() -> str:
    """``import linred`` alone: it must stay light (NumPy only; GPU libraries load on first use)."""
    return "import linred"


def timeraw_first_sum() -> tuple[str, str]:
    """``import linred`` and a first small NumPy sum: the import plus planning the first call."""
    return "import linred\nlinred.segmented_sum(x, 4)", "import numpy as np\nx = np.ones(1 << 12, dtype=np.float32)"
