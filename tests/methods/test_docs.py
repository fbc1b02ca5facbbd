"""Method files stay short: a module docstring of at most 10 lines, whose longer notes (the choices a
paper leaves open) live on a page of docs/methods/ that exists and names the file it documents."""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FILES = sorted(p for p in (REPO / "src/fedfactor/methods").glob("*.py") if p.name not in ("__init__.py", "base.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_method_docstring_is_short_and_its_notes_page_exists(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert len(doc.splitlines()) <= 10
    for page in re.findall(r"docs/methods/[\w.]+\.md", doc):
        assert page == f"docs/methods/{path.stem}.md"
        assert f"src/fedfactor/methods/{path.name}" in (REPO / page).read_text()


def test_every_page_is_listed_in_the_methods_readme():
    readme = (REPO / "docs/methods/README.md").read_text()
    pages = sorted(p.name for p in (REPO / "docs/methods").glob("*.md") if p.name != "README.md")
    assert pages and all(f"]({name})" in readme for name in pages)
