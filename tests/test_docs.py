"""Every doc the code and the docs cite is in the repository, and so is every section cited.

A citation is a Markdown file name in capitals, bare or with its folder (`DESIGN.md`, `docs/TELEMETRY.md`,
`deploy/README.md`), optionally followed by section numbers (`§6`, `§1, §4, §5.2`) or a section's name in
quotes (`docs/BENCHMARKS.md, "Data plane"`, `docs/BENCHMARKS.md ("The demo, live")`). A bare name is looked
up in docs/ and then at the root. When the cited doc numbers its headings (`## 7. Planning`, `### 1.2 ...`),
each cited section must be one of them; a quoted name must begin one of the doc's headings (or a
paragraph's bold lead). A decision record (`docs/decisions/0014-stream-guard.md`) is cited by its path
and must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("controller", "tests", "deploy", "grafana", "protos", "docs", "scenarios")
ROOT_FILES = ("README.md", "CONTRIBUTING.md", "Makefile", "pyproject.toml", ".pre-commit-config.yaml")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".proto", ".json", ".service", ".sysusers", ""}
SKIPPED_DIRS = {"gen", "__pycache__", "golden"}

# Names that look like doc citations but are not: a placeholder output file in a usage line.
NOT_CITATIONS = {"OUT.md"}
# The shared data folder lives beside the repository (`../shared/data`), not in it.
OUTSIDE_PREFIXES = ("shared/", "../")

CITATION = re.compile(r"(?<![\w./-])((?:\.\./)*(?:[\w.-]+/)*[A-Z][A-Z0-9_]*\.md)`?"  # the file
                      r"((?:[ ,]*(?:and )?§ ?\d+(?:\.\d+)*)*)")  # then its sections
SECTION = re.compile(r"§ ?(\d+(?:\.\d+)*)")
# A section's name right after the citation: `DOC.md, "Name"`, `DOC.md ("Name")` or `DOC.md` ("Name").
NAMED = re.compile(r"((?:\.\./)*(?:[\w.-]+/)*[A-Z][A-Z0-9_]*\.md)`?(?:,| \(|`? \()\s*\"([^\"]+)\"")
HEADING_TEXT = re.compile(r"^#{1,6}\s+(?:\d+(?:\.\d+)*\.?\s+)?(.+?)\s*$", re.M)
RUN_IN_HEADING = re.compile(r"^\*\*([^*]+)\*\*", re.M)  # a paragraph's bold lead: **KEDA over mTLS.** Two ...
DECISION = re.compile(r"docs/decisions/\d{4}-[\w.-]+\.md")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)


def _files() -> list[Path]:
    out = [ROOT / f for f in ROOT_FILES if (ROOT / f).is_file()]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or SKIPPED_DIRS & set(path.relative_to(ROOT).parts):
                continue
            if path.suffix in SUFFIXES and path != Path(__file__).resolve():
                out.append(path)
    return out


def citations(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """[(cited file, cited sections)] in `text`.

    "see docs/TELEMETRY.md §1, §4" → [("docs/TELEMETRY.md", ("1", "4"))].
    """
    return [(m.group(1), tuple(s.rstrip(".") for s in SECTION.findall(m.group(2)))) for m in CITATION.finditer(text)]


def resolve(cited: str) -> Path | None:
    """The repository file a citation names, or None when it is outside the repository on purpose."""
    if cited.startswith(OUTSIDE_PREFIXES):
        return None
    if "/" in cited:
        return ROOT / cited
    in_docs = ROOT / "docs" / cited
    return in_docs if in_docs.is_file() else ROOT / cited


def numbered_sections(doc: Path) -> set[str]:
    return set(HEADING.findall(doc.read_text()))


def _lines():
    """(file relative to the root, line number, line) for every scanned file's lines."""
    for path in _files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            yield str(path.relative_to(ROOT)), lineno, line


def _all_citations() -> list[tuple[str, int, str, tuple[str, ...]]]:
    return [(where, lineno, cited, sections) for where, lineno, line in _lines()
            for cited, sections in citations(line) if cited not in NOT_CITATIONS]


CITED = _all_citations()


def headings(doc: Path) -> list[str]:
    """Each heading's text, without its #s and number, and each paragraph's bold lead."""
    text = doc.read_text()
    return HEADING_TEXT.findall(text) + RUN_IN_HEADING.findall(text)


def _scan(pattern: re.Pattern[str]) -> list[tuple[str, int, re.Match[str]]]:
    return [(where, lineno, m) for where, lineno, line in _lines() for m in pattern.finditer(line)]


def test_the_scan_finds_the_citations_the_code_relies_on():
    names = {cited for _, _, cited, _ in CITED}
    assert {"docs/TELEMETRY.md", "DESIGN.md", "docs/OPERATING.md"} <= names
    assert any(cited == "DESIGN.md" and "7" in sections for _, _, cited, sections in CITED)


def test_every_cited_doc_is_in_the_repository():
    missing = [f"{where}:{line}: {cited}" for where, line, cited, _ in CITED
               if (doc := resolve(cited)) is not None and not doc.is_file()]
    assert not missing, "cited docs that are not in the repository:\n" + "\n".join(missing)


def test_every_cited_section_exists():
    bad = []
    for where, line, cited, sections in CITED:
        doc = resolve(cited)
        if not sections or doc is None or not doc.is_file():
            continue
        have = numbered_sections(doc)
        bad += [f"{where}:{line}: {cited} §{s} (sections: {', '.join(sorted(have))})"
                for s in sections if have and s not in have]
    assert not bad, "cited sections that do not exist:\n" + "\n".join(bad)


def test_every_cited_section_name_begins_a_heading():
    named = _scan(NAMED)
    assert any(m.group(1) == "docs/BENCHMARKS.md" for _, _, m in named)
    bad = []
    for where, line, m in named:
        doc = resolve(m.group(1))
        if doc is None or not doc.is_file():
            continue
        names = headings(doc)
        if not any(h.startswith(m.group(2)) for h in names):
            bad.append(f"{where}:{line}: {m.group(1)}, \"{m.group(2)}\" (headings: {'; '.join(names[:40])})")
    assert not bad, "cited section names that begin no heading:\n" + "\n".join(bad)


def test_every_cited_decision_record_exists():
    cited = _scan(DECISION)
    missing = [f"{where}:{line}: {m.group(0)}" for where, line, m in cited if not (ROOT / m.group(0)).is_file()]
    assert not missing, "cited decision records that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("text,expected", [
    ("see docs/TELEMETRY.md §1, §4, §5.2 for the names", [("docs/TELEMETRY.md", ("1", "4", "5.2"))]),
    ("The pattern (DESIGN.md §7): replicas are lost", [("DESIGN.md", ("7",))]),
    ("summarised in docs/TELEMETRY.md §7. What is reproduced", [("docs/TELEMETRY.md", ("7",))]),
    ("One ScaledObject per pool (`docs/OPERATING.md` §5)", [("docs/OPERATING.md", ("5",))]),
    ("Figures from shared/data/README.md.", [("shared/data/README.md", ())]),
    ("https://github.com/org/repo/blob/main/README.md and docs/gen-ai/metrics.md", []),
])
def test_citation_parsing(text, expected):
    assert citations(text) == expected


def test_resolution_and_sections(tmp_path):
    assert resolve("DESIGN.md") == ROOT / "docs" / "DESIGN.md"
    assert resolve("README.md") == ROOT / "README.md"
    assert resolve("shared/data/README.md") is None
    doc = tmp_path / "X.md"
    doc.write_text("# X\n\n## 1. One\n\n### 1.2 Two\n\n## Unnumbered\n")
    assert numbered_sections(doc) == {"1", "1.2"}


# Issue 31's limit: docs/BENCHMARKS.md is a report of today's figures, not a notebook. Readings, what was
# tried and superseded figures go to docs/decisions/ (a record per choice), leaving a pointer.
BENCHMARKS_MAX_LINES = 600


def test_benchmarks_stays_a_report():
    lines = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= BENCHMARKS_MAX_LINES, (
        f"docs/BENCHMARKS.md has {len(lines)} lines, over issue 31's {BENCHMARKS_MAX_LINES}: move readings and "
        "history into decision records (docs/decisions/README.md) and leave a one-line pointer")
