"""A row of push buttons wired to ``owner._on_<key>`` (used by the history and profile views)."""
from __future__ import annotations

from PySide6.QtWidgets import QPushButton

from widgets.flow_layout import FlowLayout


def button_bar(owner, prefix: str, specs) -> tuple[FlowLayout, dict[str, QPushButton]]:
    """``specs``: ``(key, text, tooltip)`` triples. Each button is named ``{prefix}_{key}``
    and its ``clicked`` calls ``owner._on_{key}``. Returns the layout (a row that wraps
    onto a second one when the tab is narrower than the buttons: issue 37, item 7) and
    the buttons by key."""
    bar = FlowLayout()
    buttons: dict[str, QPushButton] = {}
    for key, text, tip in specs:
        b = QPushButton(text)
        b.setObjectName(f"{prefix}_{key}")
        b.setToolTip(tip)
        b.clicked.connect(getattr(owner, f"_on_{key}"))
        bar.addWidget(b)
        buttons[key] = b
    return bar, buttons
