"""Docs that cannot drift: the generated reference equals what the code gives, the benchmark's figures in the
README and docs/benchmark.md (and its chart) are what docs/results.json gives, and every link from README.md
and docs/ to a file of this repository finds the file and, for [`name`](file.py#L12), the line of `def name` or
`class name` (a web page scrolls to a line, not to a name)."""

from __future__ import annotations

import json
import re

import pytest
from helpers import ROOT

from scripts import reference_docs
from scripts.bench import published

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?:\[([^\[\]]*))?\]\(([^)\s]+)\)")  # [text](target), the text where it has no brackets


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


def test_the_readme_says_which_targets_were_missed_with_the_figure_and_the_goal():
    results = json.loads(published.RESULTS.read_text())
    results["targets"] = {"hvd_np2_gloo_true_efficiency_0.80_b100": {"met": False, "efficiency": 0.5},
                          "pipeline_10x_training_b100": {"met": True, "ratio": 12.0},
                          "flight_recorder_within_3pct_b1000": {"met": None, "ratio": None}}
    section = published.readme_section(results)
    assert "**Targets**: 1 of 3 met" in section
    assert "- Missed: np=2 Gloo's true parallel efficiency at batch 100: 0.50 (target 0.80)." in section
    assert "- Met: the input pipeline at batch 100: 12x a rank's training (target 10x)." in section
    assert "- Not measured: the flight recorder's cost in step time at batch 1000 (target at most 3%)." in section


def test_a_target_with_no_words_stops_the_publishing():
    results = json.loads(published.RESULTS.read_text())
    results["targets"] = {"some_new_target_b100": {"met": True}}
    with pytest.raises(ValueError, match="no words for the target some_new_target_b100"):
        published.readme_section(results)


def local_links(doc) -> list[tuple[str, str, str]]:
    """(link text, target path relative to the repository, anchor) for every link of `doc` into this repository;
    the text is empty where it holds brackets."""
    found = []
    for text, target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address, or a place in the same page
        path, _, anchor = target.partition("#")
        found.append((text, (doc.parent / path).resolve().relative_to(ROOT).as_posix(), anchor))
    return found


def wrong_line_link(text: str, path: str, anchor: str) -> str | None:
    """What is wrong with a link into a Python file, which names its function in its text and points at the line
    that defines it, [`name`](file.py#L12), and what it should be; None: nothing."""
    if not anchor:
        return None
    name = re.search(r"`(\w+)`", text)
    if name is None:
        return f"[{text}] {path}#{anchor}: name the function or class in the link's text, as [`name`]"
    lines = [number for number, line in enumerate((ROOT / path).read_text().splitlines(), 1)
             if re.match(rf"\s*(async\s+)?(def|class)\s+{name[1]}\b", line)]
    if not lines:
        return f"[{text}] {path}#{anchor}: {path} has no def or class {name[1]}"
    if anchor.removeprefix("L") not in map(str, lines):
        return f"[{text}] {path}#{anchor} should be #L{lines[0]}, where {name[1]} is defined"
    return None


def wrong_links(doc) -> list[str]:
    """Every link of `doc` into this repository that misses its file or its function's line, and why."""
    wrong = []
    for text, path, anchor in local_links(doc):
        if not (ROOT / path).exists():
            wrong.append(f"{path}: no such file")
        elif path.endswith(".py") and (problem := wrong_line_link(text, path, anchor)):
            wrong.append(problem)
    return wrong


@pytest.mark.parametrize("doc", DOCS, ids=[doc.name for doc in DOCS])
def test_every_link_to_the_repository_finds_its_file_and_the_line_of_its_function(doc):
    wrong = wrong_links(doc)
    assert wrong == [], f"{doc.name} links to what is not there:\n" + "\n".join(wrong)


def test_the_link_check_can_fail():
    page = ROOT / "docs" / "probe-not-committed.md"
    line = next(number for number, text in enumerate((ROOT / "hvd_mnist/cli.py").read_text().splitlines(), 1)
                if text.startswith("def main"))
    page.write_text(f"[`main`](../hvd_mnist/cli.py#L{line}) [b](../nowhere.py) [`nothing`](../hvd_mnist/cli.py#L1) "
                    f"[`main`](../hvd_mnist/cli.py#main) [`main`](../hvd_mnist/cli.py#L{line + 1}) "
                    "[cli](../hvd_mnist/cli.py#L1)")
    try:
        assert local_links(page)[:2] == [("`main`", "hvd_mnist/cli.py", f"L{line}"), ("b", "nowhere.py", "")]
        assert wrong_links(page) == [
            "nowhere.py: no such file",
            "[`nothing`] hvd_mnist/cli.py#L1: hvd_mnist/cli.py has no def or class nothing",
            f"[`main`] hvd_mnist/cli.py#main should be #L{line}, where main is defined",
            f"[`main`] hvd_mnist/cli.py#L{line + 1} should be #L{line}, where main is defined",
            "[cli] hvd_mnist/cli.py#L1: name the function or class in the link's text, as [`name`]"]
    finally:
        page.unlink()
