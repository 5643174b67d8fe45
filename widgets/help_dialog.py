"""The Help menu's pages (issue 19, item 5): a quick start and the concepts (TTFT, TPOT,
ITL, e2e, goodput, SLO, knee, verdict, KV cache) as package data under
``resources/help/`` (the README's "Concepts" holds the same terms), and the keyboard
shortcuts, listed from the window's own actions so the list cannot go stale."""
from __future__ import annotations

import html
from importlib import resources

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTextBrowser, QVBoxLayout, QWidget

#: page name → (window title, file under resources/help/)
PAGES = {"quick_start": ("Quick start", "quick_start.html"), "concepts": ("Concepts", "concepts.html")}


def page_html(name: str) -> str:
    """The HTML of a packaged help page (``quick_start``, ``concepts``)."""
    return (resources.files("resources") / "help" / PAGES[name][1]).read_text("utf-8")


def shortcuts_html(window: QWidget) -> str:
    """A table of every action of ``window`` that has a shortcut: what it does, the keys."""
    rows = []
    seen = set()
    for a in window.findChildren(QAction):
        keys = a.shortcut().toString(QKeySequence.NativeText)
        text = a.text().replace("&", "").rstrip("…")
        if keys and (text, keys) not in seen:
            seen.add((text, keys))
            rows.append((text, keys))
    body = "".join(f"<tr><td>{html.escape(t)}</td><td><b>{html.escape(k)}</b></td></tr>" for t, k in rows)
    return ("<h2>Keyboard shortcuts</h2><table cellspacing='4'>" + body + "</table>"
            "<p>In the log: Enter finds the next match of the search, Shift+Enter the previous one. "
            "Tab moves between the form's fields (the Environment box included).</p>")


class HelpDialog(QDialog):
    """One help page in a browser pane (links open in the system browser)."""

    def __init__(self, title: str, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"vLLM Dyno — {title}")
        self.browser = QTextBrowser()
        self.browser.setOpenExternalLinks(True)
        self.browser.setHtml(text)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.close)
        lay = QVBoxLayout(self)
        lay.addWidget(self.browser)
        lay.addWidget(buttons)
        self.resize(640, 560)
