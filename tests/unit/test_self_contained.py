"""The repository is self-contained: a fresh clone with nothing beside it passes the tests.

No file of the project points to documents or cases outside the repository (design
notes live in docs/, field cases in tests/cases/), and no test reads beside the
checkout (the guard in tests/conftest.py fails any test that does)."""
from __future__ import annotations

import re

import yaml

from tests import conftest
from tests.conftest import CASES, ROOT, beside_checkout

#: the folders whose files must not point outside the repository, and single files
FOLDERS = ("app", "widgets", "tests", "benchmarks", "scripts", "docs", "packaging")
FILES = ("README.md", "Makefile", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".spec", ".desktop",
                 ".xml", ".qss", ".json"}

#: what an outside reference looks like, and where that content lives now. The design
#: documents that used to sit beside the checkout were upper-case; docs/ has them
#: lower-case, so any upper-case name is a dangling reference.
OUTSIDE = [
    (re.compile(r"\.\.[/\\]shared\b"), "a folder beside the checkout: use docs/ or tests/cases/"),
    (re.compile(r"\bshared[/\\]cases\b"), "tests/cases/"),
    (re.compile(r"\bDESIGN\.md\b"), "docs/design.md"),
    (re.compile(r"\bVLLM-FACTS\.md\b"), "docs/vllm-facts.md"),
    (re.compile(r"\bPERF-MODEL\.md\b"), "docs/perf-model.md"),
    (re.compile(r"\bVLLM_DYNO_SHARE[D]\b"), "nothing: the cases are in tests/cases/"),
]


def _project_files():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name == "Makefile") \
                    and "__pycache__" not in path.parts:
                yield path
    for name in FILES:
        if (ROOT / name).is_file():
            yield ROOT / name


def test_no_file_points_outside_the_repository():
    bad = []
    files = list(_project_files())
    assert len(files) > 50
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for pattern, instead in OUTSIDE:
                if pattern.search(line):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}  → cite {instead}")
    assert not bad, "references outside the repository:\n" + "\n".join(bad)


def test_tests_build_no_path_outside_the_checkout():
    """Test code never climbs above the repository root."""
    climbs = re.compile(r"ROOT\.parent\b|\.parent\.parent\.parent\b|[\"']\.\./")
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if climbs.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_field_cases_are_in_the_repository():
    assert CASES.resolve().is_relative_to(ROOT.resolve())
    assert not hasattr(conftest, "SHARED")
    for kind in ("launch", "streaming", "metrics", "nvml"):
        files = sorted((CASES / kind).glob("*.yaml"))
        assert files, kind
        for path in files:
            case = yaml.safe_load(path.read_text())
            assert case["id"] == path.stem and case["expect"], path
    assert (CASES / "README.md").is_file()
    for doc in ("design.md", "vllm-facts.md", "perf-model.md"):
        assert (ROOT / "docs" / doc).is_file(), doc


def test_guard_tells_beside_from_inside():
    root = "/w/repo"
    allowed = ("/w/venv",)
    assert beside_checkout("/w/other/cases/launch/x.yaml", root, allowed)
    assert beside_checkout("/w/repo/../other/notes.md", root, allowed)  # normalised first
    assert beside_checkout("/w/notes.txt", root, allowed)
    assert beside_checkout("/w/repo-old/x", root, allowed)  # a sibling checkout is beside too
    assert not beside_checkout("/w/repo/tests/cases/launch/x.yaml", root, allowed)
    assert not beside_checkout("/w/repo", root, allowed)
    assert not beside_checkout("/w/venv/lib/python3.11/os.py", root, allowed)
    assert not beside_checkout("/w/.cache/huggingface/x", root, allowed)
    assert not beside_checkout("/usr/lib/python3.11/os.py", root, allowed)
    assert not beside_checkout("/tmp/pytest-of-me/x", root, allowed)
    assert not beside_checkout("/x", "/", allowed)


def test_guard_is_installed():
    assert conftest.READ_GUARD_INSTALLED
    assert conftest.reads_inside_checkout is not None
