"""The documentation a newcomer reads: the README stays a short front page, every page it
links exists, and the architecture page names every module of the package, so that a new
module arrives with its line there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: the README is the front page: what it is, the two commands, what a line means, where next
README_MAX_LINES = 250
#: the families each have their page
FAMILY_PAGES = ("switch", "logprobs", "rl-consistency", "collectives", "hardware",
                "patch-guard", "preflight", "isolation", "stack-profiles", "reports",
                "architecture")


def test_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"


def test_every_linked_page_exists() -> None:
    missing = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).resolve().is_file():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_every_family_has_its_page() -> None:
    missing = [name for name in FAMILY_PAGES if not (ROOT / "docs" / f"{name}.md").is_file()]
    assert not missing, missing


def test_the_architecture_page_names_every_module() -> None:
    text = ARCHITECTURE.read_text()
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "harness").rglob("*.py")
                     if "__pycache__" not in p.parts)
    missing = [m for m in modules if f"`{m}`" not in text]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"
    named = set(re.findall(r"`(harness/[\w/]+\.py)`", text))
    gone = sorted(named - set(modules))
    assert not gone, f"docs/architecture.md names modules that do not exist: {', '.join(gone)}"


def test_no_reference_to_files_outside_the_repository() -> None:
    """A reader of the repository has no "facts file": cite the upstream source instead."""
    offenders = []
    for path in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "suites").rglob("*.py"),
                 *(ROOT / "docs").glob("*.md"), README]:
        text = path.read_text()
        if re.search(r"facts file|ascend-facts|\.\./shared/", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders


#: the words that once meant several things (issue 69), each with the one name per meaning
GLOSSARY_TERMS = ("drift", "envelope", "upstream API moved", "upstream edit", "vacuous",
                  "stand-in", "reaper")


def test_the_architecture_page_lists_each_term_once() -> None:
    """One row per term in the "Words" table, and the old names of the other two "drift"s
    are gone from the code."""
    text = ARCHITECTURE.read_text()
    table = text.split("## Words", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| term")]
    assert sorted(rows) == sorted(GLOSSARY_TERMS), rows
    stale = [str(p.relative_to(ROOT)) for p in [*(ROOT / "harness").rglob("*.py"),
                                                 *(ROOT / "suites").rglob("*.py")]
             if re.search(r"UpstreamDrift|check_drift|no fail-fast on drift", p.read_text())]
    assert not stale, stale
