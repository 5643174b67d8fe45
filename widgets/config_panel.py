"""The configuration form: engine, model, GPUs and the ``vllm serve`` options.

Presentation only: it turns widget values into a :class:`app.config.ServerConfig`
(plus engine, sim rig and attach target) and back. The rows of the vLLM options are
generated from their declarations (:data:`app.config.VLLM_OPTIONS`: label, widget kind,
group, help text as tooltip); options without a form group are kept from the loaded
config. Tensor/pipeline-parallel choices are limited to values valid for the selected
cards and the model's heads (from the plan).
"""
from __future__ import annotations

import html

import shlex
from typing import Any

from pydantic import ValidationError
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from app.config import (GROUP_MODEL, QUANTIZATION_METHODS, SPEC_METHODS_MODEL_FREE, SPECULATIVE_METHODS, VLLM_OPTIONS,
                        ServerConfig, VllmOption)
from app.engines import SELECTABLE, Cards, Engine
from app.planner.checks import valid_dp_sizes, valid_pp_sizes, valid_tp_sizes
from app.profiles.model import SIM_RIG_OPTIONS, SimRig
from widgets.fit import FormScrollArea, narrow_combos

#: the engine selector's entries, in order (app.engines: each engine's label and hint)
ENGINES = SELECTABLE
#: used until the installed vLLM's list (or its version's list) is known
FALLBACK_QUANT = list(QUANTIZATION_METHODS)
GIB = 2**30


class OptSpinBox(QSpinBox):
    """A spin box whose lowest value shows "default" (not set: vLLM's default). A typed
    0 is refused with a tooltip saying why — it used to turn into "default" silently,
    and vLLM takes none of these options as 0; stepping below 1 (or typing "default")
    is how to unset it."""

    def validate(self, text: str, pos: int):
        t = text.strip()
        if t and t.isdigit() and int(t) == 0:
            if self.hasFocus():  # the user typing it (not a programmatic check of the text)
                QToolTip.showText(self.mapToGlobal(self.rect().bottomLeft()),
                                  "0 is not a value here: vLLM takes 1 or more. Step below 1 (↓) or type "
                                  "\"default\" for vLLM's default.", self)
            return QValidator.Invalid, text, pos
        return super().validate(text, pos)


def _opt_spin(maximum: int, step: int = 1) -> QSpinBox:
    """A spin box whose 0 means "not set" (vLLM's default)."""
    s = OptSpinBox()
    s.setRange(0, maximum)
    s.setSingleStep(step)
    s.setSpecialValueText("default")
    s.setAccelerated(True)
    return s


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


class OptionEditor:
    """One generated form row for a vLLM option, built from its :class:`VllmOption`.

    ``widget``: the value widget; ``row``: what the form shows (the widget, or a layout
    around it); ``label``: the row's label. ``value()`` is the field's value (None: not
    set, vLLM's default), ``set_value()`` shows one, ``connect()`` calls a slot on edits.
    The tooltip teaches (issue 19, item 5): the option's name and flag, what it does
    with its unit (the declaration's help), then — once the planner has run — vLLM's
    default for the installed version on the selected cards and the planner's advice
    (:func:`app.planner.option_help.option_notes`).
    """

    def __init__(self, field: str, spec: VllmOption) -> None:
        self.field, self.spec = field, spec
        self.label = spec.label or field
        self.widget: QWidget = self._make()
        self.row: QWidget | QHBoxLayout = self.widget
        self.extra = ""  # where the choices come from (the quantization list)
        self.note: Any = None  # an OptionNote of the current plan
        self.widget.setToolTip(self.tooltip())

    def tooltip(self, note: str = "") -> str:
        note = note or self.extra
        head = f"{self.field}: {self.spec.help}" + (f" ({note})" if note else "")
        parts = [f"<b>{_esc(self.field)}</b>: {_esc(head[len(self.field) + 2:])}",
                 f"<span style='color:#666'>vllm serve {_esc(self.spec.flag)}</span>"]
        if self.note is not None:
            parts.append(f"<b>Default</b>: {_esc(self.note.default)}")
            if self.note.advice:
                parts.append("<b>Planner</b>:<br>" + "<br>".join("• " + _esc(a) for a in self.note.advice))
        # a table of a set width: Qt wraps a rich-text tooltip narrowly otherwise
        return "<qt><table width='460'><tr><td>" + "<br>".join(parts) + "</td></tr></table></qt>"

    def set_note(self, note: Any) -> None:
        """Show ``note`` (an :class:`app.planner.option_help.OptionNote`, or None)."""
        self.note = note
        self.widget.setToolTip(self.tooltip())

    def _make(self) -> QWidget:
        raise NotImplementedError

    def value(self) -> Any:
        raise NotImplementedError

    def set_value(self, v: Any) -> None:
        raise NotImplementedError

    def connect(self, slot: Any) -> None:
        raise NotImplementedError


class _IntEditor(OptionEditor):
    """``int``: a spin box over ``minimum``…``maximum``; always a value."""

    def _make(self) -> QWidget:
        s = QSpinBox()
        s.setRange(int(self.spec.minimum), int(self.spec.maximum))
        s.setSingleStep(int(self.spec.step))
        s.setAccelerated(True)
        return s

    def value(self) -> Any:
        return self.widget.value()

    def set_value(self, v: Any) -> None:
        self.widget.setValue(int(v) if v is not None else int(self.spec.minimum))

    def connect(self, slot: Any) -> None:
        self.widget.valueChanged.connect(slot)


class _OptIntEditor(_IntEditor):
    """``opt_int``: a spin box whose 0 shows "default" (= not set)."""

    def _make(self) -> QWidget:
        return _opt_spin(int(self.spec.maximum), int(self.spec.step))

    def value(self) -> Any:
        return self.widget.value() or None

    def set_value(self, v: Any) -> None:
        self.widget.setValue(v or 0)


class _FloatEditor(OptionEditor):
    """``float``: a spin box with ``decimals`` (and a slider when ``slider``). With a
    ``form_default`` it shows that value when unset, and stays unset (None: vLLM's own
    default, which differs between versions) until the user changes it; without, its
    ``minimum`` shows "default" (= not set)."""

    def _make(self) -> QWidget:
        sp = self.spec
        box = QDoubleSpinBox()
        box.setRange(sp.minimum, sp.maximum)
        box.setSingleStep(sp.step)
        box.setDecimals(sp.decimals)
        if sp.form_default is None:
            box.setSpecialValueText("default")
        return box

    def __init__(self, field: str, spec: VllmOption) -> None:
        super().__init__(field, spec)
        self._unset = spec.form_default is not None  # shows form_default, means "not set"
        self._setting = False
        self.widget.valueChanged.connect(self._edited)
        if spec.slider:
            scale = 10**spec.decimals
            self.slider = QSlider(Qt.Horizontal)
            self.slider.setRange(round(spec.minimum * scale), round(spec.maximum * scale))
            self.slider.valueChanged.connect(lambda x: self.widget.setValue(x / scale))
            self.widget.valueChanged.connect(lambda x: self.slider.setValue(round(x * scale)))
            row = QHBoxLayout()
            row.addWidget(self.slider, 1)
            row.addWidget(self.widget)
            self.row = row

    def _edited(self, _v: float) -> None:
        if not self._setting:
            self._unset = False

    def value(self) -> Any:
        v = round(self.widget.value(), self.spec.decimals)
        if self.spec.form_default is None:
            return None if v <= self.spec.minimum else v
        return None if self._unset and v == self.spec.form_default else v

    def set_value(self, v: Any) -> None:
        default = self.spec.form_default if self.spec.form_default is not None else self.spec.minimum
        self._setting = True
        try:
            self.widget.setValue(v if v is not None else default)
        finally:
            self._setting = False
        self._unset = v is None and self.spec.form_default is not None

    def connect(self, slot: Any) -> None:
        self.widget.valueChanged.connect(slot)


class _ComboEditor(OptionEditor):
    def _make(self) -> QWidget:
        return QComboBox()

    def value(self) -> Any:
        return self.widget.currentData()

    def connect(self, slot: Any) -> None:
        self.widget.currentIndexChanged.connect(slot)


class _ChoiceEditor(_ComboEditor):
    """``choice``: a combo box, first the "not set" item (``unset_text``), then
    ``choices``; a loaded value not among them is added."""

    def __init__(self, field: str, spec: VllmOption) -> None:
        super().__init__(field, spec)
        self.set_choices(spec.choices)

    def set_choices(self, choices: Any) -> None:
        """Offer ``choices`` (keeps the current value, added if it is not among them)."""
        w = self.widget
        cur = w.currentData() if w.count() else None
        w.blockSignals(True)
        w.clear()
        w.addItem(self.spec.unset_text, None)
        for c in choices:
            if c != self.spec.unset_text:
                w.addItem(str(c), c)
        w.blockSignals(False)
        if cur is not None:
            self.set_value(cur)

    def set_value(self, v: Any) -> None:
        w = self.widget
        if v is None or v == self.spec.unset_text:
            w.setCurrentIndex(0)
            return
        if w.findData(v) < 0:
            w.addItem(str(v), v)
        w.setCurrentIndex(w.findData(v))


class _TristateEditor(_ComboEditor):
    """``tristate``: default / on / off (→ None / ``--flag`` / ``--no-flag``)."""

    def _make(self) -> QWidget:
        c = QComboBox()
        for text, data in (("default", None), ("on", True), ("off", False)):
            c.addItem(text, data)
        return c

    def set_value(self, v: Any) -> None:
        self.widget.setCurrentIndex({None: 0, True: 1, False: 2}[v])


class _ParallelEditor(_ComboEditor):
    """``parallel``: a combo box of the sizes valid here (filled by the panel, which knows
    the cards and the model); 1 means not set."""

    def tooltip(self, note: str = "") -> str:
        return super().tooltip(note or "only sizes valid for the selected cards and the model are offered")

    def value(self) -> Any:
        v = self.widget.currentData() or 1
        return v if v > 1 else None

    def set_value(self, v: Any) -> None:
        i = self.widget.findData(v or 1)
        if i >= 0:
            self.widget.setCurrentIndex(i)


class _FlagEditor(OptionEditor):
    """``flag``: a check box labelled ``label`` (checked → ``--flag``, else not set)."""

    def __init__(self, field: str, spec: VllmOption) -> None:
        super().__init__(field, spec)
        self.label = ""

    def _make(self) -> QWidget:
        return QCheckBox(self.spec.label or self.field)

    def value(self) -> Any:
        return True if self.widget.isChecked() else None

    def set_value(self, v: Any) -> None:
        self.widget.setChecked(bool(v))

    def connect(self, slot: Any) -> None:
        self.widget.toggled.connect(slot)


class _TextEditor(OptionEditor):
    """``text``: a line edit; empty = not set (the field's default)."""

    def _make(self) -> QWidget:
        e = QLineEdit()
        default = ServerConfig.model_fields[self.field].default
        e.setPlaceholderText("optional" if default is None else str(default))
        return e

    def value(self) -> Any:
        return self.widget.text().strip() or None

    def set_value(self, v: Any) -> None:
        default = ServerConfig.model_fields[self.field].default
        self.widget.setText("" if v is None or v == default else str(v))

    def connect(self, slot: Any) -> None:
        self.widget.textChanged.connect(slot)


class _SpeculativeEditor(OptionEditor):
    """``speculative``: vLLM's ``--speculative-config`` object as three fields in a row —
    the method (combo: off, then :data:`app.config.SPECULATIVE_METHODS`), the draft model
    or head (line edit; not used by ngram/suffix) and the number of speculative tokens
    (spin box). Keys of a loaded object that the row does not show
    (``prompt_lookup_max``, ``draft_tensor_parallel_size`` …) are kept as they were."""

    def _make(self) -> QWidget:
        w = QWidget()
        row = QHBoxLayout(w)
        row.setContentsMargins(0, 0, 0, 0)
        self.method = QComboBox()
        self.method.addItem("off", None)
        for m in SPECULATIVE_METHODS:
            self.method.addItem(m, m)
        self.draft = QLineEdit()
        self.draft.setPlaceholderText("draft model / head")
        self.tokens = QSpinBox()
        self.tokens.setRange(1, 16)
        self.tokens.setValue(3)
        self.tokens.setPrefix("k = ")
        self.tokens.setToolTip("num_speculative_tokens: draft tokens proposed and verified per step")
        row.addWidget(self.method)
        row.addWidget(self.draft, 1)
        row.addWidget(self.tokens)
        self._rest: dict[str, Any] = {}
        self.method.currentIndexChanged.connect(self._enable)
        self._enable()
        return w

    def _enable(self, *_a: Any) -> None:
        m = self.method.currentData()
        self.draft.setEnabled(m is not None and m not in SPEC_METHODS_MODEL_FREE)
        self.tokens.setEnabled(m is not None)

    def value(self) -> Any:
        m = self.method.currentData()
        if m is None:
            return None
        d = dict(self._rest)  # the loaded object's keys, in its order
        d["method"] = m
        model = self.draft.text().strip()
        if model and m not in SPEC_METHODS_MODEL_FREE:
            d["model"] = model
        else:
            d.pop("model", None)
        d["num_speculative_tokens"] = self.tokens.value()
        return d

    def set_value(self, v: Any) -> None:
        d = dict(v or {})
        m = d.get("method")
        if v and m is None:  # vLLM infers it from the model (app.config.speculative_method)
            m = "ngram" if d.get("model") in ("ngram", "[ngram]") else "draft_model"
        if m is not None and self.method.findData(m) < 0:
            self.method.addItem(str(m), m)
        self.method.setCurrentIndex(self.method.findData(m) if m is not None else 0)
        self.draft.setText(str(d.get("model") or ""))
        self.draft.setCursorPosition(0)  # the start of a long id shows
        k = d.get("num_speculative_tokens")
        self.tokens.setValue(int(k) if k else 3)
        self._rest = d
        self._enable()

    def connect(self, slot: Any) -> None:
        self.method.currentIndexChanged.connect(slot)
        self.draft.textChanged.connect(slot)
        self.tokens.valueChanged.connect(slot)


_EDITORS: dict[str, type[OptionEditor]] = {
    "int": _IntEditor, "opt_int": _OptIntEditor, "float": _FloatEditor, "choice": _ChoiceEditor,
    "tristate": _TristateEditor, "parallel": _ParallelEditor, "flag": _FlagEditor, "text": _TextEditor,
    "speculative": _SpeculativeEditor,
}


def make_editor(field: str, spec: VllmOption) -> OptionEditor:
    """The form row of option ``field`` (its widget kind from ``spec.kind``)."""
    return _EDITORS[spec.kind](field, spec)


class GpuTable(QTableWidget):
    """The cards NVML reports, with a checkbox each. ``selection_changed`` on toggles."""

    selection_changed = Signal()
    COLS = ["", "GPU", "Memory", "Temp", "Processes"]

    def __init__(self) -> None:
        super().__init__(0, len(self.COLS))
        self.setHorizontalHeaderLabels(self.COLS)
        self.verticalHeader().setVisible(False)
        self.horizontalHeader().setSectionResizeMode(1, QHeaderView.Stretch)
        for c in (0, 2, 3, 4):
            self.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeToContents)
        self.setSelectionMode(QTableWidget.NoSelection)
        self.setEditTriggers(QTableWidget.NoEditTriggers)
        self.setMaximumHeight(150)
        self.itemChanged.connect(lambda *_: self.selection_changed.emit())
        self.readings: list[Any] = []
        self.status_text = "detecting GPUs…"
        self._show_message(self.status_text)

    def _show_message(self, text: str) -> None:
        self.blockSignals(True)
        self.setRowCount(1)
        it = QTableWidgetItem(text)
        it.setFlags(Qt.ItemIsEnabled)
        self.setItem(0, 1, it)
        for c in (0, 2, 3, 4):
            self.setItem(0, c, QTableWidgetItem(""))
        self.blockSignals(False)

    def set_readings(self, readings: list[Any], status_text: str) -> None:
        """``readings``: app.telemetry.gpu_source.GpuReading list ([] when no GPU)."""
        self.readings = list(readings)
        self.status_text = status_text
        if not readings:
            self._show_message(status_text)
            return
        self.blockSignals(True)
        self.setRowCount(len(readings))
        for row, r in enumerate(readings):
            chk = QTableWidgetItem()
            chk.setFlags(Qt.ItemIsUserCheckable | Qt.ItemIsEnabled)
            chk.setCheckState(Qt.Checked)
            chk.setData(Qt.UserRole, r.index)
            self.setItem(row, 0, chk)
            self.setItem(row, 1, QTableWidgetItem(f"{r.index}: {r.name or '?'}"))
            mem = "–"
            if r.memory_total_bytes:
                used = (r.memory_used_bytes or 0) / GIB
                mem = f"{used:.1f} / {r.memory_total_bytes / GIB:.1f} GiB"
                if r.used_includes_reserved:  # NVML memory info v1 only: say it, do not pass it off as used
                    mem += " (incl. reserved)"
            mem_item = QTableWidgetItem(mem)
            mem_item.setToolTip(r.memory_note())
            self.setItem(row, 2, mem_item)
            self.setItem(row, 3, QTableWidgetItem("–" if r.temp_gpu_c is None else f"{r.temp_gpu_c:.0f} °C"))
            procs = r.processes or []
            txt = ", ".join(f"{p.pid} ({(p.used_memory_bytes or 0) / GIB:.1f} GiB)" for p in procs) or "none"
            self.setItem(row, 4, QTableWidgetItem(txt))
        self.blockSignals(False)
        self.selection_changed.emit()

    def selected(self) -> list[int]:
        out = []
        for row in range(self.rowCount()):
            it = self.item(row, 0)
            if it is not None and it.data(Qt.UserRole) is not None and it.checkState() == Qt.Checked:
                out.append(int(it.data(Qt.UserRole)))
        return out

    def select(self, indices: list[int] | None) -> None:
        """Check exactly ``indices`` (None = all)."""
        self.blockSignals(True)
        for row in range(self.rowCount()):
            it = self.item(row, 0)
            if it is None or it.data(Qt.UserRole) is None:
                continue
            on = indices is None or int(it.data(Qt.UserRole)) in indices
            it.setCheckState(Qt.Checked if on else Qt.Unchecked)
        self.blockSignals(False)
        self.selection_changed.emit()


def _text_of(ed: QWidget) -> str:
    """The text of a line edit or an editable combo box."""
    return ed.currentText() if isinstance(ed, QComboBox) else ed.text()


class ConfigPanel(FormScrollArea):
    """The server form. ``changed`` fires on every edit (the plan panel debounces it)."""

    changed = Signal()
    profile_selected = Signal(str)
    save_profile_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("configPanel")
        self._heads: tuple[int, int, int] | None = None  # heads, kv heads, layers
        self._loading = False
        self._sim_rig = None  # the loaded profile's SimRig (seed, time scale)
        body = QWidget()
        self.setWidget(body)
        v = QVBoxLayout(body)

        # profile
        row = QHBoxLayout()
        self.profile = QComboBox()
        self.profile.setToolTip("Tuning profile: the form's values, the ramp and the rig")
        self.profile.activated.connect(lambda i: self.profile_selected.emit(self.profile.itemText(i)))
        self.save_btn = QPushButton("Save…")
        self.save_btn.setToolTip("Save the form and the ramp as a profile")
        self.save_btn.clicked.connect(self.save_profile_requested)
        row.addWidget(QLabel("Profile"))
        row.addWidget(self.profile, 1)
        row.addWidget(self.save_btn)
        v.addLayout(row)

        # engine
        eng = QGroupBox("Engine")
        f = QFormLayout(eng)
        self.engine = QComboBox()
        for e in ENGINES:
            self.engine.addItem(e.spec.label, e.value)
        self.engine.setToolTip(" · ".join(f"{e.spec.label}: {e.spec.hint}" for e in ENGINES))
        f.addRow("Engine", self.engine)
        self.sim_gpu = QComboBox()
        self.sim_count = QSpinBox()
        self.sim_count.setRange(1, 16)
        self.sim_count.setSuffix(" GPUs")
        rig = QHBoxLayout()
        rig.addWidget(self.sim_gpu, 1)
        rig.addWidget(QLabel("×"))
        rig.addWidget(self.sim_count)
        self.sim_row = QWidget()
        self.sim_row.setLayout(rig)
        rig.setContentsMargins(0, 0, 0, 0)
        f.addRow("Rig", self.sim_row)
        # the rig's other options with a form row, generated from their declaration (SimRig's
        # SimOption: label, help, choices); empty = the rig's default
        self.sim_options: dict[str, QWidget] = {}
        for name, opt in SIM_RIG_OPTIONS.items():
            if opt.label is None:
                continue
            if opt.choices:
                ed: QWidget = QComboBox()
                ed.setEditable(True)
                ed.addItems(["", *opt.choices])
                ed.lineEdit().setPlaceholderText("default")
                ed.currentTextChanged.connect(self._edited)
            else:
                ed = QLineEdit()
                ed.setPlaceholderText("default")
                ed.textChanged.connect(self._edited)
            ed.setToolTip(f"{opt.flag}: {opt.help}")
            ed.setObjectName(f"sim_{name}")
            f.addRow(opt.label, ed)
            self.sim_options[name] = ed
        self.attach_url = QLineEdit("http://127.0.0.1:8000")
        self.attach_model = QLineEdit()
        self.attach_model.setPlaceholderText("served model name (empty: the first /v1/models lists)")
        f.addRow("URL", self.attach_url)
        f.addRow("Served name", self.attach_model)
        self._engine_form = f
        v.addWidget(eng)

        # model
        mg = QGroupBox("Model")
        f = QFormLayout(mg)
        mrow = QHBoxLayout()
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.setInsertPolicy(QComboBox.NoInsert)
        self.model.setToolTip("A local model directory, a Hugging Face id, or a catalog entry")
        browse = QPushButton("…")
        browse.setToolTip("Choose a model directory (holding config.json)")
        browse.setFixedWidth(28)
        browse.clicked.connect(self._browse_model)
        mrow.addWidget(self.model, 1)
        mrow.addWidget(browse)
        f.addRow("Model", mrow)
        forms: dict[str, QFormLayout] = {GROUP_MODEL: f}
        v.addWidget(mg)

        # GPUs
        self.gpu_box = QGroupBox("GPUs")
        gl = QVBoxLayout(self.gpu_box)
        self.gpu_table = GpuTable()
        gl.addWidget(self.gpu_table)
        qrow = QHBoxLayout()
        self.four_btn = QPushButton("4 cards")
        self.eight_btn = QPushButton("8 cards")
        self.all_btn = QPushButton("All")
        self.four_btn.clicked.connect(lambda: self.gpu_table.select(list(range(4))))
        self.eight_btn.clicked.connect(lambda: self.gpu_table.select(list(range(8))))
        self.all_btn.clicked.connect(lambda: self.gpu_table.select(None))
        for b in (self.four_btn, self.eight_btn, self.all_btn):
            qrow.addWidget(b)
        qrow.addStretch(1)
        gl.addLayout(qrow)
        v.addWidget(self.gpu_box)

        # the vLLM options: one generated row each, in declaration order; a group box per
        # new group (after the GPUs); options without a group are not shown
        self.options: dict[str, OptionEditor] = {}
        for field, spec in VLLM_OPTIONS.items():
            if spec.group is None:
                continue
            if spec.group not in forms:
                box = QGroupBox(spec.group)
                forms[spec.group] = QFormLayout(box)
                v.addWidget(box)
            ed = make_editor(field, spec)
            forms[spec.group].addRow(ed.label, ed.row)
            self.options[field] = ed
        self._hidden: dict[str, Any] = {}  # loaded values of the options the form does not show
        # the widgets other code reaches by name
        self.tp = self.options["tensor_parallel_size"].widget
        self.pp = self.options["pipeline_parallel_size"].widget
        self.dp = self.options["data_parallel_size"].widget
        self.quant = self.options["quantization"].widget
        self.max_num_seqs = self.options["max_num_seqs"].widget
        self.max_model_len = self.options["max_model_len"].widget
        self.set_quantization_methods(FALLBACK_QUANT, "built-in list")

        # extra
        xg = QGroupBox("Extra options and environment")
        f = QFormLayout(xg)
        self.extra = QLineEdit()
        self.extra.setPlaceholderText("--swap-space 4 --seed 1")
        self.env = QPlainTextEdit()
        self.env.setPlaceholderText("NAME=value, one a line (VLLM_API_KEY goes here, never in options)")
        self.env.setFixedHeight(64)
        self.env.setTabChangesFocus(True)  # Tab moves on, as in every other field (a tab character broke a plan)
        f.addRow("Options", self.extra)
        f.addRow("Environment", self.env)
        v.addWidget(xg)
        v.addStretch(1)

        for w in (self.engine, self.sim_gpu):
            w.currentIndexChanged.connect(self._edited)
        for ed in self.options.values():
            ed.connect(self._edited)
        self.model.currentTextChanged.connect(self._edited)
        self.sim_count.valueChanged.connect(self._cards_changed)  # TP 8 was offered with 4 cards (issue 37)
        for f in self._parallel_fields():  # a size chosen: the others offer what fits beside it
            self.options[f].widget.currentIndexChanged.connect(self._refill_parallel)
        for w in (self.attach_url, self.attach_model, self.extra):
            w.textChanged.connect(self._edited)
        self.env.textChanged.connect(self._edited)
        self.gpu_table.selection_changed.connect(self._cards_changed)
        self.engine.currentIndexChanged.connect(self._engine_changed)
        # the form follows the panel's width (FormScrollArea): a combo box sized to its longest
        # entry (a profile name, a model id) made the form wider than the panel and clipped it
        narrow_combos(body)
        self._refill_parallel()
        self._engine_changed()

    # ------------------------------------------------------------------ choices
    def set_catalogs(self, gpu_names: list[str], model_ids: list[str]) -> None:
        self._loading = True
        cur = self.sim_gpu.currentText()
        self.sim_gpu.clear()
        self.sim_gpu.addItems(gpu_names)
        if cur:
            if self.sim_gpu.findText(cur) < 0:
                self.sim_gpu.addItem(cur)
            self.sim_gpu.setCurrentText(cur)
        text = self.model.currentText()
        self.model.clear()
        self.model.addItems(model_ids)
        self.model.setCurrentText(text)
        self.model.lineEdit().setCursorPosition(0)  # a long id shows its start (the organisation)
        self._loading = False

    def set_quantization_methods(self, methods: list[str], source: str) -> None:
        """Offer ``methods`` for quantization (``source``: where the list comes from)."""
        ed = self.options["quantization"]
        self.quant.blockSignals(True)
        ed.set_choices(methods)
        self.quant.blockSignals(False)
        ed.extra = source
        self.quant.setToolTip(ed.tooltip())

    def set_option_notes(self, notes: dict[str, Any]) -> None:
        """Each option's default and advice from the current plan (None: no plan)."""
        for f, ed in self.options.items():
            ed.set_note((notes or {}).get(f))

    def set_model_shape(self, heads: int | None, kv_heads: int | None, layers: int | None) -> None:
        """The model's attention heads, KV heads and layers (None: unknown → all sizes)."""
        new = (heads, kv_heads, layers) if heads else None
        if new != self._heads:
            self._heads = new
            self._refill_parallel()

    def card_count(self) -> int:
        cards = self.engine_key().spec.cards
        if cards is Cards.SIM_RIG:
            return self.sim_count.value()
        if cards is Cards.MACHINE:
            return max(1, len(self.gpu_table.selected())) if self.gpu_table.readings else 1
        return 1

    def valid_tp(self) -> list[int]:
        """Tensor sizes offered: the planner's rule (:func:`app.planner.checks.valid_tp_sizes`),
        TP × PP × DP ≤ the cards."""
        h, kv, _ = self._heads or (None, None, None)
        return valid_tp_sizes(self.card_count(), (self.pp.currentData() or 1) * (self.dp.currentData() or 1), h, kv)

    def valid_pp(self) -> list[int]:
        """Pipeline sizes offered: :func:`app.planner.checks.valid_pp_sizes`."""
        layers = self._heads[2] if self._heads else None
        return valid_pp_sizes(self.card_count(), (self.tp.currentData() or 1) * (self.dp.currentData() or 1), layers)

    def valid_dp(self) -> list[int]:
        """Data parallel sizes offered: :func:`app.planner.checks.valid_dp_sizes`."""
        return valid_dp_sizes(self.card_count(), self.tp.currentData() or 1, self.pp.currentData() or 1)

    def _fill(self, combo: QComboBox, values: list[int], want: int) -> None:
        combo.blockSignals(True)
        combo.clear()
        for x in values:
            combo.addItem(str(x), x)
        if want not in values:
            combo.addItem(f"{want} (not valid here)", want)
        self._set_combo_data(combo, want)
        combo.blockSignals(False)

    def valid_sizes(self, field: str) -> list[int]:
        """The sizes offered for parallel option ``field`` (TP, PP and DP: see valid_tp,
        valid_pp and valid_dp; another: 1 … the card count)."""
        if field == "tensor_parallel_size":
            return self.valid_tp()
        if field == "pipeline_parallel_size":
            return self.valid_pp()
        if field == "data_parallel_size":
            return self.valid_dp()
        return list(range(1, self.card_count() + 1))

    def _parallel_fields(self) -> list[str]:
        return [f for f, ed in self.options.items() if ed.spec.kind == "parallel"]

    def _refill_parallel(self, *_: Any) -> None:
        """Offer each parallel size the values valid with the others' current values and
        the card count (a value no longer valid stays, marked "not valid here")."""
        fields = self._parallel_fields()
        for _pass in range(2):  # each list depends on the others' values: twice settles them
            for f in fields:
                w = self.options[f].widget
                self._fill(w, self.valid_sizes(f), w.currentData() or 1)

    @staticmethod
    def _set_combo_data(combo: QComboBox, value: Any) -> None:
        i = combo.findData(value)
        if i >= 0:
            combo.setCurrentIndex(i)

    # ------------------------------------------------------------------ events
    def _edited(self, *_: Any) -> None:
        if not self._loading:
            self.changed.emit()

    def _cards_changed(self) -> None:
        self._refill_parallel()
        self._edited()

    def _engine_changed(self, *_: Any) -> None:
        eng = self.engine_key()
        f = self._engine_form
        f.setRowVisible(self.sim_row, eng.simulated)
        for ed in self.sim_options.values():
            f.setRowVisible(ed, eng.simulated)
        f.setRowVisible(self.attach_url, not eng.launches)
        f.setRowVisible(self.attach_model, not eng.launches)
        self.gpu_box.setVisible(eng.spec.cards is Cards.MACHINE)
        self._refill_parallel()

    def _browse_model(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Model directory (holding config.json)")
        if d:
            self.model.setCurrentText(d)

    # ------------------------------------------------------------------ values
    def engine_key(self) -> Engine:
        """The selected engine (vLLM while nothing is selected)."""
        return Engine.parse(self.engine.currentData()) or Engine.VLLM

    def sim_rig(self, time_scale: float | None = None):
        """The simulated rig as the form shows it (:class:`app.profiles.model.SimRig`):
        the card and count and the rig options with a row (cooling, ambient: empty = the
        rig's default) from the form, the seed, time scale and perturbation
        (``--sim-perturb``) of the loaded profile's rig; ``time_scale`` (the window's,
        tests and benchmarks) overrides. Raises ValueError naming the option (a row's
        text that is not a value of it)."""

        base = self._sim_rig or SimRig()
        upd: dict[str, Any] = {"gpu": self.sim_gpu.currentText() or "RTX 4090", "count": self.sim_count.value()}
        for name, ed in self.sim_options.items():
            upd[name] = SimRig.option_value(name, _text_of(ed))
        if time_scale is not None and time_scale != 1.0:
            upd["time_scale"] = time_scale
        return base.model_copy(update=upd)

    def build_config(self) -> ServerConfig:
        """The form as a ServerConfig. Raises ValueError (pydantic's, naming the field)."""
        model = self.model.currentText().strip()
        if not model:
            raise ValueError("model: give a model directory, a Hugging Face id or a catalog entry")
        env: dict[str, str] = {}
        for n, line in enumerate(self.env.toPlainText().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"environment line {n} {line!r}: write NAME=value")
            k, val = line.split("=", 1)
            env[k.strip()] = val.strip()
        try:
            extra = shlex.split(self.extra.text())
        except ValueError as e:
            raise ValueError(f"extra options: {e}") from e
        kw: dict[str, Any] = dict(model=model, env=env, extra_args=extra)
        kw.update({f: v for f, v in self._hidden.items() if v is not None})
        for field, ed in self.options.items():
            v = ed.value()
            if v is not None:
                kw[field] = v
        if self.engine_key().spec.cards is Cards.MACHINE and self.gpu_table.readings:
            kw["gpus"] = self.gpu_table.selected()

        try:
            return ServerConfig(**kw)
        except ValidationError as e:
            msgs = "; ".join(f"{'.'.join(map(str, er['loc'])) or 'config'}: {er['msg']}" for er in e.errors())
            raise ValueError(msgs) from None

    def set_config(self, cfg: ServerConfig) -> None:
        """Show ``cfg`` in the form (invalid TP/PP values are kept and marked)."""
        self._loading = True
        try:
            self.model.setCurrentText(cfg.model)
            self.model.lineEdit().setCursorPosition(0)  # a long id shows its start (the organisation)
            for field in self._parallel_fields():  # the wanted sizes first, then each list beside the others
                self._fill(self.options[field].widget, [], getattr(cfg, field) or 1)
            self._refill_parallel()
            for field, ed in self.options.items():
                if ed.spec.kind != "parallel":
                    ed.set_value(getattr(cfg, field))
            self._hidden = {f: getattr(cfg, f) for f in VLLM_OPTIONS if f not in self.options}
            self.extra.setText(shlex.join(cfg.extra_args))
            self.env.setPlainText("\n".join(f"{k}={v}" for k, v in cfg.env.items()))
            if cfg.gpus is not None and self.gpu_table.readings:
                self.gpu_table.select(cfg.gpus)
        finally:
            self._loading = False
        self.changed.emit()

    def set_engine(self, engine: Engine | str, sim_gpu: str | None = None, sim_count: int | None = None,
                   attach_url: str | None = None, attach_model: str | None = None, sim_rig: Any = None) -> None:
        """Show the engine; ``sim_rig``: the loaded profile's SimRig (its options with a
        row are shown — cooling, ambient —, its seed, time scale and perturbation are kept
        for :meth:`sim_rig`)."""
        self._sim_rig = sim_rig
        self._loading = True
        try:
            self._set_combo_data(self.engine, Engine(engine).value)
            for name, ed in self.sim_options.items():
                v = getattr(sim_rig, name, None) if sim_rig is not None else None
                text = "" if v is None else SIM_RIG_OPTIONS[name].text(v)
                if isinstance(ed, QComboBox):
                    ed.setCurrentText(text)
                else:
                    ed.setText(text)
            if sim_gpu:
                if self.sim_gpu.findText(sim_gpu) < 0:
                    self.sim_gpu.addItem(sim_gpu)
                self.sim_gpu.setCurrentText(sim_gpu)
            if sim_count:
                self.sim_count.setValue(int(sim_count))
            if attach_url:
                self.attach_url.setText(attach_url)
            if attach_model is not None:
                self.attach_model.setText(attach_model)
        finally:
            self._loading = False
        self._engine_changed()
        self.changed.emit()

    def to_profile(self) -> dict[str, Any]:
        """The form as profile fields (``engine``, ``server``, ``env``, ``gpus``, ``sim``,
        ``attach_url``; see widgets.profiles.form_profile). For engine attach the served
        name is kept as the server's ``served-model-name``."""
        cfg = self.build_config()
        server = cfg.to_vllm_config()
        eng = self.engine_key()
        data: dict[str, Any] = {"schema_version": 1, "engine": eng, "server": server, "env": dict(cfg.env)}
        if cfg.gpus is not None:
            data["gpus"] = list(cfg.gpus)
        if eng.simulated:
            data["sim"] = self.sim_rig().model_dump(exclude_none=True)
        if not eng.launches:
            data["attach_url"] = self.attach_url.text().strip()
            if self.attach_model.text().strip():
                server["served-model-name"] = self.attach_model.text().strip()
        return data
