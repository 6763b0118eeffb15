"""What the documentation names exists: every test file the README, docs/ and .ci/run point at, and the Gradio
version docs/cluster.md speaks of is the one pyproject.toml pins."""

from __future__ import annotations

import re

from tests.support.paths import REPO

DOCS = [REPO / "README.md", REPO / ".ci" / "run", *sorted((REPO / "docs").glob("*.md"))]
TEST_PATH = re.compile(r"tests/[\w/*.-]+\.py")


def test_every_test_file_the_docs_name_exists() -> None:
    named = {(doc.name, path) for doc in DOCS for path in TEST_PATH.findall(doc.read_text(encoding="utf-8"))}
    assert any(doc == "coreml.md" for doc, _ in named)  # the pages that list tests are read
    missing = [(doc, path) for doc, path in sorted(named) if not list(REPO.glob(path))]
    assert missing == []


def test_the_cluster_page_names_the_pinned_gradio() -> None:
    pin = re.search(r'"gradio==([\d.]+)"', (REPO / "pyproject.toml").read_text(encoding="utf-8")).group(1)
    page = (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
    named = set(re.findall(r"Gradio (\d+\.\d+(?:\.\d+)?)", page))
    assert named == {pin}, named
