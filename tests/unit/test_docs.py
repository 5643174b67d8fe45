"""Docs by audience (issue 33, item 9): the README is the user's — at most 20 KB, with a
table of contents — and the operator's, security reviewer's, contributor's and
architect's material is in docs/ and CONTRIBUTING.md, linked from it. Every relative link
of these pages (a file, an image, a heading) leads somewhere."""
from __future__ import annotations

import re

from tests.conftest import ROOT

PAGES = ["README.md", "CONTRIBUTING.md", "docs/cli.md", "docs/workloads.md", "docs/window.md", "docs/rigs.md",
         "docs/processes.md", "docs/security.md", "docs/architecture.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"(?m)^#+ (.+)$", text)}


def test_the_readme_is_the_users_with_a_table_of_contents():
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= 20_000, readme.stat().st_size
    text = readme.read_text()
    assert "## Contents" in text
    toc = text[text.index("## Contents"):text.index("\n## ", text.index("## Contents") + 5)]
    for anchor in ("two-commands", "the-window", "concepts", "the-main-commands", "where-files-go", "security"):
        assert f"(#{anchor})" in toc, anchor
    for page in PAGES[1:]:
        assert f"({page})" in text, f"the README does not link {page}"
    for command in ("make run", "make test", "vllm-dyno ramp", "vllm-dyno run", "vllm-dyno tune"):
        assert command in text, command


def test_every_relative_link_of_the_pages_leads_somewhere():
    bad = []
    for rel in PAGES:
        page = ROOT / rel
        for m in LINK.finditer(page.read_text()):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                bad.append(f"{rel}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{rel}: {target} (no such heading)")
    assert bad == [], "\n".join(bad)
