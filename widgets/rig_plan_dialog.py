"""The launch plan of a rig of several hosts, shown before anything starts (issue 21,
item 3): each host's role, rank and command as ``vllm-dyno hosts plan`` prints them, the
findings of the hosts' entries, what the head's API server exposes; Launch, Cancel, and
Export… (the plan as a shell script of ``ssh`` lines, written atomically). A layout the
hosts cannot run shows its error and fix, and Launch is disabled.

Presentation only: the plan, the findings and the script are app.hosts.preview's
:class:`~app.hosts.preview.RigPreview`."""
from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtGui import QFont, QFontDatabase, QTextCharFormat, QTextCursor, QTextOption
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QLabel, QMessageBox, QPushButton, QTextEdit,
                               QVBoxLayout, QWidget)

from app.engines import Engine
from app.fileio import write_atomic
from app.hosts.preview import RigPreview

ERROR_COLOR = "#a61b1b"
WARNING_COLOR = "#9a6700"


def _para(text: str, color: str | None = None) -> QLabel:
    style = f" style='color:{color}'" if color else ""
    label = QLabel(f"<span{style}>{text}</span>")
    label.setWordWrap(True)
    return label


def _mark_hosts(edit: QTextEdit) -> None:
    """Each host's comment line in bold, with space above it (the text itself unchanged:
    what is copied is what ``vllm-dyno hosts plan`` prints)."""
    cur = QTextCursor(edit.document())
    block = edit.document().begin()
    while block.isValid():
        if block.text().startswith("# "):
            cur.setPosition(block.position())
            cur.setPosition(block.position() + block.length() - 1, QTextCursor.KeepAnchor)
            fmt = QTextCharFormat()
            fmt.setFontWeight(QFont.Bold)
            cur.mergeCharFormat(fmt)
            if block.position() > 0:
                bf = block.blockFormat()
                bf.setTopMargin(10)
                cur.setBlockFormat(bf)
        block = block.next()


class RigPlanDialog(QDialog):
    """``preview``: what to show; ``engine``: ``vllm`` or ``sim`` (the sim's agents run
    the simulated server with these options). ``exec()`` returns Accepted for Launch."""

    def __init__(self, preview: RigPreview, engine: Engine | str = Engine.VLLM, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.preview = preview
        n = len(preview.hosts)
        self.setWindowTitle(f"Launch on {n} hosts")
        v = QVBoxLayout(self)
        v.addWidget(_para(f"<b>vLLM over {n} hosts</b> (multiprocessing backend): the first host is the head and "
                          "serves the API; every host runs the command below, started through its agent over SSH."))
        if Engine(engine).simulated:
            v.addWidget(_para("Engine sim: each host's agent runs the simulated server with these options "
                              "instead of vLLM."))
        if preview.error:
            self.error_label = _para(f"<b>These hosts cannot run this layout:</b> {html.escape(preview.error)}",
                                     ERROR_COLOR)
            v.addWidget(self.error_label)
        for f in preview.findings:
            where = f"host {html.escape(f.host)}: " if f.host else ""
            v.addWidget(_para(f"<b>{f.level}</b>: {where}{html.escape(f.message)}",
                              ERROR_COLOR if f.level == "error" else WARNING_COLOR))
        self.commands = QTextEdit()
        self.commands.setObjectName("rigPlanCommands")
        self.commands.setReadOnly(True)
        self.commands.setAcceptRichText(False)
        self.commands.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.commands.setWordWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)  # every word in view, none clipped
        self.commands.setPlainText(preview.text())
        _mark_hosts(self.commands)
        self.commands.setVisible(bool(preview.plan))
        v.addWidget(self.commands, 1)
        if preview.plan:
            v.addWidget(_para("Before starting, each host's agent is asked for its vLLM, the model, /dev/shm and "
                              "the interface that holds its address: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME are "
                              "set to it, and the launch stops, naming the host, if one cannot run its part."))
        for i, line in enumerate(preview.exposure):
            v.addWidget(_para(("<b>Beyond this machine</b> — " if i == 0 else "") + html.escape(line),
                              WARNING_COLOR))
        bb = QDialogButtonBox(QDialogButtonBox.Cancel)
        self.launch_button = QPushButton("Launch on the hosts" if not preview.exposed else
                                         "Launch, reachable from other machines")
        self.launch_button.setEnabled(preview.can_launch)
        self.launch_button.setToolTip("" if preview.can_launch else
                                      "the layout cannot run on these hosts: see the error above")
        bb.addButton(self.launch_button, QDialogButtonBox.AcceptRole)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Save the commands as a shell script: one ssh line per host")
        self.export_button.setEnabled(bool(preview.plan))
        bb.addButton(self.export_button, QDialogButtonBox.ActionRole)
        self.export_button.clicked.connect(self._on_export)
        bb.accepted.connect(self.accept)
        bb.rejected.connect(self.reject)
        self.buttons = bb
        v.addWidget(bb)
        self.resize(960, 480)

    def export(self, path: str | Path) -> Path:
        """Write the plan's script to ``path`` (atomically: the old file stays whole on any
        error). Raises OSError, or PlanError without a plan."""
        write_atomic(path, self.preview.script())
        return Path(path)

    def _on_export(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the launch commands", "launch-rig.sh",
                                              "Shell script (*.sh);;All files (*)")
        if not path:
            return
        try:
            self.export(path)
        except (OSError, ValueError) as e:
            QMessageBox.warning(self, "Export", f"Cannot write {path}: {e}")
