"""Issue 19, item 5: the Help menu — a quick start, the concepts (the README's terms) and
the keyboard shortcuts, the last listed from the window's actions."""
from __future__ import annotations

import re
from pathlib import Path

from widgets.help_dialog import page_html

ROOT = Path(__file__).resolve().parents[2]
TERMS = ("TTFT", "TPOT", "ITL", "e2e", "Throughput", "Goodput", "SLO", "Concurrency", "Knee", "Verdict", "KV cache")


def test_the_concepts_page_and_the_readme_define_the_same_terms():
    page = page_html("concepts")
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Concepts"):readme.index("\n## ", readme.index("## Concepts") + 5)]
    for t in TERMS:
        assert f"<b>{t}</b>" in page, t
        assert f"**{t}**" in section, t
    assert "(e2e − TTFT) ÷ (output tokens − 1)" in page and "(e2e − TTFT) ÷ (output tokens − 1)" in section


def test_help_menu_opens_each_page(main_window, qtbot):
    w = main_window
    menu = next(a.menu() for a in w.menuBar().actions() if a.text() == "&Help")
    texts = [a.text() for a in menu.actions() if a.text()]
    assert texts[:3] == ["&Quick start", "&Concepts: TTFT, TPOT, ITL, goodput, knee", "&Keyboard shortcuts"], texts
    quick = w.show_help("quick_start")
    assert quick.isVisible() and "Run ramp" in quick.browser.toPlainText() and "verdict" in quick.browser.toPlainText()
    assert w.show_help("quick_start") is quick  # raised again, not a second window
    concepts = w.show_help("concepts").browser.toPlainText()
    assert all(t in concepts for t in TERMS)
    keys = w.show_help("shortcuts").browser.toPlainText()
    for action, key in (("Launch", "Ctrl+L"), ("Run ramp", "Ctrl+R"), ("Stop", "Ctrl+."), ("Quick start", "F1")):
        assert re.search(rf"{re.escape(action)}\s+{re.escape(key)}", keys), (action, key, keys)
    w.shutdown()  # closes the pages with the window
    assert not any(d.isVisible() for d in w.help_dialogs.values())
