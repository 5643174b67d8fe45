"""The banner shown when a launch fails, or the server dies after it was ready: the
explanation, the supporting log lines, **Show in log** and **Apply fix** (the planner's
diagnosis, :func:`app.planner.diagnose.diagnose`)."""
from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from app.planner.diagnose import evidence_text, undiagnosed_note
from app.planner.plan import fix_to_flags


class DiagnosisBanner(QFrame):
    """Hidden until :meth:`show_failure`. ``apply_fix(dict)`` when the user presses it;
    ``show_evidence(list)`` (the evidence lines) for **Show in log**."""

    apply_fix = Signal(object)
    show_evidence = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("diagnosisBanner")
        self.setStyleSheet("#diagnosisBanner { background:#fde4e4; border:1px solid #a61b1b; border-radius:4px; }")
        v = QVBoxLayout(self)
        v.setContentsMargins(8, 6, 8, 6)
        top = QHBoxLayout()
        self.title = QLabel()
        self.title.setWordWrap(True)
        self.title.setTextInteractionFlags(Qt.TextSelectableByMouse)
        top.addWidget(self.title, 1)
        self.log_btn = QPushButton("Show in log")
        self.log_btn.setObjectName("showDiagnosisEvidence")
        self.log_btn.setToolTip("Scroll the Log tab to the line this diagnosis names")
        self.log_btn.clicked.connect(self._show)
        top.addWidget(self.log_btn)
        self.fix_btn = QPushButton("Apply fix")
        self.fix_btn.setObjectName("applyDiagnosisFix")
        self.fix_btn.clicked.connect(self._apply)
        self.close_btn = QPushButton("Dismiss")
        self.close_btn.clicked.connect(self.hide)
        top.addWidget(self.fix_btn)
        top.addWidget(self.close_btn)
        v.addLayout(top)
        self.evidence = QLabel()
        self.evidence.setWordWrap(True)
        self.evidence.setTextFormat(Qt.RichText)
        self.evidence.setTextInteractionFlags(Qt.TextSelectableByMouse)
        v.addWidget(self.evidence)
        self.diagnosis: Any = None
        self.hide()

    def show_failure(self, reason: str, diagnosis: Any | None) -> None:
        """``reason``: the supervisor's one-line failure; ``diagnosis``: a Diagnosis or None."""
        self.diagnosis = diagnosis
        first = reason.splitlines()[0] if reason else "the server failed"
        if diagnosis is None:
            self.title.setText(f"<b>Launch failed.</b> {html.escape(first)}")
            note = undiagnosed_note(reason, None)
            self.evidence.setText(html.escape(note).replace("\n", "<br>"))
            self.evidence.setVisible(bool(note))
            self.fix_btn.hide()
            self.log_btn.hide()
        else:
            what = "The server died after it was ready" if diagnosis.after_ready else "Launch failed"
            self.title.setText(f"<b>{what} — {html.escape(diagnosis.problem)}.</b> "
                               f"{html.escape(diagnosis.explanation)}")
            ev = "<br>".join(f"<code>{html.escape(evidence_text(l).strip()[:300])}</code>"
                             for l in diagnosis.evidence[:4])
            self.log_btn.setVisible(bool(diagnosis.evidence))
            self.evidence.setText(ev or html.escape(first))
            self.evidence.show()
            if diagnosis.fix:
                self.fix_btn.setToolTip(f"Change the form: {fix_to_flags(diagnosis.fix)}")
                self.fix_btn.show()
            else:
                self.fix_btn.hide()
        self.show()

    def _show(self) -> None:
        if self.diagnosis is not None and self.diagnosis.evidence:
            self.show_evidence.emit(list(self.diagnosis.evidence))

    def _apply(self) -> None:
        if self.diagnosis is not None and self.diagnosis.fix:
            self.apply_fix.emit(dict(self.diagnosis.fix))
            self.hide()
