"""Sphinx configuration: ``pip install ".[docs]" && sphinx-build -W -b html docs build/docs``."""

import linred

project = "linred"
author = "The linred authors"
copyright = "the linred authors; Apache License 2.0"
release = version = linred.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "numpydoc"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_heading_anchors = 3
# The docstrings' examples are doctests; their outputs are shown as written.
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
autodoc_typehints = "none"  # the numpydoc Parameters sections say it better than the signatures

html_theme = "pydata_sphinx_theme"
html_title = f"linred {release}"
html_theme_options = {"navigation_depth": 2}
