"""Sphinx configuration: ``pip install ".[docs]" && sphinx-build -W -b html docs build/docs``.

The build needs no GPU and no network: the API reference is generated from the
docstrings of the source tree beside this directory (so it documents what is
checked out, installed or not), and no intersphinx inventory is fetched.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import linred

project = "linred"
author = "The linred authors"
copyright = "the linred authors; Apache License 2.0"
release = version = linred.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary", "numpydoc"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_heading_anchors = 3
# The docstrings' examples are doctests (tests/test_package.py); their outputs are shown as written.
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
# numpydoc's docstring checks on every documented object (a failure is a warning, and -W makes it
# an error), Examples (EX01) included; an extended summary and a See Also section are optional.
numpydoc_validation_checks = {"all", "ES01", "SA01"}
# NumPy's names are not linked (no intersphinx: the build stays offline); -n must not flag them.
nitpick_ignore_regex = [(r"py:.*", r"numpy(\..*)?")]
autodoc_typehints = "none"  # the numpydoc Parameters sections say it better than the signatures
autosummary_generate = False  # the reference is one page; no stub files are written into docs/

html_theme = "pydata_sphinx_theme"
html_title = f"linred {release}"
html_theme_options = {"navigation_depth": 2, "show_toc_level": 2, "header_links_before_dropdown": 8}
