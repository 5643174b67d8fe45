"""A row of push buttons wired to ``owner._on_<key>`` (used by the history and profile views)."""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QPushButton


def button_bar(owner, prefix: str, specs) -> tuple[QHBoxLayout, dict[str, QPushButton]]:
    """``specs``: ``(key, text, tooltip)`` triples. Each button is named ``{prefix}_{key}``
    and its ``clicked`` calls ``owner._on_{key}``. Returns the layout (stretch at the end)
    and the buttons by key."""
    bar = QHBoxLayout()
    buttons: dict[str, QPushButton] = {}
    for key, text, tip in specs:
        b = QPushButton(text)
        b.setObjectName(f"{prefix}_{key}")
        b.setToolTip(tip)
        b.clicked.connect(getattr(owner, f"_on_{key}"))
        bar.addWidget(b)
        buttons[key] = b
    bar.addStretch(1)
    return bar, buttons
