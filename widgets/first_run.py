"""The first-run strip (issue 19, item 2): the three steps from an opened window to an
answer — Launch, Run ramp (or Tune), read the verdict — above the tabs, each ticked as it
happens; it goes away once the first verdict is read (or on its ×) and stays away (the
window's ``gui.ini``: ``onboarding/done``)."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton

#: (key, text before, text once done)
STEPS = (
    ("launch", "<b>1 · Launch</b> the server (toolbar; the demo profile is a simulated 8× RTX 4090 rig — "
               "no GPU needed)", "<b>1 · Launched</b> ✓"),
    ("ramp", "<b>2 · Run ramp</b> (Ramp tab) — or let <b>Tune</b> find better flags", "<b>2 · Measured</b> ✓"),
    ("verdict", "<b>3 · Read the verdict</b>: users at your SLO, with the flags (top of Results)",
     "<b>3 · Verdict</b> ✓"),
)
STYLE = ("QFrame#firstRun { background:#fff8e1; border:1px solid #e0c068; border-radius:4px; }"
         " QLabel[done=\"true\"] { color:#2e7d32; }")
#: how long the strip stays after the last step, ms (the user sees it ticked)
HIDE_AFTER_MS = 6000


class FirstRunStrip(QFrame):
    """Steps ticked by :meth:`mark`; ``finished`` once all three are done (after
    :data:`HIDE_AFTER_MS`) or the × is clicked — the window then hides it for good."""

    finished = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("firstRun")
        self.setStyleSheet(STYLE)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 3, 4, 3)
        lay.setSpacing(14)
        self.labels: dict[str, QLabel] = {}
        for key, text, _ in STEPS:
            lab = QLabel(text)
            lab.setTextFormat(Qt.RichText)
            lab.setWordWrap(True)
            self.labels[key] = lab
            lay.addWidget(lab, 1)
        self.close_btn = QToolButton()
        self.close_btn.setText("×")
        self.close_btn.setToolTip("Hide these first steps for good")
        self.close_btn.setAutoRaise(True)
        self.close_btn.clicked.connect(self.dismiss)
        lay.addWidget(self.close_btn, 0, Qt.AlignTop)
        self.done: set[str] = set()
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.dismiss)

    def mark(self, key: str) -> None:
        """Step ``key`` (``launch``, ``ramp``, ``verdict``) happened; the earlier ones
        count as done too (a verdict means there was a launch and a ramp)."""
        keys = [k for k, _, _ in STEPS]
        if key not in keys or self.isHidden() and self.done == set(keys):
            return
        for k in keys[:keys.index(key) + 1]:
            if k not in self.done:
                self.done.add(k)
                lab = self.labels[k]
                lab.setText(next(d for kk, _, d in STEPS if kk == k))
                lab.setProperty("done", "true")
                lab.style().unpolish(lab)
                lab.style().polish(lab)
        if self.done == set(keys) and not self._timer.isActive():
            self._timer.start(HIDE_AFTER_MS)

    @property
    def waiting_to_hide(self) -> bool:
        """Every step is done and the strip shows them ticked until it hides."""
        return self._timer.isActive()

    def settle(self) -> None:
        """The window closes: a strip waiting to hide after its last step is done now."""
        if self._timer.isActive():
            self.dismiss()

    def dismiss(self) -> None:
        self._timer.stop()
        self.hide()
        self.finished.emit()
