"""Docs that cannot drift: the generated reference equals what the code gives, the benchmark's figures in the
README and docs/benchmark.md (and its chart) are what docs/results.json gives, and every link from README.md
and docs/ to a file of this repository finds the file and, for `file.py#name`, the function or class."""

from __future__ import annotations

import re

import pytest
import reference_docs  # scripts/ is on the path (helpers)
from bench import published
from helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_cli_reference_is_what_the_parser_gives():
    assert (ROOT / "docs" / "cli.md").read_text() == reference_docs.render(), (
        "docs/cli.md is out of date: run .venv/bin/python scripts/reference_docs.py")


def test_the_benchmark_figures_in_the_docs_are_what_results_json_gives():
    assert published.stale() == [], (
        "out of date with docs/results.json: run .venv/bin/python scripts/benchmark.py --publish")


def test_a_figure_typed_into_a_results_section_is_found(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    readme.write_text(text.replace(published.END, "| 100 | 99,999 |\n" + published.END))
    monkeypatch.setattr(published, "SECTIONS", {readme: "readme"})
    monkeypatch.setattr(published, "ROOT", tmp_path)
    monkeypatch.setattr(published, "CHART", ROOT / "docs" / "benchmark_chart.png")
    monkeypatch.setattr(published, "RESULTS", ROOT / "docs" / "results.json")
    assert published.stale() == ["README.md"]


def local_links(doc) -> list[tuple[str, str]]:
    """(target path relative to the repository, anchor) for every link of `doc` into this repository."""
    found = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address, or a place in the same page
        path, _, anchor = target.partition("#")
        found.append(((doc.parent / path).resolve().relative_to(ROOT).as_posix(), anchor))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[doc.name for doc in DOCS])
def test_every_link_to_the_repository_finds_its_file_and_symbol(doc):
    missing = []
    for path, anchor in local_links(doc):
        file = ROOT / path
        if not file.exists():
            missing.append(path)
        elif anchor and file.suffix == ".py" and not re.search(rf"^\s*(def|class) {re.escape(anchor)}\b",
                                                                 file.read_text(), re.M):
            missing.append(f"{path}#{anchor}")
    assert missing == [], f"{doc.name} links to what does not exist"


def test_the_link_check_can_fail(tmp_path, monkeypatch):
    page = ROOT / "docs" / "probe-not-committed.md"
    page.write_text("[a](../hvd_mnist/cli.py#no_such_function) [b](../nowhere.py) [c](../hvd_mnist/cli.py#main)")
    try:
        assert local_links(page) == [("hvd_mnist/cli.py", "no_such_function"), ("nowhere.py", ""),
                                     ("hvd_mnist/cli.py", "main")]
        with pytest.raises(AssertionError, match="links to what does not exist"):
            test_every_link_to_the_repository_finds_its_file_and_symbol(page)
    finally:
        page.unlink()
