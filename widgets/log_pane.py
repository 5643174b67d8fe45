"""The server log: follow, search, errors highlighted, copy, the diagnosis's evidence.

Lines are pulled from a source callable by a 10 Hz timer (never one signal per line);
the view keeps the last ``max_lines`` lines. :meth:`LogPane.show_evidence` scrolls to the
line a diagnosis names as the cause and marks it (and the other evidence lines).
"""
from __future__ import annotations

import re
from typing import Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import (QColor, QFont, QGuiApplication, QSyntaxHighlighter, QTextCharFormat, QTextCursor, QTextDocument,
                           QTextFormat)
from PySide6.QtWidgets import (QCheckBox, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton, QTextEdit,
                               QVBoxLayout, QWidget)

ERROR_RE = re.compile(r"\bERROR\b|Traceback|Error:|Exception\b|CRITICAL|out of memory|No available memory|"
                      r"Value error, |Assertion failed, ")  # the last two: pydantic's, vLLM's config refusals
WARN_RE = re.compile(r"\bWARNING\b|\bWARN\b")
EVIDENCE_COLOR = "#ffc94d"  # the cause a diagnosis names
EVIDENCE_OTHER_COLOR = "#ffe9b0"  # its other evidence lines


class _Highlighter(QSyntaxHighlighter):
    def __init__(self, doc: QTextDocument) -> None:
        super().__init__(doc)
        self.err = QTextCharFormat()
        self.err.setForeground(QColor("#b00020"))
        self.err.setBackground(QColor("#fdecee"))
        self.warn = QTextCharFormat()
        self.warn.setForeground(QColor("#8a5a00"))

    def highlightBlock(self, text: str) -> None:
        if ERROR_RE.search(text):
            self.setFormat(0, len(text), self.err)
        elif WARN_RE.search(text):
            self.setFormat(0, len(text), self.warn)


class LogPane(QWidget):
    """``source()`` returns new ``(t, stream, text)`` tuples; call :meth:`start_follow`."""

    def __init__(self, source: Callable[[], list[tuple[float, str, str]]] | None = None,
                 max_lines: int = 20000, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.source = source
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        bar = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search the log (Enter: next, Shift+Enter: previous)")
        self.search.returnPressed.connect(lambda: self.find(backward=False))
        self.search.textChanged.connect(self._highlight_all)
        self.matches = QLabel("")
        self.follow = QCheckBox("Follow")
        self.follow.setChecked(True)
        self.errors_only = QCheckBox("Errors only")
        self.errors_only.toggled.connect(self._refilter)
        self.copy_btn = QPushButton("Copy")
        self.copy_btn.setToolTip("Copy the selection, or the whole log when nothing is selected")
        self.copy_btn.clicked.connect(self.copy)
        self.clear_btn = QPushButton("Clear")
        self.clear_btn.clicked.connect(self.clear)
        bar.addWidget(self.search, 1)
        bar.addWidget(self.matches)
        bar.addWidget(self.follow)
        bar.addWidget(self.errors_only)
        bar.addWidget(self.copy_btn)
        bar.addWidget(self.clear_btn)
        v.addLayout(bar)
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(max_lines)
        self.view.setLineWrapMode(QPlainTextEdit.NoWrap)
        f = QFont("monospace")
        f.setStyleHint(QFont.Monospace)
        f.setPointSize(9)
        self.view.setFont(f)
        self._hl = _Highlighter(self.view.document())
        v.addWidget(self.view, 1)
        self.lines: list[str] = []
        self.max_lines = max_lines
        self._evidence: list[str] = []
        self._evidence_sels: list[QTextEdit.ExtraSelection] = []
        self._search_sels: list[QTextEdit.ExtraSelection] = []
        self.timer = QTimer(self)
        self.timer.setInterval(100)
        self.timer.timeout.connect(self.pull)

    def keyPressEvent(self, ev) -> None:
        if ev.key() in (Qt.Key_Return, Qt.Key_Enter) and ev.modifiers() & Qt.ShiftModifier:
            self.find(backward=True)
            return
        super().keyPressEvent(ev)

    def start(self) -> None:
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def pull(self) -> None:
        """Append new lines from the source (timer slot)."""
        if self.source is None:
            return
        new = self.source()
        if new:
            self.append_lines([text for _, _, text in new])

    def append_lines(self, texts: list[str]) -> None:
        self.lines.extend(texts)
        if len(self.lines) > self.max_lines:
            del self.lines[: len(self.lines) - self.max_lines]
        shown = [t for t in texts if ERROR_RE.search(t)] if self.errors_only.isChecked() else texts
        if not shown:
            return
        sb = self.view.verticalScrollBar()
        keep = sb.value()
        cur = QTextCursor(self.view.document())
        cur.movePosition(QTextCursor.End)
        if not self.view.document().isEmpty():
            cur.insertText("\n")
        cur.insertText("\n".join(shown))
        if self.follow.isChecked():
            sb.setValue(sb.maximum())
        else:
            sb.setValue(keep)

    def _refilter(self) -> None:
        lines = self.lines
        self.view.clear()
        self.lines = []
        self.append_lines(lines)
        if self._evidence:
            self.show_evidence(self._evidence, scroll=False)

    def clear(self) -> None:
        self.lines = []
        self._evidence, self._evidence_sels = [], []
        self.view.clear()
        self._apply_selections()

    def text(self) -> str:
        return "\n".join(self.lines)

    def copy(self) -> None:
        sel = self.view.textCursor().selectedText().replace("\u2029", "\n")
        QGuiApplication.clipboard().setText(sel or self.text())

    def find(self, backward: bool = False) -> bool:
        """Move to the next (or previous) match of the search text; wraps around."""
        text = self.search.text()
        if not text:
            return False
        flags = QTextDocument.FindBackward if backward else QTextDocument.FindFlag(0)
        if self.view.find(text, flags):
            self.follow.setChecked(False)
            return True
        cur = self.view.textCursor()
        cur.movePosition(QTextCursor.End if backward else QTextCursor.Start)
        self.view.setTextCursor(cur)
        found = self.view.find(text, flags)
        if found:
            self.follow.setChecked(False)
        return found

    def _highlight_all(self, text: str) -> None:
        sels = []
        if text:
            fmt = QTextCharFormat()
            fmt.setBackground(QColor("#ffe066"))
            doc = self.view.document()
            cur = doc.find(text)
            while not cur.isNull() and len(sels) < 2000:
                s = QTextEdit.ExtraSelection()
                s.cursor = cur
                s.format = fmt
                sels.append(s)
                cur = doc.find(text, cur)
        self._search_sels = sels
        self._apply_selections()
        self.matches.setText(f"{len(sels)} match{'es' if len(sels) != 1 else ''}" if text else "")

    # ------------------------------------------------------------------ evidence
    def _apply_selections(self) -> None:
        self.view.setExtraSelections(self._evidence_sels + self._search_sels)

    def _find_block(self, line: str, used: set[int]):
        """The last block of the view whose text is ``line`` (else contains it) and whose
        number is not in ``used`` (evidence can repeat a line: two fields, one message), or None."""
        doc = self.view.document()
        want = line.rstrip("\r\n")
        part = want.strip()
        loose = None
        b = doc.lastBlock()
        while b.isValid():
            if b.blockNumber() not in used:
                t = b.text()
                if t == want:
                    return b
                if loose is None and part and part in t:
                    loose = b
            b = b.previous()
        return loose

    def show_evidence(self, evidence: list[str], scroll: bool = True) -> bool:
        """Mark the diagnosis's ``evidence`` lines (the first, the cause, strongest) and
        scroll so that the cause is in the middle of the view; Follow is turned off so
        that later lines do not scroll it away. False when the cause is not in the view."""
        self._evidence = list(evidence)
        self._evidence_sels = []
        cause, used = None, set()
        for k, line in enumerate(evidence):
            b = self._find_block(line, used)
            if b is None:
                continue
            used.add(b.blockNumber())
            sel = QTextEdit.ExtraSelection()
            sel.cursor = QTextCursor(b)
            fmt = QTextCharFormat()
            fmt.setBackground(QColor(EVIDENCE_COLOR if k == 0 else EVIDENCE_OTHER_COLOR))
            fmt.setProperty(QTextFormat.FullWidthSelection, True)
            if k == 0:
                fmt.setFontWeight(QFont.Bold)
                cause = b
            sel.format = fmt
            self._evidence_sels.append(sel)
        self._apply_selections()
        if cause is None:
            return False
        if scroll:
            self.follow.setChecked(False)
            self.view.setTextCursor(QTextCursor(cause))
            self.view.centerCursor()
        return True

    def evidence_line(self) -> int | None:
        """The block number of the marked cause (None when nothing is marked)."""
        for sel in self._evidence_sels:
            if sel.format.fontWeight() == QFont.Bold:
                return sel.cursor.blockNumber()
        return None
