"""The documentation: every public name documented with an example, pages that match the code, the Sphinx build."""

from __future__ import annotations

import doctest
import importlib.util
import inspect
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import linred

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference.rst"

#: documented methods of the public classes (the reference lists them with ``:members:``)
PUBLIC_METHODS = {"SegmentedReduction": ("execute", "free")}


def numpydoc_sections(doc: str) -> dict[str, str]:
    """The sections of a numpydoc docstring: header -> body (the summary is under "")."""
    lines = inspect.cleandoc(doc).splitlines()
    sections: dict[str, list[str]] = {"": []}
    current = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        underline = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and re.fullmatch(r"-{3,}", underline.strip()) and len(underline.strip()) == len(line.strip()):
            current = line.strip()
            sections[current] = []
            i += 2
            continue
        sections[current].append(line)
        i += 1
    return {name: "\n".join(body) for name, body in sections.items()}


def documented_objects() -> list[tuple[str, object]]:
    """Every callable in ``linred.__all__`` and the documented methods of its classes."""
    objects = []
    for name in linred.__all__:
        obj = getattr(linred, name)
        if callable(obj):
            objects.append((name, obj))
            for method in PUBLIC_METHODS.get(name, ()):
                objects.append((f"{name}.{method}", getattr(obj, method)))
    return objects


@pytest.mark.parametrize("name, obj", documented_objects(), ids=[n for n, _ in documented_objects()])
def test_public_name_has_numpydoc_examples(name, obj):
    """Every public function, class and documented method has a summary and an Examples section with a doctest."""
    doc = obj.__doc__
    assert doc, f"linred.{name} has no docstring"
    sections = numpydoc_sections(doc)
    assert sections[""].strip(), f"linred.{name} has no summary line"
    assert "Examples" in sections, f"linred.{name} has no numpydoc 'Examples' section"
    assert re.search(r"^>>> ", sections["Examples"], re.M), f"linred.{name}'s Examples section has no >>> line"
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        params = [p for p in inspect.signature(obj).parameters if p != "self"]
        if params:
            assert "Parameters" in sections, f"linred.{name} takes {params} but has no Parameters section"
            for p in params:
                assert re.search(rf"^{p}\b", sections["Parameters"], re.M), f"linred.{name} does not document {p!r}"


def test_every_public_name_is_in_the_reference():
    text = REFERENCE.read_text()
    for name in linred.__all__:
        obj = getattr(linred, name)
        if callable(obj):
            directive = "autoclass" if inspect.isclass(obj) and not issubclass(obj, BaseException) else None
            directive = "autoexception" if inspect.isclass(obj) and issubclass(obj, BaseException) else directive
            directive = directive or "autofunction"
            assert re.search(rf"^\.\. {directive}:: {re.escape(name)}$", text, re.M), f"{name} is not in {REFERENCE}"
            assert re.search(rf"^   {re.escape(name)}$", text, re.M), f"{name} is not in the reference's summary table"
        else:
            # data has no docstring of its own: its entry in the reference carries the example
            entry = re.search(rf"^\.\. data:: {re.escape(name)}\n(.*?)(?=^\S|\Z)", text, re.M | re.S)
            assert entry, f"{name} is not documented in {REFERENCE}"
            assert ">>> " in entry.group(1), f"the reference's entry for {name} has no example"
    for cls, methods in PUBLIC_METHODS.items():
        members = re.search(rf"^\.\. autoclass:: {cls}\n   :members: (.*)$", text, re.M)
        assert members and {m.strip() for m in members.group(1).split(",")} == set(methods)


def test_reference_examples_run():
    """The ``>>>`` examples written in the reference page itself (not in docstrings) are doctests."""
    text = REFERENCE.read_text()
    test = doctest.DocTestParser().get_doctest(text, {}, "reference.rst", str(REFERENCE), 0)
    assert test.examples, "reference.rst has no examples"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_installation_lists_every_extra():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    text = (DOCS / "installation.md").read_text()
    for extra in extras:
        assert f"| `{extra}` |" in text, f"docs/installation.md does not list the extra {extra!r}"


# --- the dispatch table in docs/backends.md is the shipped one ---

_DTYPE_GROUPS = {
    "bool and integers": {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"},
    "real floating": {"float16", "bfloat16", "float32", "float64"},
    "floating and complex": {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"},
}
_DTYPE_GROUPS["bool, integers and real floating"] = _DTYPE_GROUPS["bool and integers"] | _DTYPE_GROUPS["real floating"]


def _doc_dtypes(text: str) -> set[str]:
    if text in _DTYPE_GROUPS:
        return _DTYPE_GROUPS[text]
    return {t.strip() for t in text.split(",")}


def _doc_lengths(text: str) -> tuple[str, int]:
    """A rule's ``lengths`` and ``upto_log2`` from the page's length column."""
    text = text.strip()
    for prefix, lengths in (("powers of two", "pow2"), ("other than powers of two", "other")):
        if text.startswith(prefix):
            return lengths, _doc_upto_log2(text.removeprefix(prefix).removeprefix(",").strip())
    return "any", _doc_upto_log2(text)


def _doc_upto_log2(text: str) -> int:
    """A rule's ``upto_log2`` from the page's length column: ``< 256``, ``64 - 255`` (en dash), ``≥ 256``, ``any``."""
    text = text.strip()
    if text == "any" or text.startswith("≥"):
        return 64
    if text.startswith("<"):
        return int(math.log2(int(text[1:]))) - 1
    _, high = (int(v) for v in re.split("\\s*[\u2013-]\\s*", text))
    return int(math.log2(high + 1)) - 1


def test_backends_page_shows_the_shipped_dispatch_table():
    text = (DOCS / "backends.md").read_text()
    header = "| layout | op | dtypes | segment length | order |"
    assert header in text
    rows = []
    for line in text.split(header, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        layout, op, dtypes, length, order = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((layout, op, _doc_dtypes(dtypes), *_doc_lengths(length), [b.strip() for b in order.split(",")]))
    shipped = json.loads((ROOT / "linred" / "dispatch_default.json").read_text())["rules"]
    expected = [
        (r["layout"], r["op"], set(r["dtypes"]), r.get("lengths", "any"), r.get("upto_log2", 64), r["order"])
        for r in shipped
    ]
    assert rows == expected, "docs/backends.md's dispatch table differs from linred/dispatch_default.json"


# --- the Sphinx build (where the docs extra is installed) ---

_SPHINX_PACKAGES = ("sphinx", "numpydoc", "myst_parser", "pydata_sphinx_theme")


def test_docs_need_no_network():
    """No intersphinx: the build runs offline, as CI does."""
    conf = (DOCS / "conf.py").read_text()
    assert "intersphinx" not in conf.split("extensions", 1)[1].split("\n", 1)[0]


@pytest.mark.slow
@pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in _SPHINX_PACKAGES),
    reason='the docs extra is not installed (pip install ".[docs]")',
)
def test_sphinx_build_is_clean(tmp_path):
    """``sphinx-build -W -n`` (warnings are errors, nitpicky references) builds the site."""
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("index", "installation", "api", "how-it-works", "backends", "performance", "reference"):
        assert (tmp_path / f"{page}.html").exists(), page
    reference = (tmp_path / "reference.html").read_text()
    for name in linred.__all__:
        assert f'id="linred.{name}"' in reference, f"linred.{name} is not in the built reference"
