"""The Ramp form's workload rows, generated from the kinds' declarations
(:func:`app.loadgen.workload.form_rows`: one :class:`~app.loadgen.workload.FormRow` per
field — a line edit, a file with a browse button, a check box or a spin box). Presentation
only: the values are the Workload's fields, parsed by the kind's own ``parse``."""
from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (QCheckBox, QDoubleSpinBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QSpinBox, QWidget)

from app.loadgen.workload import Workload, form_rows


class WorkloadRows(QObject):
    """The rows of one ``section`` (``requests`` or ``arrivals``) added to ``form``:
    ``widgets[field]`` its editor, ``labels[field]`` its label; :meth:`values` the fields
    the rows set, :meth:`set_values` fills them from a ramp mapping; ``changed`` when any
    row is edited. ``below``: a widget shown as a full-width row under a field's row
    (the dataset's length histograms under Prompts file)."""

    changed = Signal()

    def __init__(self, form: QFormLayout, section: str, parent: QWidget,
                 below: dict[str, QWidget] | None = None) -> None:
        super().__init__(parent)
        self.owner = parent
        self.rows = form_rows(section)
        self.widgets: dict[str, QWidget] = {}
        self.labels: dict[str, QLabel] = {}
        for r in self.rows:
            w: QWidget
            if r.widget in ("text", "file"):
                edit = QLineEdit()
                edit.setPlaceholderText(r.placeholder)
                edit.textChanged.connect(self.changed)
                w = edit
            elif r.widget == "check":
                box = QCheckBox(r.placeholder)
                box.toggled.connect(self.changed)
                w = box
            elif r.widget == "number":
                num = QDoubleSpinBox()
                num.setRange(r.minimum, r.maximum)
                num.setDecimals(r.decimals)
                num.setSingleStep(r.step)
                num.valueChanged.connect(self.changed)
                w = num
            else:  # count: whole numbers, 0 = None
                cnt = QSpinBox()
                cnt.setRange(int(r.minimum), int(r.maximum))
                cnt.setSpecialValueText(r.special)
                cnt.valueChanged.connect(self.changed)
                w = cnt
            w.setObjectName(_object_name(r.field))
            w.setToolTip(r.tooltip)
            self.widgets[r.field] = w
            label = QLabel(r.label)
            self.labels[r.field] = label
            if r.widget == "file":
                row = QHBoxLayout()
                row.addWidget(w, 1)
                b = QPushButton("…")
                b.setFixedWidth(28)
                b.clicked.connect(self._browser(w, r.label))
                row.addWidget(b)
                form.addRow(label, row)
            else:
                form.addRow(label, w)
            if below and r.field in below:
                form.addRow(below[r.field])
        self.set_values({})

    def _browser(self, edit: QWidget, title: str) -> Callable[[], None]:
        def browse() -> None:
            path, _ = QFileDialog.getOpenFileName(self.owner, title, "",
                                                  "Datasets (*.jsonl *.json *.csv *.tsv *.parquet);;All files (*)")
            if path and isinstance(edit, QLineEdit):
                edit.setText(path)
        return browse

    def values(self) -> dict[str, Any]:
        """The fields the rows set (a row left empty or at its default sets none).
        Raises ValueError from a row's ``parse``, naming the field's form."""
        out: dict[str, Any] = {}
        for r in self.rows:
            w = self.widgets[r.field]
            if isinstance(w, QLineEdit):
                text = w.text().strip()
                v = r.parse(text) if r.parse is not None else (text or None)
                if v is not None:
                    out[r.field] = v
            elif isinstance(w, QCheckBox):
                out[r.field] = r.on if w.isChecked() else r.off
            elif isinstance(w, QSpinBox):
                out[r.field] = w.value() or None
            elif isinstance(w, QDoubleSpinBox):
                out[r.field] = round(w.value(), r.decimals)
        return out

    def set_values(self, ramp: dict[str, Any]) -> None:
        """Fill the rows from a ramp mapping (a profile's ``ramp:``); a field it does not
        set shows the Workload's default."""
        for r in self.rows:
            w = self.widgets[r.field]
            v = ramp.get(r.field)
            if v is None and r.field in Workload.model_fields:
                v = Workload.model_fields[r.field].default
            if isinstance(w, QLineEdit):
                w.setText(r.text(v) if v is not None else "")
            elif isinstance(w, QCheckBox):
                w.setChecked(v != r.off)
            elif isinstance(w, QSpinBox):
                w.setValue(int(v or 0))
            elif isinstance(w, QDoubleSpinBox):
                w.setValue(float(v or 0))

    def set_visible(self, visible: bool) -> None:
        for f in self.widgets:
            self.widgets[f].setVisible(visible)
            self.labels[f].setVisible(visible)


def _object_name(field: str) -> str:
    """``max_concurrency`` → ``maxConcurrency`` (the Qt object name tests find a row by)."""
    head, *rest = field.split("_")
    return head + "".join(x.title() for x in rest)
